"""SPECD_ENGINE_CPU: a real verifier's engine thread runs alone on its CPU, and no other thread of the verifier (its
serving process, the engine process's others, the drafter link's process) may run there; requests are served."""
import os

import psutil
import pytest

from bench.local_stack import Stack
from specd import environment
from specd.options import ServiceOptions
from specd.startup_errors import StartupError
from specd_cli.launcher import plan_stack
from support.e2e_clients import generate
from verifier_service import server

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                reason="needs Linux CPU affinity and two CPUs")


def affinities(process: psutil.Process) -> list[set[int]]:
    """The CPUs each thread of the process may run on."""
    return [os.sched_getaffinity(thread.id) for thread in process.threads()]


@pytest.fixture(scope="module")
def stack():
    cpu = max(os.sched_getaffinity(0))
    stack = Stack(extra_args=("--device", "cpu", "--dtype", "float32", "--async-scheduling", "on"),
                  extra_env={environment.ENGINE_CPU: str(cpu)}).start()
    yield stack, cpu
    stack.stop_cleanly()


def test_the_engine_thread_alone_runs_on_its_cpu_and_requests_are_served(stack):
    stack, cpu = stack
    result = generate(stack.gateway_address, "def add(a, b):\n", 16, num_speculative_tokens=4)
    assert len(result.token_ids) == 16
    serving = psutil.Process(stack.services["verifier-0"].process.pid)
    processes = [serving, *serving.children(recursive=True)]
    assert len(processes) >= 3  # the serving process, the engine process, the drafter link's process
    on_cpu = {process: [a for a in affinities(process) if cpu in a] for process in processes}
    engine_processes = [process for process, threads in on_cpu.items() if threads]
    # One process (the engine's) has threads on the CPU, each on it alone: the engine thread, and the OpenMP threads
    # its CPU forward starts (on CUDA there are none); nothing else of the verifier may run there.
    assert len(engine_processes) == 1 and engine_processes[0] != serving
    engine = engine_processes[0]
    assert all(a == {cpu} for a in on_cpu[engine])
    assert len(affinities(engine)) > len(on_cpu[engine])  # its main thread, pipe thread and others keep off it


def test_a_cpu_the_verifier_may_not_use_is_refused_before_start(monkeypatch):
    monkeypatch.setenv(environment.ENGINE_CPU, str(max(os.sched_getaffinity(0)) + 1000))
    with pytest.raises(StartupError, match=environment.ENGINE_CPU):
        server.choose_engine_cpu("cuda", 1)


def test_up_refuses_one_engine_cpu_for_several_replicas(monkeypatch):
    monkeypatch.setenv(environment.ENGINE_CPU, "auto")
    assert any(s.name == "verifier" for s in plan_stack(ServiceOptions(), num_verifiers=1, port_offset=0))
    with pytest.raises(ValueError, match=environment.ENGINE_CPU):
        plan_stack(ServiceOptions(), num_verifiers=2, port_offset=0)
