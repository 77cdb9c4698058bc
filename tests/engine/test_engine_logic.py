"""Scheduler and step-loop behaviour with a fake paged runner (fast; the real model is in test_engine_greedy)."""
import time

import pytest

from specd.sampling import InvalidParameter, SamplingParams
from support.engine_runs import run
from support.fake_runner import FakePagedRunner
from support.fake_workload import MAX_TOKENS, PROMPTS, VOCAB, add_all, expected, greedy_references
from support.proposers import AdversarialProposer, BruteForceNgramProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine.outputs import FinishReason

def make_engine(proposer=None, **config) -> Engine:
    runner = FakePagedRunner(num_blocks=config.pop("num_blocks", 64), vocab_size=VOCAB)
    config.setdefault("max_num_batched_tokens", 16)  # small: prompts are prefilled in chunks
    return Engine(EngineConfig(**config), proposer=proposer, runner=runner)


@pytest.fixture(scope="module")
def references() -> dict[str, list[int]]:
    return greedy_references()


@pytest.mark.parametrize("kind", ["none", "oracle", "adversarial", "ngram"])
def test_chunked_prefill_and_drafts_reproduce_plain_greedy(kind, references):
    proposer = {"none": None, "oracle": OracleProposer(references),
                "adversarial": AdversarialProposer(references, VOCAB), "ngram": BruteForceNgramProposer()}[kind]
    engine = make_engine(proposer)
    add_all(engine)
    assert run(engine) == expected(references)
    assert engine.block_manager.num_used_blocks == 0
    if proposer is not None:
        assert sorted(proposer.released) == sorted(PROMPTS)


def test_oracle_drafts_are_all_accepted_and_cut_steps(references):
    engine = make_engine(OracleProposer(references), num_speculative_tokens=4)
    engine.add_request("r5", PROMPTS["r5"], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    usage = outputs[-1].usage
    assert usage.accepted_tokens == usage.draft_tokens > 0
    assert usage.steps == 1 + -(-(MAX_TOKENS - 1) // 5)  # prefill emits 1, then 5 per verify step


def test_tiny_kv_budget_preempts_and_leaves_outputs_unchanged(references):
    engine = make_engine(OracleProposer(references), num_blocks=14)
    add_all(engine)
    assert run(engine) == expected(references)
    assert sum(step.num_preemptions for step in engine.take_step_stats()) > 0


def test_prefix_cache_hit_skips_recomputation(references):
    engine = make_engine()
    prompt = PROMPTS["r5"]  # 28 tokens = 7 full blocks of 4
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("first", prompt, params)
    first = run(engine)["first"]
    computed_once = engine.runner.num_computed_tokens
    engine.add_request("second", prompt, params)
    assert run(engine)["second"] == first
    computed_twice = engine.runner.num_computed_tokens - computed_once
    assert computed_twice == computed_once - 24  # 6 cached blocks; the 7th holds the last prompt token


def test_abort_frees_blocks_at_once_and_reports_abort():
    engine = make_engine()
    engine.add_request("a", PROMPTS["r5"], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", PROMPTS["r1"], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    used = engine.block_manager.num_used_blocks
    assert engine.abort("a")
    assert engine.block_manager.num_used_blocks < used
    outputs = run(engine)
    assert outputs["a"] == [] and len(outputs["b"]) == 3
    assert not engine.abort("a")


def test_stop_token_ends_output_with_nothing_after_it(references):
    continuation = expected(references)["r2"]
    stop = continuation[5]
    cut = continuation.index(stop)
    engine = make_engine(OracleProposer(references))
    engine.add_request("r2", PROMPTS["r2"], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,)))
    steps = []
    while engine.has_unfinished_requests():
        steps += engine.step()
    assert [t for s in steps for t in s.new_token_ids] == continuation[:cut + 1]
    assert steps[-1].finish_reason == FinishReason.STOP


def test_max_model_len_caps_output_and_drafts(references):
    engine = make_engine(OracleProposer(references), max_model_len=PROMPTS["r1"].__len__() + 6)
    engine.add_request("r1", PROMPTS["r1"], SamplingParams(max_tokens=100, ignore_eos=True))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert len([t for o in outputs for t in o.new_token_ids]) == 6
    assert outputs[-1].finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize("prompt, params, field", [
    ([], SamplingParams(), "prompt_token_ids"),
    ([1] * 300, SamplingParams(), "prompt_token_ids"),
    ([1, VOCAB], SamplingParams(), "prompt_token_ids"),
    ([1, -1], SamplingParams(), "prompt_token_ids"),
    ([1, 2], SamplingParams(), "request_id"),
])
def test_bad_input_names_the_field_and_leaves_other_requests_running(prompt, params, field):
    engine = make_engine()
    engine.add_request("ok", PROMPTS["r1"], SamplingParams(max_tokens=5, ignore_eos=True))
    request_id = "ok" if field == "request_id" else "bad"
    with pytest.raises(InvalidParameter) as error:
        engine.add_request(request_id, prompt, params)
    assert error.value.field == field
    assert len(run(engine)["ok"]) == 5


def test_sampled_requests_with_the_same_seed_give_the_same_output():
    def sample(batch_mates: int) -> list[int]:
        engine = make_engine(BruteForceNgramProposer())
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
        engine.add_request("seeded", PROMPTS["r3"], params)
        for i in range(batch_mates):
            engine.add_request(f"mate{i}", PROMPTS["r2"], SamplingParams(max_tokens=10, temperature=1.0))
        return run(engine)["seeded"]

    assert sample(0) == sample(0) == sample(3)


def test_max_num_seqs_bounds_the_running_batch():
    engine = make_engine(max_num_seqs=2)
    add_all(engine, SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
        assert engine.load().num_running <= 2


class SlowToDraftProposer(OracleProposer):
    """Drafts as it is asked (no begin_propose), and takes 20 ms to."""

    def propose(self, requests):
        time.sleep(0.02)
        return super().propose(requests)


def test_a_synchronous_step_times_all_it_spent_on_its_drafts_as_its_propose_stage(references):
    """Whether the proposer answers as it is asked or later, the propose stage holds that time (the step waited)."""
    engine = make_engine(SlowToDraftProposer(references), num_speculative_tokens=4)
    engine.add_request("r5", PROMPTS["r5"], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    run(engine)
    drafting = [s for s in engine.take_step_stats() if s.spec_decoding]
    assert drafting and all(s.stage_seconds["propose"] >= 0.02 for s in drafting)
