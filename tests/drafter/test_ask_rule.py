"""Which steps the drafter link asks the drafter service under SPECD_DRAFTER_PROBE_STEPS=8 (drafter_service/ask_rule.py):
the rule alone, then through a real link process in front of a real drafter, with and without its memory of earlier
outputs; and the variable's checks."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from drafter_service.ask_rule import PATIENCE, PROBE_STEPS, AskRule
from drafter_service.batch import DraftRequest
from drafter_service.config import DrafterConfig
from drafter_service.link import DrafterLink
from drafter_service.local import LocalProposer
from bench.local_stack import REPO_ROOT, free_port
from specd import environment
from support.drafter_servers import SERVED_OUTPUT as OUTPUT, ThreadedDrafter, connected, serve_and_release

pytestmark = pytest.mark.timeout(120)

OTHER_PROMPT = [7, 8]


def step(rule: AskRule, step_id: int, context: list[int], own: list[int], service: list[int] | None = None,
         limit: int = 4) -> bool:
    """One step of request "a" through the rule: whether it was asked; an asked step's answer is heard at once
    (`service`: the service's drafts, None for the own ones, "missed" for none)."""
    requests = [DraftRequest("a", list(context), limit)]
    asked = rule.should_ask(requests, {"a": own} if own else {})
    if asked:
        rule.asked(step_id, requests, {"a": own})
        if service != "missed":
            rule.heard(step_id, {} if service is None else {"a": service})
    return asked


def test_a_request_is_asked_until_the_service_answers_then_one_step_in_probe_steps():
    rule, context = AskRule(PROBE_STEPS), [1, 2, 3]
    assert step(rule, 1, context, own=[], service="missed") and step(rule, 2, context, own=[])  # no answer: again
    context += [4]
    asked = [step(rule, n, context + [5] * n, own=[5, 5]) for n in range(3, 3 + 3 * PROBE_STEPS)]
    assert sum(asked) == 3 and asked.index(True) == PROBE_STEPS - 1  # the own drafts do as well: probes only
    rule = AskRule(PROBE_STEPS)  # one that wants no drafts: sent once, for the service to see its prompt, then never
    assert [step(rule, n, context + [5] * n, own=[], limit=0) for n in range(1, 3 * PROBE_STEPS)] == [True] + [
        False] * (3 * PROBE_STEPS - 2)



def test_by_default_every_step_that_wants_drafts_is_asked_and_one_that_wants_none_at_first_sight_only():
    rule, context = AskRule(1), [1, 2, 3]
    assert step(rule, 1, context, own=[], limit=0)  # the service takes what it holds at first sight for the prompt
    assert not any(step(rule, n, context + [4] * n, own=[], limit=0) for n in range(2, 5))
    assert all(step(rule, n, context + [4] * n, own=[4], service=[5]) for n in range(5, 5 + 2 * PATIENCE))


def test_a_request_whose_service_drafts_match_more_is_asked_every_step_until_they_go_wrong():
    rule, context = AskRule(PROBE_STEPS), [1, 2, 3]
    assert step(rule, 1, context, own=[9], service=[4, 5])  # the service drafts more than the own rule
    context += [4]  # the own draft is wrong, the service's right: it gained
    # Both drafts right, or both run out: a tie, which keeps the request asked every step
    assert all(step(rule, n, context + [5] * (n - 2), own=[5], service=[5]) for n in range(2, 2 + 2 * PATIENCE))
    context += [5] * (2 * PATIENCE)
    # The service's drafts go wrong where the own ones, as long as allowed, do not: after PATIENCE of those, one step
    # in PROBE_STEPS
    asked = [step(rule, n, context + [5] * n, own=[5], service=[6], limit=1)
             for n in range(1, 1 + PATIENCE + 2 * PROBE_STEPS)]
    assert asked == [True] * PATIENCE + ([False] * (PROBE_STEPS - 1) + [True]) * 2


def test_once_the_service_has_gained_a_step_the_own_rule_drafts_short_for_is_asked():
    rule, context = AskRule(PROBE_STEPS), [1, 2, 3]
    step(rule, 1, context, own=[7])  # the service drafts what the own rule does
    assert not any(step(rule, n, context + [n], own=[]) for n in range(2, 5))  # never gained: probes only
    rule.release(["a"])
    step(rule, 1, context, own=[9], service=[4])
    step(rule, 2, context + [4], own=[9], service=[9])  # gained: asked every step...
    for n in range(3, 3 + PATIENCE):
        step(rule, n, context + [4] + [9] * (n - 2), own=[9], service=[8])  # ...until its drafts went wrong
    assert not step(rule, 20, context + [4] + [9] * 20, own=[9] * 4)
    assert step(rule, 21, context + [4] + [9] * 21, own=[9])  # the own rule runs out before the limit (4): ask


def test_a_judgement_waits_until_the_tokens_tell_the_drafts_apart():
    rule, context = AskRule(PROBE_STEPS), [1, 2, 3]
    step(rule, 1, context, own=[4, 5, 6], service=[4, 5, 7])
    assert not step(rule, 2, context + [4, 5], own=[6])  # both matched all of it: not known yet
    context += [4, 5, 7]
    assert step(rule, 3, context, own=[6])  # the service's third token matched, the own one did not


def ready_link(address: str, probe_steps: int | None = PROBE_STEPS) -> DrafterLink:
    """A link whose process has started and whose client has had an answer from the service."""
    link, deadline = DrafterLink(address, timeout_s=5.0, probe_steps=probe_steps), time.monotonic() + 60
    while True:
        fallbacks = link.num_fallbacks
        link.propose([DraftRequest("warm", [0, 0], 1)])
        if link.num_fallbacks == fallbacks:
            link.release(["warm"])
            return link
        assert time.monotonic() < deadline, "the link never had the service's answer"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def remembering():
    with ThreadedDrafter(DrafterConfig(host="127.0.0.1", port=0, metrics_port=0, memory_scope="global")) as drafter:
        yield drafter


def test_the_memorys_drafts_reach_every_step_once_they_gain(remembering):
    other_verifier = connected(remembering.address)
    serve_and_release(other_verifier, "earlier")  # its output is in the memory now
    link = ready_link(remembering.address)
    try:
        context = OTHER_PROMPT + OUTPUT[:6]  # nothing in it repeats: only the memory drafts
        drafts = [link.propose([DraftRequest("b", context + OUTPUT[6:6 + n], 4)]) for n in range(5)]
    finally:
        link.close()
        other_verifier.close()
    assert drafts == [{"b": OUTPUT[6 + n:10 + n]} for n in range(5)]
    assert link.num_unasked == 0


@pytest.mark.parametrize("probe_steps", [PROBE_STEPS, None])
def test_without_a_memory_the_service_is_asked_one_step_in_probe_steps_and_the_drafts_are_the_same(
        monkeypatch, probe_steps):
    """None: SPECD_DRAFTER_PROBE_STEPS unset, so every step is asked."""
    monkeypatch.delenv(environment.DRAFTER_PROBE_STEPS, raising=False)
    with ThreadedDrafter(DrafterConfig(host="127.0.0.1", port=0, metrics_port=0, memory_scope="off")) as drafter:
        link = ready_link(drafter.address, probe_steps)
        try:
            context = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
            steps = 4 * PROBE_STEPS
            drafts = [link.propose([DraftRequest("c", context + [3, 4, 1, 2] * n, 4)]) for n in range(steps)]
        finally:
            link.close()
    own = LocalProposer(DrafterConfig(memory_scope="off"))
    assert drafts == [{"c": own.propose([DraftRequest(f"own{n}", context + [3, 4, 1, 2] * n, 4)])[f"own{n}"]}
                      for n in range(steps)]
    if probe_steps is None:
        assert link.num_unasked == 0
    else:
        assert steps - 6 <= link.num_unasked < steps - 1


@pytest.mark.parametrize("limit", [4, 0])
def test_a_released_requests_tokens_the_service_was_not_asked_about_still_reach_its_memory(remembering, limit):
    """A request that wants drafts is asked about at its first step, then one step in PROBE_STEPS; one that wants none
    (speculation off) never. Either way its whole output reaches the memory when it is released."""
    output = list(range(300 + 100 * limit, 324 + 100 * limit))
    link, reader = ready_link(remembering.address), connected(remembering.address)
    try:
        for n in range(1, len(output) + 1):
            link.propose([DraftRequest("r", OTHER_PROMPT + output[:n], limit)])
        assert link.num_unasked >= (len(output) - 6 if limit else 0)
        link.release(["r"])
        deadline, tail = time.monotonic() + 20, output[-8:-4]  # drafted from the memory: its last 4 tokens
        while (drafts := reader.propose([DraftRequest("q", [9, 9] + tail, 4)])) != {"q": output[-4:]}:
            reader.release(["q"])
            assert time.monotonic() < deadline, drafts
            time.sleep(0.05)  # the release is on another stream: not applied yet
    finally:
        link.close()
        reader.close()


def test_a_bad_probe_steps_value_stops_the_verifier_at_start_up_naming_the_variable():
    argv = [sys.executable, "-m", "specd_cli", "verifier", "--host", "127.0.0.1", "--device", "cpu",
            "--port", str(free_port()), "--metrics-port", str(free_port()), "--drafter-addr", "none"]
    env = {**os.environ, environment.DRAFTER_PROBE_STEPS: "0"}
    result = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert environment.DRAFTER_PROBE_STEPS in result.stderr.strip().splitlines()[-1]
