"""How many draft slots a step gets: k in every step of up to `max_batch_size` running requests, or, with
`goodput` (experimental, `--draft-policy goodput`), as many as pay for themselves in tokens per second.

A decode / verify step is padded to one width for the whole batch (a captured CUDA graph of width up to
k + 1 tokens per sequence), so one request with drafts makes every sequence in the step score that many
tokens. Whether that pays depends on the batch: a small batch reads its weights once whatever the width
(memory-bound: a verify step of k = 4 cost 1.12x a decode step for the default model on an H200), a large
one computes every padded token (compute-bound). So the policy measures both sides and picks, per step,
the draft cap c that maximises

    expected tokens a request emits per step with c drafts  /  measured seconds of a step of width c + 1

for the step's batch size (bucketed by powers of two). The numerator is 1 + the sum over positions i < c of
the share of decoding request-steps whose draft at position i was accepted, over the engine's recent steps
(the drafter fills only the slots its evidence supports, so an unfilled slot counts as a miss and costs
nothing). The denominator is a moving average of the steps' own seconds, one per (batch bucket, width).
Nothing is capped at a batch size before `settle_steps` steps were seen there. c = 0 wins where drafts do not pay; then one step in `explore_every` still drafts, so that a change in the
traffic or in the costs is seen. At a batch size where drafting steps were measured and plain ones not, the
first `min_steps` steps decode without drafts to measure the baseline. A width not measured yet at a batch size is interpolated between the
measured ones (beyond them: as the nearest, so that it gets tried). Caps within `margin` of the best keep the wider one: noise must not toggle drafting.

Not yet the default: on an H200 through the stack (default model, docs/BENCHMARKS.md round 21) it made 2,863 /
6,396 tok/s at 16 / 64 clients with k = 4 against the batch-size rule's 2,762 / 8,455, one run each, where
runs of one setting spread by up to 1.6x; on the CPU the two were within noise. It judges a step by the
engine's step time, and at 16 clients drafting paid there (1.39 tokens a step for 1.25x the score time)
while the stack's tokens a second still fell (0.89x k = 0).

Either way, steps with more than `max_batch_size` running requests never draft: verify widths have
CUDA graphs only up to that batch size (cuda_graphs.py).

Which of its slots a request fills is the drafter's call, from the evidence it has (match length, how often a
continuation followed). Drafts never change what is emitted (greedy stays token-for-token identical, sampling
keeps the target distribution), so this only chooses which steps score drafts.
"""
from __future__ import annotations

from dataclasses import dataclass

from verifier_service.engine.batch import ScheduledBatch


@dataclass(frozen=True)
class DraftPolicyConfig:
    max_batch_size: int = 32  # no drafting in steps with more running requests (0 = no limit)
    goodput: bool = False  # cap drafts by measured goodput (False: every step under max_batch_size drafts k)
    explore_every: int = 64  # with drafts off for a batch size, one step in this many drafts anyway
    margin: float = 0.03  # a narrower cap must beat a wider one by this share of goodput
    min_steps: int = 8  # steps a (batch, width) cost needs before it counts as measured
    settle_steps: int = 64  # steps at a batch size before the policy caps anything there (k until then)
    min_request_steps: int = 32  # decoding request-steps of drafting before acceptance counts as measured
    smoothing: float = 0.05  # weight of a new step in the moving averages

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size: {self.max_batch_size} must be >= 0 (0 = no limit)")
        if self.explore_every < 1:
            raise ValueError(f"explore_every: {self.explore_every} must be >= 1")


@dataclass
class _Average:
    """A moving average of samples that each stand for `n` observations (a plain mean over the first ones)."""

    value: float = 0.0
    count: int = 0

    def add(self, sample: float, weight: float, n: int = 1) -> None:
        self.count += n
        self.value += max(1 - (1 - weight) ** n, n / self.count) * (sample - self.value)


class DraftPolicy:
    """Decides, per step, how many draft slots decoding requests may get (see the module docstring)."""

    def __init__(self, config: DraftPolicyConfig | None = None) -> None:
        self.config = config or DraftPolicyConfig()
        self.num_skipped = 0  # request-steps of decoding requests with k > 0 held back (since start)
        self._costs: dict[tuple[int, int], _Average] = {}  # (batch bucket, width) -> seconds a step
        self._accepted: list[_Average] = []  # per draft position: accepted drafts per decoding request-step
        self._decisions: dict[int, int] = {}  # batch bucket -> decisions taken (for exploring)
        self._caps: dict[tuple[int, int], int] = {}  # (batch bucket, k) -> cap, until the next observed step

    # -- deciding ----------------------------------------------------------------------------------

    def cap(self, num_running: int, k: int) -> int:
        """The most drafts a decoding request asking k may get in a step with num_running requests; 0: none.
        Decided once per (batch bucket, k) between two observed steps."""
        if not self.batch_allows_drafts(num_running) or k <= 0:
            return 0
        if not self.config.goodput:
            return k
        key = (_bucket(num_running), k)
        if key not in self._caps:
            self._caps[key] = self._decide(*key)
        return self._caps[key]

    def _decide(self, bucket: int, k: int) -> int:
        if sum(a.count for (b, _), a in self._costs.items() if b == bucket) < self.config.settle_steps:
            return k  # a short burst of requests is not worth measuring: they draft as asked
        decode = self._costs.get((bucket, 1))
        if decode is None or decode.count < self.config.min_steps:
            return 0  # wider steps measured here, plain decoding not (yet): the baseline comes first
        best, best_goodput = k, None
        for cap in range(k, -1, -1):  # widest first: a narrower cap must win by the margin
            goodput = self._goodput(bucket, cap)
            if best_goodput is None or goodput > best_goodput * (1 + self.config.margin):
                best, best_goodput = cap, goodput
        if best == 0:
            decisions = self._decisions.get(bucket, 0) + 1
            self._decisions[bucket] = decisions
            if decisions % self.config.explore_every == 0:
                return k  # look again: traffic and costs change
        return best

    def allowed_drafts(self, num_running: int, k: int) -> int:
        """cap(), counting a decoding request held back from drafting in num_skipped."""
        cap = self.cap(num_running, k)
        self.num_skipped += cap == 0 and k > 0
        return cap

    @property
    def learns(self) -> bool:
        """Whether finished steps should be observed (only goodput learns from them)."""
        return self.config.goodput

    def batch_allows_drafts(self, num_running: int) -> bool:
        """The hard rule: no drafting with more than max_batch_size running requests (0 = no limit)."""
        limit = self.config.max_batch_size
        return limit == 0 or num_running <= limit

    def _goodput(self, bucket: int, cap: int) -> float:
        """Expected tokens a request emits per second of step with `cap` drafts."""
        tokens = 1.0
        for position in range(cap):
            if position < len(self._accepted) and self._accepted[position].count >= self.config.min_request_steps:
                tokens += self._accepted[position].value
            else:
                tokens += 1.0  # not measured: assume it pays until the steps say otherwise
        decode = self._cost(bucket, 1)
        cost = self._cost(bucket, cap + 1) or decode
        if cost is None:
            return tokens  # nothing measured at this batch size: the widest cap wins
        return tokens / cost

    def _cost(self, bucket: int, width: int) -> float | None:
        """Seconds of a step of `width` at this batch size: measured, else interpolated between the nearest
        measured widths (a width beyond them costs as the nearest: optimistic, so it gets tried); None: none."""
        measured = {w: a.value for (b, w), a in self._costs.items() if b == bucket and a.count >= self.config.min_steps}
        if width in measured or not measured:
            return measured.get(width)
        below = max((w for w in measured if w < width), default=None)
        above = min((w for w in measured if w > width), default=None)
        if below is None or above is None:
            return measured[below if above is None else above]
        share = (width - below) / (above - below)
        return measured[below] + share * (measured[above] - measured[below])

    # -- learning ----------------------------------------------------------------------------------

    def observe(self, batch: ScheduledBatch, num_accepted: list[int], seconds: float) -> None:
        """One finished step: its batch, each request's accepted drafts, and how long the step took. Steps that
        fed a prompt chunk say nothing about decoding costs and are skipped."""
        decoding = [r for r in batch.requests if r.num_logits and r.num_tokens - r.num_draft_tokens == 1]
        if not decoding or len(decoding) != len(batch.requests):
            return
        self._caps.clear()
        width = 1 + max(r.num_draft_tokens for r in decoding)
        weight = self.config.smoothing
        self._costs.setdefault((_bucket(len(decoding)), width), _Average()).add(seconds, weight)
        while len(self._accepted) < width - 1:
            self._accepted.append(_Average())
        for position in range(width - 1):  # one observation per decoding request-step
            share = sum(1 for accepted in num_accepted if accepted > position) / len(decoding)
            self._accepted[position].add(share, weight, n=len(decoding))


def _bucket(num_running: int) -> int:
    """Batch sizes 1, 2, 3-4, 5-8, ... share costs (a step's cost changes little within a power of two)."""
    return 1 << max(0, num_running - 1).bit_length()
