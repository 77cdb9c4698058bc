"""Routing over real grpc.aio Verifier servers on loopback, their Serve streams over gRPC and over the Serve socket:
load, health, failover, cancel, deadline."""
import asyncio
import socket
from contextlib import aclosing

import grpc
import pytest

from gateway.request import GenerationRequest
from gateway.router import ReplicaPin, Router, UpstreamError
from gateway.serve_socket import SocketCall
from specd.sampling import SamplingParams
from support.scripted_verifier import ScriptedVerifier

# Fixtures live on the session loop (pyproject), so the tests must too: grpc.aio binds to one loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKENS = [10, 11, 12, 13, 14, 15]
REQUEST = GenerationRequest(prompt_token_ids=(1, 2, 3), sampling=SamplingParams(max_tokens=16, temperature=1.0))


@pytest.fixture(params=["grpc", "socket"])
async def replicas(request):
    servers = [await ScriptedVerifier(TOKENS, serve_socket=request.param == "socket").start() for _ in range(2)]
    yield servers
    for server in servers:
        await server.stop()


@pytest.fixture
async def router(replicas):
    router = Router([replica.address for replica in replicas], poll_interval=0.05)
    await router.start()
    yield router
    await router.close()


async def collect(router, request=REQUEST, deadline=None):
    return [chunk async for chunk in router.generate("req", request, deadline)]


async def test_a_request_streams_every_step_and_finishes_with_usage(router):
    chunks = await collect(router)
    assert [t for c in chunks for t in c.token_ids] == TOKENS
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.steps == 3
    assert all(not c.finish_reason for c in chunks[:-1])


async def test_a_replica_with_a_serve_socket_streams_over_it(router, replicas):
    if replicas[0].serve_socket is None:
        pytest.skip("gRPC Serve")
    await collect(router)
    assert sum(len(replica.serve_socket.connections) for replica in replicas) == 1  # the stream stays open


async def test_requests_go_to_the_least_loaded_replica(router, replicas):
    replicas[0].reported_running = 5
    await router.poll()
    for _ in range(4):
        await collect(router)
    assert (len(replicas[0].requests), len(replicas[1].requests)) == (0, 4)


async def test_two_equally_loaded_replicas_share_the_requests(router, replicas):
    for _ in range(6):
        await collect(router)
    assert len(replicas[0].requests) >= 2 and len(replicas[1].requests) >= 2


async def test_concurrent_requests_spread_over_replicas(router, replicas):
    for replica in replicas:
        replica.hold_after_steps = 1
    streams = [aclosing(router.generate(f"r{i}", REQUEST)) for i in range(4)]
    iterators = [await stream.__aenter__() for stream in streams]
    for iterator in iterators:
        await anext(iterator)  # each request holds its replica after its first step
    assert (replicas[0].live, replicas[1].live) == (2, 2)
    for stream in streams:
        await stream.__aexit__(None, None, None)


async def test_a_stale_load_report_does_not_count_requests_that_already_finished_here(replicas):
    router = Router([replica.address for replica in replicas], poll_interval=60)  # polls only when told
    await router.start()
    replicas[0].hold_after_steps = replicas[1].hold_after_steps = 1
    router.replicas[1].healthy = False  # the first burst all goes to replica 0
    first_burst = [aclosing(router.generate(f"a{i}", REQUEST)) for i in range(3)]
    for stream in first_burst:
        await anext(await stream.__aenter__())
    await router.poll()  # replica 0 reports 3 running; both replicas are healthy
    for stream in first_burst:
        await stream.__aexit__(None, None, None)
    second_burst = [aclosing(router.generate(f"b{i}", REQUEST)) for i in range(2)]
    for stream in second_burst:
        await anext(await stream.__aenter__())
    # The report still says 3 on replica 0, but those were this gateway's calls and are gone.
    assert (len(replicas[0].requests), len(replicas[1].requests)) == (4, 1)
    for stream in second_burst:
        await stream.__aexit__(None, None, None)
    await router.close()


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
async def test_a_replica_failing_before_the_first_token_is_retried_on_another(router, replicas, code):
    """CANCELLED too: grpc answers it to a call that reaches a replica as its drain begins (a rollout)."""
    replicas[0].fail_with = code
    replicas[1].reported_running = 3  # the router would pick replica 0 first
    await router.poll()
    chunks = await collect(router)
    assert [t for c in chunks for t in c.token_ids] == TOKENS
    assert len(replicas[0].requests) == 1 and len(replicas[1].requests) == 1


async def test_a_stopped_replica_is_skipped(router, replicas):
    await replicas[0].stop()
    for _ in range(3):
        chunks = await collect(router)
        assert chunks[-1].finish_reason == "stop"
    assert len(replicas[1].requests) == 3
    await router.poll()
    assert [r.healthy for r in router.replicas] == [False, True]


async def test_a_failure_after_the_first_token_resumes_on_another_replica(router, replicas):
    replicas[1].reported_running = 3
    await router.poll()
    replicas[0].hold_after_steps = 1
    async with aclosing(router.generate("req", REQUEST)) as chunks:
        first = await anext(chunks)
        await replicas[0].stop()
        rest = [chunk async for chunk in chunks]
    resumed = replicas[1].requests[0]
    assert list(resumed.prompt_token_ids) == [*REQUEST.prompt_token_ids, *first.token_ids]
    assert resumed.sampling.max_tokens == REQUEST.sampling.max_tokens - len(first.token_ids)
    usage = rest[-1].usage  # one request's counts across both replicas
    assert usage.prompt_tokens == len(REQUEST.prompt_token_ids)
    assert usage.completion_tokens == len(first.token_ids) + len(TOKENS)


async def test_a_resumed_stream_keeps_the_reported_seed_and_its_output_positions(router, replicas):
    """So that a seeded (or randomly seeded) sampled stream goes on exactly as it would have (engine side:
    tests/engine/test_seeded_sampling.py)."""
    replicas[1].reported_running = 3  # the first call goes to replicas[0]
    await router.poll()
    replicas[0].hold_after_steps, replicas[0].drawn_seed = 2, 777
    async with aclosing(router.generate("req", REQUEST)) as chunks:
        first = [await anext(chunks)]
        while sum(len(chunk.token_ids) for chunk in first) < 4:  # two steps (over a socket they may come as one)
            first.append(await anext(chunks))
        await replicas[0].stop()
        rest = [chunk async for chunk in chunks]
    sent = replicas[0].requests[0].sampling
    assert not sent.HasField("seed") and sent.output_position_offset == 0
    resumed = replicas[1].requests[0].sampling
    assert resumed.seed == first[0].seed == 777
    assert resumed.output_position_offset == sum(len(chunk.token_ids) for chunk in first) == 4
    assert rest[0].seed == 777  # the new replica reports the same seed


async def test_a_failure_after_the_first_token_with_no_replica_left_is_unavailable(router, replicas):
    await replicas[1].stop()
    await router.poll()
    replicas[0].hold_after_steps = 1
    async with aclosing(router.generate("req", REQUEST)) as chunks:
        await anext(chunks)
        await replicas[0].stop()
        with pytest.raises(UpstreamError) as error:
            await anext(chunks)
    assert error.value.code == grpc.StatusCode.UNAVAILABLE


async def test_bad_input_errors_are_not_retried(router, replicas):
    for replica in replicas:
        replica.fail_with = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(UpstreamError) as error:
        await collect(router)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(replicas[0].requests) + len(replicas[1].requests) == 1


async def test_when_every_replica_is_down_the_request_fails_unavailable(router, replicas):
    for replica in replicas:
        await replica.stop()
    with pytest.raises(UpstreamError) as error:
        await collect(router)
    assert error.value.code == grpc.StatusCode.UNAVAILABLE


async def test_closing_the_stream_cancels_the_verifier_call(router, replicas):
    for replica in replicas:
        replica.hold_after_steps = 1
    async with aclosing(router.generate("req", REQUEST)) as chunks:
        await anext(chunks)
    serving = next(r for r in replicas if r.requests)
    await asyncio.wait_for(serving.cancelled.wait(), timeout=5)
    assert serving.live == 0


async def test_cancelling_the_consumer_task_cancels_the_verifier_call(router, replicas):
    for replica in replicas:
        replica.hold_after_steps = 1
    task = asyncio.create_task(collect(router))
    while not any(r.live for r in replicas):
        await asyncio.sleep(0.01)
    task.cancel()
    serving = next(r for r in replicas if r.requests)
    await asyncio.wait_for(serving.cancelled.wait(), timeout=5)


async def test_the_remaining_deadline_is_passed_downstream(router, replicas):
    deadline = asyncio.get_running_loop().time() + 3.0
    await collect(router, deadline=deadline)
    remaining = next(r.time_remaining[0] for r in replicas if r.requests)
    assert 2.0 < remaining < 3.5  # grpc rounds deadlines; without one it would be None


async def test_a_deadline_that_passes_mid_stream_ends_the_request(router, replicas):
    for replica in replicas:
        replica.hold_after_steps = 1
    with pytest.raises(UpstreamError) as error:
        await collect(router, deadline=asyncio.get_running_loop().time() + 0.3)
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_max_model_len_comes_from_the_load_reports(router):
    assert router.max_model_len() == 2048


async def test_when_every_replica_is_full_the_last_error_is_reported(router, replicas):
    for replica in replicas:
        replica.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(UpstreamError) as error:
        await collect(router)
    assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(replicas[0].requests) == len(replicas[1].requests) == 1


async def test_pinned_requests_follow_the_first_to_its_replica(router, replicas):
    """The samples of one prompt (n > 1) go where the first went, so its KV blocks are in that prefix cache,
    even while that replica is the busier one."""
    pin = ReplicaPin()
    first = router.generate("s0", REQUEST, pin=pin)
    await anext(first)  # the first sample is running
    others = [[chunk async for chunk in router.generate(f"s{i}", REQUEST, pin=pin)] for i in (1, 2, 3)]
    await first.aclose()
    assert len(others) == 3 and sorted(len(r.requests) for r in replicas) == [0, 4]


async def _until_sent(replica, request_id: str = "req") -> None:
    """Until `replica` has streamed every step it will stream for now, and they had time to arrive."""
    while not replica.requests or replica.live:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)


async def test_steps_that_piled_up_while_the_consumer_was_busy_arrive_as_one_chunk(router, replicas):
    replicas[1].reported_running = 3
    await router.poll()  # the call goes to replicas[0]
    async with aclosing(router.generate("req", REQUEST)) as chunks:
        first = await anext(chunks)
        await _until_sent(replicas[0])  # the consumer is busy elsewhere while the other two steps come
        rest = [chunk async for chunk in chunks]
    # (Steps that reach the gateway in one read, as a socket's may, are one chunk even before the consumer is busy.)
    assert len(rest) <= 1 and first.token_ids + sum((chunk.token_ids for chunk in rest), ()) == tuple(TOKENS)
    assert [first, *rest][-1].finish_reason == "stop" and [first, *rest][-1].usage.steps == 3


async def test_an_error_behind_piled_up_steps_comes_after_their_tokens(replicas):
    router = Router([replicas[0].address], poll_interval=60)
    await router.start()
    replicas[0].tokens_per_step, replicas[0].hold_after_steps = 1, 4
    try:
        async with aclosing(router.generate("req", REQUEST)) as chunks:
            first = await anext(chunks)  # step 1 (with the next ones where they came in the same read)
            await asyncio.sleep(0.1)  # steps 2-4 arrive and wait; the fifth is held
            await replicas[0].stop()
            await asyncio.sleep(0.1)  # the stream's end is queued behind them
            merged = await anext(chunks)
            with pytest.raises(UpstreamError) as error:
                await anext(chunks)
    finally:
        await router.close()
    assert first.token_ids + merged.token_ids == tuple(TOKENS[:4]) and not merged.finish_reason
    assert error.value.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("interval", [3, 4])
async def test_a_stream_interval_gathers_tokens_after_the_first_and_sends_the_last_at_once(replicas, interval):
    tokens = list(range(20, 31))  # 11 tokens, one a step
    for replica in replicas:  # steps apart, as an engine's are (back to back, a socket may bring several in one read)
        replica.tokens, replica.tokens_per_step, replica.step_seconds = tokens, 1, 0.005
    router = Router([replica.address for replica in replicas], poll_interval=60, stream_interval=interval)
    await router.start()
    try:
        chunks = await collect(router)
    finally:
        await router.close()
    counts = [len(chunk.token_ids) for chunk in chunks]
    assert [t for chunk in chunks for t in chunk.token_ids] == tokens and chunks[-1].finish_reason == "stop"
    assert counts[0] == 1  # the first token at once
    assert all(count >= interval for count in counts[1:-1])  # then at least `interval` a wake-up
    assert len(chunks) <= 2 + (len(tokens) - 1) // interval  # the last, finishing, without waiting for more


async def test_a_serve_socket_the_gateway_cannot_reach_leaves_the_replica_on_grpc_serve(caplog):
    verifier = await ScriptedVerifier(TOKENS, serve_socket=True).start()
    reachable_port, verifier.serve_port = verifier.serve_port, unused_port()  # e.g. a network policy in between
    router = Router([verifier.address], poll_interval=0.05)
    try:
        await router.start()
        assert "Serve socket" in caplog.text and router.replicas[0].serve_port == 0
        chunks = await collect(router)
        assert [t for c in chunks for t in c.token_ids] == TOKENS
        assert not isinstance(router.replicas[0].stream._call, SocketCall)  # gRPC Serve
        verifier.serve_port = reachable_port  # reachable again: the next stream the replica opens goes there
        await router.poll()
        assert router.replicas[0].serve_port == reachable_port
    finally:
        await router.close()
        await verifier.stop()


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again: nothing listens there
