"""The engine thread on a CPU of its own (SPECD_ENGINE_CPU, off by default).

The engine thread never sleeps after its pipe writes: each step it wakes the serving process's reader of its step
message and the drafter link's process. A pipe write is a synchronous wake-up in Linux, on which the scheduler may run
the woken thread on the writer's CPU first, and the engine thread then waits out the reader's work for the step
(tools/wake_cost.py: on the 2-core machine a writer's 500 us round took 789-843 us with the reader as it is, 599-625
with the reader kept off the writer's CPU; docs/BENCHMARKS.md round 46). Here the serving process keeps every thread of
its own off one CPU before it starts the engine process, which inherits that, and the engine thread alone takes it; so
no helper the engine thread wakes can run there. `auto` takes the last CPU the verifier may use, where it may use at
least MIN_CPUS (`specd up` refuses it for several verifier replicas: they would take the same one); a number
takes that CPU.
"""
from __future__ import annotations

import logging
import os

from specd import environment
from specd.startup_errors import StartupError

logger = logging.getLogger(__name__)

MIN_CPUS = 4  # below this, taking one would leave the rest of the verifier (serving process, drafter link) too few


def choose(device: str, tensor_parallel_size: int) -> int | None:
    """The engine thread's CPU by SPECD_ENGINE_CPU, or None: off, tensor parallel (each rank has an engine thread of
    its own), or `auto` off CUDA (the CPU's forward runs torch's OpenMP threads, which the engine thread starts and
    which would share its one CPU) or with too few CPUs. A number is taken on any device; one outside the CPUs the
    verifier may use, or its only one, is refused, naming the variable."""
    try:
        setting = environment.engine_cpu()
    except ValueError as error:
        raise StartupError(str(error)) from None
    if setting == "off" or tensor_parallel_size != 1 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if setting == "auto":
        if device != "cuda":
            return None
        if len(allowed) < MIN_CPUS:
            logger.info("%s=auto: %d CPUs, fewer than %d; the engine thread shares them", environment.ENGINE_CPU,
                        len(allowed), MIN_CPUS)
            return None
        return max(allowed)
    cpu = int(setting)
    if cpu not in allowed or len(allowed) < 2:
        raise StartupError(f"{environment.ENGINE_CPU}={cpu}: the verifier may use CPUs {sorted(allowed)} "
                         "and needs another beside it")
    return cpu


def keep_process_off(cpu: int) -> None:
    """Every thread of this process, and every thread and process they start from now on, off `cpu`."""
    others = os.sched_getaffinity(0) - {cpu}
    for thread_id in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread_id), others)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def take(cpu: int) -> None:
    """The calling thread (the engine's) alone on `cpu`."""
    os.sched_setaffinity(0, {cpu})


def step_aside() -> None:
    """A thread the engine thread starts (which inherits its one CPU) back on the CPUs of the process's main thread,
    which kept off it (where nothing was taken, that changes nothing)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, os.sched_getaffinity(os.getpid()))  # the main thread's id is the process's
