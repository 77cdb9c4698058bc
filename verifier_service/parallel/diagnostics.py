"""What a tensor-parallel verifier says about itself, so that a slow or stuck run shows where each rank is.

A hang across processes is silent: every rank waits in a collective for another. So
- every rank logs each start-up phase when it begins and ends (`phase`), and the first steps it runs;
- SIGUSR1 makes a rank write the Python stacks of all its threads to stderr (every rank registers it:
  `kill -USR1 <pid>` on a live verifier); rank 0's watch writes its own and signals every other rank when it
  declares a step hung (supervisor.py);
- with SPECD_TENSOR_PARALLEL_DUMP_S=S, a phase or one of the first steps that runs longer than S seconds
  writes its rank's stacks every S seconds while it lasts, without any signal from outside. A Python thread
  formats them, holding the interpreter lock: faulthandler's timed dump reads the other threads' frames without
  it, and on H100s it crashed ranks (SIGSEGV) that were compiling with inductor's worker threads running.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from specd import environment
from verifier_service.engine.batch import ScheduledBatch

logger = logging.getLogger(__name__)

FIRST_STEPS_LOGGED = 3  # steps each rank logs, with their kind (CUDA graph or eager) and their timing


def dump_after_s() -> float | None:
    """SPECD_TENSOR_PARALLEL_DUMP_S as seconds; None when unset or 0 (no timed stack dumps)."""
    value = environment.tensor_parallel_dump_s()
    if value < 0:
        raise ValueError(f"{environment.TENSOR_PARALLEL_DUMP_S}: must be >= 0 (0 = off), got {value}")
    return value or None


def register_stack_dump_signal() -> None:
    """SIGUSR1 writes this process's Python stacks (all threads) to stderr, even while the main thread waits
    in native code (a collective, a device sync)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def dump_stacks(other_ranks: Iterable[int]) -> None:
    """Writes this process's stacks to stderr and asks the processes `other_ranks` (pids) for theirs."""
    faulthandler.dump_traceback(all_threads=True)
    for pid in other_ranks:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def format_stacks() -> str:
    """Every thread's Python stack, innermost call last, as traceback prints it (taken under the GIL)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(f"Thread {names.get(ident, ident)} (most recent call first):\n"
                     + "".join(reversed(traceback.format_stack(frame)))
                     for ident, frame in sys._current_frames().items())


@contextmanager
def phase(rank: int, name: str) -> Iterator[None]:
    """Logs `name` on rank `rank` when it begins and ends (with its seconds); with SPECD_TENSOR_PARALLEL_DUMP_S,
    writes the rank's stacks every that many seconds while it runs."""
    dump_s = dump_after_s()
    logger.info("rank %d: %s ...", rank, name)
    began = time.monotonic()
    done = threading.Event()
    if dump_s is not None:
        threading.Thread(target=_dump_while_running, args=(rank, name, began, dump_s, done), daemon=True,
                         name=f"rank-{rank}-phase-watch").start()
    try:
        yield
    except BaseException:
        logger.error("rank %d: %s failed after %.2f s", rank, name, time.monotonic() - began)
        raise
    finally:
        done.set()
    logger.info("rank %d: %s done in %.2f s", rank, name, time.monotonic() - began)


def _dump_while_running(rank: int, name: str, began: float, every_s: float, done: threading.Event) -> None:
    while not done.wait(every_s):
        stacks = format_stacks()
        if not done.is_set():
            logger.warning("rank %d: %s still running after %.0f s; its stacks:\n%s", rank, name,
                           time.monotonic() - began, stacks)


def describe_step(batch: ScheduledBatch, runner) -> str:
    """One line for a step: requests, tokens, whether a CUDA graph replays it (and which), the feedback."""
    shape = runner.graphs.shape_for(batch) if runner.graphs is not None else None
    kind = f"CUDA graph (bucket, width) = {shape}" if shape is not None else "eager"
    feedback = "none" if batch.previous_result is None else tuple(batch.previous_result.shape)
    return f"{len(batch.requests)} requests, {batch.num_tokens} tokens, {kind}, feedback {feedback}"
