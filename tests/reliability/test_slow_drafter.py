"""A slow drafter costs no request and no time: each step waits for drafts only up to the drafter
client's per-step deadline, then decodes without them (counted as a fallback); output is unchanged."""
import time

import pytest

from support.e2e_clients import generate, metric_value
from support.stack import Stack

INJECTED_DELAY_MS = 250  # far beyond the per-step budget (the drafter client's deadline, 5 ms)
STEP_CEILING_SECONDS = 0.1  # a propose stage this long would mean steps wait for the drafter
PROMPT = "a b c d a b c d a b c d a b c d a b c"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def stack():
    stack = Stack(num_verifiers=1).start()
    drafter = stack.services["drafter"]
    drafter.stop()
    drafter.argv += ["--inject-delay-ms", str(INJECTED_DELAY_MS)]
    stack.restart("drafter")
    yield stack
    exit_codes = stack.stop()
    assert all(code == 0 for code in exit_codes.values()), f"unclean stop {exit_codes}\n{stack.logs()}"


def propose_stage(stack) -> tuple[float, float]:
    """(steps observed, steps whose propose stage took at most STEP_CEILING_SECONDS)."""
    url = stack.metrics_url("verifier-0")
    return (metric_value(url, "specd_step_stage_seconds_count", stage="propose"),
            metric_value(url, "specd_step_stage_seconds_bucket", stage="propose", le=str(STEP_CEILING_SECONDS)))


def test_a_slow_drafter_does_not_slow_steps_beyond_the_budget(stack):
    plain = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=0)
    steps_before, fast_before = propose_stage(stack)
    fallbacks_before = metric_value(stack.metrics_url("verifier-0"), "specd_drafter_fallbacks_total")
    started = time.monotonic()
    speculative = generate(stack.gateway_address, PROMPT, MAX_TOKENS, num_speculative_tokens=4)
    seconds = time.monotonic() - started
    steps, fast = propose_stage(stack)
    assert speculative.token_ids == plain.token_ids
    assert steps - steps_before >= speculative.usage.steps - 1  # the prefill step proposes nothing
    assert fast - fast_before == steps - steps_before, "a step waited for the slow drafter"
    assert metric_value(stack.metrics_url("verifier-0"), "specd_drafter_fallbacks_total") > fallbacks_before
    assert seconds < speculative.usage.steps * INJECTED_DELAY_MS / 1000 / 2
