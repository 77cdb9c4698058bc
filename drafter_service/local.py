"""The n-gram drafter in-process: the engine's Proposer protocol over the same index, no RPC.

Used by engine tests and benches, and wherever a separate drafter process is not wanted. Each
request's context is taken as append-only between steps: only tokens beyond what the index holds
are appended; a context that shrank or whose last held token changed is re-indexed from scratch.
"""
from __future__ import annotations

from collections.abc import Sequence

from drafter_service.config import DrafterConfig
from drafter_service.state import SequenceStore
from verifier_service.engine.proposer import DraftRequest


class LocalNgramProposer:
    """Implements verifier_service.engine.proposer.Proposer with prompt lookup, in this process."""

    def __init__(self, config: DrafterConfig | None = None) -> None:
        self.config = config or DrafterConfig()
        self._store = SequenceStore(self.config.max_ngram, self.config.max_tokens_held)
        self._held_lengths: dict[str, int] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        """Drafts per request id; requests with num_draft_tokens == 0 only update the index."""
        return {r.request_id: self._propose_one(r) for r in requests}

    def _propose_one(self, request: DraftRequest) -> list[int]:
        index = self._sync(request.request_id, request.token_ids)
        if index is None:
            return []
        config = self.config
        return index.propose(min(request.num_draft_tokens, config.max_draft_tokens),
                             request.min_ngram or config.min_ngram,
                             request.max_ngram or config.max_ngram)

    def _sync(self, request_id: str, token_ids: Sequence[int]):
        key = request_id
        held = self._held_lengths.get(request_id, 0)
        if held and (held > len(token_ids) or key not in self._store):
            held = 0
        index = self._store.apply(key, held, token_ids[held:])
        if index is not None and held and index.tokens[held - 1] != token_ids[held - 1]:
            index = self._store.apply(key, 0, token_ids)  # the context was rewritten: start afresh
        self._held_lengths[request_id] = len(token_ids) if index is not None else 0
        return index

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget finished or aborted requests."""
        for request_id in request_ids:
            self._store.release(request_id)
            self._held_lengths.pop(request_id, None)
