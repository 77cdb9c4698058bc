"""Drafter faults cost no request and no time (one stack, one drafter, one verifier, a gateway).

- Killed and restarted mid-run under load (a short run of the soak benchmark, bench/soak.py): nothing lost, nothing
  different from the greedy reference, fallbacks counted, and drafting comes back after the restart.
- Slow (--inject-delay-ms far beyond the per-step budget): each step waits for drafts only up to the
  drafter client's deadline, then decodes without them; output is unchanged.
"""
import time

import pytest

from bench import soak
from bench.local_stack import Stack, metric_value
from support.e2e_clients import generate

INJECTED_DELAY_MS = 250  # far beyond the per-step budget (the drafter client's deadline, 5 ms)
STEP_CEILING_SECONDS = 0.1  # a propose stage this long would mean steps wait for the drafter
REPEATING_PROMPT = "a b c d a b c d a b c d a b c d a b c"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def stack():
    stack = Stack(num_verifiers=1).start()
    yield stack
    stack.stop_cleanly()


def verifier_metric(stack, name: str, **labels) -> float:
    return metric_value(stack.metrics_url("verifier-0"), name, **labels)


def test_short_soak_with_a_drafter_kill_loses_nothing_and_changes_nothing(stack):
    report = soak.run_soak(stack, clients=12, duration=30.0, max_tokens=16, kill_at=0.4, down_for=4.0)
    print("\n" + soak.format_report(report))
    assert report.completed >= report.clients, "too little load to mean anything"
    assert report.lost == 0 and report.errored == {}, report
    assert report.wrong == 0, report
    assert report.drafter_fallbacks > 0  # the kill happened under load and was absorbed


def test_drafting_resumes_after_the_drafter_restarts(stack):
    assert stack.services["drafter"].process.poll() is None  # the soak restarted it
    for _ in range(3):  # the verifier reconnects in the background; give it a request or two
        result = generate(stack.gateway_address, REPEATING_PROMPT, MAX_TOKENS, num_speculative_tokens=4)
        if result.usage.accepted_tokens > 0:
            break
    assert result.usage.accepted_tokens > 0


def propose_stage(stack) -> tuple[float, float]:
    """(steps observed, steps whose propose stage took at most STEP_CEILING_SECONDS)."""
    return (verifier_metric(stack, "specd_step_stage_seconds_count", stage="propose"),
            verifier_metric(stack, "specd_step_stage_seconds_bucket", stage="propose", le=str(STEP_CEILING_SECONDS)))


def test_a_slow_drafter_does_not_slow_steps_beyond_the_budget(stack):
    drafter = stack.services["drafter"]
    drafter.stop()
    drafter.argv += ["--inject-delay-ms", str(INJECTED_DELAY_MS)]
    stack.restart("drafter")
    plain = generate(stack.gateway_address, REPEATING_PROMPT, MAX_TOKENS, num_speculative_tokens=0)
    steps_before, fast_before = propose_stage(stack)
    fallbacks_before = verifier_metric(stack, "specd_drafter_fallbacks_total")
    started = time.monotonic()
    speculative = generate(stack.gateway_address, REPEATING_PROMPT, MAX_TOKENS, num_speculative_tokens=4)
    seconds = time.monotonic() - started
    steps, fast = propose_stage(stack)
    assert speculative.token_ids == plain.token_ids
    assert steps - steps_before >= speculative.usage.steps - 1  # the prefill step proposes nothing
    assert fast - fast_before == steps - steps_before, "a step waited for the slow drafter"
    assert verifier_metric(stack, "specd_drafter_fallbacks_total") > fallbacks_before
    assert seconds < speculative.usage.steps * INJECTED_DELAY_MS / 1000 / 2
