"""The verifier's warning for an engine step far slower than the recent median (specd_step_seconds' stalls)."""
import logging

from verifier_service.engine.stats import StepStats
from verifier_service.step_stall_log import StepStallLog


def step(seconds: float, forward_tokens=(4,), replays: int = 1) -> StepStats:
    return StepStats(stage_seconds={"score": seconds / 2}, seconds=seconds, forward_tokens=list(forward_tokens),
                     num_graph_replays=replays)


def test_a_step_over_ten_times_the_median_is_logged_with_its_widths(caplog):
    log = StepStallLog(min_steps=20, refresh_steps=4, min_seconds=0)
    with caplog.at_level(logging.WARNING, logger="verifier_service.step_stall_log"):
        for _ in range(40):
            assert not log.observe(step(0.001))
        assert not log.observe(step(0.009))  # 9x: slow, not a stall
        assert log.observe(step(0.011, forward_tokens=(37,), replays=0))
    [record] = caplog.records
    assert "11.00 ms against a median of 1.00 ms" in record.message
    assert "forwards of [37] tokens, 0 of them replayed a CUDA graph, 0 the model's pieces" in record.message
    assert log.num_stalls == 1


def test_nothing_is_judged_before_enough_steps(caplog):
    log = StepStallLog(min_steps=20)
    with caplog.at_level(logging.WARNING, logger="verifier_service.step_stall_log"):
        assert not log.observe(step(0.001))
        assert not log.observe(step(1.0))
    assert caplog.records == []


def test_the_median_follows_the_load():
    """Steps that stay 20x longer (a much heavier batch) are stalls only until they are the recent median."""
    log = StepStallLog(min_steps=20, window=64, refresh_steps=8, min_seconds=0)
    for _ in range(64):
        log.observe(step(0.001))
    stalls = [log.observe(step(0.02)) for _ in range(200)]
    assert all(stalls[:8]) and not any(stalls[64:])


def test_a_prompt_chunk_of_tens_of_milliseconds_is_not_a_stall_but_a_compile_of_seconds_is():
    """At one client on an H200: decode steps of 0.63 ms, prefills of 20-55 ms, a Triton compile of 2.55 s."""
    log = StepStallLog(min_steps=20)
    for _ in range(40):
        log.observe(step(0.00063))
    assert not log.observe(step(0.055, forward_tokens=(387, 1)))
    assert log.observe(step(2.55, forward_tokens=(37, 1)))
