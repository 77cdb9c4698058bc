"""The verifier's one-line speculation summary per interval."""
import logging

from verifier_service.engine.stats import SpecDecodingStats
from verifier_service.spec_decode_log import SpecDecodeIntervalLog


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def step(num_draft_tokens: int, num_accepted: int) -> SpecDecodingStats:
    stats = SpecDecodingStats()
    stats.observe(num_draft_tokens, num_accepted, num_accepted + 1)
    return stats


def test_one_line_per_interval_with_mean_length_and_per_position_rates(caplog) -> None:
    clock = FakeClock()
    log = SpecDecodeIntervalLog(interval_seconds=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="verifier_service.spec_decode_log"):
        log.observe(step(4, 4))
        log.observe(step(4, 0))
        assert caplog.records == []
        clock.now = 10.0
        log.observe(None)
    [record] = caplog.records
    assert "mean acceptance length 3.00" in record.message  # (5 + 1) emitted / 2 drafts
    assert "accepted 4 / drafted 8" in record.message
    assert "per-position acceptance [0.500, 0.500, 0.500, 0.500]" in record.message


def test_an_interval_without_drafts_logs_nothing_and_counts_restart(caplog) -> None:
    clock = FakeClock()
    log = SpecDecodeIntervalLog(interval_seconds=1.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="verifier_service.spec_decode_log"):
        clock.now = 5.0
        log.observe(None)
        log.observe(step(2, 1))
        clock.now = 6.0
        log.observe(None)
    [record] = caplog.records
    assert "accepted 1 / drafted 2 tokens in 1 drafts" in record.message
