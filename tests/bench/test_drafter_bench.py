"""`make bench-drafter` runs: a short pass of bench/drafter.py prints its two tables (the server side with a draft
hit rate, the client round trip over loopback to a real drafter process), so a renamed field cannot break it
unnoticed, as one once did."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_the_drafter_bench_prints_both_tables():
    result = subprocess.run([sys.executable, "-m", "bench.drafter", "--batches", "2", "--contexts", "128",
                             "--steps", "4"], capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    server_row = lines[lines.index(next(l for l in lines if l.split()[:2] == ["seqs", "context"])) + 1].split()
    assert server_row[:2] == ["2", "128"] and 0.0 <= float(server_row[-2]) <= 1.0  # the draft hit rate
    assert any(line.startswith("client round trip") for line in lines)
    round_trip = lines[-1].split()
    assert round_trip[:2] == ["2", "128"] and int(round_trip[-1]) >= 0  # its fallbacks: a loaded machine has some
