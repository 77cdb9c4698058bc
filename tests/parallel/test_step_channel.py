"""The step channel between two real processes over gloo: a step that fits one frame, one that needs a
second broadcast, device feedback of one or two dimensions (or none, or empty) beside it, and stop."""
from __future__ import annotations

import multiprocessing
import os

import torch
import torch.distributed as dist

from verifier_service.parallel.rank_start import join_process_groups
from verifier_service.parallel.step_channel import StepChannel
from verifier_service.parallel.teardown import leave_process_groups

CAPACITY = 8  # int64 per frame: a payload beyond 5 numbers continues in a second broadcast
STEPS = [(torch.arange(4), None),
         (torch.arange(100, 130), torch.tensor([[7, 0], [8, 2], [9, 1]])),  # (last token, accepted) per request
         (torch.arange(3), torch.tensor([7, 8])),
         (torch.arange(3), torch.tensor([], dtype=torch.int64))]


def receive_all(port: int, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    channel = StepChannel(join_process_groups(1, 2, store, torch.device("cpu")), torch.device("cpu"), CAPACITY)
    received = []
    while (step := channel.receive()) is not None:
        received.append((step.host.tolist(), None if step.feedback is None else step.feedback.tolist()))
    leave_process_groups()
    results.put(received)


def test_steps_arrive_whole_and_in_order_until_stop():
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    worker = spawn.Process(target=receive_all, args=(store.port, results))
    worker.start()
    try:
        channel = StepChannel(join_process_groups(0, 2, store, torch.device("cpu")), torch.device("cpu"), CAPACITY)
        for host, feedback in STEPS:
            channel.publish(host, feedback)
        channel.stop()
        received = results.get(timeout=60)
    finally:
        leave_process_groups()
        worker.join(timeout=30)
    assert worker.exitcode == 0
    assert received == [(h.tolist(), None if f is None else f.tolist()) for h, f in STEPS]
