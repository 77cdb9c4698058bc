"""Rank 0's runner under tensor parallelism: what the engine calls instead of a ModelRunner.

`execute(batch)` (and `execute_greedy`) sends the batch to the other ranks (one StepChannel publish) and
runs rank 0's own shard of the forward; the other ranks run the same forward on the same batch
(worker.py), and the forward's collectives tie them together. The logits come back whole on rank 0 (the
LM head gathers the vocabulary), so the engine's sampling and verification are the single-GPU code, on
rank 0 only.

A batch is checked before it is sent, so a bad one fails on rank 0 alone, as it would without
parallelism; any failure after that leaves the ranks out of step, so it is fatal (supervisor.py).
The first steps are logged with their kind (diagnostics.py); `close` ends the run on every rank together
(teardown.py).
"""
from __future__ import annotations

import inspect
import logging

import torch

from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.parallel.batch_codec import encode_batch
from verifier_service.parallel.diagnostics import FIRST_STEPS_LOGGED, describe_step
from verifier_service.sharding.shared_tuning import in_lockstep
from verifier_service.parallel.step_channel import StepChannel
from verifier_service.parallel.supervisor import RankSupervisor
from verifier_service.parallel.teardown import leave_process_groups, release_cuda_graphs

logger = logging.getLogger(__name__)


class RankFailure(RuntimeError):
    """A tensor-parallel rank died or hung: the sharded model cannot run any more."""


class ParallelRunner:
    """Rank 0's ModelRunner (`local`) plus the channel to, and the watch over, ranks 1..N-1.

    Reads of other attributes (num_blocks, vocab_size, device, graphs, model, ...) are the local runner's:
    rank 0's shard, with the same block count, vocabulary and limits as every rank. The local runner's
    methods are not: one that launches device work, run on rank 0 alone, would leave the other ranks
    behind, so only those defined here exist (a caller that probes with getattr, as the engine does for
    execute_greedy, then takes its fallback). A new runner method the engine calls must be added here.
    """

    def __init__(self, local: ModelRunner, channel: StepChannel, supervisor: RankSupervisor) -> None:
        self.local, self.channel, self.supervisor = local, channel, supervisor
        self.tensor_parallel_size = len(supervisor.workers) + 1
        self._closed = False

    def __getattr__(self, name: str):  # only called for names the instance itself lacks
        if name == "local":  # not set yet
            raise AttributeError(name)
        value = getattr(self.local, name)
        if inspect.ismethod(value):
            raise AttributeError(f"{name}: ParallelRunner runs only the methods it defines, on every rank "
                                 f"(verifier_service/parallel/runner.py)")
        return value

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [batch.num_logits, vocab_size], as ModelRunner.execute returns them."""
        self.local.check(batch)
        return self._step(batch, self.local.execute)

    @torch.inference_mode()
    def execute_greedy(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """ModelRunner.execute_greedy: the CUDA graph's own greedy verdict, None where no graph fits (then
        nothing was sent). The other ranks execute the batch, which replays the same graph (its verdict,
        computed from the gathered logits on every rank, is read on rank 0 only)."""
        self.local.check(batch)
        if self.local.graphs is None or self.local.graphs.shape_for(batch) is None:
            return None
        return self._step(batch, self.local.execute_greedy)

    def _step(self, batch: ScheduledBatch, run):
        """Sends the batch, then runs rank 0's part with run(batch); any failure here is fatal."""
        if self.supervisor.failure is not None:
            raise RankFailure(f"tensor parallelism failed: {self.supervisor.failure}")
        progress = self.supervisor.progress
        progress.begin(lambda: describe_step(batch, self.local))
        if progress.steps <= FIRST_STEPS_LOGGED:
            logger.info("rank 0: step %d: %s", progress.steps, describe_step(batch, self.local))
        try:
            self.channel.publish(*encode_batch(batch))
            with in_lockstep():  # the other ranks run this forward too (kernels they tune, they tune together)
                result = run(batch)
        except Exception as error:
            self.supervisor.fail(f"rank 0's step failed: {type(error).__name__}: {error}")
            raise
        progress.launched(self.local.device)
        return result

    def add_failure_callback(self, callback) -> None:
        """callback(reason) once a rank dies or hangs (the verifier leaves the service: server.py)."""
        self.supervisor.add_failure_callback(callback)

    def close(self) -> None:
        """Stops the other ranks and leaves the process groups with them; after a rank failure, kills them and
        aborts the groups. Returns within a bounded time either way (teardown.py); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        healthy = self.supervisor.failure is None
        self.supervisor.stop_watching()  # the other ranks now exit by design
        if healthy:
            self.channel.stop()  # they drop their graphs and leave the groups now, as rank 0 does below
        else:
            self.supervisor.stop(timeout_s=0.0)  # they may wait in a collective for good
        release_cuda_graphs(self.local, synchronize=healthy)
        leave_process_groups(healthy)
        self.supervisor.stop()
