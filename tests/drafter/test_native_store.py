"""The native (C++) sequence store does what the Python reference store does, batch for batch.

Random runs of steps (fresh, in-step, out-of-step and unknown deltas; releases; closed sessions; a
budget small enough to evict) go to a Drafter on each store; every reply, the held contexts and the
counters must agree, and every draft must be what the brute-force rule gives for the held context.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drafter_service.batch import ProposeBatch, SequenceDelta
from drafter_service.config import DrafterConfig
from drafter_service.drafter import Drafter
from drafter_service.stores import BACKENDS
from support.ngram_reference import brute_force_propose

pytestmark = pytest.mark.skipif("native" not in BACKENDS, reason="the native store is not built")

SEQUENCE_IDS = ["a", "b", "c", "dé"]  # a non-ASCII id goes through UTF-8 keys
tokens = st.one_of(st.integers(0, 3), st.sampled_from([2**31 - 1, -(2**31), -1, 49151]))
delta = st.tuples(st.sampled_from(SEQUENCE_IDS), st.sampled_from(["held", "fresh", "wrong"]),
                  st.lists(tokens, max_size=12), st.integers(0, 9), st.integers(0, 6), st.integers(0, 6))
step = st.tuples(st.integers(0, 1), st.lists(delta, max_size=5), st.lists(st.sampled_from(SEQUENCE_IDS),
                                                                          max_size=2), st.booleans())
configs = st.builds(lambda low, extra, cap, budget: DrafterConfig(
    min_ngram=low, max_ngram=low + extra, max_draft_tokens=cap, max_tokens_held=budget),
    st.integers(1, 3), st.integers(0, 3), st.integers(1, 8), st.integers(1, 60))


def _start(mode: str, held: list[int] | None) -> int:
    if mode == "fresh" or (mode == "held" and held is None):
        return 0
    return len(held) if mode == "held" else len(held or []) + 1


@settings(max_examples=300, deadline=None)
@given(config=configs, steps=st.lists(step, max_size=25))
def test_native_and_python_stores_answer_every_batch_alike(config, steps):
    drafters = {name: Drafter(config, name) for name in ("native", "python")}
    sessions = {name: [d.open_session(), d.open_session()] for name, d in drafters.items()}
    for step_id, (which, deltas, released, close_after) in enumerate(steps):
        reference = sessions["python"][which]
        batch = ProposeBatch.from_deltas(step_id, [
            SequenceDelta(i, _start(mode, reference.held_tokens(i)), new, k, low, high)
            for i, mode, new, k, low, high in deltas], released)
        native, python = (sessions[name][which].step(batch) for name in ("native", "python"))
        assert (native.draft_counts, native.draft_token_ids, native.resync_sequence_ids) == (
            python.draft_counts, python.draft_token_ids, python.resync_sequence_ids)
        columns = zip(batch.sequence_ids, native.drafts(), batch.num_draft_tokens, batch.min_ngrams,
                      batch.max_ngrams)
        for position, (sequence_id, draft, k, low, high) in enumerate(columns):
            held = sessions["native"][which].held_tokens(sequence_id)
            last = sequence_id not in batch.sequence_ids[position + 1:]  # held is what its last delta left
            if last and sequence_id not in native.resync_sequence_ids and held is not None:
                low, high = max(low or config.min_ngram, 1), min(high or config.max_ngram, config.max_ngram)
                assert draft == brute_force_propose(held, min(k, config.max_draft_tokens), low, high)
        for sequence_id in SEQUENCE_IDS:
            assert [s.held_tokens(sequence_id) for s in sessions["native"]] == [
                s.held_tokens(sequence_id) for s in sessions["python"]]
        if close_after:
            for name in sessions:
                sessions[name][which].close()
        stores = [drafters[name].store for name in ("native", "python")]
        assert len({(len(s), s.total_tokens, s.num_evicted) for s in stores}) == 1


def test_a_long_context_drafts_like_the_reference_at_every_step():
    config = DrafterConfig(min_ngram=1, max_ngram=4)
    session = Drafter(config, "native").open_session()
    context = [i % 97 for i in range(3000)] + [5, 6, 7, 8, 5, 6]
    session.step(ProposeBatch.from_deltas(0, [SequenceDelta("s", 0, context, 0)]))
    for step_id, token in enumerate([7, 8, 1, 2, 3, 1, 2], start=1):
        delta = SequenceDelta("s", len(context), [token], num_draft_tokens=6)
        reply = session.step(ProposeBatch.from_deltas(step_id, [delta]))
        context.append(token)
        assert reply.drafts() == [brute_force_propose(context, 6, 1, 4)]


def test_columns_that_do_not_line_up_are_refused_before_anything_changes():
    drafter = Drafter(DrafterConfig(), "native")
    bad = ProposeBatch(1, ["a", "b"], [0, 0], [2, 2], [1, 2, 3], [1, 1])
    with pytest.raises(ValueError, match="new_token_ids"):
        drafter.open_session().step(bad)
    assert len(drafter.store) == 0


def test_the_drafter_runs_the_native_store_unless_told_otherwise(monkeypatch):
    """Where it is built (make install builds it), production gets the native store, not the 10x slower fallback."""
    monkeypatch.delenv("SPECD_DRAFTER_STORE", raising=False)
    assert Drafter(DrafterConfig()).store_backend == "native"
