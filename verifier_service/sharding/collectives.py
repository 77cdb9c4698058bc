"""The collectives inside a sharded forward, on the default process group (the tensor-parallel ranks).

`all_reduce_` is registered as a custom op so that torch.compile keeps it as one opaque call inside the
compiled layer regions (model/compile.py) instead of tracing into torch.distributed; at run time, and
while a CUDA graph is captured, it is a plain `dist.all_reduce` (NCCL records it into the graph like any
kernel, as nano-vllm's and vLLM's captured decode steps do), or, where start-up set one up (on CUDA unless
SPECD_TENSOR_PARALLEL_ALL_REDUCE=nccl), the one-shot all-reduce over symmetric memory for the tensors it takes
(one_shot_all_reduce.py); in the deterministic mode, an all-gather summed in rank order (`use_fixed_order`).
`all_reduce_add_rms_norm` is the one shot's all-reduce of a row-parallel layer's output
together with the residual add and RMSNorm after it, in one kernel (sharding/layers.py: ReducingRMSNorm).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.13 renamed all_gather_into_tensor (same arguments); the GPU image's torch 2.11 has only the old name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_one_shot = None  # this rank's OneShotAllReduce, when start-up set one up (use_one_shot)
_fixed_order = False  # the deterministic mode: every sum in rank order (use_fixed_order)


def use_one_shot(one_shot) -> None:
    """Sends the all-reduces one_shot fits through it from now on (None: NCCL / gloo for all)."""
    global _one_shot
    _one_shot = one_shot


def use_fixed_order(fixed: bool) -> None:
    """With `fixed`, all-reduces sum every element over the ranks in rank order, ((r0 + r1) + r2) + ..., whatever
    the tensor's size: a ring or tree all-reduce adds in an order that follows how the size splits into chunks, so
    a token's sums would depend on how many rows came with it (the deterministic mode)."""
    global _fixed_order
    _fixed_order = fixed


def all_reduce_in_use() -> str:
    """Which all-reduce this rank's small tensors take: "one-shot" when start-up set it up, else "nccl"."""
    return "one-shot" if _one_shot is not None else "nccl"


@torch.library.custom_op("specd::tensor_parallel_all_reduce", mutates_args=("tensor",))
def all_reduce_(tensor: torch.Tensor) -> None:
    """Sums `tensor` over the ranks, in place."""
    if _fixed_order:
        _sum_in_rank_order_(tensor)
    elif _one_shot is not None and _one_shot.fits(tensor):
        _one_shot(tensor)
    else:
        dist.all_reduce(tensor)


@all_reduce_.register_fake
def _all_reduce_shape(tensor: torch.Tensor) -> None:
    return None


def _sum_in_rank_order_(tensor: torch.Tensor) -> None:
    world_size = dist.get_world_size()
    parts = tensor.new_empty(world_size * tensor.numel())  # rank-major
    _all_gather_single(parts, tensor.contiguous().view(-1))
    parts = parts.view(world_size, *tensor.shape)
    tensor.copy_(parts[0])
    for part in parts[1:]:
        tensor += part


def fuses_add_rms_norm(x: torch.Tensor) -> bool:
    """Whether all_reduce_add_rms_norm(x, ...) runs as one kernel: the one shot is set up and takes x's shape.
    Read while a region compiles (shapes and dtype only), so that other shapes keep NCCL's all-reduce, with the
    add and norm fused by the compiler behind it."""
    return _one_shot is not None and _one_shot.fits_rows(x)


@torch.library.custom_op("specd::tensor_parallel_all_reduce_add_rms_norm", mutates_args=())
def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * rms_norm(stream), stream) with stream = residual + x summed over the ranks (RMSNorm.add_forward
    of the sum), x and residual [rows, hidden], in the one shot's one kernel: only where fuses_add_rms_norm(x)
    (ReducingRMSNorm asks before it calls)."""
    return _one_shot.add_rms_norm(x.contiguous(), residual.contiguous(), weight, eps)


@all_reduce_add_rms_norm.register_fake
def _all_reduce_add_rms_norm_shape(x, residual, weight, eps):
    return torch.empty_like(x), torch.empty_like(residual)


def gather_vocab(local_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Every rank's vocabulary slice side by side: [n, vocab_per_rank] -> [n, vocab_size] (padding cut off)."""
    world_size = dist.get_world_size()
    rows, per_rank = local_logits.shape
    gathered = local_logits.new_empty(world_size * rows, per_rank)  # rank-major: [rank 0's n rows, rank 1's ...]
    _all_gather_single(gathered, local_logits.contiguous())
    by_token = gathered.view(world_size, rows, per_rank).permute(1, 0, 2).reshape(rows, world_size * per_rank)
    return by_token[:, :vocab_size]


def min_over_ranks(value: int, device: torch.device) -> int:
    """The smallest `value` any rank holds (e.g. KV blocks: every rank must hold the same block ids)."""
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())
