"""The drafter in-process: the engine's Proposer protocol over the drafter's own sequence store, no RPC.

The same store as the service (native when built, stores.py), so the same index, evidence rule and
memory of earlier outputs: engine tests, benches and replays draft exactly as a drafter process would.
Each request's context is taken as append-only between steps: only tokens beyond what the store holds
are sent; a context that shrank or whose last held token changed is sent whole again (start = 0).
"""
from __future__ import annotations

from collections.abc import Sequence

from drafter_service.batch import DraftRequest, ProposeBatch
from drafter_service.config import DrafterConfig
from drafter_service.stores import new_sequence_store

_SESSION = 0  # the store's namespace for this process's request ids


class LocalProposer:
    """Implements verifier_service.engine.proposer.Proposer with the drafter's store, in this process."""

    def __init__(self, config: DrafterConfig | None = None, store_backend: str | None = None) -> None:
        self.config = config or DrafterConfig()
        self.store = new_sequence_store(self.config, store_backend)
        self._sent: dict[str, tuple[int, int]] = {}  # per request: (tokens held, the last of them)
        self.proposed_tokens = [0, 0]  # draft tokens proposed so far, from (own contexts, the memory)

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        """Drafts per request id; requests with draft_limit 0 only update the store."""
        reply = self.store.propose_batch(_SESSION, self._batch(requests))
        for request_id in reply.resync_sequence_ids:  # evicted: send it whole next time
            self._sent.pop(request_id, None)
        self.proposed_tokens[0] += reply.num_proposed_tokens - reply.memory_draft_tokens
        self.proposed_tokens[1] += reply.memory_draft_tokens
        return dict(zip((r.request_id for r in requests), reply.drafts()))

    def _batch(self, requests: Sequence[DraftRequest]) -> ProposeBatch:
        """The step's columns: each request's tokens beyond what the store holds (all of them where its context was
        rewritten), built in one pass rather than through SequenceDelta and ProposeBatch.from_deltas: a synchronous
        engine waits for them, and after a CPU forward the one pass costs 13-20 us less (tools/propose_cost.py)."""
        ids, starts, counts, new_tokens, limits, min_ngrams, max_ngrams, keys = [], [], [], [], [], [], [], []
        sent = self._sent
        for request in requests:
            tokens = request.token_ids
            held, last = sent.get(request.request_id, (0, None))
            if held > len(tokens) or (held and tokens[held - 1] != last):
                held = 0  # the context was rewritten: start afresh
            sent[request.request_id] = (len(tokens), tokens[-1] if tokens else None)
            ids.append(request.request_id)
            starts.append(held)
            counts.append(len(tokens) - held)
            new_tokens += tokens[held:]
            limits.append(request.draft_limit)
            min_ngrams.append(request.min_ngram)
            max_ngrams.append(request.max_ngram)
            keys.append(request.tenant_key)
        return ProposeBatch(0, ids, starts, counts, new_tokens, limits, min_ngrams, max_ngrams, (), keys)

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget finished or aborted requests (their outputs go to the memory of earlier outputs)."""
        self.store.release_sequences(_SESSION, [i for i in request_ids if self._sent.pop(i, None)])
