"""The synchronous engine's proposer (drafter_service/context_first.py) over a real drafter on loopback: each step's
drafts come from the requests' own contexts at once; the service is waited for only where its drafts (its memory of
earlier outputs) have been beating the own ones, and then its memory's drafts are the step's."""
from __future__ import annotations

import time

import pytest

from drafter_service.batch import DraftRequest
from drafter_service.client import DrafterClient
from drafter_service.context_first import ContextFirstProposer
from drafter_service.config import DrafterConfig
from bench.local_stack import free_port
from support.drafter_servers import SERVED_OUTPUT as OUTPUT, ThreadedDrafter, connected, serve_and_release

pytestmark = pytest.mark.timeout(60)


def forward(proposer: ContextFirstProposer, timeout: float = 10.0) -> None:
    """What a CPU forward (50-100 ms) gives the service's answer: time to come in (here until it has)."""
    deadline = time.monotonic() + timeout
    while not proposer._answers and time.monotonic() < deadline:  # noqa: SLF001 - the asker's answers
        time.sleep(0.01)


OTHER_PROMPT = [7, 8]


def config(scope: str) -> DrafterConfig:
    return DrafterConfig(host="127.0.0.1", port=0, metrics_port=0, memory_scope=scope)


def test_a_context_that_repeats_itself_drafts_from_its_own_copy_and_the_service_agrees():
    tokens = [5, 6, 7, 8, 5, 6]
    with ThreadedDrafter(config("off")) as drafter:
        client = connected(drafter.address)
        proposer = ContextFirstProposer(client)
        try:
            first = proposer.propose([DraftRequest("a", tokens, 4)])
            forward(proposer)
            fallbacks = proposer.num_fallbacks
            second = proposer.propose([DraftRequest("a", tokens + [7], 4)])
            forward(proposer)
            proposer.release(["a"])
        finally:
            proposer.close()
    assert first == {"a": [7, 8, 5, 6]} and second == {"a": [8, 5, 6, 7]}
    assert proposer.num_fallbacks == fallbacks  # the service answered the first step, and then the second
    assert proposer.num_context_drafts == 0  # no step waited for it: it never drafted otherwise


def test_the_memory_drafts_a_step_after_the_service_says_so_and_the_steps_wait_for_it_while_it_does():
    with ThreadedDrafter(config("global")) as drafter:
        other_verifier, client = connected(drafter.address), connected(drafter.address)
        proposer = ContextFirstProposer(client)
        try:
            serve_and_release(other_verifier, "earlier")  # its output is in the memory now
            context = OTHER_PROMPT + OUTPUT[:6]  # nothing in it repeats: only the memory drafts
            first = proposer.propose([DraftRequest("b", context, 4)])
            forward(proposer)
            second = proposer.propose([DraftRequest("b", context + OUTPUT[6:7], 4)])
            third = proposer.propose([DraftRequest("b", context + OUTPUT[6:8], 4)])
            proposer.release(["b"])
            again = proposer.propose([DraftRequest("c", context, 4)])
        finally:
            other_verifier.close()
            proposer.close()
    assert first == {"b": []}  # the own copy's drafts, at once: the service's answer comes after
    # The next step shows the service's drafts would have had a token accepted, the own ones none: from then on the
    # steps wait for the service, and its memory's drafts are theirs.
    assert second == {"b": OUTPUT[7:11]} and third == {"b": OUTPUT[8:12]}
    assert again == {"c": OUTPUT[6:10]}  # a service that remembers is waited for at a request's first step


# Closing a channel that never connected makes grpc's own connectivity-watching thread raise ("Channel closed!").
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_service_leaves_the_own_drafts():
    client = DrafterClient(f"127.0.0.1:{free_port()}", timeout_s=0.05)  # nothing listens there
    proposer = ContextFirstProposer(client)
    try:
        assert proposer.propose([DraftRequest("a", [1, 2, 3, 1, 2], 4)]) == {"a": [3, 1, 2, 3]}
        forward(proposer)
        assert proposer.propose([DraftRequest("a", [1, 2, 3, 1, 2, 3], 4)]) == {"a": [1, 2, 3, 1]}
        forward(proposer)
        fallbacks = proposer.num_fallbacks
    finally:
        proposer.close()
    assert fallbacks == 2  # both steps missed the service (and were drafted all the same)
