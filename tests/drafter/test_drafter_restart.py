"""A drafter process that dies costs drafts, never requests; the client recovers when one returns."""
from __future__ import annotations

import signal
import time

import pytest

from drafter_service.ngram import NgramIndex
from support.drafter_servers import free_port, start_drafter_process
from drafter_service.client import DrafterClient
from verifier_service.engine.proposer import DraftRequest

pytestmark = pytest.mark.timeout(120)


def _propose_until(client, requests, done, timeout=30.0):
    """Propose every few ms (as an engine would) until `done(drafts)`; returns those drafts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        drafts = client.propose(requests)
        if done(drafts):
            return drafts
        time.sleep(0.01)
    raise TimeoutError("condition not reached")


def test_a_killed_drafter_means_counted_fallbacks_then_recovery_on_the_same_port():
    port = free_port()
    tokens = [11, 12, 13, 11, 12]
    want = NgramIndex(1, 4, tokens).propose(4)
    requests = [DraftRequest("a", tokens, draft_limit=4)]
    process = start_drafter_process(port)
    client = DrafterClient(f"127.0.0.1:{port}", timeout_s=1.0)
    try:
        _propose_until(client, requests, lambda d: d == {"a": want})
        process.kill()
        process.wait()
        before = client.num_fallbacks
        started = time.monotonic()
        assert client.propose(requests) == {}
        assert time.monotonic() - started <= client.timeout_s + 0.2  # never stalls past the deadline
        assert client.num_fallbacks == before + 1
        _propose_until(client, requests, lambda d: client.num_fallbacks >= before + 3)
        assert client.propose(requests) == {}  # still down: no drafts, no error

        process = start_drafter_process(port)  # the new drafter knows nothing: drafts prove a re-sync
        _propose_until(client, requests, lambda d: d == {"a": want})
    finally:
        client.close()
        process.kill()
        process.wait()


def test_sigterm_drains_and_exits_cleanly():
    process = start_drafter_process(free_port())
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
