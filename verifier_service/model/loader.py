"""Builds a CausalLM from a Hugging Face checkpoint folder (safetensors, sharded or single file).

Name mapping from the checkpoint to our parameters: everything keeps its Hugging Face name except
  self_attn.{q,k,v}_proj.{weight,bias} -> rows [q | k | v] of self_attn.qkv_proj
  mlp.{gate,up}_proj.{weight,bias}      -> rows [gate | up] of mlp.gate_up_proj
and `lm_head.weight` is the embedding matrix when the config ties them or the checkpoint has no LM head.
The model is built on the meta device and materialised once in the target dtype and device, so
loading never holds a second copy of the weights.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open

from verifier_service.model.config import ModelConfig, load_model_config
from verifier_service.model.decoder import CausalLM

_FUSED = {  # checkpoint projection -> (our fused projection, index of its part)
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints saved


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: from model.safetensors.index.json when sharded."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model: no *.safetensors weights in {model_dir}")
    return files


def _part_sizes(config: ModelConfig, fused: str) -> list[int]:
    if fused == "qkv_proj":
        kv = config.num_kv_heads * config.head_dim
        return [config.num_heads * config.head_dim, kv, kv]
    return [config.intermediate_size, config.intermediate_size]


def _target(name: str, config: ModelConfig) -> tuple[str, int | None, int]:
    """Our parameter name for a checkpoint tensor, its row offset in a fused parameter (or None), parts."""
    module_path, _, kind = name.rpartition(".")
    parent, _, projection = module_path.rpartition(".")
    if projection not in _FUSED:
        return name, None, 1
    fused, part = _FUSED[projection]
    sizes = _part_sizes(config, fused)
    return f"{parent}.{fused}.{kind}", sum(sizes[:part]), len(sizes)


def load_weights(model: CausalLM, model_dir: Path) -> None:
    """Copies every checkpoint tensor into its (possibly fused) parameter; fails on missing weights."""
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.config.tie_word_embeddings
    loaded, expected = Counter(), {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                target, offset, parts = _target(name, model.config)
                if target not in params:
                    raise ValueError(f"model: checkpoint weight {name!r} has no place in our {model.config.model_type}")
                tensor = f.get_tensor(name)
                param = params[target].data
                rows = param if offset is None else param.narrow(0, offset, tensor.shape[0])
                rows.copy_(tensor)
                loaded[target] += 1
                expected[target] = parts
    if "lm_head.weight" not in loaded:  # tied, or a checkpoint without its own LM head
        model.tie_embeddings()
        loaded["lm_head.weight"] = expected["lm_head.weight"] = 1
    missing = [n for n in params if loaded[n] != expected.get(n, 1)]
    if missing:
        raise ValueError(f"model: checkpoint in {model_dir} lacks weights for {missing[:5]}")


def load_model(model_dir: str | Path, device: torch.device | str, dtype: torch.dtype,
               max_position: int | None = None) -> CausalLM:
    """Reads config and weights of `model_dir` into a CausalLM on `device` in `dtype`, ready for inference."""
    model_dir, device = Path(model_dir), torch.device(device)
    config = load_model_config(model_dir)
    with torch.device("meta"):
        model = CausalLM(config, max_position).to(dtype)
    if config.tie_word_embeddings:
        model.tie_embeddings()  # before materialising, so the LM head takes no memory of its own
    model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.tie_embeddings()  # to_empty gives each module fresh tensors, which unties them
    model.model.rotary.rebuild(device)
    load_weights(model, model_dir)
    return model.eval().requires_grad_(False)
