"""`specd up` when a service cannot start (readiness and stopping: test_stop_signals.py)."""
import subprocess
import sys

from bench.local_stack import REPO_ROOT
from support.ports import free_offset


def test_a_service_that_dies_at_start_up_stops_the_stack():
    argv = [sys.executable, "-m", "specd_cli", "up", "--port-offset", str(free_offset()), "--host", "127.0.0.1",
            "--model", "/nonexistent/model"]
    result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "specd: ready" not in result.stdout
    assert "exited with code" in result.stderr
