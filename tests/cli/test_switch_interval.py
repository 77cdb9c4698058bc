"""Every specd process runs under specd's thread switch interval (specd/switch_interval.py), or the operator's."""
import os
import subprocess
import sys

import pytest

from bench.local_stack import REPO_ROOT, free_port

APPLY = "import sys; from specd.switch_interval import apply_switch_interval; apply_switch_interval(); " \
        "print(sys.getswitchinterval())"


def _run(code_or_argv, value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECD_SWITCH_INTERVAL_S"}
    if value is not None:
        env["SPECD_SWITCH_INTERVAL_S"] = value
    argv = [sys.executable, "-c", code_or_argv] if isinstance(code_or_argv, str) else code_or_argv
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value, expected", [(None, 0.0005), ("0.005", 0.005), ("0.0001", 0.0001)])
def test_the_interval_is_specds_unless_the_operator_sets_one(value, expected):
    result = _run(APPLY, value)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["0", "-1", "fast", "nan", "2"])
def test_a_bad_interval_stops_a_service_with_one_line_naming_the_variable(value):
    argv = [sys.executable, "-m", "specd_cli", "drafter", "--host", "127.0.0.1", "--port", str(free_port()),
            "--metrics-port", str(free_port())]
    result = _run(argv, value)
    assert result.returncode == 2
    assert "SPECD_SWITCH_INTERVAL_S" in result.stderr and "Traceback" not in result.stderr
