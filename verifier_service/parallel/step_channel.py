"""Rank 0 -> every other rank, once per step: the step's host-side inputs and an optional device tensor of
feedback. The one interface between rank 0's step path and the other ranks' loops (worker.py).

Host inputs: one int64 CPU buffer (what batch_codec.py packs), broadcast on a gloo group, so no rank
waits on its device for it. It travels in a fixed frame of FRAME_CAPACITY int64 (128 KiB):
[kind, payload length, feedback rows, feedback columns, payload ...], one broadcast for every step whose inputs fit
(decode and verify steps of hundreds of sequences); a longer payload (large prefill chunks) goes on in
one more broadcast of exactly the rest.
Feedback: a small int64 device tensor of one or two dimensions (today the step in flight's result, per
request its last token and accepted drafts, which only the device knows yet under async scheduling)
broadcast on the default group: NCCL on CUDA, ordered on the streams like the forward's own collectives,
so no host waits for it either.
A STOP frame ends the other ranks' loops.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

FRAME_CAPACITY = 16384  # int64 per frame, header included
_STEP, _STOP = 1, 0
_HEADER = 4  # kind, payload length, feedback rows (-1: none), feedback columns (0: one dimension)


@dataclass
class Step:
    """One step's inputs as a rank other than 0 receives them."""

    host: torch.Tensor  # [n] int64 on the CPU
    feedback: torch.Tensor | None  # [rows] or [rows, columns] int64 on the rank's device


class StepChannel:
    """host_group: a gloo group of all ranks; device: this rank's (feedback lands there)."""

    def __init__(self, host_group: dist.ProcessGroup, device: torch.device, capacity: int = FRAME_CAPACITY):
        self.host_group, self.device = host_group, device
        self._frame = torch.zeros(capacity, dtype=torch.int64)

    # -- rank 0 -----------------------------------------------------------------------------------

    def publish(self, host: torch.Tensor, feedback: torch.Tensor | None = None) -> None:
        """Sends one step's inputs: host [n] int64 on the CPU; feedback int64 on the device, [rows] or
        [rows, columns], or None."""
        if feedback is not None and (feedback.dtype != torch.int64 or feedback.dim() not in (1, 2)):
            raise ValueError(f"feedback: must be int64 of 1 or 2 dimensions, got {feedback.dtype} "
                             f"{tuple(feedback.shape)}")
        length = host.numel()
        first = min(length, self._frame.numel() - _HEADER)
        shape = (-1, 0) if feedback is None else (feedback.shape[0], feedback.shape[1] if feedback.dim() == 2 else 0)
        self._frame[:_HEADER] = torch.tensor([_STEP, length, *shape])
        self._frame[_HEADER:_HEADER + first] = host[:first]
        dist.broadcast(self._frame, src=0, group=self.host_group)
        if first < length:
            dist.broadcast(host[first:].contiguous(), src=0, group=self.host_group)
        if feedback is not None and feedback.numel():
            dist.broadcast(feedback.contiguous(), src=0)

    def stop(self) -> None:
        """Ends every other rank's receive loop."""
        self._frame[:_HEADER] = torch.tensor([_STOP, 0, -1, 0])
        dist.broadcast(self._frame, src=0, group=self.host_group)

    # -- ranks 1..N-1 -----------------------------------------------------------------------------

    def receive(self) -> Step | None:
        """Blocks until rank 0 publishes; None once it stops."""
        dist.broadcast(self._frame, src=0, group=self.host_group)
        kind, length, feedback_rows, feedback_columns = self._frame[:_HEADER].tolist()
        if kind == _STOP:
            return None
        first = min(length, self._frame.numel() - _HEADER)
        host = self._frame[_HEADER:_HEADER + first].clone()
        if first < length:
            rest = torch.empty(length - first, dtype=torch.int64)
            dist.broadcast(rest, src=0, group=self.host_group)
            host = torch.cat([host, rest])
        return Step(host, self._receive_feedback(feedback_rows, feedback_columns))

    def _receive_feedback(self, rows: int, columns: int) -> torch.Tensor | None:
        if rows < 0:
            return None
        feedback = torch.empty((rows, columns) if columns else (rows,), dtype=torch.int64, device=self.device)
        if feedback.numel():
            dist.broadcast(feedback, src=0)
        return feedback
