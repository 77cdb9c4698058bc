"""Logs engine steps far slower than usual: what a dashboard's specd_step_seconds shows as a stall, with why.

Fed every step's stats after the warm-up (the verifier's metrics exporter). A step over `factor` times the median
of the recent steps, and over `min_seconds`, logs one warning naming its length, that median, the forward passes it launched (tokens fed to
each), how many replayed a CUDA graph, and its stage times, so a stall can be traced to an eager forward, a new
width, a preemption or a slow drafter. The median is recomputed every `refresh_steps` steps over the last
`window` ones; no step is judged before `min_steps` have been seen. The floor keeps ordinary prompt chunks out: at one
client on an H200 every prefill (20-55 ms against 0.63 ms decode steps) logged a warning without it.
"""
from __future__ import annotations

import logging
import statistics
from collections import deque

from verifier_service.engine.stats import StepStats

logger = logging.getLogger(__name__)


class StepStallLog:
    def __init__(self, factor: float = 10.0, window: int = 1024, min_steps: int = 100,
                 refresh_steps: int = 64, min_seconds: float = 0.1) -> None:
        self.factor, self.min_steps, self.refresh_steps = factor, min_steps, refresh_steps
        self.min_seconds = min_seconds
        self._recent: deque[float] = deque(maxlen=window)
        self._median = 0.0
        self._since_refresh = 0
        self.num_stalls = 0

    def observe(self, step: StepStats) -> bool:
        """Adds one step; True (and a log line) when it stalled."""
        stalled = len(self._recent) >= self.min_steps and step.seconds > max(self.factor * self._median, self.min_seconds)
        if stalled:
            self.num_stalls += 1
            stages = ", ".join(f"{stage} {1000 * seconds:.2f}" for stage, seconds in step.stage_seconds.items())
            logger.warning("slow engine step: %.2f ms against a median of %.2f ms; forwards of %s tokens, %d of "
                           "them replayed a CUDA graph, %d the model's pieces; stages (ms): %s; %d running, "
                           "%d preempted",
                           1000 * step.seconds, 1000 * self._median, step.forward_tokens, step.num_graph_replays,
                           step.num_piecewise_replays, stages, step.num_running, step.num_preemptions)
        self._recent.append(step.seconds)
        self._since_refresh += 1
        if self._since_refresh >= self.refresh_steps or len(self._recent) <= self.min_steps:
            self._median, self._since_refresh = statistics.median(self._recent), 0
        return stalled
