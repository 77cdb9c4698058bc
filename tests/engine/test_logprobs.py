"""Logprobs in the verify step and through the engine, on hand-made logits and the fake paged model.

The real model against transformers is tests/engine/test_logprobs_model.py; here: which rows are reported
(emitted tokens only, cut with them), the processed distribution, mixed batches, async scheduling, the greedy
fast path, and that a step where nobody asked does no logprob work at all.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specd.sampling import InvalidParameter, SamplingParams
from support.fake_runner import FakePagedRunner, context_logits, greedy_reference
from support.proposers import AdversarialProposer, OracleProposer
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine.outputs import FinishReason
from verifier_service.engine.rejection_sampler import verify
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata

# Target logits of the three positions a request with two drafts scores: draft 0, draft 1, bonus.
ROWS = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0],
                     [0.0, 0.3, 2.0, 1.0, -0.5, 1.2],
                     [1.0, 1.0, 1.0, 0.2, 0.1, -3.0]])
VOCAB = 32
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def verify_one_each(params: list[SamplingParams], drafts: list[int]):
    """One request per params, each with `drafts` scored against ROWS, in one batch."""
    requests = [Request(f"r{i}", [0], p, i) for i, p in enumerate(params)]
    batch = ScheduledBatch([ScheduledRequest(r.request_id, [0] + drafts, 1, [0], len(drafts), len(drafts) + 1)
                            for r in requests])
    logits = ROWS[:len(drafts) + 1].repeat(len(requests), 1)
    return verify(logits, SamplingMetadata.build(batch, requests, torch.device("cpu")))


def test_each_emitted_token_gets_its_rows_logprob_and_the_top_n_sorted():
    verified = verify_one_each([SamplingParams(logprobs=2)], drafts=[0, 2])  # both accepted, bonus row: argmax 0
    expected = ROWS.log_softmax(dim=-1)
    assert verified.token_ids == [[0, 2, 0]]
    entries = verified.logprobs[0]
    assert [e.token_id for e in entries] == [0, 2, 0]
    assert [e.logprob for e in entries] == [expected[0, 0].item(), expected[1, 2].item(), expected[2, 0].item()]
    assert [e.top[0] for e in entries[:2]] == [(0, expected[0, 0].item()), (2, expected[1, 2].item())]
    assert all(len(e.top) == 2 and e.top[0][1] >= e.top[1][1] for e in entries)


def test_rows_after_a_rejected_draft_are_not_reported():
    verified = verify_one_each([SamplingParams(logprobs=0)], drafts=[1, 2])  # draft 1 is not row 0's argmax
    assert verified.token_ids == [[0]]
    (entry,) = verified.logprobs[0]
    assert entry.token_id == 0 and entry.logprob == ROWS.log_softmax(dim=-1)[0, 0].item() and entry.top == ()


def test_only_requests_that_asked_get_logprobs_and_a_step_where_none_asked_has_none():
    mixed = verify_one_each([SamplingParams(), SamplingParams(logprobs=1)], drafts=[0])
    assert mixed.logprobs[0] is None and len(mixed.logprobs[1]) == 2
    assert verify_one_each([SamplingParams(), SamplingParams()], drafts=[0]).logprobs is None


def test_raw_logprobs_ignore_temperature_and_filters():
    params = SamplingParams(temperature=0.5, top_k=2, logprobs=5, seed=1)
    verified = verify_one_each([params], drafts=[])
    (entry,) = verified.logprobs[0]
    assert entry.logprob == ROWS[0].log_softmax(dim=-1)[entry.token_id].item()
    assert len(entry.top) == 5


def test_processed_logprobs_are_the_filtered_temperature_scaled_distribution():
    params = SamplingParams(temperature=0.5, top_k=2, logprobs=5, logprobs_mode="processed", seed=1)
    (entry,) = verify_one_each([params], drafts=[]).logprobs[0]
    kept = ROWS[0, :2] / 0.5  # the two most likely tokens, 0 and 1
    expected = kept.log_softmax(dim=-1)
    assert entry.token_id in (0, 1)
    assert entry.top == ((0, pytest.approx(expected[0].item())), (1, pytest.approx(expected[1].item())))
    assert entry.logprob == pytest.approx(expected[entry.token_id].item())


def test_processed_logprobs_of_a_greedy_request_are_its_unfiltered_distribution():
    params = SamplingParams(top_k=1, logprobs=3, logprobs_mode="processed")  # greedy: filters do not apply
    (entry,) = verify_one_each([params], drafts=[]).logprobs[0]
    assert [value for _, value in entry.top] == ROWS[0].log_softmax(dim=-1).topk(3).values.tolist()


def test_raw_logprobs_are_taken_before_the_logit_bias_that_chose_the_token():
    params = SamplingParams(logprobs=2, logit_bias={3: 10.0})  # greedy: the bias makes token 3 the argmax
    (entry,) = verify_one_each([params], drafts=[]).logprobs[0]
    raw = ROWS[0].log_softmax(dim=-1)
    assert entry.token_id == 3 and entry.logprob == raw[3].item()
    assert entry.top == ((0, raw[0].item()), (1, raw[1].item()))


def test_processed_logprobs_include_the_logit_bias():
    params = SamplingParams(logprobs=2, logprobs_mode="processed", logit_bias={3: 10.0})
    (entry,) = verify_one_each([params], drafts=[]).logprobs[0]
    processed = (ROWS[0] + torch.tensor([0.0, 0.0, 0.0, 10.0, 0.0, 0.0])).log_softmax(dim=-1)
    assert entry.token_id == 3 and entry.logprob == pytest.approx(processed[3].item())
    assert [token for token, _ in entry.top] == [3, 0]


@pytest.mark.parametrize("params, field", [
    (dict(logprobs=21), "logprobs"), (dict(logprobs=-1), "logprobs"), (dict(logprobs_mode="sampled"), "logprobs_mode"),
])
def test_bad_logprobs_parameters_name_the_field(params, field):
    with pytest.raises(InvalidParameter) as error:
        SamplingParams(**params)
    assert error.value.field == field


# -- through the engine, with the fake paged model (its logits are known exactly) ------------------


def make_engine(proposer=None, runner=None, **config) -> Engine:
    config = EngineConfig(model="fake", num_speculative_tokens=4, **config)
    return Engine(config, proposer=proposer, runner=runner or FakePagedRunner(vocab_size=VOCAB))


def collect(engine: Engine) -> dict[str, tuple[list[int], list, FinishReason | None]]:
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens, logprobs, _ = results.setdefault(output.request_id, ([], [], None))
            tokens += output.new_token_ids
            if output.logprobs is not None:
                logprobs += output.logprobs
            results[output.request_id] = (tokens, logprobs, output.finish_reason)
    return results


def expected_logprobs(tokens: list[int]) -> list[float]:
    return [context_logits(PROMPT + tokens[:i], VOCAB).log_softmax(dim=-1)[t].item() for i, t in enumerate(tokens)]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("drafts", ["none", "accepted", "rejected"])
def test_engine_reports_the_logprob_of_every_emitted_token(drafts, async_scheduling):
    reference = {"lp": PROMPT + greedy_reference(PROMPT, 20, VOCAB)}
    proposer = {"none": None, "accepted": OracleProposer(reference),
                "rejected": AdversarialProposer(reference, VOCAB)}[drafts]
    engine = make_engine(proposer, async_scheduling=async_scheduling)
    engine.add_request("lp", PROMPT, SamplingParams(max_tokens=20, ignore_eos=True, logprobs=2))
    engine.add_request("plain", PROMPT, SamplingParams(max_tokens=20, ignore_eos=True))
    results = collect(engine)
    assert any(s.scheduled_ahead for s in engine.take_step_stats()) == async_scheduling
    tokens, logprobs, _ = results["lp"]
    assert PROMPT + tokens == reference["lp"]
    assert [e.logprob for e in logprobs] == expected_logprobs(tokens)
    assert results["plain"][1] == []  # its outputs carried no logprobs


def test_logprobs_are_cut_with_the_tokens_at_a_stop_token():
    continuation = greedy_reference(PROMPT, 20, VOCAB)
    stop = continuation[6]
    reference = {"lp": PROMPT + continuation}
    engine = make_engine(OracleProposer(reference))  # steps of 5 tokens: the stop token lands mid-step
    engine.add_request("lp", PROMPT, SamplingParams(max_tokens=20, stop_token_ids=(stop,), logprobs=1))
    tokens, logprobs, finish_reason = collect(engine)["lp"]
    assert finish_reason == FinishReason.STOP and tokens == continuation[:continuation.index(stop) + 1]
    assert [e.token_id for e in logprobs] == tokens


def test_greedy_requests_with_logprobs_skip_the_runners_greedy_verdict():
    """A runner's execute_greedy (the CUDA graph's verdict) returns tokens only: a batch with a request that
    wants logprobs goes through the logits and the rejection sampler instead."""
    greedy_steps = []

    class GreedyVerdictRunner(FakePagedRunner):
        def execute_greedy(self, batch):
            greedy_steps.append([r.request_id for r in batch.requests])
            return None  # no graph fits: the engine falls back to execute()

    engine = make_engine(runner=GreedyVerdictRunner(vocab_size=VOCAB))
    engine.add_request("plain", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
    collect(engine)
    assert greedy_steps  # the greedy path is taken where it may be
    greedy_steps.clear()
    engine.add_request("plain", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
    engine.add_request("lp", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True, logprobs=0))
    assert len(collect(engine)["lp"][1]) == 3
    assert greedy_steps == []


class AtenOps(TorchDispatchMode):
    """Records the name of every aten operator run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_steps_where_nobody_asked_do_no_logprob_work(temperature):
    def operators(logprobs: int | None) -> set[str]:
        reference = {"r": PROMPT + greedy_reference(PROMPT, 8, VOCAB)}
        engine = make_engine(OracleProposer(reference))
        engine.add_request("r", PROMPT, SamplingParams(max_tokens=8, temperature=temperature, logprobs=logprobs))
        with AtenOps() as ops:
            collect(engine)
        return ops.names

    logprob_work = {"_log_softmax", "topk"}
    assert logprob_work <= operators(logprobs=3)
    assert not logprob_work & operators(logprobs=None)

