"""A low-latency all-reduce for the small tensors of decode steps: PyTorch's symmetric memory, one shot.

A batch-1 step of a sharded model runs two all-reduces per layer of one [tokens, hidden] row block (8 KB for
Qwen3-8B). NCCL spends ~12 us on each in a CUDA graph, almost all of it latency: at TP = 2 on H100s a Qwen3-8B
decode step takes 4.40 ms against a 2.75 ms weight-read floor (docs/BENCHMARKS.md, round 10). One shot: each rank writes
its tensor into a buffer every rank of the host maps (torch.distributed._symmetric_memory: CUDA IPC over
NVLink), the ranks meet at a barrier of signal pads, and each rank sums every rank's buffer itself, then meets
the others again so that no buffer is overwritten while a peer still reads it. A copy and one kernel per all-reduce,
captured into CUDA graphs like any kernel. It needs no NVLink multicast (NVLS), which is off on our machines.

Opt-in: SPECD_TENSOR_PARALLEL_ALL_REDUCE=one-shot (default nccl). Measured (round 10, 2x H100): 9.8 us against
NCCL's 11.7 us at 8 KB, but the TP = 2 decode step was not faster with it (4.52 against 4.40 ms). Tensors of
another dtype or over MAX_BYTES (prefill chunks, big batches), and every run off CUDA, keep NCCL / gloo.
Every rank sets it up at start-up, or none does (a rank that fails says why; then all keep NCCL).
"""
from __future__ import annotations

import logging
import os
import warnings

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

MODE_ENV = "SPECD_TENSOR_PARALLEL_ALL_REDUCE"
MODES = ("nccl", "one-shot")
SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)  # what PyTorch's one-shot kernel is built for
MAX_BYTES = 512 << 10  # one shot reads every peer's whole tensor: past ~0.5 MB NCCL's ring is faster


def all_reduce_mode() -> str:
    """SPECD_TENSOR_PARALLEL_ALL_REDUCE, checked: one of MODES (default nccl)."""
    mode = os.environ.get(MODE_ENV) or "nccl"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}: must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


class OneShotAllReduce:
    """Sums small tensors of one dtype over the default process group's ranks (see the module docstring)."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.dtype = dtype
        self.group_name = dist.group.WORLD.group_name
        with warnings.catch_warnings():  # needed by older torch (the GPU image's 2.11); deprecated, a no-op, later
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(self.group_name)
        self.buffer = symm_mem.empty(MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)  # collective: every rank maps every buffer

    def fits(self, tensor: torch.Tensor) -> bool:
        """Whether one shot takes tensor: its dtype, contiguous, 16-byte aligned, at most MAX_BYTES."""
        size = tensor.numel() * tensor.element_size()
        return (tensor.dtype == self.dtype and tensor.is_contiguous() and size <= MAX_BYTES and size % 16 == 0
                and tensor.data_ptr() % 16 == 0)

    def __call__(self, tensor: torch.Tensor) -> None:
        """Sums `tensor` over the ranks, in place."""
        flat = tensor.view(-1)
        staged = self.buffer[:flat.numel()]
        staged.copy_(flat)  # PyTorch's documented one-shot op reads the shared buffer and writes any output
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, flat)


def set_up(dtype: torch.dtype, device: torch.device) -> OneShotAllReduce | None:
    """Every rank's OneShotAllReduce when the mode asks for one and every rank could make it, else None (then
    all ranks keep NCCL). Call on every rank after the process groups exist, before any CUDA graph capture."""
    if all_reduce_mode() != "one-shot" or device.type != "cuda":
        return None
    if dtype not in SUPPORTED_DTYPES:  # the same answer on every rank: no need to agree
        logger.warning("one-shot all-reduce takes %s, not %s: NCCL all-reduces throughout",
                       ", ".join(map(str, SUPPORTED_DTYPES)), dtype)
        return None
    made, reason = None, ""
    try:
        made = OneShotAllReduce(dtype, device)
    except Exception as error:  # noqa: BLE001 - reported, then every rank falls back together
        reason = f"{type(error).__name__}: {error}"
    everyone = torch.tensor([made is not None], dtype=torch.int32, device=device)
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    if not everyone.item():
        logger.warning("rank %d: one-shot all-reduce unavailable (%s): NCCL all-reduces throughout", dist.get_rank(),
                       reason or "another rank could not set it up")
        return None
    logger.info("rank %d: one-shot all-reduce (symmetric memory) for %s tensors up to %d KB", dist.get_rank(),
                dtype, MAX_BYTES >> 10)
    return made
