"""Which devices launch kernels with programmatic dependent launch (verifier_service/kernels/pdl.py)."""
from __future__ import annotations

import pytest
import torch

from specd import environment
from verifier_service.kernels import pdl


@pytest.fixture(autouse=True)
def undecided():
    """enabled() decides once per device: each test starts undecided, and leaves no decision to later tests."""
    pdl.enabled.cache_clear()
    yield
    pdl.enabled.cache_clear()


def test_pdl_is_off_on_the_cpu_and_when_switched_off(monkeypatch):
    assert not pdl.enabled(torch.device("cpu"))
    monkeypatch.setenv(environment.PDL, "0")
    assert not pdl.enabled(torch.device("cuda", 0))  # decided before any CUDA query: this machine has no GPU


def test_pdl_follows_the_compute_capability(monkeypatch):
    monkeypatch.delenv(environment.PDL, raising=False)
    for major, expected in ((8, False), (9, True), (10, True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, major=major: (major, 0))
        pdl.enabled.cache_clear()
        assert pdl.enabled(torch.device("cuda", 0)) is expected
