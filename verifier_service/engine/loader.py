"""Builds a CausalLM from a Hugging Face checkpoint folder (safetensors, sharded or single file).

Name mapping from the checkpoint to our parameters: everything keeps its Hugging Face name except
  self_attn.{q,k,v}_proj.{weight,bias} -> rows [q | k | v] of self_attn.qkv_proj
  mlp.{gate,up}_proj.{weight,bias}      -> rows [gate | up] of mlp.gate_up_proj
and `lm_head.weight` is the embedding matrix when the config ties them or the checkpoint has no LM head.
The model is built on the meta device and materialised once in the target dtype and device, so
loading never holds a second copy of the weights. A tensor-parallel rank (`shard`) builds its part of
the model (sharding/model.py; the loader sits above model/ and parallel/'s layers for that) and reads only its rows or columns of each tensor (safetensors slices).
`random_weights` skips the checkpoint's weights (only config.json is read): benchmarks of shapes too big
to write to disk draw each rank's shard on its own device instead.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open

from verifier_service.model.config import ModelConfig, load_model_config
from verifier_service.model.decoder import CausalLM
from verifier_service.sharding.model import ParallelCausalLM
from verifier_service.sharding.shard import RankShard

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


def load_weights(model: CausalLM, model_dir: Path, shard: RankShard | None = None) -> None:
    """Copies every checkpoint tensor (the shard's slice of it) into its (possibly fused) parameter;
    fails on missing weights."""
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
                tensor = f.get_tensor(name) if shard is None else _read_slice(f, name, shard)
                param = params[target].data
                rows = param if offset is None else param.narrow(0, offset, tensor.shape[0])
                if shard is not None and offset is None and tensor.shape[0] < param.shape[0]:
                    rows = param.zero_().narrow(0, 0, tensor.shape[0])  # the last rank's vocabulary padding
                rows.copy_(tensor)
                loaded[target] += 1
                expected[target] = parts
    if "lm_head.weight" not in loaded:  # tied, or a checkpoint without its own LM head
        model.tie_embeddings()
        loaded["lm_head.weight"] = expected["lm_head.weight"] = 1
    missing = [n for n in params if loaded[n] != expected.get(n, 1)]
    if missing:
        raise ValueError(f"model: checkpoint in {model_dir} lacks weights for {missing[:5]}")


def _read_slice(f, name: str, shard: RankShard) -> torch.Tensor:
    """The rows or columns of checkpoint tensor `name` that the shard holds, read without the rest."""
    part = shard.checkpoint_slice(name)
    if part is None:
        return f.get_tensor(name)
    dim, start, stop = part
    view = f.get_slice(name)
    return view[start:stop] if dim == 0 else view[:, start:stop]


def _build(config: ModelConfig, max_position: int | None, shard: RankShard | None) -> CausalLM:
    if shard is None:
        return CausalLM(config, max_position)
    return ParallelCausalLM(config, shard, max_position)


EMBEDDING_STD = 1.0  # random weights: the token's embedding leads the residual stream ...
RESIDUAL_WRITE_STD = 1e-4  # ... over what o_proj and down_proj add to it (initialise_random says why)
MATRIX_STD = 0.02  # the other matrices, the LM head's rows among them
TABLE_SEED = 0  # the embedding table is drawn alike on every rank: a rank's LM head rows come from other ranks' rows


@torch.no_grad()
def initialise_random(model: CausalLM, seed: int, vocab: tuple[int, int], vocab_size: int) -> None:
    """Weights of the right shapes for timing runs (a kernel's work does not depend on the values), drawn so that
    greedy decoding follows the current token by a margin no rounding crosses: the next token of t is t + 1 (t
    itself with tied embeddings), as a real model's confident choice. vocab: the rows this model holds (a tensor
    parallel rank's span, which may reach past vocab_size: zero rows), of the whole model's vocab_size.

    N(0, 1) embeddings, N(0, 1e-4) for the projections that write into the residual stream (o_proj, down_proj),
    N(0, 0.02) for the other matrices, ones for norms and biases: the current token's embedding leads the
    residual stream. The LM head's row t + 1 is 0.02 x the embedding of t, which the final norm's output meets
    with a logit of ~0.02 x hidden_size, the other rows with ~0.02 x sqrt(hidden_size). Round 13 drew N(0, 0.02)
    everywhere (1.03 tokens a step with replayed drafts); round 17 only the embeddings and residual writes as
    here, with an N(0, 0.02) head: at Llama-3-70B shapes over 4 ranks the top two of 128k near-flat logits were
    a bf16 rounding apart often enough that greedy with drafts parted from greedy without at token 11 (1.07)."""
    embedding, head = model.model.embed_tokens.weight, model.lm_head.weight
    start, stop = vocab[0], max(vocab[0], min(vocab[1], vocab_size))
    table = torch.empty(vocab_size, embedding.shape[1], dtype=embedding.dtype, device=embedding.device)
    table.normal_(0.0, EMBEDDING_STD, generator=torch.Generator(table.device).manual_seed(TABLE_SEED))
    embedding.zero_()[:stop - start] = table[start:stop]
    if head is not embedding:
        previous = (torch.arange(start, stop, device=table.device) - 1) % vocab_size
        head.zero_()[:stop - start] = table[previous] * MATRIX_STD
    del table
    generator = torch.Generator(embedding.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if param is embedding or param is head:
            continue
        if param.dim() == 1:
            param.fill_(1.0)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            param.normal_(0.0, RESIDUAL_WRITE_STD, generator=generator)
        else:
            param.normal_(0.0, MATRIX_STD, generator=generator)


def load_model(model_dir: str | Path, device: torch.device | str, dtype: torch.dtype,
               max_position: int | None = None, shard: RankShard | None = None,
               random_weights: bool = False) -> CausalLM:
    """Reads config and weights of `model_dir` into a CausalLM on `device` in `dtype`, ready for inference
    (with `shard`, this rank's part of it; with `random_weights`, random weights of its shapes)."""
    model_dir, device = Path(model_dir), torch.device(device)
    config = load_model_config(model_dir)
    with torch.device("meta"):
        model = _build(config, max_position, shard).to(dtype)
    if config.tie_word_embeddings:
        model.tie_embeddings()  # before materialising, so the LM head takes no memory of its own
    model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.tie_embeddings()  # to_empty gives each module fresh tensors, which unties them
    model.model.rotary.rebuild(device)
    if random_weights:
        vocab = shard.vocab if shard is not None else (0, config.vocab_size)
        initialise_random(model, shard.rank if shard is not None else 0, vocab, config.vocab_size)
    else:
        load_weights(model, model_dir, shard)
    return model.eval().requires_grad_(False)
