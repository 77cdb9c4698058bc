"""The drafter's domain: a batch of sequence deltas in, a batch of drafts out, per verifier stream.

Sequence ids are unique only within one verifier's stream (many verifiers may share a drafter), so
each stream gets a `DrafterSession` whose number namespaces its ids in the shared sequence store, and
which forgets all of them when the stream ends (the verifier re-syncs everything on a new stream anyway).
The memory of earlier outputs is the store's, shared by every session: what one verifier's requests
produced drafts another's.
The store is native (C++) when built, else Python: drafter_service/stores.py chooses.
"""
from __future__ import annotations

import itertools
import logging

from drafter_service.batch import DraftBatch, ProposeBatch
from drafter_service.config import DrafterConfig
from drafter_service.stores import new_sequence_store, resolve_backend

logger = logging.getLogger(__name__)


class Drafter:
    """The shared store of every stream's sequences, and the service defaults."""

    def __init__(self, config: DrafterConfig, store_backend: str | None = None) -> None:
        """`store_backend`: "native" or "python"; None = native when built (stores.resolve_backend)."""
        self.config = config
        self.store_backend = resolve_backend(store_backend)
        self.store = new_sequence_store(config, self.store_backend)
        self._session_numbers = itertools.count()
        logger.info("drafter: %s sequence store", self.store_backend)

    def open_session(self) -> DrafterSession:
        """A namespace for one verifier stream's sequence ids."""
        return DrafterSession(self, next(self._session_numbers))


class DrafterSession:
    """One verifier stream: applies its batches in request order."""

    def __init__(self, drafter: Drafter, number: int) -> None:
        self._drafter = drafter
        self._number = number

    def step(self, batch: ProposeBatch) -> DraftBatch:
        """Release, then update and propose for every sequence of the (checked) batch, in order."""
        store = self._drafter.store
        store.release_sequences(self._number, batch.released_sequence_ids)
        return store.propose_batch(self._number, batch)

    def held_tokens(self, sequence_id: str) -> list[int] | None:
        """The context the drafter holds for one of this stream's sequences (None if none)."""
        return self._drafter.store.held_tokens(self._number, sequence_id)

    def close(self) -> None:
        """Forget every sequence of this stream."""
        self._drafter.store.release_session(self._number)
