"""Draft trees: several continuations of one context, scored by the verifier in one forward (a chain where the
evidence does not split).

The evidence rule (evidence.py) follows one occurrence of the context's suffix and keeps the others only to
estimate how likely the copy goes on. A tree keeps them all: the occurrences (from the context and from the
memory of earlier outputs, each with its source's prior) are the support of the root; a node's support is
split by the token each supporting occurrence has next, one child per token. A child's estimated chance of
being accepted (its parent was) is

    q = prior(m + j) * W(child) / W(node),

where j is the child's depth (0 = the first draft), m the longest match among the child's support, prior
its source's, and W the summed weight of a support, each occurrence weighing 1 / (1 - prior(m_o + j)) (a
longer match says much more about what comes next). With one occurrence, or all agreeing, q is the chain rule's chance;
where they split, the children share it by weight. The chance of a node is the product of q along its
path, and the expected number of accepted tokens of a tree is the sum of its nodes' chances.

Nodes are taken best first (highest chance), up to `budget` nodes and `depth` levels, while a node's chance is
at least `threshold`: for a given number of scored tokens this is the tree with the most expected accepted
tokens (a node's chance never exceeds its parent's, so the best first are always a tree). A tree of budget
b whose evidence never splits is the evidence rule's chain of b tokens.

Nodes are numbered in the order taken, so a node's parent comes before it; parent -1 is the context's last
token (the token the verifier already holds).

Not served yet: bench/acceptance.py replays it against the chain on recorded outputs (--tree-budgets), and
at equal scored tokens per step it accepts only 2-9% more tokens a step; even a tree of every candidate's
whole continuation (the hindsight ceiling of these occurrences) reaches 1.13-1.22x the chain, at 6-7x its
scored tokens (docs/BENCHMARKS.md, draft trees).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from drafter_service.evidence import Occurrence, match_length

Prior = Callable[[int], float]
CANDIDATES = 16  # occurrences examined per source and step (the chain rule's 4, and more to branch on)


@dataclass
class DraftTree:
    """Tokens in the order taken; parents[i] < i, or -1 for a child of the context's last token."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    chances: list[float] = field(default_factory=list)  # estimated chance each node is accepted

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def score(self) -> float:
        """Expected accepted tokens (the sum of the nodes' chances)."""
        return sum(self.chances)

    def accepted_path(self, continuation: Sequence[int]) -> list[int]:
        """Nodes of the longest root path whose tokens are `continuation`'s first ones (greedy verification)."""
        children: dict[tuple[int, int], int] = {(p, t): i for i, (p, t) in enumerate(zip(self.parents, self.tokens))}
        path, node = [], -1
        for token in continuation:
            node = children.get((node, token), None)
            if node is None:
                break
            path.append(node)
        return path


@dataclass(frozen=True)
class _Support:
    after: Sequence[int]  # the occurrence's continuation (periodic ones unrolled to the depth)
    match: int  # how many tokens before it agree with the context's tail
    prior: Prior


def build_tree(context: Sequence[int], sources: Sequence[tuple[Sequence[Occurrence], Prior]], budget: int,
               depth: int, threshold: float) -> DraftTree:
    """The tree of the module docstring; `sources`: (occurrences, their prior) per source."""
    support = [_Support(_unrolled(o, depth), match_length(context, o.before), prior)
               for occurrences, prior in sources for o in occurrences]
    support = [s for s in support if s.match > 0 and s.after]
    tree = DraftTree()
    if budget <= 0 or depth <= 0 or not support:
        return tree
    frontier: list[tuple[float, int, int, int, list[_Support]]] = []  # (-chance, order, parent, token, support)
    order = 0
    for token, chance, group in _children(support, 0, 1.0):
        heapq.heappush(frontier, (-chance, order, -1, token, group))
        order += 1
    while frontier and len(tree) < budget:
        negative, _, parent, token, group = heapq.heappop(frontier)
        if -negative < threshold:
            break
        node = len(tree)
        tree.tokens.append(token)
        tree.parents.append(parent)
        tree.chances.append(-negative)
        level = _depth(tree, node)
        if level < depth:
            for child, chance, child_group in _children(group, level, -negative):
                heapq.heappush(frontier, (-chance, order, node, child, child_group))
                order += 1
    return tree


def _children(support: list[_Support], j: int, chance: float) -> list[tuple[int, float, list[_Support]]]:
    """(token, chance, support) of each child at depth j of a node with `support` and chance `chance`."""
    racing = [s for s in support if len(s.after) > j]
    total = sum(_weight(s, j) for s in racing)
    groups: dict[int, list[_Support]] = {}
    for s in racing:
        groups.setdefault(s.after[j], []).append(s)
    children = []
    for token, group in groups.items():
        weight = sum(_weight(s, j) for s in group)
        best = max(group, key=lambda s: s.match)
        children.append((token, chance * best.prior(best.match + j) * weight / total, group))
    return children


def _weight(support: _Support, j: int) -> float:
    """1 / the chance its copy misses at depth j: a long match outweighs many short ones, as the chain rule's
    longest-match peers do (weighing by the prior itself drafted 2-4% fewer tokens a step in the replays)."""
    return 1.0 / max(1.0 - support.prior(support.match + j), 1e-6)


def _depth(tree: DraftTree, node: int) -> int:
    """1 for a child of the context's last token."""
    level = 0
    while node >= 0:
        node, level = tree.parents[node], level + 1
    return level


def _unrolled(occurrence: Occurrence, depth: int) -> list[int]:
    copied = list(occurrence.after[:depth])
    if occurrence.periodic:
        while copied and len(copied) < depth:
            copied.extend(copied[:depth - len(copied)])
    return copied
