"""The OpenMP wait policy every specd process runs torch under, set before torch loads its OpenMP runtime.

PASSIVE: an idle OpenMP thread sleeps instead of spinning for its partner. Measured on the 2-core CPU machine
(docs/BENCHMARKS.md, 2026-11-28: the engine alone at batch 1), spinning lost whether the machine was quiet or
had a busy core beside: the default model made 13 tok/s under PASSIVE against 7 under ACTIVE, 3 with
GOMP_SPINCOUNT=30000 and 6 with 300000; when gateway, drafter and verifier share a few cores a spinning thread
also burns the core its partner needs. A value the operator set wins.
"""
from __future__ import annotations

import os


def apply_wait_policy() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
