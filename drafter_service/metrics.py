"""Prometheus export of the drafter's stats (names fixed by docs/PUBLIC_SURFACE.md).

The servicer only fills a plain `StepStats` per batch; this module turns it into metrics. Every labelled
series exists from start-up at 0. The draft length histogram is filled from the store's per-length
counts in one update per batch (a `Histogram.observe` per sequence would cost more than drafting it).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import prometheus_client
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

# A batch takes microseconds to a few milliseconds; a first sight of a long prompt, up to ~100 ms.
PROPOSE_SECONDS_BUCKETS = (10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
                           10e-3, 25e-3, 50e-3, 100e-3, 250e-3)
DRAFT_LENGTH_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # tokens; the largest ask is max_draft_tokens
SOURCES = ("context", "memory")  # where a draft came from: the sequence's own context, or the memory


@dataclass(frozen=True)
class StepStats:
    """What one ProposeRequest cost and produced."""

    seconds: float  # server-side time to apply the deltas and propose for the whole batch
    num_sequences: int  # sequences in the batch
    proposed_tokens: tuple[int, int]  # draft tokens returned, from (context, memory)
    draft_lengths: Sequence[int]  # [n] = sequences that asked for drafts and got n tokens
    sequences_held: int  # sequences in the store afterwards (all streams)
    memory_tokens: int  # tokens the memory of earlier outputs holds afterwards


class DraftLengthHistogram:
    """specd_drafter_draft_length: tokens proposed per sequence and step (asking sequences only)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self._counts = [0] * (len(DRAFT_LENGTH_BUCKETS) + 1)  # per bucket (not cumulative); last = +Inf
        self._sum = 0
        registry.register(self)

    def add(self, draft_lengths: Sequence[int]) -> None:
        """Account counts by length: draft_lengths[n] sequences got n tokens."""
        for length, count in enumerate(draft_lengths):
            if count:
                self._counts[_bucket_index(length)] += count
                self._sum += length * count

    def collect(self):
        family = HistogramMetricFamily("specd_drafter_draft_length",
                                       "Draft tokens proposed per sequence and step (sequences that asked).")
        cumulative, buckets = 0, []
        for bound, count in zip([*map(floatToGoString, DRAFT_LENGTH_BUCKETS), "+Inf"], self._counts):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric([], buckets, self._sum)
        yield family


def _bucket_index(length: int) -> int:
    for index, bound in enumerate(DRAFT_LENGTH_BUCKETS):
        if length <= bound:
            return index
    return len(DRAFT_LENGTH_BUCKETS)


class DrafterMetrics:
    """The drafter's Prometheus metrics, in their own registry (several drafters may share a process)."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.propose_seconds = prometheus_client.Histogram(
            "specd_drafter_propose_seconds", "Server-side time to answer one ProposeRequest (a batch).",
            buckets=PROPOSE_SECONDS_BUCKETS, registry=self.registry)
        self.sequences = prometheus_client.Gauge(
            "specd_drafter_sequences", "Sequences whose context the drafter holds.",
            registry=self.registry)
        self.proposed_tokens = prometheus_client.Counter(
            "specd_drafter_proposed_tokens", "Draft tokens proposed, by where they came from.", ("source",),
            registry=self.registry)
        self._proposed_by_source = [self.proposed_tokens.labels(source) for source in SOURCES]
        self.memory_tokens = prometheus_client.Gauge(
            "specd_drafter_memory_tokens", "Tokens of earlier outputs the drafter's memory holds.",
            registry=self.registry)
        self.draft_length = DraftLengthHistogram(self.registry)

    def record(self, stats: StepStats) -> None:
        """Account one batch."""
        self.propose_seconds.observe(stats.seconds)
        self.sequences.set(stats.sequences_held)
        for counter, tokens in zip(self._proposed_by_source, stats.proposed_tokens):
            counter.inc(tokens)
        self.memory_tokens.set(stats.memory_tokens)
        self.draft_length.add(stats.draft_lengths)
