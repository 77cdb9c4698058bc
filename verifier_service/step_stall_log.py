"""Logs engine steps far slower than usual: what a dashboard's specd_step_seconds shows as a stall, with why.

Fed every step's stats after the warm-up (the verifier's metrics exporter). Steps come in two kinds, each judged
against the median of its own recent steps: decode / verify steps, and prompt steps (a step that launched or
collected a prompt chunk: with async scheduling a chunk's forward is launched in one step and waited for in the
next). A prompt step is naturally tens of decode steps long (at one client on an H200, 20-55 ms against 0.63 ms), so
mixing the kinds would either call every prefill a stall or hide a decode step 30x its median.

A step over `factor` times its kind's median (and, for prompt steps, over `min_prompt_seconds`, since one long
prompt among short ones is not a stall) logs one warning naming its length, that median, the forward passes it
launched (tokens fed to each), how many replayed a CUDA graph, and its stage times, so a stall can be traced to an
eager forward, a new width, a preemption or a slow drafter. Each kind's median is recomputed every `refresh_steps`
of its steps over its last `window` ones. No step is judged before `min_steps` decode steps have been seen; until as
many prompt steps have, prompt steps are judged against the decode steps' median (with the floor).
"""
from __future__ import annotations

import logging
import statistics
from collections import deque

from verifier_service.engine.stats import StepStats

logger = logging.getLogger(__name__)


class _Median:
    """The median of a kind's recent steps, refreshed every `refresh_steps` of them."""

    def __init__(self, kind: str, window: int, min_steps: int, refresh_steps: int) -> None:
        self.kind = kind
        self._recent: deque[float] = deque(maxlen=window)
        self.min_steps, self.refresh_steps = min_steps, refresh_steps
        self.value = 0.0
        self._since_refresh = 0

    @property
    def ready(self) -> bool:
        return len(self._recent) >= self.min_steps

    def add(self, seconds: float) -> None:
        self._recent.append(seconds)
        self._since_refresh += 1
        if self._since_refresh >= self.refresh_steps or len(self._recent) <= self.min_steps:
            self.value, self._since_refresh = statistics.median(self._recent), 0


class StepStallLog:
    def __init__(self, factor: float = 10.0, window: int = 1024, min_steps: int = 100,
                 refresh_steps: int = 64, min_prompt_seconds: float = 0.1) -> None:
        self.factor, self.min_prompt_seconds = factor, min_prompt_seconds
        self._decode = _Median("decode", window, min_steps, refresh_steps)
        self._prompt = _Median("prompt", window, min_steps, refresh_steps)
        self._last_fed_prompt = False
        self.num_stalls = 0

    def observe(self, step: StepStats) -> bool:
        """Adds one step; True (and a log line) when it stalled."""
        prompt = step.num_prompt_tokens > 0 or self._last_fed_prompt
        self._last_fed_prompt = step.num_prompt_tokens > 0
        median = self._prompt if prompt else self._decode
        judge = median if median.ready else self._decode  # too few prompt steps yet: the decode steps' median
        floor = self.min_prompt_seconds if prompt else 0.0
        stalled = judge.ready and step.seconds > max(self.factor * judge.value, floor)
        if stalled:
            self.num_stalls += 1
            stages = ", ".join(f"{stage} {1000 * seconds:.2f}" for stage, seconds in step.stage_seconds.items())
            logger.warning("slow engine step: %.2f ms against a median of %.2f ms (%s steps); forwards of %s tokens "
                           "(%d of a prompt), %d of them replayed a CUDA graph, %d the model's pieces; stages (ms): "
                           "%s; %d running, %d preempted",
                           1000 * step.seconds, 1000 * judge.value, judge.kind, step.forward_tokens,
                           step.num_prompt_tokens, step.num_graph_replays, step.num_piecewise_replays, stages,
                           step.num_running, step.num_preemptions)
        median.add(step.seconds)
        return stalled
