"""A one-line speculation summary per interval in the verifier's log, like vLLM's SpecDecodingLogging.

Fed the same per-step stats as the Prometheus exporter; logs (and resets) once `interval_seconds` have
passed since the last line, and only when drafts were scored in between, so an idle verifier stays quiet.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from verifier_service.engine.stats import SpecDecodingStats

logger = logging.getLogger(__name__)


class SpecDecodeIntervalLog:
    def __init__(self, interval_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_seconds = interval_seconds
        self._clock = clock
        self._since = clock()
        self._totals = SpecDecodingStats()

    def observe(self, spec: SpecDecodingStats | None) -> None:
        """Adds one step's counts; logs when the interval is over."""
        if spec is not None and spec.num_drafts:
            self._add(spec)
        if self._clock() - self._since >= self.interval_seconds:
            if self._totals.num_drafts:
                logger.info("%s", self.summary())
            self._since = self._clock()
            self._totals = SpecDecodingStats()

    def summary(self) -> str:
        totals = self._totals
        drafts = max(totals.num_drafts, 1)
        per_position = ", ".join(f"{count / drafts:.3f}" for count in totals.num_accepted_tokens_per_pos)
        acceptance = totals.num_accepted_tokens / max(totals.num_draft_tokens, 1)
        return (f"spec decode: mean acceptance length {totals.num_emitted_tokens / drafts:.2f}, "
                f"acceptance rate {acceptance:.3f}, accepted {totals.num_accepted_tokens} / drafted "
                f"{totals.num_draft_tokens} tokens in {totals.num_drafts} drafts, "
                f"per-position acceptance [{per_position}]")

    def _add(self, spec: SpecDecodingStats) -> None:
        totals = self._totals
        totals.num_drafts += spec.num_drafts
        totals.num_draft_tokens += spec.num_draft_tokens
        totals.num_accepted_tokens += spec.num_accepted_tokens
        totals.num_emitted_tokens += spec.num_emitted_tokens
        missing = len(spec.num_accepted_tokens_per_pos) - len(totals.num_accepted_tokens_per_pos)
        totals.num_accepted_tokens_per_pos += [0] * max(missing, 0)
        for position, count in enumerate(spec.num_accepted_tokens_per_pos):
            totals.num_accepted_tokens_per_pos[position] += count
