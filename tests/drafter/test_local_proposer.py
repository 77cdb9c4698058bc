"""The in-process proposer drafts what the index drafts, following growing and rewritten contexts."""
from __future__ import annotations

import random

from drafter_service.config import DrafterConfig
from drafter_service.local import LocalNgramProposer
from drafter_service.ngram import NgramIndex
from verifier_service.engine.proposer import DraftRequest


def test_drafts_follow_each_growing_context_like_a_fresh_index():
    rng = random.Random(0)
    proposer = LocalNgramProposer(DrafterConfig(min_ngram=1, max_ngram=3))
    contexts = {f"r{i}": [rng.randrange(4) for _ in range(5)] for i in range(3)}
    for _ in range(40):
        for tokens in contexts.values():
            tokens.extend(rng.randrange(4) for _ in range(rng.randrange(1, 4)))
        drafts = proposer.propose([DraftRequest(i, t, num_draft_tokens=3) for i, t in contexts.items()])
        assert drafts == {i: NgramIndex(1, 3, t).propose(3) for i, t in contexts.items()}


def test_a_rewritten_context_is_reindexed():
    proposer = LocalNgramProposer()
    proposer.propose([DraftRequest("r", [1, 2, 3, 1, 2], num_draft_tokens=2)])
    rewritten = [4, 5, 6, 4, 5, 6]
    assert proposer.propose([DraftRequest("r", rewritten, num_draft_tokens=2)]) == {"r": [4, 5]}


def test_release_forgets_requests():
    proposer = LocalNgramProposer()
    proposer.propose([DraftRequest("r", [1, 2, 1], num_draft_tokens=2)])
    proposer.release(["r", "never-seen"])
    assert proposer.propose([DraftRequest("r", [9, 9], num_draft_tokens=1)]) == {"r": [9]}
