"""The in-process proposer drafts what the drafter's store drafts, following growing and rewritten
contexts, and remembers finished requests' outputs for later ones."""
from __future__ import annotations

import random

import pytest

from drafter_service.config import DrafterConfig
from drafter_service.local import LocalProposer
from drafter_service.stores import BACKENDS
from verifier_service.engine.proposer import DraftRequest

WITHOUT_MEMORY = DrafterConfig(min_ngram=1, max_ngram=3, memory_scope="off")


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def fresh_drafts(tokens, k, config=WITHOUT_MEMORY, backend=None):
    """What a proposer that sees the whole context at once drafts."""
    return LocalProposer(config, backend).propose([DraftRequest("fresh", list(tokens), k)])["fresh"]


def test_drafts_follow_each_growing_context_like_a_fresh_store(backend):
    rng = random.Random(0)
    proposer = LocalProposer(WITHOUT_MEMORY, backend)
    contexts = {f"r{i}": [rng.randrange(4) for _ in range(5)] for i in range(3)}
    for _ in range(40):
        for tokens in contexts.values():
            tokens.extend(rng.randrange(4) for _ in range(rng.randrange(1, 4)))
        drafts = proposer.propose([DraftRequest(i, t, draft_limit=3) for i, t in contexts.items()])
        assert drafts == {i: fresh_drafts(t, 3, backend=backend) for i, t in contexts.items()}


def test_a_rewritten_context_is_sent_whole_again(backend):
    proposer = LocalProposer(WITHOUT_MEMORY, backend)
    proposer.propose([DraftRequest("r", [1, 2, 3, 1, 2], draft_limit=2)])
    rewritten = [4, 5, 6, 7, 4, 5, 6, 7, 4, 5]
    assert proposer.propose([DraftRequest("r", rewritten, draft_limit=2)]) == {"r": [6, 7]}
    assert proposer.store.held_tokens(0, "r") == rewritten


def test_a_finished_requests_output_drafts_a_later_request(backend):
    proposer = LocalProposer(DrafterConfig(), backend)
    prompt, output = [7, 8, 9], list(range(20, 32))
    proposer.propose([DraftRequest("first", prompt + output[:1], 4)])
    proposer.propose([DraftRequest("first", prompt + output, 4)])
    proposer.release(["first"])
    assert proposer.store.held_tokens(0, "first") is None
    # another prompt, the same start of an answer: the rest comes from the memory
    assert proposer.propose([DraftRequest("second", [5, 6, 20, 21, 22, 23, 24], 4)]) == {"second": [25, 26, 27, 28]}
