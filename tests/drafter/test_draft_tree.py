"""Draft trees (drafter_service/tree.py): a chain where the evidence agrees, a branch where it splits, nodes taken
best first under the budget, and greedy verification's longest matching path."""
from __future__ import annotations

from drafter_service.config import DrafterConfig
from drafter_service.evidence import Occurrence, context_prior
from drafter_service.state import SequenceStore
from drafter_service.tree import DraftTree, build_tree


def _depths(tree: DraftTree) -> list[int]:
    depths = []
    for parent in tree.parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def test_agreeing_evidence_drafts_a_chain():
    context = [5, 1, 2, 3, 4, 9, 1, 2]
    occurrences = [Occurrence(before=[5, 1, 2], after=[3, 4, 9])]
    tree = build_tree(context, [(occurrences, context_prior)], budget=8, depth=3, threshold=0.0)
    assert tree.tokens == [3, 4, 9] and tree.parents == [-1, 0, 1]
    assert tree.chances == sorted(tree.chances, reverse=True)


def test_split_evidence_branches_and_the_better_supported_branch_comes_first():
    context = [5, 6, 7, 1, 2]
    occurrences = [Occurrence(before=[5, 6, 7, 1, 2], after=[3, 3]), Occurrence(before=[8, 1, 2], after=[4, 4]),
                   Occurrence(before=[9, 1, 2], after=[4, 5])]
    tree = build_tree(context, [(occurrences, context_prior)], budget=3, depth=2, threshold=0.0)
    roots = [token for token, parent in zip(tree.tokens, tree.parents) if parent == -1]
    assert tree.tokens[0] == 3  # one five-token match outweighs two two-token ones
    assert sorted(roots) == [3, 4] and len(tree) == 3
    assert all(parent < node for node, parent in enumerate(tree.parents))
    assert all(tree.chances[node] <= tree.chances[parent] for node, parent in enumerate(tree.parents) if parent >= 0)


def test_the_budget_and_the_threshold_bound_the_tree():
    context = [1, 2]
    occurrences = [Occurrence(before=[1, 2], after=[t, t + 1, t + 2]) for t in (10, 20, 30)]
    assert len(build_tree(context, [(occurrences, context_prior)], budget=4, depth=3, threshold=0.0)) == 4
    assert len(build_tree(context, [(occurrences, context_prior)], budget=4, depth=3, threshold=1.0)) == 0


def test_the_accepted_path_is_the_longest_root_path_that_matches():
    tree = DraftTree(tokens=[3, 4, 5, 6], parents=[-1, -1, 1, 2], chances=[0.5, 0.4, 0.3, 0.2])
    assert tree.accepted_path([4, 5, 6, 7]) == [1, 2, 3]
    assert tree.accepted_path([3, 5]) == [0]
    assert tree.accepted_path([9]) == []


def test_the_store_drafts_a_tree_that_holds_both_continuations_of_its_context():
    store = SequenceStore(DrafterConfig())
    store.apply("s", 0, [8, 1, 2, 3, 8, 1, 2, 4, 8, 1, 2])  # "8 1 2" went on as 3 once and as 4 once
    tree = store.draft_tree("s", budget=16, depth=3, threshold=0.0)
    assert len(tree.accepted_path([3, 8, 1])) == 3
    assert len(tree.accepted_path([4, 8, 1])) == 3  # the other continuation is a branch of its own
    assert sorted(_depths(tree))[:2] == [1, 1]
    assert store.draft_tree("unknown", budget=16, depth=3).tokens == []
