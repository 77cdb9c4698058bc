"""How a rank leaves a tensor-parallel run: it drops its CUDA graphs, then leaves the process groups.

NCCL keeps a communicator alive while a CUDA graph that captured one of its collectives exists (it counts
them, localPersistentRefs), and ncclCommDestroy, so dist.destroy_process_group, waits until they are all
destroyed: forever, where the graphs outlive the call (pytorch/pytorch#115388). Every rank's captured decode /
verify steps hold such collectives, so each rank resets its graphs first (nano-vllm's exit() deletes its
graphs before destroy_process_group for the same reason). NCCL's teardown may also wait on the other ranks
(it flushes what is in flight), so all ranks leave at about the same time: rank 0 sends STOP, then leaves
while the others do. After a rank failure the groups are aborted instead (nothing would flush), and a
teardown that still does not return within `timeout_s` is abandoned with an error in the log, so that it
never holds the process.
"""
from __future__ import annotations

import logging
import threading
import time

import torch
import torch.distributed as dist

from verifier_service.sharding.collectives import use_fixed_order, use_one_shot

logger = logging.getLogger(__name__)

LEAVE_TIMEOUT_S = 60.0


def release_cuda_graphs(runner, synchronize: bool = True) -> None:
    """Resets and drops a ModelRunner's captured graphs, decode / verify steps and pieces (they are never replayed
    again); synchronize first where the device is healthy, so that no replay is still running."""
    captured = [graphs for graphs in (runner.graphs, runner.pieces) if graphs is not None]
    runner.graphs = runner.pieces = None
    if not captured:
        return
    if synchronize:
        torch.cuda.synchronize(runner.device)
    for graphs in captured:
        graphs.release()


def leave_process_groups(healthy: bool = True, timeout_s: float = LEAVE_TIMEOUT_S) -> bool:
    """Destroys every process group (aborts them after a rank failure: `healthy` False); True once done,
    False when it failed or had not returned after timeout_s (then it is left running on a daemon thread)."""
    if not dist.is_initialized():
        return True
    use_one_shot(None)  # its symmetric buffer is mapped through the groups: dropped before they go
    use_fixed_order(False)
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    leave = abort if not healthy and abort is not None and dist.get_backend() == "nccl" else dist.destroy_process_group
    rank, errors = dist.get_rank(), []
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None  # a new thread starts on GPU 0

    def run() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            leave()
        except BaseException as error:  # noqa: BLE001 - reported below, on the caller's thread
            errors.append(error)

    began = time.monotonic()
    thread = threading.Thread(target=run, name="tensor-parallel-leave", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        logger.error("rank %d: leaving the process groups has not returned after %.0f s: abandoned (does a CUDA "
                     "graph with NCCL collectives still exist, or does a rank still wait in one?)", rank, timeout_s)
        return False
    if errors:
        logger.error("rank %d: leaving the process groups failed: %s: %s", rank, type(errors[0]).__name__, errors[0])
        return False
    logger.info("rank %d: left the process groups (%s) in %.1f s", rank,
                "destroyed" if leave is dist.destroy_process_group else "aborted", time.monotonic() - began)
    return True
