"""Leaving a tensor-parallel run: a clean close stops the other rank (exit 0, no failure reported) and leaves the
process groups; a close after a rank died returns at once; graphs are reset before the groups are left (NCCL
waits for every graph that captured one of its collectives); a teardown that never returns is abandoned."""
from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from engine_model.checkpoints import save_tiny_checkpoint
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.cuda_graphs import GraphedSteps
from verifier_service.engine.piecewise_graphs import PiecewiseGraphs
from verifier_service.runners import build_model_runner
from verifier_service.parallel import teardown
from verifier_service.parallel.teardown import leave_process_groups, release_cuda_graphs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EngineConfig:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_checkpoint("llama-gqa-llama3-rope-untied-sharded", folder)
    return EngineConfig(model=str(folder), device="cpu", dtype="float32", kv_cache_bytes=1 << 20,
                        tensor_parallel_size=2)


def test_close_stops_the_other_rank_cleanly_and_leaves_the_groups(config):
    runner = build_model_runner(config)
    (worker,) = runner.supervisor.workers
    runner.close()
    assert worker.exitcode == 0
    assert runner.supervisor.failure is None  # rank 1 exiting after STOP is no failure
    assert not dist.is_initialized()
    runner.close()  # a second close (a caller's finally, say) does nothing


def test_close_after_a_rank_died_returns_at_once(config):
    runner = build_model_runner(config)
    (worker,) = runner.supervisor.workers
    worker.kill()
    deadline = time.monotonic() + 30
    while runner.supervisor.failure is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner.supervisor.failure == "rank 1 exited with code -9"
    began = time.monotonic()
    runner.close()
    assert time.monotonic() - began < 10
    assert not dist.is_initialized()


class RecordingGraph:
    def __init__(self, log: list[str], name: str):
        self.log, self.name = log, name

    def reset(self) -> None:
        self.log.append(self.name)


def test_every_captured_graph_is_reset_and_dropped():
    log: list[str] = []
    graphs = GraphedSteps(None, block_size=16, scratch_block=9, max_batch=4, widths=[1, 5], max_model_len=64,
                          device=torch.device("cpu"))  # nothing captured on the CPU: graphs put in by hand
    graphs._graphs = {(1, 1): (RecordingGraph(log, "1x1"), None), (4, 5): (RecordingGraph(log, "4x5"), None)}

    class Runner:
        device = torch.device("cpu")

    pieces = PiecewiseGraphs.__new__(PiecewiseGraphs)  # no model on the CPU either: its graphs put in by hand
    pieces._graphs = {16: [RecordingGraph(log, "16/0"), RecordingGraph(log, "16/1")], 32: [RecordingGraph(log, "32/0")]}
    runner = Runner()
    runner.graphs, runner.pieces = graphs, pieces
    release_cuda_graphs(runner, synchronize=False)
    assert sorted(log) == ["16/0", "16/1", "1x1", "32/0", "4x5"] and not graphs._graphs and not pieces._graphs
    assert runner.graphs is None and runner.pieces is None
    release_cuda_graphs(runner, synchronize=False)  # nothing left to release: a no-op


def test_a_teardown_that_does_not_return_is_abandoned_after_its_timeout(monkeypatch, caplog):
    never = threading.Event()
    monkeypatch.setattr(teardown.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(teardown.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(teardown.dist, "destroy_process_group", never.wait)
    try:
        began = time.monotonic()
        assert leave_process_groups(timeout_s=0.2) is False
        assert time.monotonic() - began < 5
    finally:
        never.set()
    assert "rank 1: leaving the process groups has not returned after 0 s: abandoned" in caplog.text
