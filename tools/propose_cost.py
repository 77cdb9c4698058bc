"""A synchronous engine's propose stage (the CPU's) under its rhythm, without a model: what each part costs the
engine thread.

    PYTHONPATH=TREE python tools/propose_cost.py [--steps 300] [--forward-ms 50] [--context 300] [--batch 1]

A drafter service in its own process (bench/drafter.py's), the tree's CPU proposer in front of it
(verifier_service/engine_process.py builds it for a synchronous engine), and a loop that does what the CPU's
engine does: propose (timed, as the engine's propose stage times it), then a forward: float32 matmuls on this
thread for --forward-ms, as many torch threads as the stack gives its engine, so the caches are as cold and the
OpenMP pool as asleep as after a real step. The contexts are bench/drafter.py's Workload (copies of earlier spans,
1-4 accepted tokens a step). It prints the stage's mean and median microseconds a step, and each part's: the own
drafts (own_propose, of which store is the native call), reading the last answer, judging, and the hand-off (ask).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from functools import wraps

from bench.drafter import Workload, start_drafter
from bench.local_stack import free_port
from drafter_service.batch import DraftRequest
from specd.openmp import apply_wait_policy


def timed(owner, name: str, spent: dict[str, list[float]], part: str | None = None) -> None:
    """Wraps owner.name so each call's seconds go to the last entry of spent[part or name]."""
    method, part = getattr(owner, name), part or name

    @wraps(method)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[part][-1] += time.perf_counter() - started
    setattr(owner, name, wrapper)


def forward(seconds: float, weights, x) -> None:
    """Matmuls for about `seconds` (a step's forward: the caches and the OpenMP pool as after a real one)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for weight in weights:
            x = (x @ weight).tanh_()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--forward-ms", type=float, default=50.0)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--forward", choices=("matmul", "sleep"), default="matmul",
                        help="the step's forward as matmuls (caches as after a real one) or a sleep (caches kept)")
    args = parser.parse_args()

    apply_wait_policy()  # as the stack's processes run torch
    import torch  # noqa: PLC0415 - after the wait policy is set

    from drafter_service.client import DrafterClient  # noqa: PLC0415
    from drafter_service.context_first import ContextFirstProposer  # noqa: PLC0415
    port = free_port()
    drafter = start_drafter(port, "native", "evidence")
    proposer = ContextFirstProposer(DrafterClient(f"127.0.0.1:{port}"))  # as verifier_service/engine_process.py
    parts = ("propose", "own_propose", "_read_unread", "_judge", "ask", "store")
    spent: dict[str, list[float]] = {name: [] for name in parts}
    timed(proposer, "propose", spent)
    timed(proposer, "_read_unread", spent)
    timed(proposer, "_judge", spent)
    timed(proposer.own, "propose", spent, "own_propose")
    timed(proposer._asker, "ask", spent)  # noqa: SLF001 - the hand-off to the asker's thread
    timed(proposer.own.store, "propose_batch", spent, "store")
    weights = [torch.randn(576, 576) / 24 for _ in range(8)]
    x = torch.randn(args.k + 1, 576)
    workload = Workload(args.batch, args.context, random.Random(0))
    try:
        while proposer.service._stream is None:  # noqa: SLF001 - the background connection
            time.sleep(0.01)
        for step in range(args.steps + 20):
            for values in spent.values():
                values.append(0.0)
            requests = [DraftRequest(f"r{i}", tokens, args.k) for i, tokens in enumerate(workload.contexts)]
            proposer.propose(requests)
            if args.forward == "sleep":
                time.sleep(args.forward_ms / 1000)
            else:
                forward(args.forward_ms / 1000, weights, x)
            workload.grow()
            if step == 19:  # the warm-up's steps out
                for values in spent.values():
                    values.clear()
    finally:
        getattr(proposer, "close", proposer.service.close)()  # the proposer closes its client where it has close()
        drafter.terminate()
    print(f"{'part':>14}{'mean us':>9}{'p50 us':>8}")
    for name in parts:
        values = spent[name]
        print(f"{name:>14}{1e6 * statistics.mean(values):>9.0f}{1e6 * statistics.median(values):>8.0f}")


if __name__ == "__main__":
    main()
