"""The engine with async scheduling and drafts (steps launched behind steps still in flight, their drafts
guessed from a lookahead proposal asked a step earlier and never waited for) over the real DrafterClient and a real
drafter server on loopback: a drafter that answers in time, one that answers late (its replies arrive for steps
that no longer exist), and one that dies mid-run. The fake model takes a few milliseconds a step, as a small
model's step on a GPU does. Output is plain greedy decoding's in every case."""
from __future__ import annotations

import time

import pytest

from drafter_service.config import DrafterConfig
from specd.sampling import SamplingParams
from support.drafter_servers import ThreadedDrafter
from support.engine_runs import run
from support.fake_runner import FakePagedRunner, greedy_reference
from drafter_service.client import DrafterClient
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine

pytestmark = pytest.mark.timeout(120)

VOCAB, MAX_TOKENS = 8, 40  # a small vocabulary: the fake model's text repeats, so n-gram drafts are accepted
PROMPTS = {f"r{i}": [(3 * i + j * j) % VOCAB for j in range(6 + 4 * i)] for i in range(4)}


def expected() -> dict[str, list[int]]:
    return {rid: greedy_reference(prompt, MAX_TOKENS, VOCAB) for rid, prompt in PROMPTS.items()}


STEP_SECONDS = 0.004


class DeviceTimedRunner(FakePagedRunner):
    """The fake model, taking `step_seconds` of (GIL-free) time per forward, as a device would."""

    def __init__(self, *args, step_seconds: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.step_seconds = step_seconds

    def execute(self, batch):
        time.sleep(self.step_seconds)
        return super().execute(batch)


def generate(client: DrafterClient, between_steps=lambda engine: None,
             step_seconds: float = STEP_SECONDS) -> tuple[dict[str, list[int]], Engine]:
    runner = DeviceTimedRunner(num_blocks=128, vocab_size=VOCAB, step_seconds=step_seconds)
    engine = Engine(EngineConfig(async_scheduling=True, num_speculative_tokens=4, max_num_batched_tokens=32),
                    proposer=client, runner=runner)
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
        between_steps(engine)
    return outputs, engine


def connected_client(address: str, timeout_s: float) -> DrafterClient:
    client = DrafterClient(address, timeout_s=timeout_s)
    deadline = time.monotonic() + 20
    while client._stream is None:  # noqa: SLF001 - the connection thread opens the stream in the background
        assert time.monotonic() < deadline, "the drafter client never connected"
        time.sleep(0.01)
    return client


def scored(engine: Engine) -> int:
    return sum(s.spec_decoding.num_draft_tokens for s in engine.take_step_stats() if s.spec_decoding)


def test_a_drafter_in_time_drafts_chained_steps_exactly():
    """Proposals come back before the step they serve (a step later); those whose guess of the step in flight
    held are scored (the fake model's text is hard to guess, so few are: output is exact either way). Steps of
    20 ms leave the drafter's thread room on a loaded machine (CI's two cores held it past 4 ms steps); a rare
    late reply is still a fallback, so a tenth of the steps may miss."""
    with ThreadedDrafter(DrafterConfig(host="127.0.0.1", port=0, metrics_port=None)) as drafter:
        client = connected_client(drafter.address, timeout_s=5.0)
        try:
            outputs, engine = generate(client, step_seconds=0.02)
        finally:
            client.close()
    stats = engine.take_step_stats()
    assert outputs == expected()
    assert sum(s.spec_decoding.num_draft_tokens for s in stats if s.spec_decoding) > 0
    assert client.num_fallbacks <= len(stats) // 10 and client.num_stale_replies <= len(stats) // 10


def test_late_replies_are_dropped_and_the_steps_decode_without_them():
    config = DrafterConfig(host="127.0.0.1", port=0, metrics_port=None, inject_delay_ms=30)
    with ThreadedDrafter(config) as drafter:
        client = connected_client(drafter.address, timeout_s=0.01)  # every reply misses its step
        try:
            outputs, engine = generate(client)
        finally:
            client.close()
    assert outputs == expected()
    assert client.num_fallbacks > 0 and client.num_stale_replies > 0  # answers for steps long gone
    assert engine.block_manager.num_used_blocks == 0


def test_a_drafter_that_dies_mid_run_costs_drafts_not_requests():
    drafter = ThreadedDrafter(DrafterConfig(host="127.0.0.1", port=0, metrics_port=None)).__enter__()
    client = connected_client(drafter.address, timeout_s=5.0)
    state = {"steps": 0, "alive": True}

    def kill_after_a_few_steps(engine: Engine) -> None:
        state["steps"] += 1
        if state["steps"] == 6 and state["alive"]:
            drafter.__exit__(None, None, None)
            state["alive"] = False

    try:
        outputs, engine = generate(client, kill_after_a_few_steps)
    finally:
        client.close()
        if state["alive"]:
            drafter.__exit__(None, None, None)
    assert not state["alive"] and outputs == expected()
    assert client.num_fallbacks > 0
