"""The short soak (bench/soak.py): concurrent streaming clients, the drafter killed and restarted in
the middle; nothing lost, nothing different from the greedy reference, fallbacks counted."""
import importlib.util
import sys
from pathlib import Path

import pytest

from support.stack import Stack

SOAK_PATH = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stack():
    stack = Stack(num_verifiers=1).start()
    yield stack
    exit_codes = stack.stop()
    assert all(code == 0 for code in exit_codes.values()), f"unclean stop {exit_codes}\n{stack.logs()}"


def test_short_soak_with_a_drafter_kill_loses_nothing_and_changes_nothing(stack):
    soak = load_soak()
    report = soak.run_soak(stack, clients=12, duration=30.0, max_tokens=16, kill_at=0.4, down_for=4.0)
    print("\n" + soak.format_report(report))
    assert report.completed >= report.clients, "too little load to mean anything"
    assert report.lost == 0 and report.errored == {}, report
    assert report.wrong == 0, report
    assert report.drafter_fallbacks > 0  # the kill happened under load and was absorbed
    assert stack.services["drafter"].process.poll() is None  # restarted
