"""The evidence rule: which earlier occurrence a draft copies, and how long the evidence lets it run.

Drafts come from two sources: the sequence's own context (prompt + output so far) and the memory of
earlier outputs (memory.py). For one source and a context t[0:L):

1. Match. n = the largest n in [min_n, max_n] (in the memory: n >= MIN_MEMORY_MATCH) whose suffix
   t[L-n:L] occurred earlier in the source with a token after it. Candidates: its CANDIDATES most recent
   occurrences (a suffix tree would give all; the latest few are what repeats). A candidate's match
   length m is how many tokens before it agree with the context's tail (n or more, at most MAX_MATCH).
2. Follow. The candidates with the longest match, m*, are the peers (the occurrences of the longest
   matched string, like the node a suffix tree would reach); the draft copies what followed the most
   recent peer: d[j] = s[e + j]. Past the end of the own context the copy continues periodically
   (ngram.py); past the end of a remembered output it stops.
3. Estimate. Token j is accepted (all before it were) with estimated chance
       q_j = prior(m* + j) * (A_j + 1) / (T_j + 1):
   the chance that a match of that length goes on (`prior`: a longer match is more often continued),
   times the share of the peers still in the race (those that agreed with d[0:j] and have a token at
   e + j: T_j others and the followed one) that continue with d[j] (A_j others and the followed one):
   how often this continuation followed. Peers that disagree drop out. The chance of the whole prefix is
   p_j = q_0 * ... * q_j.
4. Cut. The draft stops at k tokens or before the first token with p_j < threshold (the drafter's
   min_draft_probability), so a sequence with no evidence gets no drafts. Its score is sum(p_j), the
   expected number of accepted tokens; of the two sources the higher score wins (the context on a tie).

The priors were fitted to the acceptance of drafts replayed on recorded outputs of three workloads
(bench/acceptance.py): after a one-token match a copy misses about 2 times in 3, and every further
matched token takes 30% off the chance of a miss for a copy from the own context, 15% for an output
remembered from another request (which shares less with this one than its own context does). The
estimates they give came out calibrated on those replays (of the tokens given 0.4-0.6, about half were
accepted).

Compared with SuffixDecoding (arXiv 2411.04975, Arctic Inference), whose idea of scoring a path by how
often each continuation followed this follows: its estimate is the frequency alone, so a continuation
seen once counts as certain and the draft length is capped by the match length instead; here the match
length sets a prior that the frequency scales, so one long match drafts far and many short ones do
not, and both sources are indexed by n-gram keys over flat token arrays (hash chains in the native
store) rather than by trees of nodes.

This is the reference; native_store.cpp implements the same rule, with the same floating-point
operations in the same order, and tests/drafter compares the two.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CANDIDATES = 4  # occurrences examined per source and step (8 or 16 drafted no better in the replays)
MAX_MATCH = 32  # match lengths are counted up to this
FIRST_MISS = 0.65  # chance that a copy after a one-token match is wrong
# The memory is searched for matches of at least this many tokens: a one-token match with another
# request's output never won over the own context in the replays, and finding it costs the most.
MIN_MEMORY_MATCH = 2


def _prior_table(decay: float) -> tuple[float, ...]:
    """[m] = 1 - FIRST_MISS * decay^(m - 1) for m in [1, MAX_MATCH] ([0] as [1]), by repeated products
    (native_store.cpp builds the same table the same way, so both round alike)."""
    table, miss = [], FIRST_MISS
    for _ in range(MAX_MATCH):
        table.append(1.0 - miss)
        miss *= decay
    return (table[0], *table)


_CONTEXT_PRIOR = _prior_table(0.7)
_MEMORY_PRIOR = _prior_table(0.85)


def context_prior(match_length: int) -> float:
    """Chance that a copy from the sequence's own context goes on right after `match_length` tokens."""
    return _CONTEXT_PRIOR[min(match_length, MAX_MATCH)]


def memory_prior(match_length: int) -> float:
    """The same for a copy from another request's output."""
    return _MEMORY_PRIOR[min(match_length, MAX_MATCH)]


@dataclass(frozen=True)
class Occurrence:
    """An earlier occurrence of the context's suffix: the tokens around the position after it."""

    before: Sequence[int]  # up to MAX_MATCH tokens before it (within its sequence), in order
    after: Sequence[int]  # up to k tokens from it (within its sequence)
    periodic: bool = False  # the own context: `after` ends at the context's end and may repeat from there


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    score: float  # expected accepted tokens: the sum of the prefixes' estimated chances


NO_DRAFT = Draft([], 0.0)


def match_length(context: Sequence[int], before: Sequence[int]) -> int:
    """How many tokens at the end of `context` equal those at the end of `before` (at most MAX_MATCH)."""
    limit = min(len(context), len(before), MAX_MATCH)
    length = 0
    while length < limit and context[-1 - length] == before[-1 - length]:
        length += 1
    return length


def draft(context: Sequence[int], occurrences: Sequence[Occurrence], k: int, prior, threshold: float) -> Draft:
    """The rule of the module docstring for one source; `occurrences` latest first, all matching >= 1 token."""
    if k <= 0 or not occurrences:
        return NO_DRAFT
    lengths = [match_length(context, o.before) for o in occurrences]
    longest = max(lengths)
    followed, *others = [o for o, m in zip(occurrences, lengths) if m == longest]
    copy = _continuation(followed, k)
    tokens: list[int] = []
    chance, score = 1.0, 0.0
    for j, token in enumerate(copy):
        others = [o for o in others if len(o.after) > j]
        agreeing = [o for o in others if o.after[j] == token]
        chance *= prior(longest + j) * (len(agreeing) + 1) / (len(others) + 1)
        if chance < threshold:
            break
        tokens.append(token)
        score += chance
        others = agreeing
    return Draft(tokens, score)


def _continuation(occurrence: Occurrence, k: int) -> list[int]:
    copied = list(occurrence.after[:k])
    if occurrence.periodic:
        while len(copied) < k:
            copied.extend(copied[:k - len(copied)])
    return copied


def better(from_context: Draft, from_memory: Draft) -> tuple[Draft, int]:
    """(the draft with the higher score, 0 if it came from the context else 1); the context wins ties."""
    if from_memory.score > from_context.score:
        return from_memory, 1
    return from_context, 0
