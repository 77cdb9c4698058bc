"""A cancel wins whatever it races: an abort that reaches the verifier before its engine thread took the
request (still queued for the thread), while it waits, mid-prefill or in flight (this folder's verifiers
schedule asynchronously) must leave nothing running and no KV block held (issue 17, item 1)."""
import asyncio
import random

import httpx

from specd.serving import open_channel
from specd.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from support.e2e_clients import wait_for_load

BUSY_PROMPT = [random.Random(0).randrange(100, 40000) for _ in range(1500)]  # a prefill that takes a while
LONG = 3000  # tokens an orphaned request would go on generating: minutes on the CPU
ROUNDS, RACERS = 3, 24


def request(request_id: str, prompt: list[int]) -> verifier_pb2.VerifierGenerateRequest:
    sampling = common_pb2.SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True)
    return verifier_pb2.VerifierGenerateRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling)


async def cancelled_after(stub, message, delay: float) -> None:
    call = stub.Generate(message)
    await asyncio.sleep(delay)
    call.cancel()


async def race_round(address: str, round_index: int, rng: random.Random) -> None:
    """Keeps the engine thread busy with a long prefill while many short-lived requests come and go."""
    async with open_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        busy = stub.Generate(request(f"busy-{round_index}", BUSY_PROMPT))
        racers = [cancelled_after(stub, request(f"r{round_index}-{i}", [rng.randrange(100, 40000)
                                                                       for _ in range(rng.choice([3, 40, 400]))]),
                                  rng.uniform(0.0, 0.6))
                  for i in range(RACERS)]
        await asyncio.gather(*racers)
        busy.cancel()


def empty(report) -> bool:
    return report.num_running + report.num_waiting == 0 and report.num_used_blocks == 0 and report.kv_cache_usage == 0


def test_cancels_racing_additions_leave_every_verifier_idle_with_an_empty_cache(stack):
    rng = random.Random(17)
    for address in stack.verifier_addresses:
        for round_index in range(ROUNDS):
            asyncio.run(race_round(address, round_index, rng))
            wait_for_load(address, empty, timeout=20)


def test_an_http_client_that_leaves_early_leaves_nothing_running(stack):
    """The issue's repro: one client's long prompt keeps the verifier busy; another asks for 1,500 tokens
    and closes its connection 0.2 s later."""
    async def repro() -> None:
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=60) as client:
            long_prompt = " ".join(["word"] * 1800)
            busy = asyncio.ensure_future(client.post("/v1/completions", json={
                "model": "default", "prompt": long_prompt, "max_tokens": 200, "ignore_eos": True}))
            await asyncio.sleep(0.5)
            leaver = asyncio.ensure_future(client.post("/v1/completions", json={
                "model": "default", "prompt": "Count: 1, 2, 3,", "max_tokens": 1500, "ignore_eos": True}))
            await asyncio.sleep(0.2)
            leaver.cancel()
            busy.cancel()
            await asyncio.gather(busy, leaver, return_exceptions=True)

    for _ in range(3):
        asyncio.run(repro())
        for address in stack.verifier_addresses:
            wait_for_load(address, empty, timeout=20)
