"""Draft slots: large batches draft not at all, every other decoding request gets its k (clamped to
max_speculative_tokens) in every step, rejected drafts do not back a request off, and output stays plain
greedy's whatever is drafted."""
import pytest

from support.engine_runs import run
from support.fake_runner import FakePagedRunner, greedy_reference
from support.proposers import AdversarialProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.draft_policy import DraftPolicy, DraftPolicyConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine.sampling_params import InvalidParameter, SamplingParams

K = 4


def test_no_drafts_in_steps_with_more_running_requests_than_the_limit():
    policy = DraftPolicy(DraftPolicyConfig(max_batch_size=32))
    assert [policy.allows(33) for _ in range(10)] == [False] * 10
    assert policy.num_skipped == 10
    assert policy.allows(32) and policy.allows(1) and policy.num_skipped == 10
    assert DraftPolicy(DraftPolicyConfig(max_batch_size=0)).allows(10_000)


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


def test_rejected_drafts_do_not_stop_a_request_from_drafting(references):
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
