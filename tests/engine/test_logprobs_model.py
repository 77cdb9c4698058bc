"""With the real default model (float32, CPU): every emitted token's logprobs equal transformers' log_softmax
of the same model's logits at its position, within 1e-4, whether the token was an accepted draft, a
recovered or bonus token, or decoded without speculation, with async scheduling on and off."""
import dataclasses

import pytest
import torch
from transformers import AutoTokenizer

from specd.default_model import resolve_model_path
from specd.sampling import SamplingParams
from support import reference
from support.engine_runs import run
from support.proposers import AdversarialProposer, BruteForceNgramProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine

MAX_TOKENS = 24
TOLERANCE = 1e-4
TEXTS = [
    "The capital of France is",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
]
CONFIG = EngineConfig(model="default", device="cpu", dtype="float32", block_size=16,
                      kv_cache_bytes=64 * 2**20, max_num_batched_tokens=512, num_speculative_tokens=4)


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model_path("default")


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer(text)["input_ids"] for text in TEXTS]


@pytest.fixture(scope="module")
def references(prompts, model_dir) -> dict[str, list[int]]:
    """Prompt + transformers' greedy continuation, per request id (what the oracle and the adversary know)."""
    outputs = reference.hf_greedy(model_dir, prompts, MAX_TOKENS, ignore_eos=True)
    return {f"p{i}": prompt + output for i, (prompt, output) in enumerate(zip(prompts, outputs))}


@pytest.fixture(scope="module")
def runner():
    from verifier_service.runners import build_model_runner

    return build_model_runner(CONFIG)


def generate(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> dict[str, tuple[list, list]]:
    """Each request's (tokens, logprobs entries) over the whole run."""
    for index, prompt in enumerate(prompts):
        engine.add_request(f"p{index}", prompt, params)
    results: dict[str, tuple[list, list]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens, logprobs = results.setdefault(output.request_id, ([], []))
            tokens += output.new_token_ids
            logprobs += output.logprobs
    return results


def expected_logprobs(model_dir, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab]: transformers' log_softmax at the position of each output token."""
    logits = reference.hf_logits(model_dir, prompt + tokens[:-1])
    return logits[len(prompt) - 1:].log_softmax(dim=-1)


def assert_logprobs_match(expected: torch.Tensor, tokens: list[int], logprobs: list, num_top: int,
                          tolerance: float = TOLERANCE) -> None:
    """tolerance: on the logprobs; a temperature T scales the logits' float32 differences (and it) by 1 / T."""
    assert [entry.token_id for entry in logprobs] == tokens
    for row, entry in zip(expected, logprobs):
        assert abs(entry.logprob - float(row[entry.token_id])) < tolerance
        values = [value for _, value in entry.top]
        assert len(entry.top) == num_top and values == sorted(values, reverse=True)
        assert all(abs(value - float(row[token])) < tolerance for token, value in entry.top)
        assert torch.allclose(torch.tensor(values), row.topk(num_top).values, atol=tolerance)
        if num_top and float(row[entry.token_id]) > values[-1] + tolerance:  # clearly among the top N
            assert entry.token_id in [token for token, _ in entry.top]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("drafts", ["none", "accepted", "rejected"])
def test_greedy_logprobs_equal_transformers_log_softmax(drafts, async_scheduling, prompts, references, runner,
                                                        model_dir):
    proposer = {"none": None, "accepted": OracleProposer(references),
                "rejected": AdversarialProposer(references, runner.vocab_size, CONFIG.num_speculative_tokens)}[drafts]
    engine = Engine(dataclasses.replace(CONFIG, async_scheduling=async_scheduling), proposer=proposer, runner=runner)
    results = generate(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5))
    spec = [s.spec_decoding for s in engine.take_step_stats() if s.spec_decoding]
    accepted, scored = sum(s.num_accepted_tokens for s in spec), sum(s.num_draft_tokens for s in spec)
    assert (scored > 0) == (drafts != "none")
    if drafts == "accepted":
        assert accepted > 0
    if drafts == "rejected" and not async_scheduling:  # steps launched ahead draft from guesses, right or wrong
        assert accepted == 0
    for index, prompt in enumerate(prompts):
        tokens, logprobs = results[f"p{index}"]
        assert prompt + tokens == references[f"p{index}"]
        assert_logprobs_match(expected_logprobs(model_dir, prompt, tokens), tokens, logprobs, num_top=5)
        assert all(entry.top[0][0] == entry.token_id for entry in logprobs)  # greedy picks the most likely


@pytest.mark.parametrize("num_speculative_tokens", [0, 4])
def test_sampled_tokens_get_the_raw_model_distribution(num_speculative_tokens, prompts, runner, model_dir):
    """Raw logprobs (the default) ignore temperature and top-k: the model's own log_softmax at each position,
    for tokens drawn by rejection sampling from n-gram drafts as for tokens decoded one by one."""
    engine = Engine(CONFIG, proposer=BruteForceNgramProposer(), runner=runner)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, top_k=40, seed=7, logprobs=3,
                            num_speculative_tokens=num_speculative_tokens)
    results = generate(engine, prompts, params)
    accepted = sum(s.spec_decoding.num_accepted_tokens for s in engine.take_step_stats() if s.spec_decoding)
    assert (accepted > 0) == (num_speculative_tokens > 0)
    for index, prompt in enumerate(prompts):
        tokens, logprobs = results[f"p{index}"]
        assert_logprobs_match(expected_logprobs(model_dir, prompt, tokens), tokens, logprobs, num_top=3)


def test_processed_logprobs_are_the_distribution_sampled_from(prompts, runner, model_dir):
    """temperature 0.5 and top_k 3: the log of softmax(logits / 0.5) renormalised over the 3 most likely tokens;
    the others are -inf, so of the 5 asked for only those 3 are listed."""
    engine = Engine(CONFIG, proposer=BruteForceNgramProposer(), runner=runner)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.5, top_k=3, seed=3, logprobs=5,
                            logprobs_mode="processed")
    results = generate(engine, prompts, params)
    for index, prompt in enumerate(prompts):
        tokens, logprobs = results[f"p{index}"]
        logits = reference.hf_logits(model_dir, prompt + tokens[:-1])[len(prompt) - 1:] / 0.5
        kept = logits.topk(3).indices
        processed = torch.full_like(logits, float("-inf")).scatter(1, kept, logits.gather(1, kept)).log_softmax(-1)
        assert_logprobs_match(processed, tokens, logprobs, num_top=3, tolerance=TOLERANCE / 0.5)
