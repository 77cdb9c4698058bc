"""What waking a helper costs a thread that keeps working, without a model: the engine thread's pattern.

The engine thread never sleeps after a pipe write: each step it wakes the drafter link's process and the serving
process's reader of its step message, then goes on with the next step. A pipe write is a synchronous wake-up in Linux,
on which the scheduler may run the woken thread on the writer's CPU, ahead of the writer. Here a writer does
--work-us of Python work, writes one message, and again, for --seconds; a reader process answers each message with
--reader-us of Python work. Per way of running the reader it prints the writer's microseconds a round against its
work alone, what a write took, and the share of messages the reader handled on the writer's CPU:

    python tools/wake_cost.py [--seconds 3] [--work-us 500] [--reader-us 200]

Ways: `normal`; `batch` (the reader as SCHED_BATCH: it no longer preempts on wake-up); `apart` (the reader's CPUs
exclude the writer's, the writer pinned to one). Linux only; no dependencies.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time


def current_cpu() -> int:
    """The CPU the calling thread last ran on (field 39 of /proc/thread-self/stat)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def reader(conn, way: str, reader_s: float, writer_cpu: int, allowed: set[int]) -> None:
    if way == "batch":
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    elif way == "apart":
        os.sched_setaffinity(0, allowed - {writer_cpu})
    same = handled = 0
    while (message := conn.recv_bytes()) != b"end":
        spin(reader_s)
        same += current_cpu() == int(message)
        handled += 1
    conn.send((same, handled))


def run(way: str, seconds: float, work_s: float, reader_s: float) -> dict:
    allowed = os.sched_getaffinity(0)
    writer_cpu = current_cpu()
    if way == "apart":
        os.sched_setaffinity(0, {writer_cpu})
    ours, theirs = multiprocessing.Pipe()
    process = multiprocessing.Process(target=reader, args=(theirs, way, reader_s, writer_cpu, allowed))
    process.start()
    rounds, writes = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        spin(work_s)
        cpu = current_cpu()
        written = time.perf_counter()
        ours.send_bytes(str(cpu).encode())
        writes.append(time.perf_counter() - written)
        rounds.append(time.perf_counter() - started)
    ours.send_bytes(b"end")
    same, handled = ours.recv()
    process.join()
    os.sched_setaffinity(0, allowed)
    return {"round_us": 1e6 * statistics.mean(rounds), "write_us": 1e6 * statistics.mean(writes),
            "same_cpu": same / max(handled, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--work-us", type=float, default=500.0)
    parser.add_argument("--reader-us", type=float, default=200.0)
    parser.add_argument("--ways", default="normal,batch,apart,normal,batch,apart")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; writer work {args.work_us:.0f} us a round, reader {args.reader_us:.0f} us a message")
    print(f"{'reader':>8}{'round us':>10}{'write us':>10}{'on the writer CPU':>19}")
    for way in args.ways.split(","):
        if way == "apart" and len(os.sched_getaffinity(0)) < 2:
            continue  # one CPU: nowhere apart to run the reader
        row = run(way, args.seconds, args.work_us / 1e6, args.reader_us / 1e6)
        print(f"{way:>8}{row['round_us']:>10.0f}{row['write_us']:>10.1f}{row['same_cpu']:>19.2f}", flush=True)


if __name__ == "__main__":
    main()
