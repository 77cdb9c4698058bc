"""Greedy outputs of the default model on the acceptance workloads, recorded once and cached.

Recorded with specd's engine on the CPU in float32 (greedy output is token for token what plain decoding
gives, which the exactness tests check; drafting only makes the recording faster). Cached as JSON under
${SPECD_HOME:-~/.cache/specd}/drafter-acceptance/, keyed by the workload's text, the token limit and
the model folder, so an edited workload is recorded afresh; never in git.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from acceptance_workloads import Turn

from specd import environment


@dataclass(frozen=True)
class Recording:
    """One request: what was asked, and what the model answered."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]


def cache_dir() -> Path:
    return environment.specd_home() / "drafter-acceptance"


def load_or_record(name: str, turns: list[Turn], max_tokens: int) -> list[Recording]:
    """The cached recordings of a workload, recording (minutes on the CPU) what is missing."""
    from specd.default_model import resolve_model_path

    model_path = resolve_model_path("default")
    key = hashlib.sha256(json.dumps([[t.user, t.follows, t.raw] for t in turns] + [max_tokens, model_path.name])
                         .encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.json"
    if path.exists():
        return [Recording(**r) for r in json.loads(path.read_text())]
    started = time.perf_counter()
    recordings = _record(turns, max_tokens, model_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.__dict__ for r in recordings]))
    print(f"recorded {name}: {len(recordings)} requests, "
          f"{sum(len(r.output_token_ids) for r in recordings)} tokens in {time.perf_counter() - started:.0f} s")
    return recordings


def _record(turns: list[Turn], max_tokens: int, model_path: Path) -> list[Recording]:
    from transformers import AutoTokenizer

    from drafter_service.local import LocalProposer
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine
    from verifier_service.engine.sampling_params import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engine = Engine(EngineConfig(model=str(model_path), device="cpu", dtype="float32", num_speculative_tokens=8),
                    proposer=LocalProposer())
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=(tokenizer.eos_token_id,))
    conversations: list[list[dict]] = []
    recordings = []
    for number, turn in enumerate(turns):
        history = conversations[turn.follows] if turn.follows is not None else []
        messages = history + [{"role": "user", "content": turn.user}]
        text = turn.user if turn.raw else tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                        tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        engine.add_request(f"record-{number}", list(prompt), params)
        output: list[int] = []
        while engine.has_unfinished_requests():
            for step_output in engine.step():
                output += step_output.new_token_ids
        answer = tokenizer.decode([t for t in output if t != tokenizer.eos_token_id])
        conversations.append(messages + [{"role": "assistant", "content": answer}])
        recordings.append(Recording(list(prompt), output))
    return recordings
