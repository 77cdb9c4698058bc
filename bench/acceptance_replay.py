"""Replays recorded greedy outputs through a proposer, as a verifier at batch 1 would use it.

The rule, per request: the prefill step emits the first recorded token without drafts; then each step
asks the proposer for up to k drafts (never more than the tokens left to emit, less one), accepts the
longest prefix that equals the recorded continuation, and emits one more recorded token (the target
model's own), as greedy verification does. Requests run one after another, in recording order, and are
released when they end, so a drafter with memory sees the earlier ones.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from acceptance_recordings import Recording

from verifier_service.engine.proposer import DraftRequest, Proposer


@dataclass
class ReplayResult:
    """Totals over a workload."""

    tokens: int = 0  # emitted (recorded output tokens)
    steps: int = 0  # verifier steps, the prefill included
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # of them, accepted
    propose_seconds: float = 0.0  # time inside proposer.propose
    propose_calls: int = 0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps

    @property
    def proposed_per_step(self) -> float:
        return self.proposed / self.steps

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def propose_us(self) -> float:
        return self.propose_seconds / max(self.propose_calls, 1) * 1e6


def replay(proposer: Proposer, recordings: list[Recording], k: int) -> ReplayResult:
    """Every recording through `proposer` with at most k drafts a step."""
    result = ReplayResult()
    for number, recording in enumerate(recordings):
        request_id = f"replay-{number}"
        output = recording.output_token_ids
        context = list(recording.prompt_token_ids) + output[:1]  # the prefill step's token
        emitted, result.steps = 1, result.steps + 1
        while emitted < len(output):
            wanted = min(k, len(output) - emitted - 1)
            started = time.perf_counter()
            drafts = proposer.propose([DraftRequest(request_id, context, wanted)]).get(request_id, [])
            result.propose_seconds += time.perf_counter() - started
            result.propose_calls += 1
            drafts = drafts[:wanted]
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == output[emitted + accepted]:
                accepted += 1
            context += output[emitted:emitted + accepted + 1]  # in place: contexts only grow
            emitted += accepted + 1
            result.steps += 1
            result.proposed += len(drafts)
            result.accepted += accepted
        result.tokens += len(output)
        proposer.release([request_id])
    return result
