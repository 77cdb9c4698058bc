"""Penalties and logit bias with speculation give the tokens of plain decoding (k = 0), with the fake paged runner:
whatever the drafts, however many, with async scheduling on and off. Each verify row is adjusted with the counts of
the tokens before it (prompt, output, the drafts before it, and under async scheduling the tokens of the step still
in flight), so a wrong count anywhere changes the output."""
from dataclasses import replace

import pytest

from specd.sampling import InvalidParameter, SamplingParams
from support.engine_runs import run
from support.fake_runner import FakePagedRunner
from support.fake_workload import MAX_TOKENS, PROMPTS, VOCAB
from support.proposers import AdversarialProposer, FlakyProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine

PLAIN = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
PENALIZED = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, presence_penalty=0.4, frequency_penalty=0.7,
                           repetition_penalty=1.5, logit_bias={3: 2.0, 17: -1.5})


def make_engine(proposer=None, async_scheduling=False, k=4, runner=None) -> Engine:
    config = EngineConfig(async_scheduling=async_scheduling, num_speculative_tokens=k, max_num_batched_tokens=16)
    return Engine(config, proposer=proposer, runner=runner or FakePagedRunner(vocab_size=VOCAB))


def generate(engine: Engine, params=PENALIZED) -> dict[str, list[int]]:
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, params)
    return run(engine)


@pytest.fixture(scope="module")
def plain_decoding() -> dict[str, list[int]]:
    """The penalized output without speculation or overlap: what every other way must reproduce."""
    return generate(make_engine(k=0))


def oracle_references(outputs: dict[str, list[int]]) -> dict[str, list[int]]:
    return {rid: PROMPTS[rid] + out + [0] * 8 for rid, out in outputs.items()}


def test_penalties_and_bias_change_the_greedy_output(plain_decoding):
    assert plain_decoding != generate(make_engine(k=0), PLAIN)  # else the equalities below would prove nothing


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_accepted_drafts_give_the_tokens_of_plain_decoding(plain_decoding, async_scheduling, k):
    engine = make_engine(OracleProposer(oracle_references(plain_decoding)), async_scheduling, k)
    assert generate(engine) == plain_decoding
    spec = [s.spec_decoding for s in engine.take_step_stats() if s.spec_decoding]
    assert sum(s.num_accepted_tokens for s in spec) == sum(s.num_draft_tokens for s in spec) > 0
    if async_scheduling:  # steps launched behind steps whose drafts were accepted: in-flight counts were used
        assert engine.runner.num_advances_fed > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["adversarial", "flaky"])
def test_rejected_and_random_drafts_give_the_tokens_of_plain_decoding(plain_decoding, async_scheduling, kind):
    references = oracle_references(plain_decoding)
    proposer = (AdversarialProposer(references, VOCAB) if kind == "adversarial"
                else FlakyProposer(references, VOCAB, seed=5))
    assert generate(make_engine(proposer, async_scheduling)) == plain_decoding


def test_overlapped_steps_without_drafts_give_the_tokens_of_plain_decoding(plain_decoding):
    engine = make_engine(async_scheduling=True, k=0)
    assert generate(engine) == plain_decoding
    assert engine.runner.num_previous_tokens_fed > 0  # the last token in flight was counted on the device


def test_requests_without_penalties_are_unchanged_beside_requests_with_them(plain_decoding):
    references = oracle_references(plain_decoding)
    unpenalized = generate(make_engine(k=0), PLAIN)
    references.update({f"plain-{rid}": PROMPTS[rid] + out + [0] * 8 for rid, out in unpenalized.items()})
    engine = make_engine(OracleProposer(references), async_scheduling=True)
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, PENALIZED)
        engine.add_request(f"plain-{request_id}", prompt, PLAIN)
    outputs = run(engine)
    assert {rid: outputs[rid] for rid in PROMPTS} == plain_decoding
    assert {rid: outputs[f"plain-{rid}"] for rid in PROMPTS} == unpenalized


@pytest.mark.parametrize("bias, expected", [(100.0, "all"), (-100.0, "none")])
def test_logit_bias_forces_or_bans_a_token(bias, expected):
    token = 5
    outputs = generate(make_engine(k=0), SamplingParams(max_tokens=8, ignore_eos=True, logit_bias={token: bias}))
    counts = [out.count(token) for out in outputs.values()]
    assert counts == ([8] * len(PROMPTS) if expected == "all" else [0] * len(PROMPTS))


class GraphGreedyRunner(FakePagedRunner):
    """Offers the CUDA-graph greedy path (runner.execute_greedy), which judges the raw logits; counts its use."""

    def __init__(self) -> None:
        super().__init__(vocab_size=VOCAB)
        self.greedy_batches = []

    def execute_greedy(self, batch):
        self.greedy_batches.append([r.request_id for r in batch.requests])
        return None  # as a batch no graph fits: the engine falls back to execute + the rejection sampler


def test_greedy_requests_with_penalties_or_bias_never_take_the_graph_greedy_path():
    runner = GraphGreedyRunner()
    engine = make_engine(runner=runner, k=0)
    engine.add_request("biased", PROMPTS["r1"], SamplingParams(max_tokens=4, logit_bias={3: 1.0}))
    run(engine)
    engine.add_request("penalized", PROMPTS["r1"], SamplingParams(max_tokens=4, presence_penalty=0.5))
    run(engine)
    engine.add_request("plain", PROMPTS["r1"], SamplingParams(max_tokens=4))
    run(engine)
    assert runner.greedy_batches and all(batch == ["plain"] for batch in runner.greedy_batches)


def test_a_logit_bias_token_outside_the_vocabulary_is_refused_naming_it():
    engine = make_engine()
    with pytest.raises(InvalidParameter) as error:
        engine.add_request("r", PROMPTS["r1"], SamplingParams(logit_bias={VOCAB: 1.0}))
    assert error.value.field == f"logit_bias[{VOCAB}]"
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("field, value", [
    ("presence_penalty", 2.5), ("frequency_penalty", -2.01), ("frequency_penalty", float("nan")),
    ("repetition_penalty", 0.0), ("repetition_penalty", float("inf")), ("logit_bias", {5: 100.5}),
    ("logit_bias", {-1: 1.0}), ("logit_bias", {t: 1.0 for t in range(301)})])
def test_bad_penalties_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidParameter) as error:
        SamplingParams(**{field: value})
    assert error.value.field.startswith(field)


@pytest.mark.parametrize("resumed_after", [1, 5])
def test_a_resumed_stream_counts_its_earlier_output_as_output(plain_decoding, resumed_after):
    """The gateway resumes a stream on another verifier with the output so far appended to the prompt and
    output_position_offset saying how many tokens that is: presence and frequency penalties keep counting them
    as output, so the continuation is the uninterrupted stream's."""
    engine = make_engine(k=0)
    for request_id, prompt in PROMPTS.items():
        emitted = plain_decoding[request_id][:resumed_after]
        params = replace(PENALIZED, max_tokens=MAX_TOKENS - resumed_after, output_position_offset=resumed_after)
        engine.add_request(request_id, prompt + emitted, params)
    continued = run(engine)
    assert continued == {rid: out[resumed_after:] for rid, out in plain_decoding.items()}
