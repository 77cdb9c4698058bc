"""With the real default model in float32: drafts from the drafter's memory of earlier outputs never change
greedy output, whether the remembered outputs are right (the same requests again) or wrong.

The engine drafts on every step (adaptive_drafting off) through the drafter's own store in-process
(LocalProposer, native when built), and must equal transformers' greedy generate token for token.
"""
import pytest

from drafter_service.local import LocalProposer
from specd.default_model import resolve_model_path
from specd.sampling import SamplingParams
from support import reference
from support.engine_runs import run
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.runners import build_model_runner
from verifier_service.engine.proposer import DraftRequest

MAX_TOKENS = 48
TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "List the numbers from one to twenty, separated by commas: one, two, three,",
    "Once upon a time, in a small village by the sea, there lived",
    "The three primary colours are",
]
CONFIG = EngineConfig(model="default", device="cpu", dtype="float32", block_size=16, kv_cache_bytes=64 * 2**20,
                      max_num_batched_tokens=512, num_speculative_tokens=8, adaptive_drafting=False)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return reference.default_model_token_ids(TEXTS)


@pytest.fixture(scope="module")
def hf_greedy(prompts) -> list[list[int]]:
    return reference.hf_greedy(resolve_model_path("default"), prompts, MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def runner():
    return build_model_runner(CONFIG)


def generate(engine: Engine, prompts: list[list[int]], prefix: str) -> list[list[int]]:
    for index, prompt in enumerate(prompts):
        engine.add_request(f"{prefix}{index}", prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    outputs = run(engine)
    return [outputs[f"{prefix}{index}"] for index in range(len(prompts))]


def drafted_and_accepted(engine: Engine) -> tuple[int, int]:
    spec = [s.spec_decoding for s in engine.take_step_stats() if s.spec_decoding]
    return sum(s.num_draft_tokens for s in spec), sum(s.num_accepted_tokens for s in spec)


def test_drafts_remembered_from_the_same_requests_leave_greedy_output_unchanged(prompts, hf_greedy, runner):
    proposer = LocalProposer()
    engine = Engine(CONFIG, proposer=proposer, runner=runner)
    assert generate(engine, prompts, "first-") == hf_greedy
    engine.take_step_stats()
    before = proposer.proposed_tokens[1]
    assert generate(engine, prompts, "again-") == hf_greedy
    drafted, accepted = drafted_and_accepted(engine)
    assert proposer.proposed_tokens[1] > before  # the second pass drew on the memory
    assert accepted > 0.9 * drafted


def test_drafts_remembered_from_wrong_outputs_leave_greedy_output_unchanged(prompts, hf_greedy, runner):
    proposer = LocalProposer()
    vocab = runner.vocab_size
    for index, (prompt, output) in enumerate(zip(prompts, hf_greedy)):  # every 6th token off by one
        wrong = [(t + 1) % vocab if i % 6 == 5 else t for i, t in enumerate(output)]
        proposer.propose([DraftRequest(f"wrong-{index}", prompt + wrong[:1], 0)])
        proposer.propose([DraftRequest(f"wrong-{index}", prompt + wrong, 0)])
        proposer.release([f"wrong-{index}"])
    engine = Engine(CONFIG, proposer=proposer, runner=runner)
    assert generate(engine, prompts, "p") == hf_greedy
    drafted, accepted = drafted_and_accepted(engine)
    assert proposer.proposed_tokens[1] > 0 and accepted < drafted
