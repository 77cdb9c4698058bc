"""Stop strings: end generation when the text contains one, without ever sending any part of it.

Text that could be the beginning of a stop string is held back until the next delta shows whether it
is; at the end of the stream the held text is released (`flush`).
"""
from __future__ import annotations


class StopStringMatcher:
    """Filters one request's text deltas against its stop strings."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of `text` safe to send now; sets `stopped` once a stop string has appeared."""
        if self.stopped:
            return ""
        if not self._stop:
            return text
        pending = self._held + text
        match = self._first_match(pending)
        if match is not None:
            self.stopped = True
            self._held = ""
            return pending[:match]
        keep = self._longest_partial_match(pending)
        self._held = pending[len(pending) - keep:]
        return pending[:len(pending) - keep]

    def flush(self) -> str:
        """Text held back at the end of the stream (it never completed a stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _first_match(self, text: str) -> int | None:
        positions = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(positions) if positions else None

    def _longest_partial_match(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
