"""Ranks 1..N-1 of a tensor-parallel verifier: a process that runs whatever forward rank 0 runs.

Its whole life: join the process groups, build its shard's runner (the same start-up as rank 0's, in
step with it: launch.py), then receive each step's batch and execute it, until rank 0 says stop; then drop
its CUDA graphs and leave the process groups together with rank 0 (teardown.py). It never schedules,
samples or talks gRPC. It exits non-zero on any error (rank 0's watch sees the exit and takes the verifier
out) and as soon as rank 0's process ends, so no rank outlives the verifier. Its first steps wait for the
device and are logged with their time (diagnostics.py): a step that never ends names itself.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

from verifier_service.engine.config import EngineConfig
from verifier_service.engine.model_runner import ModelRunner, resolve_device
from verifier_service.engine.start_up_objects import freeze as freeze_start_up_objects
from verifier_service.parallel.batch_codec import decode_batch
from verifier_service.parallel.diagnostics import (FIRST_STEPS_LOGGED, describe_step, phase,
                                                   register_stack_dump_signal)
from verifier_service.parallel.rank_start import join_and_build, plan_shards
from verifier_service.sharding.shared_tuning import in_lockstep
from verifier_service.parallel.step_channel import Step
from verifier_service.parallel.teardown import leave_process_groups, release_cuda_graphs

logger = logging.getLogger(__name__)


def run_worker(config: EngineConfig, drafts: bool, rank: int, store_port: int, num_threads: int) -> None:
    """The process target of rank `rank` (spawned by launch.start_tensor_parallel)."""
    logging.basicConfig(level=logging.INFO, force=True,  # spawn ran the parent's main module, which may set its own
                        format=f"%(asctime)s verifier rank {rank} %(levelname)s %(name)s: %(message)s")
    register_stack_dump_signal()
    _exit_with_rank_0()
    torch.set_num_threads(num_threads)
    try:
        left = _serve(config, drafts, rank, store_port)
    except BaseException:  # noqa: BLE001 - any error leaves the ranks out of step: exit, and rank 0 follows
        logger.exception("rank %d failed", rank)
        os._exit(1)
    if not left:  # teardown abandoned (logged): skip the interpreter's exit, which would wait on it again
        logging.shutdown()
        os._exit(0)


def _serve(config: EngineConfig, drafts: bool, rank: int, store_port: int) -> bool:
    """Start-up, the step loop, teardown; whether the process groups were left cleanly."""
    size = config.tensor_parallel_size
    store = dist.TCPStore("127.0.0.1", store_port, size, is_master=False)
    runner, channel = join_and_build(config, drafts, plan_shards(config), rank, store, resolve_device(config.device))
    logger.info("rank %d of %d ready", rank, size)
    with torch.inference_mode(), in_lockstep():  # this rank runs only what rank 0 runs on every rank
        for index in itertools.count(1):
            if (step := channel.receive()) is None:
                break
            if index <= FIRST_STEPS_LOGGED:
                _execute_logged(runner, step, rank, index)
                if index == FIRST_STEPS_LOGGED:
                    _freeze_start_up_objects(rank)
            else:
                runner.execute(decode_batch(step.host, step.feedback))
    logger.info("rank %d: stopping after %d steps", rank, index - 1)
    release_cuda_graphs(runner)
    return leave_process_groups()


def _execute_logged(runner: ModelRunner, step: Step, rank: int, index: int) -> None:
    """One of the first steps, waited for on the device inside a logged phase."""
    batch = decode_batch(step.host, step.feedback)
    with phase(rank, f"step {index} ({describe_step(batch, runner)})"):
        runner.execute(batch)
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)


def _freeze_start_up_objects(rank: int) -> None:
    """What rank 0's verifier does after its warm-up (server.py), here after the warm-up's first steps (the first
    prefill compiles its shapes on every rank)."""
    frozen = freeze_start_up_objects()
    logger.info("rank %d: %d objects from start-up frozen (full collections skip them)", rank, frozen)


def _exit_with_rank_0() -> None:
    """A thread that ends this process when rank 0's does (killed, crashed, or exited after a failure)."""
    parent = multiprocessing.parent_process()

    def watch() -> None:
        wait([parent.sentinel])
        logger.error("rank 0 exited: stopping")
        os._exit(1)

    threading.Thread(target=watch, name="rank-0-watch", daemon=True).start()
