"""Draft proposers for tests: always right, always wrong, and a brute-force n-gram lookup.

All follow verifier_service.engine.proposer.Proposer. The oracle and the adversary know each request's
reference sequence (prompt + the continuation plain decoding produces).
"""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from verifier_service.engine.proposer import DraftRequest


class _RecordingProposer:
    """Keeps what the engine asked for and released, so tests can check the protocol too."""

    def __init__(self) -> None:
        self.num_calls = 0
        self.num_proposed = 0
        self.released: list[str] = []

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        self.num_calls += 1
        drafts = {r.request_id: self._draft(r)[:r.draft_limit] for r in requests}
        self.num_proposed += sum(map(len, drafts.values()))
        return drafts

    def release(self, request_ids: Sequence[str]) -> None:
        self.released += request_ids

    def _draft(self, request: DraftRequest) -> list[int]:
        raise NotImplementedError


class OracleProposer(_RecordingProposer):
    """Proposes the reference continuation: every draft is accepted under greedy decoding."""

    def __init__(self, references: Mapping[str, Sequence[int]]) -> None:
        super().__init__()
        self.references = {k: list(v) for k, v in references.items()}

    def _draft(self, request: DraftRequest) -> list[int]:
        reference = self.references.get(request.request_id, [])
        context = len(request.token_ids)
        return reference[context:context + request.draft_limit]


class AdversarialProposer(OracleProposer):
    """Proposes a token that is never the reference's: every draft is rejected under greedy decoding.

    With `num_speculative_tokens` k, a proposal longer than k (one asked ahead of steps in flight: what they emit,
    then drafts; draft_lookahead.py) is the reference but for its last k tokens, so that it survives the engine's
    check against the tokens known by the time it is used, and its drafts are still scored and rejected."""

    def __init__(self, references: Mapping[str, Sequence[int]], vocab_size: int,
                 num_speculative_tokens: int | None = None) -> None:
        super().__init__(references)
        self.vocab_size = vocab_size
        self.num_speculative_tokens = num_speculative_tokens

    def _draft(self, request: DraftRequest) -> list[int]:
        right = super()._draft(request)
        wrong_from = 0 if self.num_speculative_tokens is None else max(0, len(right) - self.num_speculative_tokens)
        wrong = [(t + 1) % self.vocab_size for t in right[wrong_from:]]
        return right[:wrong_from] + wrong or [0] * request.draft_limit


class BruteForceNgramProposer(_RecordingProposer):
    """Prompt lookup: find the latest earlier match of the context's last n tokens (longest n first)
    and propose the tokens that followed it."""

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4) -> None:
        super().__init__()
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def _draft(self, request: DraftRequest) -> list[int]:
        tokens = list(request.token_ids)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == suffix:
                    return tokens[start + n:start + n + request.draft_limit]
        return []


class FlakyProposer(OracleProposer):
    """Everything a proposer may do, at random (seeded): raise, answer nothing, answer right, wrong, too
    long, or with ids outside the vocabulary. The engine must decode exactly whatever it gets."""

    def __init__(self, references: Mapping[str, Sequence[int]], vocab_size: int, seed: int = 0) -> None:
        super().__init__(references)
        self.vocab_size = vocab_size
        self.random = random.Random(seed)

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        roll = self.random.random()
        if roll < 0.1:
            raise RuntimeError("drafter exploded")
        if roll < 0.2:
            return {}
        return {r.request_id: self._flaky_draft(r) for r in requests}

    def _flaky_draft(self, request: DraftRequest) -> list[int]:
        right = self._draft(request)
        roll = self.random.random()
        if roll < 0.4:
            return right
        if roll < 0.6:
            return right + [self.random.randrange(self.vocab_size) for _ in range(5)]  # longer than asked
        if roll < 0.8:
            return [self.random.randrange(self.vocab_size) for _ in range(self.random.randint(0, 6))]
        return right[:1] + [self.vocab_size + 3, -1]  # ids outside the vocabulary: the draft is cut there
