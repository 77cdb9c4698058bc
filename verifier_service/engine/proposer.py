"""The interface between the engine and whatever proposes draft tokens.

The engine asks once per step for every decoding request's drafts; implementations are the gRPC
drafter client (verifier_service/drafter_client.py), the in-process n-gram proposer, and the oracle /
adversarial proposers the tests use. A proposer must never raise for a missing or failed draft: it
returns fewer (or no) tokens, and the request decodes without them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DraftRequest:
    """One request's need for drafts this step."""

    request_id: str
    token_ids: Sequence[int]  # the whole context so far: prompt + generated tokens (do not mutate)
    num_draft_tokens: int  # at most this many drafts are used (already capped by max_tokens / model len)
    min_ngram: int = 0  # 0 = the proposer's default
    max_ngram: int = 0


class Proposer(Protocol):
    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        """Drafts per request id (missing id or empty list = no drafts). Never raises for a draft failure."""
        ...

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget finished or aborted requests."""
        ...
