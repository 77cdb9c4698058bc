"""Soak: a bounded load run against a whole stack, with the drafter killed and a verifier restarted in the middle.

    python -m bench.soak                          # 64 streaming clients for 5 minutes, default model, CPU
    python -m bench.soak --clients 16 --duration 45 --json out.json
    python -m bench.soak --device cuda --dtype bfloat16 --kv-cache-bytes 8589934592   # two verifiers on one GPU
    python -m bench.soak --device cuda --dtype bfloat16 --deterministic ...   # outputs exactly the reference there

The stack runs as real processes on free loopback ports (bench/local_stack.py): a drafter, `--verifiers`
verifiers and a gateway. First the greedy reference of every prompt is taken with speculation off; then
`--clients` concurrent streaming gRPC clients send greedy requests back to back for `--duration` seconds. At
`--kill-at` of the run the drafter is SIGKILLed, at `--restart-verifier-at` the last verifier (a crash: no drain),
each started again `--down-for` seconds later. The report: requests sent, completed, errored (by status code),
outputs that differ from the reference, latency percentiles, drafter fallbacks, what was killed when, and each
service's resident memory at start, after a tenth of the run and at the end. Target: nothing lost or wrong (the
gateway resumes the dead verifier's requests on another).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import numpy as np
import psutil

from bench.local_stack import Stack, metric_value
from specd.v1 import gateway_pb2, gateway_pb2_grpc

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The three primary colors are",
    "Count from 1 to 20: 1, 2, 3, 4,",
    "Q: What is the capital of Italy?\nA:",
    "import numpy as np\n\ndef mean(values):\n",
    "Once upon a time, in a small village,",
    "a b c d a b c d a b c d a b c",
    "List three fruits:\n1.",
]


@dataclass
class SoakReport:
    clients: int
    duration_seconds: float
    sent: int = 0
    completed: int = 0
    errored: dict[str, int] = field(default_factory=dict)
    wrong: int = 0
    latency_p50_seconds: float = float("nan")
    latency_p99_seconds: float = float("nan")
    ttft_p50_seconds: float = float("nan")
    ttft_p99_seconds: float = float("nan")
    drafter_fallbacks: float = 0.0
    events: list[str] = field(default_factory=list)  # what was killed and started again, when, in that order
    # service -> (before the load, after the first tenth of it (allocator pools warm), at the end)
    rss_mib: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return self.sent - self.completed


class _Load:
    """What the clients record while the run goes on."""

    def __init__(self, reference: dict[str, list[int]]) -> None:
        self.reference = reference
        self.sent = 0
        self.completed = 0
        self.wrong = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []
        self.ttfts: list[float] = []

    async def one(self, stub, prompt: str, max_tokens: int) -> None:
        request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0)
        self.sent += 1
        started, first, token_ids = time.monotonic(), None, []
        try:
            async for response in stub.Generate(request, timeout=120):
                first = first or time.monotonic()
                token_ids += response.token_ids
        except grpc.aio.AioRpcError as error:
            self.errors[error.code().name] += 1
            return
        self.completed += 1
        self.latencies.append(time.monotonic() - started)
        self.ttfts.append((first or time.monotonic()) - started)
        self.wrong += token_ids != self.reference[prompt]


async def _clients(address: str, load: _Load, clients: int, deadline: float, max_tokens: int) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def client(index: int) -> None:
            turn = index
            while time.monotonic() < deadline:
                await load.one(stub, PROMPTS[turn % len(PROMPTS)], max_tokens)
                turn += 1

        await asyncio.gather(*(client(i) for i in range(clients)))


async def _sample_rss(stack: Stack, at: float, samples: list) -> None:
    await asyncio.sleep(at)
    samples.append(await asyncio.to_thread(_rss_mib, stack))


async def _kill_and_restart(stack: Stack, name: str, at: float, down_for: float, events: list[str]) -> None:
    """SIGKILLs the service `at` seconds into the run and starts it again `down_for` seconds later."""
    started = time.monotonic()
    await asyncio.sleep(at)
    stack.kill(name)
    events.append(f"{name} killed at {time.monotonic() - started:.0f} s")
    await asyncio.sleep(down_for)
    await asyncio.to_thread(stack.restart, name)
    events.append(f"{name} serving again at {time.monotonic() - started:.0f} s")


def _rss_mib(stack: Stack) -> dict[str, float]:
    """Each running service's resident memory, its processes together (a verifier's engine process, the gateway's
    workers; a restarted service's new ones)."""
    return {name: _tree_rss(psutil.Process(s.process.pid)) / 2**20
            for name, s in stack.services.items() if name != "drafter" and s.process.poll() is None}


def _tree_rss(process: psutil.Process) -> int:
    rss = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            rss += member.memory_info().rss
        except psutil.NoSuchProcess:  # a compile worker that just ended
            pass
    return rss


def _greedy_reference(address: str, prompt: str, max_tokens: int) -> list[int]:
    """The prompt's greedy output with speculation off: what every output under load must equal."""
    request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                          num_speculative_tokens=0)
    with grpc.insecure_channel(address) as channel:
        responses = gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120)
        return [token_id for response in responses for token_id in response.token_ids]


def run_soak(stack: Stack, clients: int, duration: float, max_tokens: int = 24, kill_at: float = 0.5,
             down_for: float = 5.0, restart_verifier_at: float | None = None) -> SoakReport:
    """Runs the load against a started stack (with a drafter) and returns the report; with restart_verifier_at,
    the last verifier is killed at that fraction of the run too."""
    faults = [("drafter", kill_at)]
    if restart_verifier_at is not None:
        verifiers = sorted(name for name in stack.services if name.startswith("verifier"))
        if len(verifiers) < 2:
            raise ValueError("restart_verifier_at: needs two verifiers or more (one keeps serving, and counting)")
        faults.append((verifiers[-1], restart_verifier_at))
    reference = {p: _greedy_reference(stack.gateway_address, p, max_tokens) for p in PROMPTS}
    load = _Load(reference)
    fallbacks = metric_value(stack.metrics_url("verifier-0"), "specd_drafter_fallbacks_total")
    rss_start = _rss_mib(stack)

    rss_warm: list[dict[str, float]] = []
    events: list[str] = []

    async def main() -> None:
        tasks = [asyncio.create_task(_kill_and_restart(stack, name, duration * at, down_for, events))
                 for name, at in faults]
        tasks.append(asyncio.create_task(_sample_rss(stack, duration * 0.1, rss_warm)))
        await _clients(stack.gateway_address, load, clients, time.monotonic() + duration, max_tokens)
        await asyncio.gather(*tasks)

    started, nan = time.monotonic(), float("nan")
    asyncio.run(main())
    rss_end = _rss_mib(stack)
    latencies, ttfts = np.array(load.latencies or [np.nan]), np.array(load.ttfts or [np.nan])
    return SoakReport(
        clients=clients, duration_seconds=time.monotonic() - started, sent=load.sent,
        completed=load.completed, errored=dict(load.errors), wrong=load.wrong,
        latency_p50_seconds=float(np.percentile(latencies, 50)),
        latency_p99_seconds=float(np.percentile(latencies, 99)),
        ttft_p50_seconds=float(np.percentile(ttfts, 50)), ttft_p99_seconds=float(np.percentile(ttfts, 99)),
        drafter_fallbacks=metric_value(stack.metrics_url("verifier-0"), "specd_drafter_fallbacks_total") - fallbacks,
        events=events,
        rss_mib={name: (rss_start[name], rss_warm[0].get(name, nan), rss_end.get(name, nan)) for name in rss_start})


def format_report(report: SoakReport) -> str:
    """The report as a Markdown table."""
    rows = [("clients", report.clients), ("duration (s)", f"{report.duration_seconds:.0f}"),
            ("requests sent", report.sent), ("completed", report.completed),
            ("lost (sent - completed)", report.lost),
            ("errored by code", ", ".join(f"{k}: {v}" for k, v in report.errored.items()) or "none"),
            ("outputs differing from greedy reference", report.wrong),
            ("latency p50 / p99 (s)", f"{report.latency_p50_seconds:.2f} / {report.latency_p99_seconds:.2f}"),
            ("TTFT p50 / p99 (s)", f"{report.ttft_p50_seconds:.2f} / {report.ttft_p99_seconds:.2f}"),
            ("drafter fallbacks (steps), verifier-0", f"{report.drafter_fallbacks:.0f}"),
            ("faults", "; ".join(report.events) or "none")]
    rows += [(f"RSS {name}: start / after 10% / end (MiB)", f"{start:.0f} / {warm:.0f} / {end:.0f}")
             for name, (start, warm, end) in report.rss_mib.items()]
    return "\n".join(["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--kill-at", type=float, default=0.5, help="fraction of the run when the drafter dies")
    parser.add_argument("--restart-verifier-at", type=float, default=0.75,
                        help="fraction of the run when the last verifier dies (negative: never)")
    parser.add_argument("--down-for", type=float, default=10.0, help="seconds before a killed service starts again")
    parser.add_argument("--verifiers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model", default="default")
    parser.add_argument("--kv-cache-bytes", type=int, help="each verifier's KV cache (verifiers that share a GPU)")
    parser.add_argument("--deterministic", action="store_true",
                        help="every service in the deterministic mode: on a GPU in bfloat16 the default mode's greedy "
                             "text may differ from the reference under load (near-ties, batch-dependent rounding)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    extra_args = ("--device", args.device, "--dtype", args.dtype, "--model", args.model)
    if args.deterministic:
        extra_args += ("--deterministic",)
    if args.kv_cache_bytes is not None:
        extra_args += ("--kv-cache-bytes", str(args.kv_cache_bytes))
    stack = Stack(num_verifiers=args.verifiers, extra_args=extra_args).start()
    try:
        report = run_soak(stack, args.clients, args.duration, args.max_tokens, args.kill_at, args.down_for,
                          args.restart_verifier_at if args.restart_verifier_at >= 0 else None)
    finally:
        stack.stop()
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2))
    return 0 if report.lost == 0 and report.wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
