"""A real drafter server (on each store built here) and the verifier's real DrafterClient on loopback.

These pin the stream's mechanics (deltas, re-syncs, late replies, errors, metrics), so the drafter runs
plain prompt lookup without memory, whose drafts are easy to predict; test_shared_memory.py covers the
memory over real streams."""
from __future__ import annotations

import time
import urllib.request
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from drafter_service.config import DrafterConfig
from drafter_service.ngram import NgramIndex
from drafter_service.stores import BACKENDS
from specd.v1 import drafter_pb2, drafter_pb2_grpc
from support.drafter_servers import ThreadedDrafter
from drafter_service.client import DrafterClient
from verifier_service.engine.proposer import DraftRequest

pytestmark = pytest.mark.timeout(60)

CONFIG = DrafterConfig(host="127.0.0.1", port=0, metrics_port=0, min_ngram=1, max_ngram=4, drafting="ngram",
                       memory_scope="off")
GENEROUS_S = 5.0  # deadline for steps whose drafts the test checks (a loaded CI box can be slow)


def expected(tokens, k=4):
    return NgramIndex(1, 4, tokens).propose(k)


def request(request_id, tokens, k=4):
    return DraftRequest(request_id, tokens, draft_limit=k)


def propose_until_connected(client, requests, timeout=20.0):
    """Drafts from the first step the client's stream answers (it connects in the background)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fallbacks = client.num_fallbacks
        drafts = client.propose(requests)
        if client.num_fallbacks == fallbacks:
            return drafts
        time.sleep(0.02)  # not connected yet: nothing to await, the connection thread retries
    raise TimeoutError("the drafter client never got an answer")


@pytest.fixture(scope="module", params=BACKENDS)
def drafter(request):
    with ThreadedDrafter(CONFIG, request.param) as server:
        yield server


@pytest.fixture
def client(drafter):
    client = DrafterClient(drafter.address, timeout_s=GENEROUS_S)
    yield client
    client.close()


def test_a_batched_round_trip_sends_deltas_and_returns_every_sequences_drafts(drafter, client):
    contexts = {f"seq-{i}": [i, 7, 8, 9, i, 7] * (i + 1) for i in range(5)}
    requests = [request(i, t) for i, t in contexts.items()]
    drafts = propose_until_connected(client, requests)
    assert drafts == {i: expected(t) for i, t in contexts.items() if expected(t)}
    for tokens in contexts.values():
        tokens.extend([8, 9, 3])  # the engine appends accepted tokens to the same lists
    assert client.propose(requests) == {i: expected(t) for i, t in contexts.items() if expected(t)}
    held = drafter.on_loop(lambda: drafter.drafter.store.total_tokens)
    assert held == sum(len(t) for t in contexts.values())  # each token sent once, not per step
    client.release(list(contexts))
    client.propose([request("other", [1, 1])])  # the stream is ordered: releases are applied by now
    assert drafter.on_loop(lambda: drafter.drafter.store.total_tokens) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_evicted_sequence_is_resynced_and_drafts_again(backend):
    with ThreadedDrafter(replace(CONFIG, metrics_port=None, max_tokens_held=8), backend) as small:
        client = DrafterClient(small.address, timeout_s=GENEROUS_S)
        try:
            tokens = [3, 4, 5, 3, 4]
            assert propose_until_connected(client, [request("r", tokens)]) == {"r": [5, 3, 4, 5]}
            fallbacks = client.num_fallbacks  # steps before the stream was up count; later ones must not
            client.propose([request("other", [1, 2, 3, 4, 5])])  # 10 tokens > 8: "r" is evicted
            tokens.append(5)
            assert client.propose([request("r", tokens)]) == {}  # unknown now: the drafter says resync
            tokens.append(3)
            assert client.propose([request("r", tokens)]) == {"r": expected(tokens)}
            assert client.num_fallbacks == fallbacks  # a resync is not a drafter failure
        finally:
            client.close()


def test_a_late_reply_is_a_counted_fallback_and_is_dropped(drafter, client):
    tokens = [1, 2, 3, 1, 2]
    propose_until_connected(client, [request("late", tokens)])
    client.timeout_s = 0.0  # every step is late
    before = client.num_fallbacks
    assert client.propose([request("late", tokens + [3])]) == {}
    assert client.num_fallbacks == before + 1
    client.timeout_s = GENEROUS_S
    tokens += [3, 1]
    assert client.propose([request("late", tokens)]) == {"late": expected(tokens)}
    assert client.num_stale_replies == 1


def test_a_reply_that_arrived_while_the_step_ran_is_used_after_its_deadline(drafter, client):
    """Asked ahead (async scheduling), a proposal is collected after the step in flight: its deadline has
    passed by then, but a reply already in hand costs no waiting and must not be thrown away."""
    tokens = [1, 2, 3, 1, 2]
    propose_until_connected(client, [request("ahead", tokens)])
    client.timeout_s = 0.001
    tokens += [3]
    pending = client.begin_propose([request("ahead", tokens)])
    deadline = time.monotonic() + 20
    while client._replies.empty():  # noqa: SLF001 - the step "runs" until its reply is in hand
        assert time.monotonic() < deadline, "the drafter never answered"
        time.sleep(0.01)
    fallbacks = client.num_fallbacks
    assert pending.result() == {"ahead": expected(tokens)}
    assert client.num_fallbacks == fallbacks


@pytest.mark.parametrize("columns, field", [
    (dict(new_token_counts=[3], new_token_ids=[1, 2]), "new_token_ids"),
    (dict(new_token_counts=[1], new_token_ids=[1], tenant_keys=["a", "b"]), "tenant_keys"),
    (dict(new_token_counts=[1], new_token_ids=[1], tenant_keys=["k" * 129]), "tenant_keys"),
])
def test_bad_columns_are_refused_with_invalid_argument_naming_them(drafter, columns, field):
    bad = drafter_pb2.ProposeRequest(step_id=1, sequence_ids=["a"], starts=[0], draft_limits=[4], **columns)
    with grpc.insecure_channel(drafter.address) as channel:
        with pytest.raises(grpc.RpcError) as error:
            list(drafter_pb2_grpc.DrafterStub(channel).Propose(iter([bad]), timeout=5))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"{field}:")


def test_health_is_serving_and_reflection_lists_the_drafter(drafter):
    with grpc.insecure_channel(drafter.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "specd.v1.Drafter"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = {s.name for s in next(replies).list_services_response.service}
    assert "specd.v1.Drafter" in names


def test_metrics_count_batches_sequences_and_proposed_tokens(drafter, client):
    propose_until_connected(client, [request("m", [6, 6, 6])])
    url = f"http://127.0.0.1:{drafter.server.metrics_port}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    assert "specd_drafter_propose_seconds_bucket{le=\"1e-05\"}" in body
    count = [line for line in body.splitlines() if line.startswith("specd_drafter_propose_seconds_count")]
    assert float(count[0].split()[1]) >= 1
    assert "specd_drafter_sequences " in body
    proposed = [line for line in body.splitlines() if line.startswith("specd_drafter_proposed_tokens_total")]
    assert float(proposed[0].split()[1]) >= 4
