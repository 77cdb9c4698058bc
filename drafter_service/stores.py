"""Which sequence store the drafter runs: the native one (C++) when it is built, else the Python one.

Both follow the same rules (the docstrings of drafter_service/ngram.py, evidence.py, memory.py and
state.py) and the same interface: `propose_batch(session, batch) -> DraftBatch`,
`release_sequences(session, ids)`, `release_session(session)`, `held_tokens(session, id)`, `len()`,
`total_tokens`, `num_evicted`, `memory_tokens`. The native store
(native_store.cpp, built by `pip install -e .` through setup.py) does a whole batch in one call; the
Python store (state.py) is the reference the tests compare it with, and the fallback where the code
runs from PYTHONPATH without an install. `resolve_backend` is the one place that chooses (the
environment variable SPECD_DRAFTER_STORE=python|native overrides it); the drafter logs its choice at
start-up.
"""
from __future__ import annotations

from collections.abc import Sequence

from drafter_service.batch import DraftBatch, ProposeBatch
from drafter_service.config import MEMORY_SCOPES, DrafterConfig
from drafter_service.state import SequenceStore
from specd import environment

try:
    from drafter_service import _native_store
except ImportError:  # not built: run from PYTHONPATH without `pip install -e .`
    _native_store = None

BACKENDS = ("native", "python") if _native_store is not None else ("python",)  # the ones available


class NativeSequenceStore:
    """The C++ store behind the Python store's batch interface."""

    def __init__(self, config: DrafterConfig) -> None:
        self._store = _native_store.SequenceStore(
            config.min_ngram, config.max_ngram, config.max_draft_tokens, config.max_tokens_held,
            config.max_memory_tokens, MEMORY_SCOPES.index(config.memory_scope), config.min_draft_probability,
            config.drafting == "ngram")

    def propose_batch(self, session: int, batch: ProposeBatch) -> DraftBatch:
        """Apply every delta and propose, in order, in one native call."""
        counts, drafts, resync_positions, memory_draft_tokens, length_counts = self._store.propose_batch(
            session, batch.sequence_ids, batch.starts, batch.new_token_counts, batch.new_token_ids,
            batch.draft_limits, batch.min_ngrams, batch.max_ngrams, batch.tenant_keys)
        ids = batch.sequence_ids
        return DraftBatch(batch.step_id, counts, drafts, [ids[i] for i in resync_positions],
                          memory_draft_tokens, length_counts)

    def release_sequences(self, session: int, sequence_ids: Sequence[str]) -> None:
        if sequence_ids:
            self._store.release(session, sequence_ids)

    def release_session(self, session: int) -> None:
        self._store.release_session(session)

    def held_tokens(self, session: int, sequence_id: str) -> list[int] | None:
        """The context held for a sequence (None if not held)."""
        return self._store.held_tokens(session, sequence_id)

    def __len__(self) -> int:
        return len(self._store)

    @property
    def total_tokens(self) -> int:
        return self._store.total_tokens

    @property
    def num_evicted(self) -> int:
        return self._store.num_evicted

    @property
    def memory_tokens(self) -> int:
        return self._store.memory_tokens


def resolve_backend(backend: str | None = None) -> str:
    """`backend` if given, else $SPECD_DRAFTER_STORE if set, else native when built, else python."""
    backend = backend or environment.drafter_store() or BACKENDS[0]
    if backend not in BACKENDS:
        raise ValueError(f"drafter store: {backend!r} is not available here (have {', '.join(BACKENDS)})")
    return backend


def new_sequence_store(config: DrafterConfig, backend: str | None = None) -> NativeSequenceStore | SequenceStore:
    """A store of `backend` ("native" or "python"; None: see resolve_backend)."""
    if resolve_backend(backend) == "native":
        return NativeSequenceStore(config)
    return SequenceStore(config)
