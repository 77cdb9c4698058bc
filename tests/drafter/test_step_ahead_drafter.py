"""The synchronous engine's drafter (verifier_service/step_ahead_drafter.py) over a real drafter service and its real
gRPC client: each step drafted at once from the own context, the service (its memory) asked a step ahead."""
from __future__ import annotations

import socket
import time

import pytest

from drafter_service.batch import DraftRequest
from drafter_service.client import DrafterClient
from drafter_service.config import DrafterConfig
from drafter_service.local import LocalProposer
from support.drafter_servers import ThreadedDrafter
from verifier_service.step_ahead_drafter import StepAheadDrafter

pytestmark = pytest.mark.timeout(60)

PROMPT, OUTPUT = [1, 2, 3], list(range(100, 112))  # an earlier request's output, in the service's memory
CONTEXT = [7, 8] + OUTPUT[:6]  # a new request that has begun the same answer: only the memory drafts it


def connected(address: str) -> DrafterClient:
    """A client whose stream is up (it connects in the background)."""
    client = DrafterClient(address, timeout_s=5.0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        fallbacks = client.num_fallbacks
        client.propose([DraftRequest("probe", [0, 0], 1)])
        if client.num_fallbacks == fallbacks:
            client.release(["probe"])
            return client
        time.sleep(0.02)
    raise TimeoutError("the drafter client never got an answer")


@pytest.fixture(scope="module")
def drafter():
    with ThreadedDrafter(DrafterConfig(host="127.0.0.1", port=0, metrics_port=0, memory_scope="global")) as server:
        client = connected(server.address)  # another verifier served the earlier request: its output is remembered
        context = PROMPT + OUTPUT[:1]
        for token in OUTPUT[1:]:
            client.propose([DraftRequest("earlier", context, 4)])
            context.append(token)
        client.propose([DraftRequest("earlier", context, 0)])
        client.release(["earlier"])
        client.propose([DraftRequest("barrier", [0], 1)])  # the stream is ordered: the release is applied now
        client.close()
        yield server


@pytest.fixture
def step_ahead(drafter):
    proposer = StepAheadDrafter(connected(drafter.address))
    yield proposer
    proposer.close()


def ask(proposer, tokens, k=2, request_id="a"):
    return proposer.propose([DraftRequest(request_id, list(tokens), k)])


def answered_ahead(proposer) -> None:
    """Time for the service's answer to the question asked with the last step: a real step's forward runs here
    (50-90 ms of the default model on the CPU); a loopback drafter answers in a few."""
    time.sleep(1.0)


def test_the_service_asked_a_step_ahead_drafts_the_next_step_where_its_answer_still_fits(step_ahead):
    fallbacks = step_ahead.num_fallbacks  # those of connecting
    assert ask(step_ahead, CONTEXT) == {}  # the own context holds no match: no drafts this step, and no wait
    answered_ahead(step_ahead)
    emitted = OUTPUT[6:8]  # the step went on as the earlier output did
    assert ask(step_ahead, CONTEXT + emitted) == {"a": OUTPUT[8:10]}
    assert step_ahead.num_fallbacks == fallbacks


def test_an_answer_that_no_longer_fits_gives_way_to_the_own_context(step_ahead):
    fallbacks = step_ahead.num_fallbacks
    assert ask(step_ahead, CONTEXT, request_id="b") == {}
    answered_ahead(step_ahead)
    assert ask(step_ahead, CONTEXT + [OUTPUT[6], 999], request_id="b") == {}  # the target went elsewhere
    assert step_ahead.num_fallbacks == fallbacks


def test_each_step_is_drafted_from_its_own_context_at_once_and_a_dead_service_costs_only_its_memory():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{free.getsockname()[1]}"
    proposer = StepAheadDrafter(DrafterClient(nobody, timeout_s=5.0))
    try:
        tokens = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
        own = LocalProposer(DrafterConfig(memory_scope="off")).propose([DraftRequest("a", tokens, 2)])["a"]
        assert own and ask(proposer, tokens) == {"a": own}
        longer = tokens + own
        own = LocalProposer(DrafterConfig(memory_scope="off")).propose([DraftRequest("a", longer, 2)])["a"]
        assert ask(proposer, longer) == {"a": own}
        assert proposer.num_fallbacks == 1 and proposer.num_context_drafts == 1  # the second step's service answer
    finally:
        proposer.close()
