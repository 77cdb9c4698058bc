"""Async scheduling (the next step scheduled and launched before this one's tokens reach the host) gives
exactly the output of synchronous stepping, with the fake paged runner (forced on: it is a CUDA default),
with and without drafts on either side of the overlap, whatever the proposer does."""
import time

import pytest

from specd.sampling import SamplingParams
from support.engine_runs import run
from support.fake_runner import FakePagedRunner
from support.fake_workload import MAX_TOKENS, PROMPTS, VOCAB, add_all, expected, greedy_references
from support.proposers import AdversarialProposer, FlakyProposer, OracleProposer
from verifier_service.engine.block_manager import BlockManager
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine.outputs import FinishReason
from verifier_service.engine.request import PENDING_TOKEN, Request
from verifier_service.engine.scheduler import Scheduler


@pytest.fixture(scope="module")
def references() -> dict[str, list[int]]:
    return greedy_references()


def make_engine(proposer=None, async_scheduling=True, **config) -> Engine:
    runner = FakePagedRunner(num_blocks=config.pop("num_blocks", 64), vocab_size=VOCAB)
    config.setdefault("max_num_batched_tokens", 16)
    return Engine(EngineConfig(async_scheduling=async_scheduling, **config), proposer=proposer, runner=runner)


def test_overlapped_steps_reproduce_plain_greedy(references):
    engine = make_engine()
    add_all(engine)
    assert run(engine) == expected(references)
    assert engine.runner.num_previous_tokens_fed > len(PROMPTS) * (MAX_TOKENS // 2)  # most steps overlapped
    assert engine.block_manager.num_used_blocks == 0 and not engine.scheduler.requests


def test_drafting_steps_overlap_and_continue_from_the_accepted_drafts(references):
    proposer = OracleProposer(references)
    engine = make_engine(proposer)
    add_all(engine)
    assert run(engine) == expected(references)
    stats = engine.take_step_stats()
    assert engine.runner.num_advances_fed > 0  # launched behind steps whose drafts were accepted
    assert sum(s.scheduled_ahead for s in stats) > len(stats) // 2
    # Guessed drafts (from a proposal covering the step in flight) are right when the oracle is: most accepted.
    spec = [s.spec_decoding for s in stats if s.spec_decoding]
    assert sum(s.num_accepted_tokens for s in spec) > 0.8 * sum(s.num_draft_tokens for s in spec)
    assert sorted(proposer.released) == sorted(PROMPTS)


@pytest.mark.parametrize("proposer_kind", ["adversarial", "flaky"])
def test_overlapped_steps_stay_exact_whatever_the_drafts(references, proposer_kind):
    proposer = (AdversarialProposer(references, VOCAB) if proposer_kind == "adversarial"
                else FlakyProposer(references, VOCAB, seed=3))
    engine = make_engine(proposer, max_draft_batch_size=3)
    add_all(engine)
    assert run(engine) == expected(references)
    assert engine.runner.num_previous_tokens_fed > len(PROMPTS) * (MAX_TOKENS // 2)
    assert engine.block_manager.num_used_blocks == 0 and not engine.scheduler.requests


def test_a_stop_token_in_flight_ends_the_output_with_nothing_after_it(references):
    continuation = expected(references)["r2"]
    stop = continuation[5]
    engine = make_engine()
    engine.add_request("r2", PROMPTS["r2"], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,)))
    engine.add_request("r4", PROMPTS["r4"], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    outputs = run(engine)
    assert outputs["r2"] == continuation[:continuation.index(stop) + 1]
    assert outputs["r4"] == expected(references)["r4"]
    assert engine.block_manager.num_used_blocks == 0
    assert engine.runner.num_previous_tokens_fed > 0  # steps did overlap


def test_max_tokens_and_max_model_len_stop_without_an_extra_step(references):
    engine = make_engine(max_model_len=len(PROMPTS["r1"]) + 6)
    engine.add_request("r1", PROMPTS["r1"], SamplingParams(max_tokens=100, ignore_eos=True))
    engine.add_request("r0", PROMPTS["r0"], SamplingParams(max_tokens=4, ignore_eos=True))
    finishes = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            finishes.setdefault(output.request_id, []).append(output.finish_reason)
    assert finishes["r1"][-1] == finishes["r0"][-1] == FinishReason.LENGTH
    computed = engine.runner.num_computed_tokens
    assert computed == len(PROMPTS["r1"]) + 5 + len(PROMPTS["r0"]) + 3  # the last token of each is never fed
    assert engine.runner.num_previous_tokens_fed > 0  # steps did overlap


def test_tiny_kv_budget_preempts_in_synchronous_steps_and_keeps_outputs(references):
    engine = make_engine(num_blocks=14)
    add_all(engine)
    assert run(engine) == expected(references)
    assert sum(step.num_preemptions for step in engine.take_step_stats()) > 0
    assert engine.block_manager.num_used_blocks == 0
    assert engine.runner.num_previous_tokens_fed > 0  # and overlapped where no one was preempted


def test_abort_while_a_step_is_in_flight_frees_blocks_and_spares_the_others(references):
    engine = make_engine()
    engine.add_request("a", PROMPTS["r5"], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", PROMPTS["r1"], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    received = 0
    for _ in range(4):
        received += sum(len(o.new_token_ids) for o in engine.step() if o.request_id == "a")
    assert engine._in_flight is not None and received > 0  # noqa: SLF001 - the case under test
    assert engine.abort("a")
    aborted = [o for o in engine.step() if o.request_id == "a"]
    # The token in flight for "a" is dropped: its usage counts only what it was sent.
    assert aborted[0].new_token_ids == [] and aborted[0].usage.completion_tokens == received
    outputs = run(engine)
    assert "a" not in outputs and len(outputs["b"]) > 0
    assert engine.block_manager.num_used_blocks == 0


def test_prefix_cache_hits_with_overlapped_steps(references):
    engine = make_engine()
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine.add_request("first", PROMPTS["r5"], params)
    first = run(engine)["first"]
    computed_once = engine.runner.num_computed_tokens
    engine.add_request("second", PROMPTS["r5"], params)
    assert run(engine)["second"] == first
    assert engine.runner.num_computed_tokens - computed_once == computed_once - 24
    assert engine.runner.num_previous_tokens_fed > 0  # steps did overlap


def test_seeded_sampling_is_the_same_with_and_without_overlap():
    """The same forwards in the same order, each position keyed alike (with drafts too: test_seeded_sampling)."""
    def sample(async_scheduling: bool) -> dict[str, list[int]]:
        engine = make_engine(async_scheduling=async_scheduling)
        for i, prompt in enumerate(PROMPTS.values()):
            engine.add_request(f"s{i}", prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.9,
                                                               seed=i, ignore_eos=True))
        outputs = run(engine)
        assert engine.runner.num_previous_tokens_fed > 0 or not async_scheduling
        return outputs

    assert sample(True) == sample(False)


def test_a_token_still_on_the_device_is_a_placeholder_that_usage_does_not_count():
    """Between schedule_ahead and update a request carries a placeholder for its token in flight: the next
    batch feeds it first, and an abort in that window (from another thread) reports only real output."""
    scheduler = Scheduler(BlockManager(16, 4, enable_prefix_caching=False), max_num_seqs=4, max_num_batched_tokens=64,
                          max_model_len=64, num_speculative_tokens=0, vocab_size=VOCAB)
    scheduler.add(Request("a", PROMPTS["r2"], SamplingParams(max_tokens=8), 0))
    prefill = scheduler.schedule()
    ahead = scheduler.schedule_ahead(prefill)
    request = scheduler.requests["a"]
    assert [s.token_ids for s in ahead.requests] == [[PENDING_TOKEN]]
    assert ahead.requests[0].start_position == len(PROMPTS["r2"]) == request.num_tokens - 1
    assert request.num_pending_tokens == 1 and request.usage().completion_tokens == 0
    assert scheduler.abort("a").usage().completion_tokens == 0
    assert scheduler.block_manager.num_used_blocks == 0


def test_every_forward_is_counted_once_in_the_step_stats(references):
    """specd_step_tokens observes each forward pass: a step that launches the next one ahead after a
    synchronous one launched two forwards, and both are there."""
    engine = make_engine()
    add_all(engine)
    run(engine)
    stats = engine.take_step_stats()
    forwards = [n for step in stats for n in step.forward_tokens]
    assert sum(forwards) == engine.runner.num_computed_tokens
    assert max(len(step.forward_tokens) for step in stats) == 2
    assert sum(step.scheduled_ahead for step in stats) > 0


def test_the_step_stats_count_the_prompt_tokens_each_step_fed():
    """What the stall log tells prompt steps from decode steps by: a prompt fed in one chunk counts all its
    tokens but the one a decode step would feed too, and no decode or verify step counts any."""
    engine = make_engine(OracleProposer(greedy_references()), max_num_batched_tokens=256, num_speculative_tokens=3)
    add_all(engine)
    run(engine)
    stats = engine.take_step_stats()
    assert sum(step.num_prompt_tokens for step in stats) == sum(len(prompt) - 1 for prompt in PROMPTS.values())
    assert [step.num_prompt_tokens > 0 for step in stats].count(True) == 1


def test_a_stop_token_reached_within_accepted_drafts_in_flight_ends_the_output_there(references):
    continuation = expected(references)["r2"]
    stop = continuation[7]
    engine = make_engine(OracleProposer(references))
    engine.add_request("r2", PROMPTS["r2"], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,)))
    engine.add_request("r4", PROMPTS["r4"], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    outputs = run(engine)
    assert outputs["r2"] == continuation[:continuation.index(stop) + 1]
    assert outputs["r4"] == expected(references)["r4"]
    assert engine.block_manager.num_used_blocks == 0
    assert engine.runner.num_advances_fed > 0


@pytest.mark.parametrize("max_tokens, max_model_len", [(7, 0), (100, 6), (1, 0)])
def test_length_limits_hold_with_drafts_in_flight(references, max_tokens, max_model_len):
    """Draft slots of a step launched ahead are capped for the case that the step in flight accepts all its
    drafts, and a request that step may finish is not scheduled ahead: never a token too many."""
    prompt = PROMPTS["r1"]
    engine = make_engine(OracleProposer(references), max_model_len=len(prompt) + max_model_len if max_model_len else 0)
    engine.add_request("r1", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    finishes = []
    while engine.has_unfinished_requests():
        finishes += [o for o in engine.step() if o.finished]
    length = min(max_tokens, max_model_len or max_tokens)
    assert [o.finish_reason for o in finishes] == [FinishReason.LENGTH]
    assert finishes[0].usage.completion_tokens == length
    assert engine.block_manager.num_used_blocks == 0


def test_abort_while_a_step_with_drafts_is_in_flight(references):
    engine = make_engine(OracleProposer(references))
    engine.add_request("r5", PROMPTS["r5"], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    engine.add_request("r1", PROMPTS["r1"], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    received: dict[str, list[int]] = {"r5": [], "r1": []}

    def drafts_in_flight_for_r5() -> bool:
        in_flight = engine._in_flight  # noqa: SLF001 - the case under test
        return in_flight is not None and any(r.request_id == "r5" and r.num_draft_tokens
                                             for r in in_flight.batch.requests)

    for _ in range(MAX_TOKENS):
        for output in engine.step():
            received[output.request_id] += output.new_token_ids
        if received["r5"] and drafts_in_flight_for_r5():
            break
    assert drafts_in_flight_for_r5()
    assert engine.abort("r5")
    step = engine.step()
    received["r1"] += [t for o in step if o.request_id == "r1" for t in o.new_token_ids]
    aborted = [o for o in step if o.request_id == "r5"]
    # The tokens in flight for r5 are dropped: its usage counts only what it was sent.
    assert aborted[0].new_token_ids == [] and aborted[0].usage.completion_tokens == len(received["r5"])
    assert received["r5"] == expected(references)["r5"][:len(received["r5"])]
    outputs = run(engine)
    assert "r5" not in outputs and received["r1"] + outputs["r1"] == expected(references)["r1"]
    assert engine.block_manager.num_used_blocks == 0


def test_usage_reports_the_k_a_request_ran_with(references):
    engine = make_engine(OracleProposer(references), num_speculative_tokens=4, max_speculative_tokens=6)
    for rid, k in (("r1", None), ("r2", 2), ("r3", 50), ("r4", 0)):
        engine.add_request(rid, PROMPTS[rid], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                                             num_speculative_tokens=k))
    usage = {}
    while engine.has_unfinished_requests():
        usage.update({o.request_id: o.usage for o in engine.step() if o.finished})
    assert {rid: u.num_speculative_tokens for rid, u in usage.items()} == {"r1": 4, "r2": 2, "r3": 6, "r4": 0}
    assert usage["r4"].draft_tokens == 0 and usage["r3"].accepted_tokens > usage["r2"].accepted_tokens


def test_every_draft_request_carries_its_tenant_key_also_when_asked_ahead(references):
    asked: list[tuple[str, str]] = []

    class TenantRecordingOracle(OracleProposer):
        def propose(self, requests):
            asked.extend((r.request_id, r.tenant_key) for r in requests)
            return super().propose(requests)

    engine = make_engine(TenantRecordingOracle(references))
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                                              tenant_key=f"tenant-of-{request_id}"))
    assert run(engine) == expected(references)
    assert sum(s.scheduled_ahead for s in engine.take_step_stats()) > 0  # lookahead requests were asked
    assert asked and all(tenant == f"tenant-of-{request_id}" for request_id, tenant in asked)


class NeverInTimeProposer(OracleProposer):
    """Offers begin_propose, whose answer is never there when collected without waiting, and takes a second when
    waited for: a drafter that is always late."""

    def __init__(self, references) -> None:
        super().__init__(references)
        self.waited = 0

    def begin_propose(self, requests):
        proposer = self

        class Late:
            def result(self, wait: bool = True):
                if wait:
                    proposer.waited += 1
                    time.sleep(1.0)
                return {}
        return Late()


def test_steps_launched_ahead_never_wait_for_the_proposer(references):
    """A late drafter costs the drafts, not the step: the only waits are the synchronous steps' (the prefill's)."""
    proposer = NeverInTimeProposer(references)
    engine = make_engine(proposer)
    add_all(engine)
    assert run(engine) == expected(references)
    stats = engine.take_step_stats()
    assert sum(s.scheduled_ahead for s in stats) > len(stats) // 2
    assert proposer.waited <= sum(not s.scheduled_ahead for s in stats)
    assert sum(s.stage_seconds.get("propose", 0.0) for s in stats if s.scheduled_ahead) < 0.05 * len(stats)
