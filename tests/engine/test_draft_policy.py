"""Draft slots: large batches draft not at all; below that each step gets the drafts that pay in measured
goodput at its batch size (k where nothing is measured yet); a request's own k still caps it; and output stays
plain greedy's whatever is drafted."""
import time

import pytest

from specd.sampling import InvalidParameter, SamplingParams
from support.engine_runs import run
from support.fake_runner import FakePagedRunner, greedy_reference
from support.proposers import AdversarialProposer, OracleProposer
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.draft_policy import DraftPolicy, DraftPolicyConfig
from verifier_service.engine.engine import Engine

K = 4
GOODPUT = DraftPolicyConfig(goodput=True)


def test_no_drafts_in_steps_with_more_running_requests_than_the_limit():
    policy = DraftPolicy(DraftPolicyConfig(max_batch_size=32))
    assert [policy.allowed_drafts(33, K) for _ in range(10)] == [0] * 10
    assert policy.num_skipped == 10
    assert policy.allowed_drafts(32, K) == K and policy.allowed_drafts(1, K) == K and policy.num_skipped == 10
    assert DraftPolicy(DraftPolicyConfig(max_batch_size=0)).allowed_drafts(10_000, K) == K


def decode_step(batch_size: int, drafts: int) -> ScheduledBatch:
    return ScheduledBatch([ScheduledRequest(f"r{i}", [1] * (1 + drafts), 10, [0], drafts, 1 + drafts)
                           for i in range(batch_size)])


def teach(policy: DraftPolicy, batch_size: int, width_seconds: dict[int, float], accepted: list[int], steps: int = 40):
    """Steps of every width in width_seconds, the requests accepting `accepted` drafts in turn."""
    for step in range(steps):
        for width, seconds in width_seconds.items():
            counts = [min(accepted[(step + i) % len(accepted)], width - 1) for i in range(batch_size)]
            policy.observe(decode_step(batch_size, width - 1), counts, seconds)


def test_with_nothing_measured_a_request_gets_its_k():
    policy = DraftPolicy(GOODPUT)
    assert policy.cap(1, K) == K and policy.cap(16, 2) == 2


def test_drafts_that_are_accepted_and_cheap_to_score_stay():
    """A memory-bound step (H200, default model: verify k = 4 at 1.12x decode); 0 to 4 drafts accepted in turn."""
    policy = DraftPolicy(GOODPUT)
    teach(policy, 1, {1: 0.63e-3, 5: 0.71e-3}, accepted=[0, 1, 2, 3, 4])
    assert policy.cap(1, K) == K


def test_drafts_that_do_not_pay_are_turned_off_but_looked_at_again():
    """A compute-bound batch: a verify step costs 3x decode, and drafts are rarely accepted."""
    policy = DraftPolicy(DraftPolicyConfig(goodput=True, explore_every=8))
    teach(policy, 16, {1: 1e-3, 5: 3e-3}, accepted=[0])
    caps = []
    for _ in range(16):
        caps.append(policy.allowed_drafts(16, K))
        policy.observe(decode_step(16, caps[-1]), [0] * 16, 1e-3 if caps[-1] == 0 else 3e-3)
    assert caps.count(K) == 2 and caps.count(0) == 14  # one step in 8 explores
    assert policy.num_skipped == 14
    assert policy.cap(1, K) == K  # other batch sizes keep their own costs: nothing measured at batch 1


def test_the_cap_is_where_goodput_peaks():
    """Acceptance that falls with the position, a cost that rises with the width: 2 drafts pay best."""
    policy = DraftPolicy(GOODPUT)
    for _ in range(40):
        for width, seconds in {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.8, 5: 2.4}.items():
            accepted = [min(width - 1, 2)] * 4  # positions 0-1 always accepted, 2-3 never
            policy.observe(decode_step(4, width - 1), accepted, seconds)
    assert policy.cap(4, K) == 2


def test_plain_steps_are_measured_first_where_only_drafting_ones_were():
    policy = DraftPolicy(GOODPUT)
    teach(policy, 4, {5: 2e-3}, accepted=[0], steps=64)
    caps = []
    for _ in range(12):
        caps.append(policy.cap(4, K))
        policy.observe(decode_step(4, caps[-1]), [0] * 4, 1e-3 if caps[-1] == 0 else 2e-3)
    assert caps[:8] == [0] * 8 and caps[8:] == [0] * 4  # then drafts that are never accepted stay off


def test_steps_with_a_prompt_chunk_teach_nothing():
    """Drafts never accepted, cheap to score: off. Had the 1 s steps with a prompt chunk counted as plain
    decoding, drafting would have looked cheaper."""
    policy = DraftPolicy(GOODPUT)
    chunk = ScheduledRequest("p", [1] * 64, 0, [0], 0, 1)
    for _ in range(40):
        policy.observe(ScheduledBatch([chunk] + decode_step(3, 0).requests), [0] * 4, 1.0)
        policy.observe(decode_step(4, 0), [0] * 4, 1e-3)
        policy.observe(decode_step(4, 4), [0] * 4, 1.1e-3)
    assert policy.cap(4, K) == 0


def test_bad_policy_settings_are_rejected_by_name():
    with pytest.raises(ValueError, match="max_batch_size"):
        DraftPolicyConfig(max_batch_size=-1)
    with pytest.raises(InvalidParameter, match="max_draft_batch_size"):
        EngineConfig(max_draft_batch_size=-1)


@pytest.mark.parametrize("num_speculative_tokens, max_speculative_tokens",
                         [(5, 4), (-1, None), (4, 33)])
def test_bad_speculative_token_limits_are_rejected_by_name(num_speculative_tokens, max_speculative_tokens):
    field = "num_speculative_tokens" if num_speculative_tokens < 0 else "max_speculative_tokens"
    with pytest.raises(InvalidParameter, match=field):
        EngineConfig(num_speculative_tokens=num_speculative_tokens, max_speculative_tokens=max_speculative_tokens)


def test_the_limit_defaults_to_eight_or_the_default_k():
    assert EngineConfig(num_speculative_tokens=4).speculative_tokens_limit == 8
    assert EngineConfig(num_speculative_tokens=12).speculative_tokens_limit == 12
    assert EngineConfig(num_speculative_tokens=4, max_speculative_tokens=6).speculative_tokens_limit == 6


VOCAB, MAX_TOKENS = 32, 60
PROMPTS = {f"r{i}": [(5 * i + j * j) % VOCAB for j in range(4 + 3 * i)] for i in range(4)}


def generate(proposer, params=None, **config) -> tuple[dict[str, list[int]], Engine]:
    engine = Engine(EngineConfig(num_speculative_tokens=K, **config), proposer=proposer,
                    runner=FakePagedRunner(num_blocks=128, vocab_size=VOCAB))
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, params or SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return run(engine), engine


@pytest.fixture(scope="module")
def references() -> dict[str, list[int]]:
    return {rid: prompt + greedy_reference(prompt, MAX_TOKENS + 40, VOCAB) for rid, prompt in PROMPTS.items()}


def expected(references):
    return {rid: ref[len(PROMPTS[rid]):][:MAX_TOKENS] for rid, ref in references.items()}


def test_rejected_drafts_do_not_stop_a_request_from_drafting_under_the_batch_size_policy(references):
    outputs, engine = generate(AdversarialProposer(references, VOCAB))
    assert outputs == expected(references)
    stats = engine.take_step_stats()
    assert sum(s.num_draft_skips for s in stats) == 0
    drafted = sum(s.spec_decoding.num_drafts for s in stats if s.spec_decoding)
    assert drafted == len(PROMPTS) * (MAX_TOKENS - 2)  # every decode step with room for a draft


def test_the_batch_size_rule_keeps_large_steps_draft_free(references):
    engine = Engine(EngineConfig(num_speculative_tokens=K, max_draft_batch_size=2), OracleProposer(references),
                    runner=FakePagedRunner(num_blocks=128, vocab_size=VOCAB))
    lengths = {rid: 10 if rid in ("r0", "r1") else MAX_TOKENS for rid in PROMPTS}  # two finish early
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=lengths[rid], ignore_eos=True))
    assert run(engine) == {rid: out[:lengths[rid]] for rid, out in expected(references).items()}
    stats = engine.take_step_stats()
    assert all(s.spec_decoding is None for s in stats if s.num_draft_skips)
    assert sum(s.num_draft_skips for s in stats) > 0 and any(s.spec_decoding for s in stats)


@pytest.mark.parametrize("asked, used", [(None, K), (0, 0), (2, 2), (7, 7), (30, 8)])
def test_a_request_gets_the_drafts_it_asks_for_up_to_the_limit(references, asked, used):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, num_speculative_tokens=asked)
    outputs, engine = generate(OracleProposer(references), params, max_speculative_tokens=8)
    assert outputs == expected(references)
    stats = [s.spec_decoding for s in engine.take_step_stats() if s.spec_decoding]
    longest = max((len(s.num_accepted_tokens_per_pos) for s in stats), default=0)
    assert longest == used  # the oracle fills every slot: the widest draft is the request's k


class WidthTimedRunner(FakePagedRunner):
    """The fake model on a device where every token fed costs: a forward takes 1 ms and 0.1 ms a token."""

    def execute(self, batch):
        time.sleep(1e-3 + 1e-4 * sum(r.num_tokens for r in batch.requests))
        return super().execute(batch)


def test_an_engine_stops_scoring_drafts_that_cost_more_than_they_bring():
    long_references = {rid: prompt + greedy_reference(prompt, 240, VOCAB) for rid, prompt in PROMPTS.items()}
    engine = Engine(EngineConfig(num_speculative_tokens=K, draft_goodput=True),
                    AdversarialProposer(long_references, VOCAB),
                    runner=WidthTimedRunner(num_blocks=128, vocab_size=VOCAB))
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=200, ignore_eos=True))
    assert run(engine) == {rid: ref[len(PROMPTS[rid]):][:200] for rid, ref in long_references.items()}
    stats = engine.take_step_stats()
    at_four = [bool(s.spec_decoding) for s in stats if s.num_running == 4]  # (the tail runs fewer: new batch sizes)
    assert all(at_four[1:60]) and at_four[-40:].count(True) <= 1  # drafts until measured, then off (but a look)
    assert sum(s.num_draft_skips for s in stats) > 0


def test_an_engine_keeps_drafts_that_pay():
    long_references = {rid: prompt + greedy_reference(prompt, 400, VOCAB) for rid, prompt in PROMPTS.items()}
    engine = Engine(EngineConfig(num_speculative_tokens=K, draft_goodput=True), OracleProposer(long_references),
                    runner=WidthTimedRunner(num_blocks=128, vocab_size=VOCAB))
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=200, ignore_eos=True))
    outputs = run(engine)
    assert outputs == {rid: ref[len(PROMPTS[rid]):][:200] for rid, ref in long_references.items()}
    stats = engine.take_step_stats()
    plain = [s for s in stats if s.num_draft_skips]
    # Drafts in every step but the 8 plain ones that measure the baseline after 64 steps at a batch size.
    assert len(plain) <= 8 * 2 and {s.num_running for s in plain} <= {4, 3, 2, 1}
    assert sum(s.num_output_tokens for s in stats) / len(stats) > 3
