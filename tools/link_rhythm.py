"""The drafter link under the engine's rhythm, without a model: where each step's drafts come from, and what
collecting them costs the engine thread.

    PYTHONPATH=TREE python tools/link_rhythm.py [--steps 400] [--step-ms 0.8,2] [--batches 1,16,64]

A drafter service in its own process (bench/drafter.py's), the tree's DrafterLink in front of it, and a loop that
does what an engine scheduling ahead does (verifier_service/engine/engine.py): ask for step n + 1's drafts, let the
step in flight run (a sleep of --step-ms), then collect step n + 1's answer without waiting. The contexts are
bench/drafter.py's Workload (copies of earlier spans, 1-4 accepted tokens a step). It prints, per step time and
batch: the share of steps that got the service's drafts, whose service was not asked (ask_rule.py; trees before it: 0),
that got the link's own after missing the service's (trees without them: 0), none; the engine
thread's microseconds per step in begin_propose and in the collection; and the CPU microseconds per step of the link
process and of the drafter service, every thread counted. Run it for two trees (PYTHONPATH) to
compare them on one machine.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import psutil

from bench.drafter import Workload, start_drafter
from bench.local_stack import free_port
from drafter_service.batch import DraftRequest
from drafter_service.link import DrafterLink


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process, all its threads."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def rhythm(link: DrafterLink, workload: Workload, steps: int, step_s: float, prefix: str) -> dict:
    """The engine's loop: ask ahead, run the step in flight, collect without waiting."""
    def ask():
        requests = [DraftRequest(f"{prefix}{i}", tokens, 4) for i, tokens in enumerate(workload.contexts)]
        started = time.perf_counter()
        pending = link.begin_propose(requests)
        return pending, time.perf_counter() - started

    pending, _ = ask()
    begin_s, collect_s = [], []
    before = link.num_fallbacks, getattr(link, "num_context_drafts", 0), getattr(link, "num_unasked", 0)
    for _ in range(steps):
        time.sleep(step_s)  # the step in flight
        started = time.perf_counter()
        pending.result(wait=False)
        collect_s.append(time.perf_counter() - started)
        workload.grow()
        pending, asked = ask()
        begin_s.append(asked)
    missed = link.num_fallbacks - before[0]
    own = getattr(link, "num_context_drafts", 0) - before[1]
    unasked = getattr(link, "num_unasked", 0) - before[2]
    pending.result(wait=False)  # the step asked last, collected at once: not one of the counted steps
    link.release([f"{prefix}{i}" for i in range(len(workload.contexts))])
    return {"service": 1 - (missed + unasked) / steps, "unasked": unasked / steps, "own": own / steps,
            "none": (missed - own) / steps,
            "begin_us": 1e6 * statistics.mean(begin_s), "collect_us": 1e6 * statistics.mean(collect_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-ms", default="0.8,2")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--context", type=int, default=512)
    args = parser.parse_args()
    port = free_port()
    drafter = start_drafter(port, "native", "evidence")
    link = DrafterLink(f"127.0.0.1:{port}", timeout_s=0.005)
    try:
        warm = Workload(1, args.context, random.Random(1))
        for _ in range(50):  # the link process starts, its stream opens (a link that never asks: 5 s)
            row = rhythm(link, warm, 20, 0.002, "warm-")
            if row["service"] + row["unasked"] >= 0.5:
                break
            time.sleep(0.1)
        print(f"{'step ms':>8}{'batch':>6}{'service':>9}{'unasked':>8}{'own':>6}{'none':>6}{'begin us':>10}{'collect us':>11}"
              f"{'link CPU us':>12}{'drafter CPU us':>15}")
        for step_ms in (float(s) for s in args.step_ms.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                workload = Workload(batch, args.context, random.Random(batch))
                pids = (link._process.pid, drafter.pid)  # noqa: SLF001 - the link's process, to read its CPU time
                before = [cpu_seconds(pid) for pid in pids]
                row = rhythm(link, workload, args.steps, step_ms / 1000, f"{step_ms}-{batch}-")
                link_us, drafter_us = (1e6 * (cpu_seconds(pid) - b) / args.steps for pid, b in zip(pids, before))
                print(f"{step_ms:>8}{batch:>6}{row['service']:>9.2f}{row['unasked']:>8.2f}{row['own']:>6.2f}{row['none']:>6.2f}"
                      f"{row['begin_us']:>10.0f}{row['collect_us']:>11.0f}{link_us:>12.0f}{drafter_us:>15.0f}",
                      flush=True)
    finally:
        link.close()
        drafter.terminate()


if __name__ == "__main__":
    main()
