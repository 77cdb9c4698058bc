"""Per-sequence state: deltas, re-sync on a mismatch, release, LRU eviction by tokens held.

The store-level tests use the Python store (the reference); the batch-level ones run on every
backend built here (tests/drafter/test_native_store.py compares the two under hypothesis).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from drafter_service.batch import ProposeBatch, SequenceDelta
from drafter_service.config import DrafterConfig
from drafter_service.drafter import Drafter
from drafter_service.state import SequenceStore
from drafter_service.stores import BACKENDS, resolve_backend


def test_deltas_extend_the_held_context():
    store = SequenceStore(DrafterConfig(max_ngram=4, max_tokens_held=100))
    store.apply("a", 0, [1, 2, 3])
    index = store.apply("a", 3, [1, 2]).index
    assert index.tokens == [1, 2, 3, 1, 2]
    assert index.propose(2) == [3, 1]
    assert store.total_tokens == 5


def test_start_zero_replaces_the_context():
    store = SequenceStore(DrafterConfig(max_ngram=4, max_tokens_held=100))
    store.apply("a", 0, [1, 2, 3])
    assert store.apply("a", 0, [9, 9]).index.tokens == [9, 9]
    assert store.total_tokens == 2


def test_a_start_that_does_not_match_asks_for_resync_and_drops_the_sequence():
    store = SequenceStore(DrafterConfig(max_ngram=4, max_tokens_held=100))
    store.apply("a", 0, [1, 2, 3])
    assert store.apply("a", 2, [7]) is None
    assert "a" not in store and store.total_tokens == 0
    assert store.apply("a", 3, [4]) is None  # still unknown until it is sent whole
    assert store.apply("a", 0, [1, 2, 3, 4]).index.tokens == [1, 2, 3, 4]


def test_an_unknown_sequence_asks_for_resync():
    store = SequenceStore(DrafterConfig(max_ngram=4, max_tokens_held=100))
    assert store.apply("never-seen", 5, [1]) is None


def test_release_forgets_and_ignores_unknown_ids():
    store = SequenceStore(DrafterConfig(max_ngram=4, max_tokens_held=100))
    store.apply("a", 0, [1, 2, 3])
    store.release("a")
    store.release("unknown")
    assert len(store) == 0 and store.total_tokens == 0


def test_eviction_drops_the_least_recently_used_until_the_budget_holds():
    store = SequenceStore(DrafterConfig(max_ngram=4, max_tokens_held=10))
    store.apply("old", 0, [1] * 4)
    store.apply("used", 0, [2] * 4)
    store.apply("old", 4, [1])  # "old" is now the most recently used
    store.apply("new", 0, [3] * 4)  # 13 tokens > 10: "used" goes first
    assert "used" not in store and "old" in store and "new" in store
    assert store.total_tokens == 9 and store.num_evicted == 1


def test_a_sequence_bigger_than_the_budget_is_not_held():
    store = SequenceStore(DrafterConfig(max_ngram=4, max_tokens_held=3))
    assert store.apply("huge", 0, [1, 2, 3, 4]) is None
    assert store.total_tokens == 0


def _delta(sequence_id, start, tokens, k=2):
    return SequenceDelta(sequence_id, start, tokens, draft_limit=k)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def test_sessions_keep_the_same_sequence_id_apart_and_forget_it_on_close(backend):
    drafter = Drafter(DrafterConfig(min_ngram=1, max_ngram=2), backend)
    first, second = drafter.open_session(), drafter.open_session()
    first.step(ProposeBatch.from_deltas(1, [_delta("s", 0, [1, 2, 1])]))
    reply = second.step(ProposeBatch.from_deltas(1, [_delta("s", 3, [5])]))
    assert reply.resync_sequence_ids == ["s"] and reply.drafts() == [[]]
    assert first.step(ProposeBatch.from_deltas(2, [_delta("s", 3, [2])])).drafts() == [[1, 2]]
    assert first.held_tokens("s") == [1, 2, 1, 2] and second.held_tokens("s") is None
    first.close()
    assert len(drafter.store) == 0


def test_a_batch_answers_every_sequence_in_order_with_request_bounds_and_a_draft_cap(backend):
    drafter = Drafter(DrafterConfig(min_ngram=1, max_ngram=4, max_draft_tokens=3), backend)
    session = drafter.open_session()
    batch = ProposeBatch.from_deltas(7, [
        _delta("b", 0, [4, 5, 6, 4, 5], k=10),  # capped at 3
        SequenceDelta("a", 0, [1, 2, 9, 2], draft_limit=2, min_ngram=2),  # "9 2" needs n=1
        _delta("c", 0, [1, 2, 1], k=0),  # state only
        SequenceDelta("d", 0, [1, 2, 3, 1, 2], draft_limit=2, max_ngram=1),  # "2" -> 3
    ])
    reply = session.step(batch)
    assert reply.step_id == 7 and reply.resync_sequence_ids == []
    assert reply.drafts() == [[6, 4, 5], [], [], [3, 1]]
    session.step(ProposeBatch.from_deltas(8, [], released_sequence_ids=["a", "b", "never-seen"]))
    assert len(drafter.store) == 2 and drafter.store.total_tokens == 8


def test_empty_bound_columns_mean_the_service_defaults(backend):
    drafter = Drafter(DrafterConfig(min_ngram=2, max_ngram=3), backend)
    batch = ProposeBatch(1, ["a"], [0], [4], [1, 2, 9, 2], [2])  # "9 2" needs n=1, below the default
    assert drafter.open_session().step(batch).drafts() == [[]]


def test_misaligned_columns_are_named():
    batch = ProposeBatch(1, ["a", "b"], [0, 0], [2, 2], [1, 2, 3], [1, 1])
    assert batch.column_error() == ("new_token_ids", "length is not the sum of new_token_counts")
    assert ProposeBatch(1, ["a"], [0], [0], [], [1], [1, 1]).column_error()[0] == "min_ngrams"
    assert ProposeBatch(1, ["a"], [], [0], [], [1]).column_error()[0] == "starts"


def test_without_the_extension_the_python_store_runs():
    # As when the code runs from PYTHONPATH without `pip install -e .`: the import fails, nothing else.
    code = ("import sys; sys.modules['drafter_service._native_store'] = None\n"
            "from drafter_service.config import DrafterConfig\nfrom drafter_service.drafter import Drafter\n"
            "print(Drafter(DrafterConfig()).store_backend)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.split() == ["python"], result.stderr


def test_the_environment_picks_the_store_and_an_unknown_one_is_refused(monkeypatch):
    monkeypatch.setenv("SPECD_DRAFTER_STORE", "python")
    assert Drafter(DrafterConfig()).store_backend == "python"
    assert resolve_backend() == "python" and resolve_backend(BACKENDS[0]) == BACKENDS[0]
    with pytest.raises(ValueError, match="drafter store"):
        resolve_backend("rust")
