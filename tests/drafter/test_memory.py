"""The memory of earlier outputs, on every store built here: what it remembers, for whom, and how much.

(tests/drafter/test_native_store.py checks every draft against a brute-force reading of the rules; these
pin the behaviours one at a time.)
"""
from __future__ import annotations

import pytest

from drafter_service.batch import ProposeBatch, SequenceDelta
from drafter_service.config import DrafterConfig
from drafter_service.drafter import Drafter
from drafter_service.stores import BACKENDS

PROMPT = [1, 2, 3]
OUTPUT = list(range(100, 112))
OTHER_PROMPT = [7, 8]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def finish(session, sequence_id: str, output=OUTPUT, tenant: str = "") -> None:
    """A request as a verifier sends it: first sight (prompt + the prefill's token), the rest, release."""
    session.step(ProposeBatch.from_deltas(0, [SequenceDelta(sequence_id, 0, PROMPT + output[:1], 0,
                                                            tenant_key=tenant)]))
    session.step(ProposeBatch.from_deltas(0, [SequenceDelta(sequence_id, len(PROMPT) + 1, output[1:], 0)]))
    session.step(ProposeBatch.from_deltas(0, [], released_sequence_ids=[sequence_id]))


def draft(session, sequence_id: str, context, k: int = 4, tenant: str = "") -> tuple[list[int], int]:
    """(draft, tokens of it from the memory) for a fresh sequence with this context."""
    reply = session.step(ProposeBatch.from_deltas(0, [SequenceDelta(sequence_id, 0, context, k, tenant_key=tenant)]))
    return reply.drafts()[0], reply.memory_draft_tokens


def test_a_released_output_drafts_another_sequence_that_starts_it_again(backend):
    session = Drafter(DrafterConfig(), backend).open_session()
    finish(session, "first")
    assert draft(session, "second", OTHER_PROMPT + OUTPUT[:6]) == (OUTPUT[6:10], 4)


def test_the_end_of_the_prompt_is_remembered_with_the_output_so_the_first_tokens_draft_too(backend):
    session = Drafter(DrafterConfig(), backend).open_session()
    finish(session, "first")
    # right after the prefill of the same prompt: the memory knows what followed it
    assert draft(session, "second", PROMPT + OUTPUT[:1])[0] == OUTPUT[1:5]


def test_without_evidence_there_are_no_drafts(backend):
    session = Drafter(DrafterConfig(), backend).open_session()
    finish(session, "first")
    assert draft(session, "second", [50, 51, 52, 53]) == ([], 0)


def test_scope_off_remembers_nothing(backend):
    drafter = Drafter(DrafterConfig(memory_scope="off"), backend)
    finish(drafter.open_session(), "first")
    assert drafter.store.memory_tokens == 0
    assert draft(drafter.open_session(), "second", OTHER_PROMPT + OUTPUT[:6]) == ([], 0)


def test_per_key_scope_drafts_only_from_the_same_keys_outputs(backend):
    drafter = Drafter(DrafterConfig(memory_scope="per-key"), backend)
    session = drafter.open_session()
    finish(session, "first", tenant="alice")
    assert draft(session, "bob's", OTHER_PROMPT + OUTPUT[:6], tenant="bob") == ([], 0)
    assert draft(session, "anonymous", OTHER_PROMPT + OUTPUT[:6]) == ([], 0)
    assert draft(session, "alice's", OTHER_PROMPT + OUTPUT[:6], tenant="alice") == (OUTPUT[6:10], 4)


def test_global_scope_ignores_tenant_keys(backend):
    session = Drafter(DrafterConfig(memory_scope="global"), backend).open_session()
    finish(session, "first", tenant="alice")
    assert draft(session, "bob's", OTHER_PROMPT + OUTPUT[:6], tenant="bob") == (OUTPUT[6:10], 4)


def test_the_memory_holds_at_most_its_budget_and_forgets_the_oldest_outputs_first(backend):
    budget = 40
    drafter = Drafter(DrafterConfig(max_memory_tokens=budget), backend)
    session = drafter.open_session()
    outputs = [list(range(1000 * i, 1000 * i + 12)) for i in range(1, 8)]  # 15 tokens each with the lead-in
    for number, output in enumerate(outputs):
        finish(session, f"r{number}", output)
        assert 0 < drafter.store.memory_tokens <= budget
    assert draft(session, "old", OTHER_PROMPT + outputs[0][:6]) == ([], 0)
    assert draft(session, "new", OTHER_PROMPT + outputs[-1][:6])[0] == outputs[-1][6:10]


def test_sequences_dropped_without_a_release_are_not_remembered(backend):
    drafter = Drafter(DrafterConfig(max_tokens_held=20), backend)
    closed = drafter.open_session()
    closed.step(ProposeBatch.from_deltas(0, [SequenceDelta("r", 0, PROMPT + OUTPUT, 0)]))
    closed.close()  # its stream ended: the verifier will resend it elsewhere
    session = drafter.open_session()
    session.step(ProposeBatch.from_deltas(0, [SequenceDelta("evicted", 0, PROMPT, 0)]))
    session.step(ProposeBatch.from_deltas(0, [SequenceDelta("evicted", 3, OUTPUT, 0)]))
    session.step(ProposeBatch.from_deltas(0, [SequenceDelta("big", 0, list(range(500, 519)), 0)]))  # evicts it
    session.step(ProposeBatch.from_deltas(0, [], released_sequence_ids=["evicted"]))
    assert drafter.store.memory_tokens == 0


def test_a_draft_stops_where_the_evidence_runs_out_and_a_zero_threshold_fills_every_slot(backend):
    context = [5, 6, 7, 8, 9, 5]  # one earlier occurrence of "5", matched by one token
    cautious = Drafter(DrafterConfig(memory_scope="off"), backend).open_session()
    eager = Drafter(DrafterConfig(memory_scope="off", min_draft_probability=0.0), backend).open_session()
    assert draft(cautious, "s", context, k=8)[0] == [6, 7]  # chances 0.35, 0.35 * 0.545, then * 0.68 < 0.15
    assert draft(eager, "s", context, k=8)[0] == [6, 7, 8, 9, 5, 6, 7, 8]  # the copy, continued periodically
