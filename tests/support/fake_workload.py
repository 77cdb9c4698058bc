"""The engine-logic tests' workload for the fake paged runner: six prompts and their greedy references."""
from __future__ import annotations

from specd.sampling import SamplingParams
from support.fake_runner import greedy_reference
from verifier_service.engine.engine import Engine

VOCAB = 32
PROMPTS = {f"r{i}": [(7 * i + j * j) % VOCAB for j in range(3 + 5 * i)] for i in range(6)}
MAX_TOKENS = 20


def add_all(engine: Engine, params=SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)) -> None:
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, params)


def greedy_references() -> dict[str, list[int]]:
    """Each prompt followed by plain greedy decoding (a few tokens beyond MAX_TOKENS, for oracle drafts)."""
    return {rid: prompt + greedy_reference(prompt, MAX_TOKENS + 8, VOCAB) for rid, prompt in PROMPTS.items()}


def expected(references: dict[str, list[int]]) -> dict[str, list[int]]:
    """The first MAX_TOKENS generated tokens of each reference."""
    return {rid: ref[len(PROMPTS[rid]):len(PROMPTS[rid]) + MAX_TOKENS] for rid, ref in references.items()}
