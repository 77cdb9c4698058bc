"""Drafter faults cost no request and no time (one stack, one drafter, one verifier, a gateway).

- Killed and restarted: meanwhile steps draft from the requests' own contexts, and the drafter answers them again
  after the restart (killed under load, in the soak: test_soak.py).
- Slow (--inject-delay-ms far beyond the per-step budget): each step waits for drafts only up to the
  drafter client's deadline, then decodes without them; output is unchanged.
"""
import time

import pytest

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


def test_drafting_resumes_after_the_drafter_restarts(stack):
    stack.kill("drafter")
    missed = verifier_metric(stack, "specd_drafter_fallbacks_total")
    without = generate(stack.gateway_address, REPEATING_PROMPT, MAX_TOKENS, num_speculative_tokens=4)
    assert len(without.token_ids) == MAX_TOKENS  # served without the drafter, not failed
    assert verifier_metric(stack, "specd_drafter_fallbacks_total") > missed
    assert without.usage.accepted_tokens > 0  # drafted from the request's own context meanwhile
    stack.restart("drafter")
    for _ in range(3):  # the verifier reconnects in the background; give it a request or two
        missed = verifier_metric(stack, "specd_drafter_fallbacks_total")
        result = generate(stack.gateway_address, REPEATING_PROMPT, MAX_TOKENS, num_speculative_tokens=4)
        if verifier_metric(stack, "specd_drafter_fallbacks_total") == missed:
            break
    assert verifier_metric(stack, "specd_drafter_fallbacks_total") == missed  # the drafter answered every step
    assert result.token_ids == without.token_ids


def propose_stage(stack) -> tuple[float, float]:
    """(steps observed, steps whose propose stage took at most STEP_CEILING_SECONDS)."""
    return (verifier_metric(stack, "specd_step_stage_seconds_count", stage="propose"),
            verifier_metric(stack, "specd_step_stage_seconds_bucket", stage="propose", le=str(STEP_CEILING_SECONDS)))


def test_a_slow_drafter_does_not_slow_steps_beyond_the_budget(stack):
    drafter = stack.services["drafter"]
    drafter.stop()
    drafter.argv += ["--inject-delay-ms", str(INJECTED_DELAY_MS)]
    stack.restart("drafter")
    started = time.monotonic()
    plain = generate(stack.gateway_address, REPEATING_PROMPT, MAX_TOKENS, num_speculative_tokens=0)
    plain_seconds = time.monotonic() - started
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
    # had its steps waited for the drafter, the request would take its steps x the delay longer than without drafts
    # (the steps' own time is the plain request's: on a busy 2-core machine 24 of them took 4 s)
    assert seconds - plain_seconds < speculative.usage.steps * INJECTED_DELAY_MS / 1000 / 2
