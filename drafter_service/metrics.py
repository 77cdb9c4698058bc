"""Prometheus export of the drafter's stats (names fixed by CONTRACT.md).

The servicer only fills a plain `StepStats` per batch; this module turns it into metrics.
"""
from __future__ import annotations

from dataclasses import dataclass

import prometheus_client

# A batch takes microseconds to a few milliseconds; a first sight of a long prompt, up to ~100 ms.
PROPOSE_SECONDS_BUCKETS = (10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
                           10e-3, 25e-3, 50e-3, 100e-3, 250e-3)


@dataclass(frozen=True)
class StepStats:
    """What one ProposeRequest cost and produced."""

    seconds: float  # server-side time to apply the deltas and propose for the whole batch
    num_sequences: int  # sequences in the batch
    proposed_tokens: int  # draft tokens returned
    sequences_held: int  # sequences in the store afterwards (all streams)


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
            "specd_drafter_proposed_tokens", "Draft tokens proposed.", registry=self.registry)

    def record(self, stats: StepStats) -> None:
        """Account one batch."""
        self.propose_seconds.observe(stats.seconds)
        self.sequences.set(stats.sequences_held)
        self.proposed_tokens.inc(stats.proposed_tokens)
