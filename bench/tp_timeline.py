"""Where a tensor-parallel batch-1 step's time goes between the hosts and the GPUs: both ranks' timelines.

`record(directory)` (gpu_tp.py latency --timeline DIR) runs one plain generation with torch's profiler on every
rank, CPU and CUDA activity: rank 0 directly, ranks 1..N-1 from their step loop (install_in_worker, started in
the spawned workers when TIMELINE_ENV names the folder; a flag file in DIR/tpN says when to profile). Each rank
writes DIR/tpN/rank{r}.json.gz, a chrome trace.

`python bench/tp_timeline.py DIR/tpN` reads the traces and prints, per rank, the mean over the steps of each step's
parts: the graph replay's device time (first kernel to last), the device's idle time before it (nothing running
since the previous graph), the other device work between graphs (copies, NCCL), when the host launched the graph
against the moment its device went idle, and the host's time in the step channel (gloo broadcast / receive).
Then the kernels that the ranks launch with different grids or blocks: torch.compile tunes each kernel on each
rank by timing it there, and the ranks may choose differently. Every all-reduce waits for the slowest rank, so a
step pays the slower choice of each: the sum of the differences, per replay, is what that costs at most.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

from specd import environment

TIMELINE_ENV = environment.BENCH_TIMELINE_DIR
FLAG = "profiling"


def profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def install_in_worker(root: Path) -> None:
    """Ranks 1..N-1: profile the steps received while root/tpN/FLAG exists (N ranks), then write this rank's trace
    there."""
    import torch.distributed as dist

    from verifier_service.parallel.step_channel import StepChannel

    receive, state = StepChannel.receive, {}

    def toggle() -> None:
        directory = root / f"tp{dist.get_world_size()}"
        wanted = (directory / FLAG).exists()
        if wanted and "profiler" not in state:
            state["profiler"] = profiler().__enter__()
        elif not wanted and "profiler" in state:
            prof = state.pop("profiler")
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(str(directory / f"rank{dist.get_rank()}.json.gz"))

    def profiled_receive(self):
        toggle()
        step = receive(self)
        toggle()  # after the last step, rank 0 removes the flag before it sends stop
        return step

    StepChannel.receive = profiled_receive


def record(directory: Path, fn, *args):
    """fn(*args) on rank 0 under the profiler while the other ranks profile their steps; fn's result."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    (directory / FLAG).touch()
    with profiler() as prof:
        result = fn(*args)
        torch.cuda.synchronize()
    (directory / FLAG).unlink()  # the other ranks write their traces at their next receive (the next step or stop)
    prof.export_chrome_trace(str(directory / "rank0.json.gz"))
    return result


# -- reading ---------------------------------------------------------------------------------------------------

def load(path: Path) -> tuple[list[dict], float]:
    """(complete events, base time in us) of one chrome trace."""
    with gzip.open(path, "rt") as file:
        trace = json.load(file)
    base = trace.get("baseTimeNanoseconds", 0) / 1e3
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"], base


def graph_launches(events: list[dict]) -> list[dict]:
    """The host's cudaGraphLaunch calls, in time order; a replay's kernels carry its correlation id."""
    return sorted((e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"),
                  key=lambda e: e["ts"])


def correlation(event: dict):
    return event.get("args", {}).get("correlation")


def steps(events: list[dict]) -> list[dict]:
    """One entry per graph replay: when the host launched it, its kernels' count and device span, its all-reduces,
    and what ran on the device and the host between it and the replay before."""
    device = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                    key=lambda e: e["ts"])
    by_correlation: dict[int, list[dict]] = {}
    for e in device:
        by_correlation.setdefault(correlation(e), []).append(e)
    channel = sorted((e for e in events if e.get("cat") == "cpu_op" and "broadcast" in e["name"]),
                     key=lambda e: e["ts"])
    rows, previous_end = [], None
    for launch in graph_launches(events):
        kernels = by_correlation.get(correlation(launch), [])
        if not kernels:
            continue
        start, end = kernels[0]["ts"], max(k["ts"] + k["dur"] for k in kernels)
        reduces = [k["dur"] for k in kernels if "one_shot" in k["name"]]
        row = {"launch": launch["ts"], "graph_us": end - start, "kernels": len(kernels),
               "first_reduce_us": reduces[0] if reduces else 0.0,
               "reduce_us": statistics.median(reduces) if reduces else 0.0}
        if previous_end is not None:
            between = [e for e in device if previous_end <= e["ts"] < start]  # this replay's kernels start at start
            row["between_us"] = sum(e["dur"] for e in between)
            row["between"] = sorted({e["name"][:40] for e in between})
            row["gap_us"] = start - previous_end  # device time between graphs, busy or idle
            row["idle_us"] = row["gap_us"] - row["between_us"]
            row["launch_after_idle_us"] = launch["ts"] - previous_end  # > 0: the host launched late
            row["channel_us"] = sum(e["dur"] for e in channel if previous_end - 5000 <= e["ts"] < launch["ts"])
        rows.append(row)
        previous_end = end
    return rows


def lag_behind(rows: list[dict], leader: list[float], base: float) -> float:
    """Mean us from rank 0's latest graph launch to this rank's (base: this trace's time base, rank 0's subtracted)."""
    lags = []
    for row in rows:
        earlier = [t for t in leader if t <= row["launch"] + base]
        if earlier:
            lags.append(row["launch"] + base - earlier[-1])
    return statistics.mean(lags) if lags else float("nan")


def summary(directory: Path) -> None:
    traces = sorted(directory.glob("rank*.json.gz"))
    leader: list[float] = []
    leader_base = 0.0
    print(f"| rank | graph steps | kernels a step | graph us | device gap us | of it busy (copies, NCCL) us | "
          f"idle us | host launch after previous graph's end us | step channel us | first all-reduce us | "
          f"median all-reduce us | launch after rank 0's us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in traces:
        events, base = load(path)
        rows = [r for r in steps(events) if "gap_us" in r][2:]  # the first replays may include warm-up effects
        if not rows:
            print(f"| {path.name} | 0 | | | | | | | | | | |")
            continue
        if path.name.startswith("rank0."):
            leader, leader_base = [r["launch"] for r in rows], base
        lag = lag_behind(rows, leader, base - leader_base) if leader and not path.name.startswith("rank0.") else 0.0

        def mean(key):
            return statistics.mean(r[key] for r in rows)

        print(f"| {path.name.split('.')[0]} | {len(rows)} | {mean('kernels'):.0f} | {mean('graph_us'):.1f} | "
              f"{mean('gap_us'):.1f} | {mean('between_us'):.1f} | {mean('idle_us'):.1f} | "
              f"{mean('launch_after_idle_us'):.1f} | {mean('channel_us'):.1f} | {mean('first_reduce_us'):.1f} | "
              f"{mean('reduce_us'):.1f} | {lag:.1f} |")
        names = sorted({n for r in rows for n in r["between"]})
        print(f"  between graphs on {path.name}: {', '.join(names) or '-'}")


def graph_kernels(events: list[dict]) -> dict[str, list[dict]]:
    """The graph replays' kernels by name."""
    launches = {correlation(launch) for launch in graph_launches(events)}
    kernels: dict[str, list[dict]] = {}
    for e in events:
        if e.get("cat") == "kernel" and correlation(e) in launches:
            kernels.setdefault(e["name"], []).append(e)
    return kernels


def launch_configs(directory: Path) -> None:
    """Kernels the ranks launch with different grids or blocks (different tuning choices), with their median us."""
    ranks = [graph_kernels(load(path)[0]) for path in sorted(directory.glob("rank*.json.gz"))]
    if len(ranks) < 2:
        return

    def config(kernel: dict) -> str:
        return f"grid {kernel['args'].get('grid')} block {kernel['args'].get('block')}"

    replays = len({correlation(k) for kernels in ranks[0].values() for k in kernels})
    differ, cost = 0, 0.0
    for name, kernels in ranks[0].items():
        configs = [sorted({config(k) for k in rank.get(name, [])}) for rank in ranks]
        if any(c != configs[0] for c in configs[1:]):
            differ += 1
            times = [statistics.median(k["dur"] for k in rank.get(name, [{"dur": 0.0}])) for rank in ranks]
            cost += (max(times) - min(times)) * len(kernels) / replays
            print(f"  launch configs differ: {name[:70]}: {' | '.join(map(str, configs))}; us by rank "
                  f"{' / '.join(f'{t:.2f}' for t in times)}")
    print(f"  {differ} of {len(ranks[0])} graph kernels launch differently on some rank: the slower choices cost "
          f"up to {cost:.0f} us a replay")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    directory = parser.parse_args().directory
    summary(directory)
    launch_configs(directory)


if __name__ == "__main__":
    main()
