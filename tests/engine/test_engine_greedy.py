"""With the real default model: speculation never changes greedy output, whatever the drafts.

Eight prompts of different lengths decode together for 64 tokens; the engine with n-gram, oracle and
adversarial drafts, and without drafts, must all equal transformers' greedy generate token for token.
"""
import dataclasses

import pytest

from specd.default_model import resolve_model_path
from specd.sampling import SamplingParams
from support import reference
from support.engine_runs import run
from support.proposers import AdversarialProposer, BruteForceNgramProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine

MAX_TOKENS = 64
TEXTS = [
    "Hello",
    "The capital of France is",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog.",
    "List the numbers from one to twenty, separated by commas: one, two, three,",
    "import os\nimport sys\n\n\ndef main():\n    for name in os.listdir(sys.argv[1]):\n        print(name)\n\n"
    "Fix the bug in this code and repeat it:\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 3,
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
    "Rewrite the class above with type hints:\n",
]
CONFIG = EngineConfig(model="default", device="cpu", dtype="float32", block_size=16,
                      kv_cache_bytes=64 * 2**20, max_num_batched_tokens=512, num_speculative_tokens=4)
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    encoded = reference.default_model_token_ids(TEXTS)
    assert len({len(p) for p in encoded}) == len(encoded)
    return encoded


@pytest.fixture(scope="module")
def hf_greedy(prompts) -> dict[str, list[int]]:
    """transformers generate(do_sample=False), 64 tokens per prompt (cached on disk across runs)."""
    outputs = reference.hf_greedy(resolve_model_path("default"), prompts, MAX_TOKENS, ignore_eos=True)
    return {f"p{index}": output for index, output in enumerate(outputs)}


@pytest.fixture(scope="module")
def runner():
    from verifier_service.runners import build_model_runner

    return build_model_runner(CONFIG)


def generate(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> dict[str, list[int]]:
    for index, prompt in enumerate(prompts):
        engine.add_request(f"p{index}", prompt, params)
    return run(engine)


@pytest.mark.parametrize("kind", ["none", "ngram", "oracle", "adversarial"])
def test_greedy_with_any_drafts_equals_transformers_generate(kind, prompts, hf_greedy, runner):
    references = {rid: prompts[int(rid[1:])] + out for rid, out in hf_greedy.items()}
    proposer = {"none": None, "ngram": BruteForceNgramProposer(),
                "oracle": OracleProposer(references),
                "adversarial": AdversarialProposer(references, runner.vocab_size)}[kind]
    engine = Engine(CONFIG, proposer=proposer, runner=runner)
    assert generate(engine, prompts) == hf_greedy
    spec = [s.spec_decoding for s in engine.take_step_stats() if s.spec_decoding]
    accepted = sum(s.num_accepted_tokens for s in spec)
    if kind == "oracle":
        assert accepted == sum(s.num_draft_tokens for s in spec) > 0
    if kind == "adversarial":
        assert accepted == 0 and sum(s.num_draft_tokens for s in spec) > 0
    if kind == "ngram":
        assert accepted > 0


@pytest.mark.parametrize("kind", ["none", "ngram"])
def test_async_scheduling_equals_transformers_generate(kind, prompts, hf_greedy, runner):
    """Steps launched before the previous one's tokens reach the host (continuing from its result tensor)
    give the same greedy output; with a proposer, chained steps draft too (guessed drafts, lookahead.py),
    and drafting stops while more than 4 requests run."""
    overlapped, advancing = [], []

    class CountingRunner:  # the real runner; counts the batches that continue from the previous step
        def __getattr__(self, name):
            return getattr(runner, name)

        def execute(self, batch):
            overlapped.append(batch.previous_result is not None)
            advancing.append(any(r.previous_num_drafts for r in batch.requests))
            return runner.execute(batch)

    config = dataclasses.replace(CONFIG, async_scheduling=True, max_draft_batch_size=4)
    proposer = BruteForceNgramProposer() if kind == "ngram" else None
    engine = Engine(config, proposer=proposer, runner=CountingRunner())
    lengths = {f"p{i}": MAX_TOKENS // 4 if i % 2 else MAX_TOKENS for i in range(len(prompts))}  # 4 finish early
    for index, prompt in enumerate(prompts):
        engine.add_request(f"p{index}", prompt, SamplingParams(max_tokens=lengths[f"p{index}"], ignore_eos=True))
    assert run(engine) == {rid: hf_greedy[rid][:n] for rid, n in lengths.items()}
    assert sum(overlapped) >= MAX_TOKENS // 4 - 2
    if proposer is not None:
        assert sum(s.spec_decoding.num_accepted_tokens for s in engine.take_step_stats() if s.spec_decoding) > 0
        assert sum(advancing) > 0  # steps launched behind steps with drafts


def test_tiny_kv_budget_preempts_and_leaves_greedy_output_unchanged(prompts, hf_greedy):
    # 12 blocks of 16 = 192 slots: the batch needs far more, so requests are preempted and recomputed.
    config = EngineConfig(model="default", device="cpu", dtype="float32", block_size=16,
                          kv_cache_bytes=12 * 737_280, max_num_batched_tokens=512)
    references = {rid: prompts[int(rid[1:])] + out for rid, out in hf_greedy.items()}
    engine = Engine(config, proposer=OracleProposer(references))
    assert engine.runner.num_blocks == 12
    short = [i for i, p in enumerate(prompts) if len(p) + MAX_TOKENS <= 12 * 16]
    outputs = generate(engine, [prompts[i] for i in short])
    assert outputs == {f"p{n}": hf_greedy[f"p{i}"] for n, i in enumerate(short)}
    assert sum(step.num_preemptions for step in engine.take_step_stats()) > 0


def test_prefix_cache_hit_skips_recomputation_and_keeps_output(prompts, hf_greedy, runner):
    engine = Engine(CONFIG, runner=runner)
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    first = generate(engine, [prompts[longest]])
    fed_first = sum(step.num_tokens for step in engine.take_step_stats())
    second = generate(engine, [prompts[longest]])
    fed_second = sum(step.num_tokens for step in engine.take_step_stats())
    cached = (len(prompts[longest]) - 1) // 16 * 16
    assert first == second == {"p0": hf_greedy[f"p{longest}"]}
    assert fed_second <= fed_first - cached


def test_a_request_alone_with_async_drafts_equals_transformers_generate(prompts, hf_greedy, runner):
    """Batch 1, overlapped, with drafts on some steps and not on others: a step behind one with drafts has its
    context length moved on the device and only an upper bound of it on the host; its attention still sees only
    the sequence's own keys (the reference backend's batch-1 shortcut once saw the bound's stale keys too)."""
    config = dataclasses.replace(CONFIG, async_scheduling=True)
    for index, prompt in enumerate(prompts):
        engine = Engine(config, proposer=BruteForceNgramProposer(), runner=runner)
        engine.add_request(f"p{index}", prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        assert run(engine) == {f"p{index}": hf_greedy[f"p{index}"]}
