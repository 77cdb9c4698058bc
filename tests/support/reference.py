"""transformers' greedy decoding as the reference for exactness tests, cached on disk.

`hf_greedy` runs `generate(do_sample=False)` in float32 on the CPU, one prompt at a time (no padding
to perturb the numerics). Each result is stored under ${SPECD_TEST_CACHE:-$TMPDIR/specd-test-cache},
keyed by the model (folder, config and weight files' sizes and times), the prompt ids, the length and
the EOS choice, so the slow reference runs once per CI run however many tests share it. `hf_logits` is
one forward of the same model over a whole sequence, the reference for logprobs. `default_model_token_ids` is
the default model's tokenizer on test texts.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from specd import environment


def cache_dir() -> Path:
    return environment.test_cache() / "hf_greedy"


def _model_fingerprint(model_dir: Path) -> str:
    """Changes whenever the checkpoint folder's files do."""
    stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in model_dir.iterdir() if p.is_file())
    return json.dumps([str(model_dir.resolve()), stats])


@functools.lru_cache(maxsize=2)
def _load(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _generate(model_dir: Path, prompt: list[int], max_new_tokens: int, ignore_eos: bool,
              repetition_penalty: float | None) -> list[int]:
    import torch

    model = _load(str(model_dir))
    eos = model.generation_config.eos_token_id
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (eos if isinstance(eos, int) else 0)
    input_ids = torch.tensor([prompt])
    with torch.inference_mode():
        # An explicit mask: generate() would otherwise mask every prompt token equal to pad_token_id.
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new_tokens,
                                eos_token_id=None if ignore_eos else eos, pad_token_id=pad,
                                temperature=None, top_p=None, top_k=None, repetition_penalty=repetition_penalty)
    return output[0, len(prompt):].tolist()


def hf_greedy(model_dir: str | Path, prompts_token_ids: list[list[int]], max_new_tokens: int,
              ignore_eos: bool = False, repetition_penalty: float | None = None) -> list[list[int]]:
    """Greedy continuations (new tokens only; a final EOS included unless ignore_eos) of each prompt, with
    transformers' repetition penalty when given."""
    model_dir = Path(model_dir)
    fingerprint = _model_fingerprint(model_dir)
    results = []
    for prompt in prompts_token_ids:
        penalty = [] if repetition_penalty is None else [repetition_penalty]  # earlier keys stay valid
        key = json.dumps([fingerprint, list(prompt), max_new_tokens, ignore_eos, *penalty])
        path = cache_dir() / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
        if path.is_file():
            results.append(json.loads(path.read_text()))
            continue
        tokens = _generate(model_dir, list(prompt), max_new_tokens, ignore_eos, repetition_penalty)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(tokens))
        partial.replace(path)  # atomic: parallel test processes never read half a file
        results.append(tokens)
    return results


def hf_logits(model_dir: str | Path, token_ids: list[int]):
    """transformers' float32 logits [len(token_ids), vocab] of one sequence (row i predicts token i + 1)."""
    import torch

    with torch.inference_mode():
        return _load(str(Path(model_dir)))(torch.tensor([list(token_ids)])).logits[0].float()


def default_model_token_ids(texts: list[str]) -> list[list[int]]:
    """Each text's token ids under the default model's tokenizer."""
    from transformers import AutoTokenizer

    from specd.default_model import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    return [tokenizer(text)["input_ids"] for text in texts]
