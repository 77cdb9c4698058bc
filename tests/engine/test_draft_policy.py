"""The drafting policy: rejected drafts back a request off (doubling, aligned probes), accepted drafts keep
it drafting, large batches draft not at all; and with the policy on, output stays plain greedy's."""
import pytest

from support.engine_runs import run
from support.fake_runner import FakePagedRunner, greedy_reference
from support.proposers import AdversarialProposer, OracleProposer
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.draft_policy import DraftBackoff, DraftPolicy, DraftPolicyConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine.sampling_params import InvalidParameter, SamplingParams

K = 4


def drafting_steps(policy: DraftPolicy, state: DraftBackoff, num_steps: int, accepted: int,
                   num_running: int = 1) -> list[int]:
    """Steps (1-based) in which the request drafted, each of its K drafts verified with `accepted` accepted."""
    steps = []
    for _ in range(num_steps):
        policy.begin_step(num_running)
        if policy.allows(state):
            steps.append(policy.step)
            policy.observe(state, K, accepted)
    return steps


def test_rejected_drafts_back_off_with_doubling_pauses_up_to_the_cap():
    policy = DraftPolicy(DraftPolicyConfig(max_backoff=16))
    steps = drafting_steps(policy, DraftBackoff(), 200, accepted=0)
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert steps[:2] == [1, 2]  # a new request drafts until its acceptance EMA falls below the threshold
    assert gaps == sorted(gaps)  # pauses only grow while every probe fails
    assert max(gaps) == gaps[-1] == 16  # at the cap, one probe every max_backoff steps
    assert len(steps) < 200 / 16 + 8
    assert policy.num_skipped == 200 - len(steps)


def test_accepted_drafts_keep_the_request_drafting_every_step():
    policy = DraftPolicy()
    assert drafting_steps(policy, DraftBackoff(), 50, accepted=2) == list(range(1, 51))
    assert policy.num_skipped == 0


def test_a_successful_probe_ends_the_backoff():
    policy, state = DraftPolicy(DraftPolicyConfig(max_backoff=8)), DraftBackoff()
    drafting_steps(policy, state, 60, accepted=0)
    assert state.backoff == 8
    steps = drafting_steps(policy, state, 30, accepted=K)  # the drafter starts matching
    assert state.backoff == 0
    assert steps[-10:] == list(range(policy.step - 9, policy.step + 1))


def test_requests_backed_off_alike_probe_in_the_same_steps():
    policy = DraftPolicy(DraftPolicyConfig(max_backoff=32))
    early, late = DraftBackoff(), DraftBackoff()
    early_steps, late_steps = [], []
    for _ in range(400):
        policy.begin_step(2)
        for state, steps in ((early, early_steps), (late, late_steps)):
            if state is late and policy.step < 37:
                continue  # `late` arrives at step 37
            if policy.allows(state):
                steps.append(policy.step)
                policy.observe(state, K, 0)
    assert early_steps[-4:] == late_steps[-4:]  # once both sit at the cap, one padded step serves both
    assert all(step % 32 == 0 for step in early_steps[-4:])


def test_no_drafts_in_steps_with_more_running_requests_than_the_limit():
    policy = DraftPolicy(DraftPolicyConfig(max_batch_size=32))
    state = DraftBackoff()
    assert drafting_steps(policy, state, 10, accepted=K, num_running=33) == []
    assert policy.num_skipped == 10
    assert drafting_steps(policy, state, 3, accepted=K, num_running=32) == [11, 12, 13]
    assert drafting_steps(DraftPolicy(DraftPolicyConfig(max_batch_size=0)), state, 2, K, 10_000) == [1, 2]


@pytest.mark.parametrize("num_running", [1, 33])
def test_may_allow_next_predicts_the_next_steps_decision_without_counting(num_running):
    """Async scheduling asks before a step whether anyone could draft in it (a backed-off request only at
    its probes); the answer must match what allows() then decides, and leave the skip count alone."""
    policy, state = DraftPolicy(DraftPolicyConfig(max_backoff=16)), DraftBackoff()
    predicted, decided = [], []
    for _ in range(100):
        skipped = policy.num_skipped
        predicted.append(policy.may_allow_next(state, num_running))
        assert policy.num_skipped == skipped
        policy.begin_step(num_running)
        decided.append(policy.allows(state))
        if decided[-1]:
            policy.observe(state, K, 0)
    assert predicted == decided
    assert any(predicted) == (num_running <= 32) and not all(predicted)


@pytest.mark.parametrize("field, value", [("min_acceptance", 1.5), ("smoothing", 0.0), ("max_backoff", 0),
                                          ("max_batch_size", -1)])
def test_bad_policy_settings_are_rejected_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        DraftPolicyConfig(**{field: value})
    if field == "max_batch_size":
        with pytest.raises(InvalidParameter, match="max_draft_batch_size"):
            EngineConfig(max_draft_batch_size=value)


VOCAB, MAX_TOKENS = 32, 60
PROMPTS = {f"r{i}": [(5 * i + j * j) % VOCAB for j in range(4 + 3 * i)] for i in range(4)}


def generate(proposer, **config) -> tuple[dict[str, list[int]], Engine]:
    engine = Engine(EngineConfig(num_speculative_tokens=K, **config), proposer=proposer,
                    runner=FakePagedRunner(num_blocks=64, vocab_size=VOCAB))
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return run(engine), engine


@pytest.fixture(scope="module")
def references() -> dict[str, list[int]]:
    return {rid: prompt + greedy_reference(prompt, MAX_TOKENS + K, VOCAB) for rid, prompt in PROMPTS.items()}


def test_the_engine_backs_off_rejected_drafts_without_changing_output(references):
    expected = {rid: ref[len(PROMPTS[rid]):][:MAX_TOKENS] for rid, ref in references.items()}
    always, _ = generate(AdversarialProposer(references, VOCAB), adaptive_drafting=False)
    adaptive_proposer = AdversarialProposer(references, VOCAB)
    adaptive, engine = generate(adaptive_proposer)
    assert always == adaptive == expected
    stats = engine.take_step_stats()
    drafted = sum(s.spec_decoding.num_drafts for s in stats if s.spec_decoding)
    skipped = sum(s.num_draft_skips for s in stats)
    assert 0 < drafted < skipped  # a few probes, most decode steps without drafts
    assert drafted + skipped == len(PROMPTS) * (MAX_TOKENS - 2)  # decode steps with room for a draft


def test_the_engine_keeps_drafting_while_drafts_are_accepted(references):
    outputs, engine = generate(OracleProposer(references))
    assert outputs == {rid: ref[len(PROMPTS[rid]):][:MAX_TOKENS] for rid, ref in references.items()}
    assert sum(s.num_draft_skips for s in engine.take_step_stats()) == 0
