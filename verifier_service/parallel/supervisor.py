"""Rank 0 keeps watch over the other ranks: one that dies or hangs takes the whole verifier out.

A sharded model cannot run with a rank missing, and the others would wait in their next collective for
ever, so there is no partial service. The first failure is recorded (every later step raises it) and
handed to the failure callbacks: the verifier's marks health NOT_SERVING and ends the process non-zero
(server.py), so the gateway routes around it as around any dead replica.
- dead: a worker process exited (its sentinel, watched by a thread);
- hung: the last step rank 0 launched has not finished, on the host or on the device (a CUDA event
  recorded after its kernels), within SPECD_TENSOR_PARALLEL_TIMEOUT_S seconds (default 300: the first
  steps compile, which takes minutes for big models). Before it fails, the watch writes rank 0's Python
  stacks and has every other rank write its own (diagnostics.py), so the log says where each one waits.
The workers watch rank 0 in turn (worker.py): they exit when it does. A clean shutdown stops the watch
first (`stop_watching`), since the workers then exit by design.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

import torch

from specd import environment
from verifier_service.parallel.diagnostics import dump_stacks

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
_POLL_S = 0.2


def hang_timeout_s() -> float:
    """Seconds a step may take before its ranks count as hung (SPECD_TENSOR_PARALLEL_TIMEOUT_S)."""
    value = environment.tensor_parallel_timeout_s(DEFAULT_TIMEOUT_S)
    if value <= 0:
        raise ValueError(f"{environment.TENSOR_PARALLEL_TIMEOUT_S}: must be > 0, got {value}")
    return value


class StepProgress:
    """When rank 0's last step began, and whether it has finished (read by the watch thread)."""

    def __init__(self) -> None:
        self._state: tuple[float, torch.cuda.Event | None, bool] | None = None  # (began, device event, done)
        self.steps = 0  # steps begun
        self._describe: Callable[[], str] = lambda: "no step yet"

    def begin(self, describe: Callable[[], str] | None = None) -> None:
        """A step begins; describe() says what it is, should it hang (called only then: it may cost)."""
        self.steps += 1
        self._describe = describe or (lambda: "")
        self._state = (time.monotonic(), None, False)

    def launched(self, device: torch.device) -> None:
        """The step's work is queued: on CUDA it ends with an event, elsewhere it has already run."""
        began = self._state[0]
        if device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._state = (began, event, False)
        else:
            self._state = (began, None, True)

    def stalled_s(self) -> float:
        """Seconds the last step has been running, 0 when it is done (or none ran)."""
        state = self._state
        if state is None or state[2] or (state[1] is not None and state[1].query()):
            return 0.0
        return time.monotonic() - state[0]

    def describe(self) -> str:
        """The last step, for a failure message: its number, whether it reached the device, what it is."""
        where = "queued on the device" if self._state is not None and self._state[1] is not None else "on the host"
        try:
            what = self._describe()
        except Exception as error:  # noqa: BLE001 - a failure message must not fail
            what = f"not described: {type(error).__name__}"
        return f"step {self.steps} ({where}: {what})"


class RankSupervisor:
    """Watches the worker processes of ranks 1..N-1 and rank 0's step progress (see the module docstring)."""

    def __init__(self, workers: list[BaseProcess], timeout_s: float) -> None:
        self.workers, self.timeout_s = workers, timeout_s
        self.progress = StepProgress()
        self.failure: str | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tensor-parallel-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add_failure_callback(self, callback: Callable[[str], None]) -> None:
        """callback(reason) runs once, on whichever thread notices the failure first."""
        self._callbacks.append(callback)
        if self.failure is not None:
            callback(self.failure)

    def fail(self, reason: str) -> None:
        """Records the first failure and runs the callbacks; later calls do nothing."""
        with self._lock:
            if self.failure is not None or self._stopping.is_set():
                return
            self.failure = reason
        logger.error("tensor parallelism failed: %s", reason)
        for callback in list(self._callbacks):
            callback(reason)

    def stop_watching(self) -> None:
        """From now on nothing counts as a failure: the workers are about to exit by design."""
        self._stopping.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """A shutdown (the workers were told to stop, or are to be killed): waits up to timeout_s for them,
        then kills what is left."""
        self.stop_watching()
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                worker.kill()
                worker.join()

    def _watch(self) -> None:
        sentinels = {worker.sentinel: rank for rank, worker in enumerate(self.workers, start=1)}
        while not self._stopping.is_set() and self.failure is None:
            ended = wait(list(sentinels), timeout=_POLL_S)
            if self._stopping.is_set():
                return
            if ended:
                rank = sentinels[ended[0]]
                worker = self.workers[rank - 1]
                worker.join(timeout=1.0)  # the exit code is read when the process is reaped
                self.fail(f"rank {rank} exited with code {worker.exitcode}")
            elif self.progress.stalled_s() > self.timeout_s:
                dump_stacks(worker.pid for worker in self.workers if worker.is_alive())
                self.fail(f"{self.progress.describe()} has not finished on every rank after "
                          f"{self.timeout_s:.0f} s (a rank hangs)")
