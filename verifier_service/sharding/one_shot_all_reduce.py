"""A low-latency all-reduce for the small tensors of decode steps, over PyTorch's symmetric memory, in one kernel.

A batch-1 step of a sharded model runs two all-reduces per layer of one [tokens, hidden] row block (8 KB for
Qwen3-8B). NCCL spends ~12 us on each in a CUDA graph, almost all of it latency: at TP = 2 on H100s a Qwen3-8B
decode step took 4.40 ms against a 2.75 ms weight-read floor (docs/BENCHMARKS_ARCHIVE.md, round 10), 0.84 ms of it in 72
all-reduces. PyTorch's own one-shot kernel (a barrier of signal pads, a read of every peer's buffer, a second
barrier, and a copy into the shared buffer before it) saved only 2 us of them. This one sends instead of reads:
each rank writes its words straight into every peer's buffer (CUDA IPC over NVLink) and waits for theirs in its
own, with no barrier (triton_one_shot.py says how). A row-parallel layer's sum feeds a residual add and an RMSNorm
(model/layers.py: RMSNorm.add_forward); `add_rms_norm` does those in the same kernel, so the layer's all-reduce
costs one launch in all.

The default on CUDA; SPECD_TENSOR_PARALLEL_ALL_REDUCE=nccl turns it off. Measured (round 11, H100s): 3.1 us an
all-reduce of 8 KB against NCCL's 11.7 (4.5 us fused with the add and norm); a Qwen3-8B TP 2 decode step 4.06-4.11
against 4.29 ms, a Llama-3-70B TP 4 step 15.29 against 16.07 ms. Tensors of another dtype or over MAX_BYTES (prefill
chunks, big batches), and every run off CUDA, keep NCCL / gloo. Every rank sets it up at start-up, or none does (a
rank that fails says why, e.g. no peer access between its GPUs; then all keep NCCL). It needs no NVLink multicast
(NVLS), which is off on our machines.
"""
from __future__ import annotations

import logging
import warnings
import weakref

import torch
import torch.distributed as dist

from specd import environment
from verifier_service.kernels import pdl

logger = logging.getLogger(__name__)

MODES = ("nccl", "one-shot")
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)  # 16-bit words: -0.0 marks a word not yet arrived
MAX_BYTES = 512 << 10  # every rank sends its whole tensor to every peer: past ~0.5 MB NCCL's ring is faster
CHUNK = 1024  # words per program of a plain all-reduce (8 per thread, one 16-byte store each)
MIN_ROW, MAX_ROW = 64, 16384  # the rows add_rms_norm takes, one per program (Llama-3-405B's hidden: 16384)


def all_reduce_mode() -> str:
    """SPECD_TENSOR_PARALLEL_ALL_REDUCE, checked: one of MODES (default one-shot)."""
    mode = environment.tensor_parallel_all_reduce()
    if mode not in MODES:
        raise ValueError(f"{environment.TENSOR_PARALLEL_ALL_REDUCE}: must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


class OneShotAllReduce:
    """Sums small tensors of one dtype over the default process group's ranks (see the module docstring).

    Its buffer holds two independent sets of slots, one for plain all-reduces and one for add_rms_norm (their
    programs split a tensor differently, and a program must own the same words at every launch): each
    [2 parities, ranks, MAX_BYTES], with a parity counter per program.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        from verifier_service.sharding.triton_one_shot import EMPTY, one_shot_kernel

        self.kernel = one_shot_kernel  # imported here: Triton is there only where CUDA is
        self.dtype, self.rank, self.world = dtype, dist.get_rank(), dist.get_world_size()
        self.pdl = pdl.enabled(device)  # launched with programmatic dependent launch (kernels/pdl.py)
        self.slot = MAX_BYTES // dtype.itemsize  # words per rank and parity
        group_name = enable_symmetric_memory(dist.group.WORLD)
        set_words = 2 * self.world * self.slot
        self.buffer = symm_mem.empty(2 * set_words, dtype=torch.int16, device=device).fill_(EMPTY.value)
        self.plain = (0, torch.zeros(-(-self.slot // CHUNK), dtype=torch.int32, device=device))
        self.norm = (set_words, torch.zeros(self.slot // MIN_ROW, dtype=torch.int32, device=device))
        self.group_name, self.handle = group_name, None
        torch.cuda.synchronize(device)  # empty before connect() lets a peer see it

    def connect(self) -> OneShotAllReduce:
        """Maps every rank's buffer into this one (collective: every rank calls it). It returns once every rank has
        called it, and each emptied its buffer first: from then on any rank may send."""
        import torch.distributed._symmetric_memory as symm_mem

        self.handle = symm_mem.rendezvous(self.buffer, self.group_name)
        return self

    def fits(self, tensor: torch.Tensor) -> bool:
        """Whether the plain all-reduce takes tensor: its dtype, contiguous, at most MAX_BYTES."""
        return tensor.dtype == self.dtype and tensor.is_contiguous() and tensor.numel() <= self.slot

    def fits_rows(self, x: torch.Tensor) -> bool:
        """Whether add_rms_norm takes x [rows, hidden]: its dtype and shape only, what a compiled graph guards on."""
        rows, hidden = x.shape
        return x.dtype == self.dtype and MIN_ROW <= hidden <= MAX_ROW and rows * hidden <= self.slot

    def __call__(self, tensor: torch.Tensor) -> None:
        """Sums `tensor` over the ranks, in place."""
        numel = tensor.numel()
        self._launch(-(-numel // CHUNK), self.plain, tensor, tensor, tensor, tensor, tensor, numel, CHUNK, 0.0,
                     block=CHUNK, norm=False)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight * rms_norm(stream), stream), stream = residual + the sum of x over the ranks, as
        RMSNorm.add_forward rounds them; x, residual [rows, hidden] contiguous, x fits_rows."""
        rows, hidden = x.shape
        normed, stream = torch.empty_like(x), torch.empty_like(residual)
        self._launch(rows, self.norm, x, normed, residual, weight, stream, x.numel(), hidden, eps,
                     block=1 << (hidden - 1).bit_length(), norm=True)
        return normed, stream

    def _launch(self, programs: int, slots: tuple[int, torch.Tensor], x, out, residual, weight, residual_out,
                numel: int, width: int, eps: float, block: int, norm: bool) -> None:
        base, parities = slots
        self.kernel[(programs,)](x.view(torch.int16), out, residual, weight, residual_out, numel, width, eps,
                                 self.handle.buffer_ptrs_dev, base, self.slot, parities, RANK=self.rank,
                                 WORLD=self.world, BLOCK=block, NORM=norm, PDL=self.pdl,
                                 num_warps=8 if block >= 4096 else 4, launch_pdl=self.pdl)


# Group name -> the process group this process enabled symmetric memory for (see enable_symmetric_memory).
_symmetric_groups: dict[str, weakref.ref] = {}


def enable_symmetric_memory(group: dist.ProcessGroup) -> str:
    """Enables symmetric memory for `group`; its name. torch (2.11) binds a group name's symmetric memory to the
    store of the first process group of that name, for the life of the process (binding it again raises). A later
    group of the same name, in a process that builds a sharded engine again (tests, benches; the verifier builds
    one), would rendezvous through the first group's store, which its peers never see, and wait forever: it is
    refused here instead (RuntimeError), so that every rank keeps NCCL."""
    import torch.distributed._symmetric_memory as symm_mem

    name = group.group_name
    if bound_to_another_group(group):
        raise RuntimeError(f"this process bound symmetric memory to an earlier process group named {name!r}, "
                           "and torch cannot bind it again")
    if name not in _symmetric_groups:
        with warnings.catch_warnings():  # needed by older torch (the GPU image's 2.11); deprecated, a no-op, later
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(name)
        _symmetric_groups[name] = weakref.ref(group)
    return name


def bound_to_another_group(group: dist.ProcessGroup) -> bool:
    """Whether this process enabled symmetric memory for another process group of group's name before."""
    earlier = _symmetric_groups.get(group.group_name)
    return earlier is not None and earlier() is not group


def set_up(dtype: torch.dtype, device: torch.device) -> OneShotAllReduce | None:
    """Every rank's OneShotAllReduce when the mode asks for one and every rank could make it, else None (then
    all ranks keep NCCL). Call on every rank after the process groups exist, before any CUDA graph capture."""
    if all_reduce_mode() != "one-shot" or device.type != "cuda":
        return None
    if dtype not in SUPPORTED_DTYPES:  # the same answer on every rank: no need to agree
        logger.warning("one-shot all-reduce takes %s, not %s: NCCL all-reduces throughout",
                       ", ".join(map(str, SUPPORTED_DTYPES)), dtype)
        return None
    one_shot = on_every_rank(lambda: OneShotAllReduce(dtype, device), device, "allocate its buffer")
    if one_shot is None or on_every_rank(one_shot.connect, device, "map its peers' buffers") is None:
        return None
    logger.info("rank %d: one-shot all-reduce (symmetric memory) for %s tensors up to %d KB", dist.get_rank(),
                dtype, MAX_BYTES >> 10)
    return one_shot


def on_every_rank(make, device: torch.device, what: str):
    """make()'s result where it succeeded on every rank of the default group, else None on every rank: the ranks
    agree in one all-reduce, so that none goes on to a collective step (the buffers' rendezvous) that another rank
    has given up, and waits there forever. `what` names the step in the warning."""
    made, reason = None, ""
    try:
        made = make()
    except Exception as error:  # noqa: BLE001 - reported, then every rank falls back together
        reason = f"{type(error).__name__}: {error}"
    everyone = torch.tensor([made is not None], dtype=torch.int32, device=device)
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    if everyone.item():
        return made
    logger.warning("rank %d: one-shot all-reduce unavailable (could not %s: %s): NCCL all-reduces throughout",
                   dist.get_rank(), what, reason or "another rank failed")
    return None
