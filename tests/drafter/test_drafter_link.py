"""The drafter link (drafter_service/link.py): the real gRPC client in its own process, relaying a real drafter."""
from __future__ import annotations

import socket
import time
from dataclasses import replace

import pytest

from drafter_service.batch import DraftRequest
from drafter_service.config import DrafterConfig
from drafter_service.link import DrafterLink, _merged
from drafter_service.local import LocalProposer
from drafter_service.ngram import NgramIndex
from drafter_service.service_asker import differences
from support.drafter_servers import ThreadedDrafter

pytestmark = pytest.mark.timeout(120)

CONFIG = DrafterConfig(host="127.0.0.1", port=0, metrics_port=0, min_ngram=1, max_ngram=4, drafting="ngram",
                       memory_scope="off")
GENEROUS_S = 5.0


def expected(tokens, k=4):
    return NgramIndex(1, 4, tokens).propose(k)


def answer(**contexts):
    """What a proposer answers for these contexts: each one's expected drafts, requests without any left out."""
    return {request_id: expected(tokens) for request_id, tokens in contexts.items() if expected(tokens)}


def own(tokens, k=4):
    """What the link drafts from its own copy of a context: the drafter's default rule, without memory."""
    return LocalProposer(DrafterConfig(memory_scope="off")).propose([request("own", tokens, k)])["own"]


def request(request_id, tokens, k=4):
    return DraftRequest(request_id, list(tokens), draft_limit=k)


def propose_until(link, requests, answered, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = link.num_fallbacks, link.num_context_drafts
        drafts = link.propose(requests)
        if answered(before):
            return drafts
        time.sleep(0.05)  # the link process is starting or its client connecting
    raise TimeoutError("the link never answered")


def propose_until_answered(link, requests):
    """The drafts of the first step the service answered in time."""
    return propose_until(link, requests, lambda before: link.num_fallbacks == before[0])


def propose_until_drafted_by_the_link(link, requests):
    """The drafts of the first step the link answered from its own copy of the contexts."""
    return propose_until(link, requests, lambda before: link.num_context_drafts > before[1])


@pytest.fixture(scope="module")
def drafter():
    with ThreadedDrafter(CONFIG) as server:
        yield server


@pytest.fixture
def link(drafter):
    link = DrafterLink(drafter.address, timeout_s=GENEROUS_S)
    yield link
    link.close()


def test_drafts_through_the_link_follow_each_context_as_it_grows(link):
    tokens = [1, 2, 3, 1, 2]
    assert propose_until_answered(link, [request("a", tokens)]) == {"a": expected(tokens)}
    other, fallbacks = [7, 8, 9, 7, 8], link.num_fallbacks
    for new in ([3], [1, 2], [9, 7]):  # only the new tokens travel; the link process holds the rest
        tokens += new
        assert link.propose([request("a", tokens), request("b", other)]) == answer(a=tokens, b=other)
    assert link.num_fallbacks == fallbacks


def test_a_step_asked_ahead_is_collected_later_without_waiting(link):
    tokens = [5, 6, 7, 5, 6]
    propose_until_answered(link, [request("ahead", tokens)])
    tokens += [7]
    pending = link.begin_propose([request("ahead", tokens)])
    later = link.begin_propose([request("ahead", tokens + [5])])
    time.sleep(0.5)  # the device "runs" the step in flight; both answers arrive meanwhile
    # The service's answer, or the link's own where `later` came before the service answered
    assert pending.result(wait=False) in ({"ahead": expected(tokens)}, {"ahead": own(tokens)})
    assert later.result(wait=False) == {"ahead": expected(tokens + [5])}


def test_a_killed_link_process_costs_drafts_then_a_new_one_serves(link):
    tokens = [1, 2, 3, 1, 2]
    propose_until_answered(link, [request("k", tokens)])
    link._process.kill()  # noqa: SLF001 - the test's way to lose the link process
    link._process.join(5)  # noqa: SLF001
    fallbacks = link.num_fallbacks
    assert link.propose([request("k", tokens + [3])]) == {}
    assert link.num_fallbacks == fallbacks + 1
    tokens += [3, 1]
    assert propose_until_answered(link, [request("k", tokens)]) == {"k": expected(tokens)}  # sent whole again


def test_a_slow_drafter_never_builds_a_queue_in_the_link():
    """Steps come every 10 ms to a drafter that answers each after 100 ms: the link asks only the newest, so it keeps
    up, where asking each in turn would leave it 5 s behind after 50 steps."""
    with ThreadedDrafter(replace(CONFIG, inject_delay_ms=100)) as slow:
        link = DrafterLink(slow.address, timeout_s=0.5)
        try:
            tokens = [1, 2, 3, 1, 2]
            propose_until_answered(link, [request("slow", tokens)])
            started = time.monotonic()
            for _ in range(50):
                link.begin_propose([request("slow", tokens)]).result(wait=False)
                time.sleep(0.01)
            tokens += [3]
            assert propose_until_answered(link, [request("slow", tokens)]) == {"slow": expected(tokens)}
            assert time.monotonic() - started < 2.5
        finally:
            link.close()


def test_the_services_answer_wins_where_it_differs_from_the_links_own(link):
    tokens = [1, 2, 3, 1, 2, 4, 1, 2]  # the service's plain lookup copies 4 tokens; the link's own rule stops at 2
    assert own(tokens) != expected(tokens)
    assert propose_until_answered(link, [request("d", tokens)]) == {"d": expected(tokens)}


def test_a_late_drafter_costs_a_step_the_services_drafts_not_the_contexts():
    with ThreadedDrafter(replace(CONFIG, inject_delay_ms=1000)) as slow:
        link = DrafterLink(slow.address, timeout_s=0.25)
        try:
            tokens = [1, 2, 3, 1, 2, 4, 1, 2]
            assert propose_until_drafted_by_the_link(link, [request("late", tokens)]) == {"late": own(tokens)}
            tokens += [4]
            before = link.num_fallbacks, link.num_context_drafts
            assert link.propose([request("late", tokens)]) == {"late": own(tokens)}
            assert (link.num_fallbacks, link.num_context_drafts) == (before[0] + 1, before[1] + 1)
        finally:
            link.close()


def test_with_no_drafter_service_the_link_still_drafts_from_each_context():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{probe.getsockname()[1]}"
    link = DrafterLink(target, timeout_s=0.25)
    try:
        tokens = [5, 6, 7, 5, 6]
        assert propose_until_drafted_by_the_link(link, [request("alone", tokens)]) == {"alone": own(tokens)}
        for new in ([7], [5, 6]):
            tokens += new
            assert link.propose([request("alone", tokens), request("none", [1, 2])]) == {"alone": own(tokens)}
    finally:
        link.close()


@pytest.mark.parametrize("context, service", [
    ({"a": [1, 2]}, {"a": [1, 2]}),  # the same: nothing to carry
    ({"a": [1, 2]}, {"a": [1, 2, 3], "b": [4]}),  # longer, and from the memory only
    ({"a": [1, 2], "b": [3]}, {"b": [3]}),  # the service drafted nothing where the link did
    ({}, {}),
])
def test_the_pipe_carries_only_where_the_service_differs(context, service):
    changed = differences(context, service)
    assert all(context.get(request_id) != tokens for request_id, tokens in changed.items())
    assert _merged(context, changed) == service


def test_steps_asked_ahead_get_the_services_drafts_where_it_answers_within_a_step(link):
    """The engine's rhythm: each step is asked one step (here 20 ms) before it is collected, without waiting. A service
    that answers within the step is what the engine collects, not the link's own rule (which drafts less on this
    context)."""
    tokens = [1, 2, 3, 1, 2, 4, 1, 2]
    propose_until_answered(link, [request("rhythm", tokens)])
    collected = []
    pending = link.begin_propose([request("rhythm", tokens)])
    for _ in range(10):
        time.sleep(0.02)  # the step in flight
        collected.append(pending.result(wait=False))
        pending = link.begin_propose([request("rhythm", tokens)])
    assert sum(drafts == {"rhythm": expected(tokens)} for drafts in collected) >= 8, collected
