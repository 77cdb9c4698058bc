"""A stuck rank shows where it waits: SIGUSR1 writes its stacks and it goes on; with SPECD_TENSOR_PARALLEL_DUMP_S a
phase that runs longer writes them by itself; phases are logged with their time."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from bench.local_stack import REPO_ROOT
from specd.environment import TENSOR_PARALLEL_DUMP_S as DUMP_ENV


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in os.environ.items() if name != DUMP_ENV}
    environment.update(PYTHONPATH=str(REPO_ROOT), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True,
                          text=True, timeout=60)


def test_sigusr1_writes_the_stacks_of_every_thread_and_the_rank_goes_on():
    result = run_python("""
        import os, signal, threading
        from verifier_service.parallel.diagnostics import register_stack_dump_signal

        def waiting_in_a_collective():
            threading.Event().wait(0.5)

        register_stack_dump_signal()
        helper = threading.Thread(target=waiting_in_a_collective)
        helper.start()
        os.kill(os.getpid(), signal.SIGUSR1)
        helper.join()
        print("went on")
    """)
    assert result.returncode == 0, result.stderr
    assert "went on" in result.stdout
    assert "most recent call first" in result.stderr
    assert "waiting_in_a_collective" in result.stderr  # the other thread's stack too


def test_a_phase_longer_than_the_dump_interval_writes_its_stacks_and_is_logged_with_its_time():
    result = run_python("""
        import logging, time
        from verifier_service.parallel.diagnostics import phase

        logging.basicConfig(level=logging.INFO)

        def capture_the_graphs():
            time.sleep(1.5)

        with phase(1, "CUDA graph capture"):
            capture_the_graphs()
        time.sleep(0.9)  # the timer is off again: no dump here
    """, **{DUMP_ENV: "0.3"})
    assert result.returncode == 0, result.stderr
    assert "rank 1: CUDA graph capture ..." in result.stderr
    assert "rank 1: CUDA graph capture done in 1.5" in result.stderr
    assert "capture_the_graphs" in result.stderr
    # One dump every 0.3 s while the phase runs (a loaded CI machine may write fewer), none once it is done.
    while_running, after = result.stderr.split("CUDA graph capture done in")
    assert 2 <= while_running.count("CUDA graph capture still running after") <= 5, result.stderr
    assert "still running" not in after, result.stderr


def test_without_the_setting_a_long_phase_writes_no_stacks():
    result = run_python("""
        import time
        from verifier_service.parallel.diagnostics import phase

        with phase(0, "loading"):
            time.sleep(0.4)
    """)
    assert result.returncode == 0, result.stderr
    assert "most recent call first" not in result.stderr
