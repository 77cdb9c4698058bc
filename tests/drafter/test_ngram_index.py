"""The incremental n-gram index agrees with a brute-force scan of the rule in drafter_service/ngram.py."""
from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drafter_service.ngram import NgramIndex
from support.ngram_reference import brute_force_propose


# Small alphabets make repeats and overlapping matches common; big ids and negatives test the keys.
small_alphabet = st.lists(st.integers(0, 3), max_size=60)
wide_ids = st.lists(st.sampled_from([0, 1, 2**31 - 1, -1, -(2**31), 49151]), max_size=40)
bounds = st.integers(1, 5).flatmap(lambda low: st.tuples(st.just(low), st.integers(low, 6)))


@settings(max_examples=300, deadline=None)
@given(tokens=st.one_of(small_alphabet, wide_ids), k=st.integers(0, 8), bounds=bounds)
def test_every_prefix_proposes_what_the_brute_force_rule_does(tokens, k, bounds):
    min_n, max_n = bounds
    index = NgramIndex(min_n, max_n)
    for length in range(len(tokens) + 1):
        assert index.propose(k) == brute_force_propose(tokens[:length], k, min_n, max_n)
        if length < len(tokens):
            index.append(tokens[length])


@settings(max_examples=200, deadline=None)
@given(tokens=st.one_of(small_alphabet, wide_ids), chunks=st.lists(st.integers(1, 9)), bounds=bounds)
def test_extending_in_chunks_indexes_like_appending_one_by_one(tokens, chunks, bounds):
    chunked, single = NgramIndex(*bounds), NgramIndex(*bounds)
    position = 0
    for size in chunks + [len(tokens)]:
        chunked.extend(tokens[position:position + size])
        position += size
        for token in tokens[len(single):position]:
            single.append(token)
        assert chunked.tokens == single.tokens and chunked._latest == single._latest


@settings(max_examples=300, deadline=None)
@given(tokens=st.one_of(small_alphabet, wide_ids), limit=st.integers(1, 9), bounds=bounds)
def test_occurrences_are_every_earlier_occurrence_latest_first(tokens, limit, bounds):
    index = NgramIndex(*bounds)
    for length in range(len(tokens) + 1):
        for n in range(bounds[0], bounds[1] + 1):
            suffix = tokens[length - n:length]
            every = [end for end in range(length - 1, n - 1, -1) if tokens[end - n:end] == suffix] if n < length else []
            assert index.occurrences(n, limit) == every[:limit]
        if length < len(tokens):
            index.append(tokens[length])


@settings(max_examples=200, deadline=None)
@given(tokens=small_alphabet, k=st.integers(1, 8), ask=bounds)
def test_per_request_bounds_inside_the_indexed_range(tokens, k, ask):
    index = NgramIndex(1, 6, tokens)
    assert index.propose(k, *ask) == brute_force_propose(tokens, k, *ask)


def test_sequences_shorter_than_n_fall_back_to_shorter_ngrams_or_nothing():
    assert NgramIndex(3, 4, [7, 7]).propose(4) == []
    assert NgramIndex(1, 4, [7, 7]).propose(3) == [7, 7, 7]
    assert NgramIndex(1, 4, [7]).propose(3) == []
    assert NgramIndex(1, 4, []).propose(3) == []


def test_the_most_recent_occurrence_wins():
    # "1 2" occurs twice earlier, followed by 8 and then 9: the later one (9) is drafted.
    assert NgramIndex(2, 2, [1, 2, 8, 1, 2, 9, 1, 2]).propose(1) == [9]


def test_a_loop_drafts_a_full_k_by_continuing_its_period():
    assert NgramIndex(1, 4, [5, 1, 2, 3, 1, 2, 3]).propose(7) == [1, 2, 3, 1, 2, 3, 1]


@functools.cache
def _real_tokens() -> list[int]:
    transformers = pytest.importorskip("transformers")
    from specd.default_model import resolve_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_path("default"))
    text = open(__file__).read() + open(NgramIndex.__init__.__code__.co_filename).read()
    return tokenizer(text)["input_ids"]


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 2000), length=st.integers(0, 400), k=st.integers(1, 8), bounds=bounds)
def test_real_text_tokenized_by_the_default_model(start, length, k, bounds):
    tokens = _real_tokens()[start:start + length]
    index = NgramIndex(*bounds)
    for position, token in enumerate(tokens):
        if position % 7 == 0:  # every prefix would be slow with the quadratic reference
            assert index.propose(k) == brute_force_propose(tokens[:position], k, *bounds)
        index.append(token)
    assert index.propose(k) == brute_force_propose(tokens, k, *bounds)
