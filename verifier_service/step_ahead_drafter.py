"""The drafter for a synchronous engine (the CPU's): each step drafted at once from its own context, the drafter
service asked a step ahead.

A synchronous engine knows a step's contexts only once the step before has been verified, and then wants their
drafts at once. Waiting for the service's round trip cost it 1.5-2.1 ms of a 50-90 ms step on the 2-core machine
(docs/BENCHMARKS.md, rounds 22 and 31). Here a step's drafts come from the drafter's rule over each request's own
context in this process (drafter_service/local.py's native store, no memory), in microseconds. The service, which
holds the memory of earlier outputs shared by every verifier, is asked at the same time on the same contexts for
a continuation long enough to cover the step about to run and the one after it (2k + 1 tokens); its answer arrives
while the step's forward runs. At the next step it serves where it still fits: the tokens that step emitted must be
its first ones (engine/draft_lookahead.py's continuations_after_known), as when the service's copy of an earlier
output goes on where the output goes on. Where it does not fit (the step rejected a draft, so the target's own
token came next), the own context's drafts serve, as they do when the service is late or dead.

`num_fallbacks` counts the steps whose service answer, asked a step ahead, was not in when they were drafted;
`num_context_drafts` those of them drafted from the own context instead (as drafter_service/link.py counts them).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from drafter_service.batch import DraftRequest
from drafter_service.config import DrafterConfig
from drafter_service.local import LocalProposer
from verifier_service.engine.draft_lookahead import continuations_after_known
from verifier_service.engine.proposer import PendingProposal


class StepAheadDrafter:
    """A Proposer (verifier_service/engine/proposer.py) over the drafter service's client, for a synchronous engine."""

    def __init__(self, service, own: LocalProposer | None = None) -> None:
        """`service`: the drafter service's client (drafter_service/client.py's DrafterClient)."""
        self.service = service
        self.own = own or LocalProposer(DrafterConfig(memory_scope="off"))  # the memory is the service's
        self.num_context_drafts = 0
        self._asked: tuple[PendingProposal, dict[str, int]] | None = None  # the service's question, context lengths

    @property
    def num_fallbacks(self) -> int:
        return self.service.num_fallbacks

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        """This step's drafts, made now (no begin_propose: there is nothing to wait for); asks the service for the
        next step's."""
        requests = list(requests)
        drafts = self.own.propose(requests)
        asked, self._asked = self._asked, None
        if asked is not None:
            fallbacks = self.service.num_fallbacks
            answer = asked[0].result(wait=False)
            if self.service.num_fallbacks > fallbacks and any(drafts.get(r.request_id) for r in requests):
                self.num_context_drafts += 1
            known = {r.request_id: (r.token_ids, len(r.token_ids)) for r in requests}
            limits = {r.request_id: r.draft_limit for r in requests}
            for request_id, tokens in continuations_after_known(answer, asked[1], known).items():
                if tokens[:limits[request_id]]:
                    drafts[request_id] = tokens[:limits[request_id]]
        ahead = [replace(r, draft_limit=2 * r.draft_limit + 1) for r in requests if r.draft_limit > 0]
        if ahead:
            self._asked = (self.service.begin_propose(ahead), {r.request_id: len(r.token_ids) for r in ahead})
        return {request_id: tokens for request_id, tokens in drafts.items() if tokens}

    def release(self, request_ids: Sequence[str]) -> None:
        self.own.release(request_ids)
        self.service.release(request_ids)

    def close(self) -> None:
        close = getattr(self.service, "close", None)
        if close is not None:
            close()
