"""A seeded sampled request emits the same tokens however it is run: alone or among other requests, with or
without speculation at any k, whatever the drafts, from the prefix cache, after preemption, with async
scheduling on or off, and resumed elsewhere with its output so far in the prompt. The fake paged runner's
logits depend only on the context, so any difference comes from the sampler's randomness."""
import dataclasses

import pytest

from specd.sampling import SamplingParams
from support.engine_runs import run
from support.fake_runner import FakePagedRunner
from support.fake_workload import PROMPTS, VOCAB
from support.proposers import AdversarialProposer, BruteForceNgramProposer, FlakyProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine

MAX_TOKENS = 24
SAMPLED = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.95, ignore_eos=True)


def params_of(request_id: str) -> SamplingParams:
    return dataclasses.replace(SAMPLED, seed=1000 + int(request_id[1:]))


def make_engine(proposer=None, k: int = 4, num_blocks: int = 64, **config) -> Engine:
    config.setdefault("max_num_batched_tokens", 16)  # prompts are prefilled in chunks
    config.setdefault("async_scheduling", False)
    return Engine(EngineConfig(num_speculative_tokens=k if proposer is not None else 0, **config),
                  proposer=proposer, runner=FakePagedRunner(num_blocks=num_blocks, vocab_size=VOCAB))


def generate(engine: Engine, request_ids=tuple(PROMPTS)) -> dict[str, list[int]]:
    for request_id in request_ids:
        engine.add_request(request_id, PROMPTS[request_id], params_of(request_id))
    return run(engine)


@pytest.fixture(scope="module")
def alone() -> dict[str, list[int]]:
    """Each request decoded by itself, one token per step: the reference."""
    return {rid: generate(make_engine(), [rid])[rid] for rid in PROMPTS}


def accepted_drafts(engine: Engine) -> int:
    return sum(s.spec_decoding.num_accepted_tokens for s in engine.take_step_stats() if s.spec_decoding)


def test_the_reference_is_sampled_not_greedy(alone):
    """Else every comparison here would only prove greedy decoding exact."""
    engine = make_engine()
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, dataclasses.replace(params_of(rid), temperature=0.0))
    greedy = run(engine)
    assert sum(a != g for rid in PROMPTS for a, g in zip(alone[rid], greedy[rid])) > len(PROMPTS) * MAX_TOKENS // 4


def test_among_other_requests_the_same_tokens(alone):
    engine = make_engine()
    for i in range(2):  # mates: unseeded sampled and greedy requests beside the six seeded ones
        engine.add_request(f"mate{i}", PROMPTS["r3"], SamplingParams(max_tokens=30, temperature=float(i)))
    outputs = generate(engine)
    assert {rid: outputs[rid] for rid in PROMPTS} == alone


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("kind", ["oracle", "ngram", "adversarial", "flaky"])
def test_speculation_at_any_k_with_any_drafts_gives_the_same_tokens(alone, kind, k, async_scheduling):
    references = {rid: PROMPTS[rid] + out for rid, out in alone.items()}
    proposer = {"oracle": OracleProposer(references), "ngram": BruteForceNgramProposer(),
                "adversarial": AdversarialProposer(references, VOCAB),
                "flaky": FlakyProposer(references, VOCAB, seed=k)}[kind]
    engine = make_engine(proposer, k=k, async_scheduling=async_scheduling)
    assert generate(engine) == alone
    accepted = accepted_drafts(engine)
    if kind == "oracle":  # the drafts are the keyed samples themselves: all accepted
        assert accepted > len(PROMPTS) * MAX_TOKENS // 2
        # steps launched ahead continued from steps whose drafts were accepted: positions moved on the device
        assert engine.runner.num_advances_fed > 0 or not async_scheduling
    if kind == "adversarial" and not async_scheduling:  # (ahead, drafts are guessed past a guessed outcome)
        assert accepted == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_after_preemption_the_same_tokens(alone, async_scheduling):
    references = {rid: PROMPTS[rid] + out for rid, out in alone.items()}
    engine = make_engine(OracleProposer(references), num_blocks=14, async_scheduling=async_scheduling)
    assert generate(engine) == alone
    assert sum(step.num_preemptions for step in engine.take_step_stats()) > 0


def test_from_the_prefix_cache_the_same_tokens(alone):
    engine = make_engine(BruteForceNgramProposer(), enable_prefix_caching=True)
    assert generate(engine, ["r5"])["r5"] == alone["r5"]
    computed = engine.runner.num_computed_tokens
    assert generate(engine, ["r5"])["r5"] == alone["r5"]
    assert engine.runner.num_computed_tokens - computed < computed - len(PROMPTS["r5"]) // 2  # the prompt was cached


@pytest.mark.parametrize("resume_after", [1, 7, 23])
def test_a_resumed_stream_continues_with_the_same_tokens(alone, resume_after):
    """What the gateway does when a verifier fails mid-stream: the output so far goes into the prompt, and
    output_position_offset says how many of its tokens were generated."""
    emitted = alone["r4"][:resume_after]
    params = dataclasses.replace(params_of("r4"), max_tokens=MAX_TOKENS - resume_after,
                                 output_position_offset=resume_after)
    engine = make_engine(BruteForceNgramProposer())
    engine.add_request("r4", PROMPTS["r4"] + emitted, params)
    assert emitted + run(engine)["r4"] == alone["r4"]


def test_an_unseeded_request_reports_the_seed_that_reproduces_it():
    engine = make_engine()
    engine.add_request("a", PROMPTS["r2"], SAMPLED)
    engine.add_request("b", PROMPTS["r2"], SAMPLED)
    engine.add_request("greedy", PROMPTS["r2"], dataclasses.replace(SAMPLED, temperature=0.0))
    outputs, seeds = {}, {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
            assert seeds.setdefault(output.request_id, output.seed) == output.seed  # one seed per request
    assert seeds["greedy"] is None
    assert seeds["a"] != seeds["b"] and all(0 <= seeds[rid] < 2**63 for rid in "ab")
    assert outputs["a"] != outputs["b"]
    again = make_engine(BruteForceNgramProposer())
    again.add_request("a", PROMPTS["r2"], dataclasses.replace(SAMPLED, seed=seeds["a"]))
    assert run(again)["a"] == outputs["a"]
