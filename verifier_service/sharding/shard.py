"""Which part of the model a tensor-parallel rank holds, and which checkpoint rows and columns fill it.

Megatron-style (arXiv 1909.08053), per decoder layer:
- column-parallel `qkv_proj`: the q rows of the rank's query heads, the k and v rows of its KV heads;
  `gate_up_proj`: the gate and up rows of its slice of the intermediate dimension. No communication.
- row-parallel `o_proj` and `down_proj`: the matching input columns; each rank's output is a partial
  sum, all-reduced (one all-reduce each), and the bias is added once, after the sum.
- vocab-parallel embedding and LM head: rows [vocab_start, vocab_start + vocab_per_rank); the embedding
  is all-reduced (each token's row lives on one rank), the LM head's logits are gathered.
Norms (and QK-norm weights) are replicated.

Heads are split by KV group, so a rank's query heads read only its own KV heads:
- num_kv_heads >= N: each rank takes a contiguous run of KV heads and their query heads. When N does not
  divide num_kv_heads the runs differ by one head (SmolLM2-135M's 3 KV heads over 2 ranks: 2 and 1); the
  rank with more heads sets the step time, the arithmetic is the same.
- num_kv_heads < N: KV heads are replicated, N / num_kv_heads ranks per KV head, each with an equal share
  of its query heads (so N must be a multiple of num_kv_heads, and that share a whole number of heads).
The intermediate dimension is split the same way (runs differing by at most one); the vocabulary in
equal slices of ceil(vocab_size / N) rows, the last one padded (padding rows are never looked up and
their logits are cut off after the gather).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from verifier_service.model.config import ModelConfig

Span = tuple[int, int]  # [start, stop)


def balanced_span(total: int, parts: int, index: int) -> Span:
    """Part `index` of `total` items cut into `parts` contiguous runs whose sizes differ by at most one."""
    size, extra = divmod(total, parts)
    start = index * size + min(index, extra)
    return start, start + size + (index < extra)


@dataclass(frozen=True)
class RankShard:
    """What rank `rank` of `world_size` holds; spans count heads, intermediate rows and vocabulary rows."""

    rank: int
    world_size: int
    head_dim: int
    q_heads: Span
    kv_heads: Span
    intermediate: Span
    vocab: Span  # may reach past vocab_size on the last rank (padding rows)
    vocab_size: int  # of the whole model

    @property
    def vocab_per_rank(self) -> int:
        return self.vocab[1] - self.vocab[0]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(query heads, KV heads, intermediate rows, vocabulary rows): what sizes this rank's kernels."""
        return _length(self.q_heads), _length(self.kv_heads), _length(self.intermediate), self.vocab_per_rank

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The model this rank builds: fewer heads, a slice of the MLP and of the vocabulary."""
        return dataclasses.replace(
            config, num_heads=_length(self.q_heads), num_kv_heads=_length(self.kv_heads),
            intermediate_size=_length(self.intermediate), vocab_size=self.vocab_per_rank)

    def checkpoint_slice(self, name: str) -> tuple[int, int, int] | None:
        """(dim, start, stop) of checkpoint tensor `name` that this rank loads, or None for all of it."""
        module_path, _, kind = name.rpartition(".")
        module = module_path.rpartition(".")[2]
        heads = {"q_proj": self.q_heads, "k_proj": self.kv_heads, "v_proj": self.kv_heads, "o_proj": self.q_heads}
        if module in heads:
            if module == "o_proj" and kind == "bias":
                return None  # added once, after the all-reduce
            start, stop = heads[module]
            return (1 if module == "o_proj" else 0), start * self.head_dim, stop * self.head_dim
        if module in ("gate_proj", "up_proj"):
            return 0, *self.intermediate
        if module == "down_proj":
            return None if kind == "bias" else (1, *self.intermediate)
        if module in ("embed_tokens", "lm_head"):
            return 0, self.vocab[0], min(self.vocab[1], self.vocab_size)
        return None


def _length(span: Span) -> int:
    return span[1] - span[0]


def plan_shard(config: ModelConfig, world_size: int, rank: int) -> RankShard:
    """Rank `rank`'s shard; raises ValueError naming the field when the model cannot be split N ways."""
    if world_size < 1:
        raise ValueError(f"tensor_parallel_size: must be >= 1, got {world_size}")
    if config.intermediate_size < world_size:
        raise ValueError(f"tensor_parallel_size: {world_size} ranks exceed the {config.intermediate_size} "
                         f"rows of intermediate_size")
    q_heads, kv_heads = _head_spans(config, world_size, rank)
    per_rank = -(-config.vocab_size // world_size)
    return RankShard(rank=rank, world_size=world_size, head_dim=config.head_dim, q_heads=q_heads,
                     kv_heads=kv_heads, intermediate=balanced_span(config.intermediate_size, world_size, rank),
                     vocab=(rank * per_rank, (rank + 1) * per_rank), vocab_size=config.vocab_size)


def _head_spans(config: ModelConfig, world_size: int, rank: int) -> tuple[Span, Span]:
    """(query heads, KV heads) of a rank; see the module docstring for the two cases."""
    group = config.num_heads // config.num_kv_heads  # query heads per KV head
    if config.num_kv_heads >= world_size:
        kv_start, kv_stop = balanced_span(config.num_kv_heads, world_size, rank)
        return (kv_start * group, kv_stop * group), (kv_start, kv_stop)
    replicas = world_size // config.num_kv_heads
    if world_size % config.num_kv_heads:
        raise ValueError(f"tensor_parallel_size: {world_size} ranks cannot share the model's "
                         f"{config.num_kv_heads} KV heads (num_key_value_heads) equally: use a multiple of "
                         f"{config.num_kv_heads} or at most {config.num_kv_heads} ranks")
    if group % replicas:
        raise ValueError(f"num_attention_heads: {config.num_heads} query heads ({group} per KV head) cannot be "
                         f"split over tensor_parallel_size {world_size} ({replicas} ranks per KV head)")
    kv_head, share = divmod(rank, replicas)
    heads_per_rank = group // replicas
    q_start = kv_head * group + share * heads_per_rank
    return (q_start, q_start + heads_per_rank), (kv_head, kv_head + 1)
