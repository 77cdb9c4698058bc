"""A tensor-parallel verifier as a real process (2 CPU ranks over gloo, real gRPC health): a rank that dies or
hangs turns it NOT_SERVING and ends it non-zero (a hang with rank 0's stacks in the log, the others asked for
theirs); rank 1 freezes its start-up objects out of the collector's way; SIGTERM stops every rank cleanly; a
model that cannot be split, or more ranks than GPUs, fails start-up naming the option."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.local_stack import REPO_ROOT, Service, free_port, wait_serving
from engine_model.checkpoints import save_tiny_checkpoint
from specd.v1 import verifier_pb2, verifier_pb2_grpc

pytestmark = pytest.mark.timeout(240)
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
RANK_FAILURE_EXIT_CODE = 3  # verifier_service/server.py


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")  # 4 query heads, 2 KV heads: one KV head per rank
    save_tiny_checkpoint("llama-gqa-llama3-rope-untied-sharded", folder)
    return folder


def verifier(model_dir, *args: str, **env: str) -> Service:
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "specd_cli", "verifier", "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(metrics_port), "--model", str(model_dir), "--device", "cpu", "--dtype", "float32",
            "--drafter-addr", "none", "--tensor-parallel-size", "2", *args]
    log = Path(tempfile.mkdtemp(prefix="specd-tp-")) / "verifier.log"
    service = Service("verifier", argv, port, metrics_port, log)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPECD_") or k == "SPECD_HOME"}
    service.launch({**base, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **env})
    return service


@pytest.fixture
def start_serving(model_dir):
    """start_serving(**env): a SERVING tensor-parallel verifier; every one started is killed afterwards."""
    started: list[tuple[Service, list[psutil.Process]]] = []

    def start(**env: str) -> Service:
        service = verifier(model_dir, **env)
        wait_serving(service.address, service.process, service.log_path)
        started.append((service, other_ranks(service)))  # read now: once rank 0 is gone its children are not
        return service

    yield start
    for service, ranks in started:
        service.stop(signal.SIGKILL)
        for rank in ranks:  # a stopped (SIGSTOP) rank cannot notice that rank 0 is gone
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()


def spawned(process: psutil.Process) -> list[psutil.Process]:
    """The processes it started through multiprocessing's spawn (not its resource tracker)."""
    try:
        return [c for c in process.children() if "spawn_main" in " ".join(c.cmdline())]
    except psutil.NoSuchProcess:
        return []


def engine_process(service: Service) -> psutil.Process:
    """The verifier's engine process (rank 0), which the serving process started."""
    (engine,) = spawned(psutil.Process(service.process.pid))
    return engine


def other_ranks(service: Service) -> list[psutil.Process]:
    """The processes rank 0 (the engine process) spawned for ranks 1..N-1."""
    try:
        return spawned(engine_process(service))
    except (psutil.NoSuchProcess, ValueError):
        return []


def health_until_exit(service: Service, timeout: float = 60.0) -> list[int | str]:
    """Every distinct health answer (or error code) seen until the process exits."""
    seen: list[int | str] = []
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(service.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while service.process.poll() is None and time.monotonic() < deadline:
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status
            except grpc.RpcError as error:
                answer = error.code().name
            if not seen or seen[-1] != answer:
                seen.append(answer)
            time.sleep(0.02)
    return seen


def test_a_killed_rank_turns_the_verifier_not_serving_and_ends_it(start_serving):
    serving = start_serving()
    (rank,) = other_ranks(serving)
    rank.kill()
    seen = health_until_exit(serving)
    assert NOT_SERVING in seen, seen
    assert serving.process.wait(timeout=30) == RANK_FAILURE_EXIT_CODE
    assert "rank 1 exited with code -9" in serving.log_path.read_text()


def test_a_dead_engine_process_turns_the_verifier_not_serving_and_ends_it(start_serving):
    serving = start_serving()
    engine, ranks = engine_process(serving), other_ranks(serving)
    engine.kill()
    seen = health_until_exit(serving)
    assert NOT_SERVING in seen, seen
    assert serving.process.wait(timeout=30) == RANK_FAILURE_EXIT_CODE
    assert "the engine process exited with code -9" in serving.log_path.read_text()
    for rank in ranks:  # rank 1 follows its rank 0 (psutil.TimeoutExpired if it outlives it)
        rank.wait(timeout=30)


def test_a_hung_rank_turns_the_verifier_not_serving_and_ends_it(start_serving):
    serving = start_serving(SPECD_TENSOR_PARALLEL_TIMEOUT_S="3")
    (rank,) = other_ranks(serving)
    rank.suspend()  # SIGSTOP: alive, but it never joins the next step's collectives
    request = verifier_pb2.VerifierGenerateRequest(request_id="stuck", prompt_token_ids=[1, 2, 3])
    errors = []

    def generate() -> None:
        with grpc.insecure_channel(serving.address) as channel:
            try:
                list(verifier_pb2_grpc.VerifierStub(channel).Generate(request, timeout=60))
            except grpc.RpcError as error:
                errors.append(error.code())

    client = threading.Thread(target=generate)
    client.start()
    seen = health_until_exit(serving)
    client.join(timeout=60)
    assert NOT_SERVING in seen, seen
    assert serving.process.wait(timeout=30) == RANK_FAILURE_EXIT_CODE
    log = serving.log_path.read_text()
    assert "has not finished on every rank after 3 s (a rank hangs)" in log
    assert "most recent call first" in log  # rank 0's stacks, written before it leaves (the stopped rank's wait)
    assert errors == [grpc.StatusCode.UNAVAILABLE]  # what the gateway retries or resumes elsewhere
    assert gone(rank, timeout=10), f"the hung rank outlived the verifier: {rank.status()}"  # it would hold its GPU


def gone(process: psutil.Process, timeout: float) -> bool:
    """Whether `process` ended (or is a zombie waiting for its new parent to reap it) within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_rank_1_freezes_its_start_up_objects_and_sigterm_stops_every_rank_cleanly(start_serving):
    serving = start_serving()
    ranks = other_ranks(serving)
    assert len(ranks) == 1
    # by SERVING the warm-up has run on rank 1 too; start-up's objects no longer stall its steps in a collection
    frozen = re.search(r"rank 1: (\d+) objects from start-up frozen", serving.log_path.read_text())
    assert frozen and int(frozen.group(1)) > 10_000, frozen
    assert serving.stop(signal.SIGTERM) == 0
    assert psutil.wait_procs(ranks, timeout=30)[1] == []  # none left alive


@pytest.mark.parametrize("args, env, message", [
    (["--tensor-parallel-size", "3"], {}, "tensor_parallel_size: 3 ranks cannot share the model's 2 KV heads"),
    (["--device", "cuda", "--tensor-parallel-size", "64"], {}, "tensor_parallel_size: 64 ranks need 64 GPUs"),
    ([], {"SPECD_TENSOR_PARALLEL_ALL_REDUCE": "two-shot"},
     "SPECD_TENSOR_PARALLEL_ALL_REDUCE: must be one of nccl, one-shot, got 'two-shot'"),
], ids=["heads", "gpus", "all-reduce"])
def test_a_bad_combination_fails_start_up_naming_it(model_dir, args, env, message):
    service = verifier(model_dir, *args, **env)
    try:
        code = service.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        service.stop(signal.SIGKILL)
        raise
    assert code != 0
    assert message in service.log_path.read_text()
