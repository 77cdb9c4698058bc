"""The native (C++) sequence store does what the Python reference store does, batch for batch, and both
draft what the rules read literally give (tests/support/ngram_reference.py).

Random runs of steps (fresh, in-step, out-of-step and unknown deltas with tenant keys; releases, which feed
the memory of earlier outputs; closed sessions; budgets small enough to evict sequences and to turn the
memory's generations over) go to a Drafter on each store, under every memory scope, drafting rule and a
range of thresholds; every reply, the held contexts, the memory's size and the counters must agree, and
every draft must be the brute-force draft of the held context and the outputs remembered so far.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drafter_service.batch import ProposeBatch, SequenceDelta
from drafter_service.config import MEMORY_SCOPES, DrafterConfig
from drafter_service.drafter import Drafter
from drafter_service.stores import BACKENDS
from support.ngram_reference import BruteForceMemory, brute_force_draft, brute_force_propose

pytestmark = pytest.mark.skipif("native" not in BACKENDS, reason="the native store is not built")

SEQUENCE_IDS = ["a", "b", "c", "dé"]  # a non-ASCII id goes through UTF-8 keys
TENANTS = ["", "tenant-1", "ténant-2"]
tokens = st.one_of(st.integers(0, 3), st.sampled_from([2**31 - 1, -(2**31), -1, 49151]))
# Spans of one text that every sequence may repeat: what a sequence's own context has not seen yet, the
# memory may have, from an earlier one.
TEXT = list(range(10, 40))
spans = st.tuples(st.integers(0, len(TEXT) - 1), st.integers(1, 12)).map(lambda s: TEXT[s[0]:s[0] + s[1]])
new_tokens = st.one_of(st.lists(tokens, max_size=12), spans, spans)
bound = st.sampled_from([0, 0, 0, 1, 2, 3, 6])  # a request's n-gram bound, mostly the default
delta = st.tuples(st.sampled_from(SEQUENCE_IDS), st.sampled_from(["held", "held", "held", "fresh", "wrong"]),
                  new_tokens, st.integers(0, 9), bound, bound, st.sampled_from(TENANTS))
step = st.tuples(st.integers(0, 1), st.lists(delta, min_size=1, max_size=5),
                 st.lists(st.sampled_from(SEQUENCE_IDS), max_size=2), st.booleans())
configs = st.builds(
    lambda low, extra, cap, budget, memory, scope, threshold, drafting: DrafterConfig(
        min_ngram=low, max_ngram=low + extra, max_draft_tokens=cap, max_tokens_held=budget, max_memory_tokens=memory,
        memory_scope=scope, min_draft_probability=threshold, drafting=drafting),
    st.integers(1, 3), st.integers(0, 3), st.integers(1, 8), st.one_of(st.just(10_000), st.integers(1, 60)),
    st.one_of(st.just(10_000), st.integers(2, 80)),
    st.sampled_from(MEMORY_SCOPES), st.one_of(st.sampled_from([0.0, 0.15, 1.0]), st.floats(0.0, 1.0)),
    st.sampled_from(["evidence", "evidence", "ngram"]))


def _start(mode: str, held: list[int] | None) -> int:
    if mode == "fresh" or (mode == "held" and held is None):
        return 0
    return len(held) if mode == "held" else len(held or []) + 1


class Reference:
    """What the memory should hold: outputs of released sequences, by the rule of drafter_service/memory.py."""

    def __init__(self, config: DrafterConfig) -> None:
        self.config = config
        self.memory = BruteForceMemory(config.max_memory_tokens)
        self.first_sight: dict[tuple[int, str], tuple[int, str]] = {}  # (length, partition) at start = 0

    def saw(self, which: int, sequence_id: str, start: int, count: int, tenant: str) -> None:
        if start == 0:
            self.first_sight[which, sequence_id] = (count, tenant if self.config.memory_scope == "per-key" else "")

    def partition(self, which: int, sequence_id: str) -> str:
        return self.first_sight[which, sequence_id][1]

    def released(self, which: int, sequence_id: str, held: list[int] | None) -> None:
        config = self.config
        if held is None or config.memory_scope == "off" or config.drafting == "ngram":
            return
        first, partition = self.first_sight[which, sequence_id]
        if len(held) > first:
            self.memory.add(partition, held[max(first - config.max_ngram, 0):])


# Finished requests to begin with, so that the memory has something to draft from: (tenant, output).
earlier = st.lists(st.tuples(st.sampled_from(TENANTS), spans), max_size=4)


def _finished_requests(earlier_outputs) -> list:
    """Steps of session 0 that start, extend and release one sequence per earlier output."""
    steps = []
    for number, (tenant, output) in enumerate(earlier_outputs):
        sequence_id = f"earlier-{number}"
        steps.append((0, [(sequence_id, "fresh", [0, 1], 0, 0, 0, tenant)], [], False))
        steps.append((0, [(sequence_id, "held", output, 0, 0, 0, tenant)], [], False))
        steps.append((0, [], [sequence_id], False))
    return steps


@settings(max_examples=400, deadline=None)
@given(config=configs, earlier_outputs=earlier, steps=st.lists(step, min_size=10, max_size=40))
def test_native_and_python_stores_answer_every_batch_alike_and_as_the_rules_say(config, earlier_outputs, steps):
    drafters = {name: Drafter(config, name) for name in ("native", "python")}
    sessions = {name: [d.open_session(), d.open_session()] for name, d in drafters.items()}
    reference = Reference(config)
    for step_id, (which, deltas, released, close_after) in enumerate(_finished_requests(earlier_outputs) + steps):
        python_session = sessions["python"][which]
        for sequence_id in dict.fromkeys(released):
            reference.released(which, sequence_id, python_session.held_tokens(sequence_id))
        batch = ProposeBatch.from_deltas(step_id, [
            SequenceDelta(i, _start(mode, python_session.held_tokens(i)), new, k, low, high, tenant)
            for i, mode, new, k, low, high, tenant in deltas], released)
        native, python = (sessions[name][which].step(batch) for name in ("native", "python"))
        assert (native.draft_counts, native.draft_token_ids, native.resync_sequence_ids, native.memory_draft_tokens,
                native.draft_length_counts) == (python.draft_counts, python.draft_token_ids,
                                                python.resync_sequence_ids, python.memory_draft_tokens,
                                                python.draft_length_counts)
        for position, (sequence_id, draft) in enumerate(zip(batch.sequence_ids, native.drafts())):
            reference.saw(which, sequence_id, batch.starts[position], batch.new_token_counts[position],
                          batch.tenant_keys[position])
            held = sessions["native"][which].held_tokens(sequence_id)
            last = sequence_id not in batch.sequence_ids[position + 1:]  # held is what its last delta left
            if last and sequence_id not in native.resync_sequence_ids and held is not None:
                low = max(batch.min_ngrams[position] or config.min_ngram, 1)
                high = min(batch.max_ngrams[position] or config.max_ngram, config.max_ngram)
                k = min(batch.draft_limits[position], config.max_draft_tokens)
                expected = brute_force_draft(held, reference.memory, reference.partition(which, sequence_id), k,
                                             low, high, config) if k and low <= high else []
                assert draft == expected
        for sequence_id in SEQUENCE_IDS:
            assert [s.held_tokens(sequence_id) for s in sessions["native"]] == [
                s.held_tokens(sequence_id) for s in sessions["python"]]
        if close_after:
            for name in sessions:
                sessions[name][which].close()
        stores = [drafters[name].store for name in ("native", "python")]
        assert len({(len(s), s.total_tokens, s.num_evicted, s.memory_tokens) for s in stores}) == 1
        assert stores[0].memory_tokens == reference.memory.total_tokens <= config.max_memory_tokens


def test_a_long_context_drafts_like_the_reference_at_every_step():
    config = DrafterConfig(min_ngram=1, max_ngram=4, drafting="ngram")
    session = Drafter(config, "native").open_session()
    context = [i % 97 for i in range(3000)] + [5, 6, 7, 8, 5, 6]
    session.step(ProposeBatch.from_deltas(0, [SequenceDelta("s", 0, context, 0)]))
    for step_id, token in enumerate([7, 8, 1, 2, 3, 1, 2], start=1):
        delta = SequenceDelta("s", len(context), [token], draft_limit=6)
        reply = session.step(ProposeBatch.from_deltas(step_id, [delta]))
        context.append(token)
        assert reply.drafts() == [brute_force_propose(context, 6, 1, 4)]


def test_columns_that_do_not_line_up_are_refused_before_anything_changes():
    drafter = Drafter(DrafterConfig(), "native")
    bad = ProposeBatch(1, ["a", "b"], [0, 0], [2, 2], [1, 2, 3], [1, 1])
    with pytest.raises(ValueError, match="new_token_ids"):
        drafter.open_session().step(bad)
    with pytest.raises(ValueError, match="tenant_keys"):
        drafter.open_session().step(ProposeBatch(1, ["a"], [0], [1], [1], [1], tenant_keys=["x", "y"]))
    assert len(drafter.store) == 0


def test_the_drafter_runs_the_native_store_unless_told_otherwise(monkeypatch):
    """Where it is built (make install builds it), production gets the native store, not the 10x slower fallback."""
    monkeypatch.delenv("SPECD_DRAFTER_STORE", raising=False)
    assert Drafter(DrafterConfig()).store_backend == "native"
