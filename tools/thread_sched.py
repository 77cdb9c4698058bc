"""Samples every Python thread's scheduling on this host, to tell why one thread's work takes longer in one setting.

For each thread of each python process: CPU time and time spent runnable but waiting for a CPU (the kernel's
/proc/PID/task/TID/schedstat), voluntary and involuntary context switches (status), and the process's command line.
A thread that waits for a CPU shows run-queue delay; one that waits for the interpreter lock or a lock shows
voluntary switches and CPU time below its wall time; one whose code just runs slower shows neither.

    python tools/thread_sched.py OUT.jsonl [--interval 1.0] [--duration 600]   # one JSON line per sample
    python tools/thread_sched.py --summary OUT.jsonl                          # the busiest threads, per window

Linux only; no dependencies.
"""
from __future__ import annotations

import argparse
import json
import os
import time


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def sample() -> dict[str, list]:
    """{pid:tid: [cpu_ns, runqueue_ns, voluntary, involuntary, cmdline]} of every thread of every python process."""
    threads: dict[str, list] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        cmdline = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
        if "python" not in cmdline:
            continue
        for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
            sched, status = _read(f"/proc/{pid}/task/{tid}/schedstat"), _read(f"/proc/{pid}/task/{tid}/status")
            if not sched or not status:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            cpu_ns, wait_ns = (int(v) for v in sched.split()[:2])
            threads[f"{pid}:{tid}"] = [cpu_ns, wait_ns, int(fields["voluntary_ctxt_switches"]),
                                       int(fields["nonvoluntary_ctxt_switches"]), cmdline[:160]]
    return threads


def record(out: str, interval: float, duration: float) -> None:
    end = time.monotonic() + duration
    with open(out, "w") as f:
        while time.monotonic() < end:
            f.write(json.dumps({"t": time.time(), "threads": sample()}) + "\n")
            f.flush()
            time.sleep(interval)


def summary(path: str, top: int = 6) -> None:
    """Per consecutive sample pair: the busiest threads' CPU share, run-queue wait share and switches a second."""
    samples = [json.loads(line) for line in open(path)]
    for before, after in zip(samples, samples[1:]):
        wall = after["t"] - before["t"]
        rows = []
        for key, (cpu, wait, vol, invol, cmd) in after["threads"].items():
            if key in before["threads"]:
                b = before["threads"][key]
                rows.append(((cpu - b[0]) / 1e9 / wall, (wait - b[1]) / 1e9 / wall, (vol - b[2]) / wall,
                             (invol - b[3]) / wall, key, cmd))
        rows.sort(reverse=True)
        print(f"t={after['t']:.1f}  " + "  |  ".join(
            f"{key} {cmd.split()[-1][:28] if cmd else ''}: cpu {c:.2f} wait {w:.2f} vol {v:.0f}/s inv {i:.0f}/s"
            for c, w, v, i, key, cmd in rows[:top] if c > 0.05))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--summary", action="store_true", help="print a recorded file's busiest threads")
    args = parser.parse_args()
    if args.summary:
        summary(args.out)
    else:
        record(args.out, args.interval, args.duration)


if __name__ == "__main__":
    main()
