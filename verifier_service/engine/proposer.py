"""The interface between the engine and whatever proposes draft tokens.

The engine asks once per step for every decoding request's drafts; implementations are the gRPC
drafter client (drafter_service/client.py), the in-process n-gram proposer, and the oracle /
adversarial proposers the tests use. A proposer must never raise for a missing or failed draft: it
returns fewer (or no) tokens, and the request decodes without them.

A proposer that answers over the network may also offer `begin_propose`: the engine then sends the next
step's question as soon as the contexts are known and collects the answer only when it launches that step,
so the round trip overlaps the host's other work too (`begin` adapts proposers without it).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from drafter_service.batch import DraftRequest  # the question any proposer answers, defined by the drafter


class PendingProposal(Protocol):
    def result(self, wait: bool = True) -> dict[str, list[int]]:
        """The drafts, waiting at most the proposer's deadline (not at all unless `wait`: then only what has
        arrived); never raises for a draft failure."""
        ...


class Proposer(Protocol):
    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        """Drafts per request id (missing id or empty list = no drafts). Never raises for a draft failure."""
        ...

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget finished or aborted requests."""
        ...


class _Answered:
    """A proposal made at once (proposers without begin_propose answer in the asking call)."""

    def __init__(self, drafts: dict[str, list[int]]) -> None:
        self._drafts = drafts

    def result(self, wait: bool = True) -> dict[str, list[int]]:
        return self._drafts


def begin(proposer: Proposer, requests: Sequence[DraftRequest]) -> PendingProposal:
    """The proposer's begin_propose(requests) where it has one, else its answer, made now: the contexts
    are read when asked, whenever the result is collected."""
    begin_propose = getattr(proposer, "begin_propose", None)
    if begin_propose is not None:
        return begin_propose(requests)
    return _Answered(proposer.propose(requests))
