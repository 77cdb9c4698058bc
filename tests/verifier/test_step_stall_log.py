"""The verifier's warning for an engine step far slower than the recent median (specd_step_seconds' stalls)."""
import logging

from verifier_service.engine.stats import StepStats
from verifier_service.step_stall_log import StepStallLog


def step(seconds: float, forward_tokens=(4,), replays: int = 1, prompt_tokens: int = 0) -> StepStats:
    return StepStats(stage_seconds={"score": seconds / 2}, seconds=seconds, forward_tokens=list(forward_tokens),
                     num_graph_replays=replays, num_prompt_tokens=prompt_tokens)


def test_a_step_over_ten_times_the_median_is_logged_with_its_widths(caplog):
    log = StepStallLog(min_steps=20, refresh_steps=4)
    with caplog.at_level(logging.WARNING, logger="verifier_service.step_stall_log"):
        for _ in range(40):
            assert not log.observe(step(0.001))
        assert not log.observe(step(0.009))  # 9x: slow, not a stall
        assert log.observe(step(0.011, forward_tokens=(5,), replays=0))
    [record] = caplog.records
    assert "11.00 ms against a median of 1.00 ms (decode steps)" in record.message
    assert "forwards of [5] tokens (0 of a prompt), 0 of them replayed a CUDA graph, 0 the model's pieces" in record.message
    assert log.num_stalls == 1


def test_nothing_is_judged_before_enough_steps(caplog):
    log = StepStallLog(min_steps=20)
    with caplog.at_level(logging.WARNING, logger="verifier_service.step_stall_log"):
        assert not log.observe(step(0.001))
        assert not log.observe(step(1.0))
    assert caplog.records == []


def test_the_median_follows_the_load():
    """Steps that stay 20x longer (a much heavier batch) are stalls only until they are the recent median."""
    log = StepStallLog(min_steps=20, window=64, refresh_steps=8)
    for _ in range(64):
        log.observe(step(0.001))
    stalls = [log.observe(step(0.02)) for _ in range(200)]
    assert all(stalls[:8]) and not any(stalls[64:])


def test_prompt_steps_are_judged_against_prompt_steps_and_a_decode_step_against_decode_steps():
    """At one client on an H200: decode steps of 0.63 ms, prefills of 20-55 ms. A prompt chunk (and the step after
    it, which waits for the chunk's forward under async scheduling) is not a stall; a decode step of 7 ms is, and
    so is a prompt step of seconds (a compile)."""
    log = StepStallLog(min_steps=20)
    for _ in range(40):
        log.observe(step(0.00063))
    assert not log.observe(step(0.055, forward_tokens=(387,), prompt_tokens=386))
    assert not log.observe(step(0.030, forward_tokens=(1,)))  # collects the chunk launched a step earlier
    assert log.observe(step(0.007))
    assert log.observe(step(2.55, forward_tokens=(37, 1), prompt_tokens=36))
    assert log.num_stalls == 2
