"""What exporting the verifier's Prometheus metrics costs per engine step, against the step itself.

The verifier's exporter runs on the engine thread after every step: it reads the step's stats objects
and updates prometheus_client counters, histograms and gauges. This times the real exporter
(verifier_service.metrics) on realistic steps (every stage timed, a batch of speculating requests,
per-position acceptance, gauges) and compares it with a real engine step of the default model,
measured here on --device. Target: under 1% of step time.

    .venv/bin/python bench/metrics_overhead.py [--device auto] [--batch 8] [--k 4] [--step-ms MS]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from verifier_service.engine.outputs import EngineLoad
from verifier_service.engine.stats import STAGES, SpecDecodingStats, StepStats
from verifier_service.metrics import VerifierMetrics, VerifierMetricsExporter

TARGET_SHARE = 0.01


def realistic_step(num_requests: int, k: int, num_stages: int) -> StepStats:
    """A decode step of `num_requests` requests with `k` drafts each, about 60% accepted."""
    spec = SpecDecodingStats()
    for i in range(num_requests):
        accepted = (i * 3) % (k + 1)  # spreads requests over 0..k accepted drafts
        spec.observe(k, accepted, accepted + 1)
    stages = list(STAGES) + [f"extra{i}" for i in range(max(0, num_stages - len(STAGES)))]
    return StepStats(stage_seconds={stage: 0.001 * (i + 1) for i, stage in enumerate(stages[:num_stages])},
                     forward_tokens=[num_requests * (k + 1)], num_output_tokens=spec.num_emitted_tokens,
                     spec_decoding=spec, num_preemptions=0, num_running=num_requests, num_waiting=2)


@dataclass
class ReplayEngine:
    """Hands the exporter the same step after every call, as the engine would after each step."""

    step: StepStats
    load_snapshot: EngineLoad

    def take_step_stats(self) -> list[StepStats]:
        return [self.step]

    def load(self) -> EngineLoad:
        return self.load_snapshot


def export_seconds_per_step(step: StepStats, iterations: int) -> float:
    """Mean wall time of one exporter.export() call on a fresh registry."""
    engine = ReplayEngine(step, EngineLoad(num_running=8, num_waiting=2, num_used_blocks=700, num_total_blocks=1000))
    fallbacks = iter(range(10**9))
    exporter = VerifierMetricsExporter(VerifierMetrics(CollectorRegistry()), engine,
                                       read_fallbacks=lambda: next(fallbacks) // 50)  # a fallback now and then
    for _ in range(200):  # warm-up: label children created, code paths hot
        exporter.export()
    started = time.perf_counter()
    for _ in range(iterations):
        exporter.export()
    return (time.perf_counter() - started) / iterations


def scrape_seconds(step: StepStats) -> float:
    """Time to render /metrics once (per scrape, not per step; reported for completeness)."""
    registry = CollectorRegistry()
    exporter = VerifierMetricsExporter(VerifierMetrics(registry), ReplayEngine(step, EngineLoad(8, 2, 700, 1000)))
    exporter.export()
    started = time.perf_counter()
    for _ in range(200):
        generate_latest(registry)
    return (time.perf_counter() - started) / 200


def measured_step_seconds(device: str, batch: int, steps: int = 20) -> float:
    """Median decode step time of the real engine (default model, no drafter) with `batch` requests."""
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine
    from verifier_service.engine.sampling_params import SamplingParams

    engine = Engine(EngineConfig(model="default", device=device))
    for i in range(batch):
        engine.add_request(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 8 + i], SamplingParams(max_tokens=steps + 8, ignore_eos=True))
    for _ in range(3):  # prefill and warm-up
        engine.step()
    durations = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        durations.append(time.perf_counter() - started)
    return sorted(durations)[len(durations) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="device of the measured engine step")
    parser.add_argument("--batch", type=int, default=8, help="requests per step")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per request")
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--step-ms", type=float, help="use this step time instead of measuring one")
    args = parser.parse_args()

    step_s = args.step_ms / 1e3 if args.step_ms else measured_step_seconds(args.device, args.batch)
    source = "given" if args.step_ms else f"measured, default model, {args.device}, batch {args.batch}"
    print(f"step time: {step_s * 1e3:.2f} ms ({source})\n")
    print(f"{'scenario':<44} {'export us/step':>14} {'share of step':>14} {'< 1%':>6}")
    worst_share = 0.0
    for num_stages in (len(STAGES), 10):
        step = realistic_step(args.batch, args.k, num_stages)
        cost = export_seconds_per_step(step, args.iterations)
        share = cost / step_s
        worst_share = max(worst_share, share)
        name = f"batch {args.batch}, k {args.k}, {num_stages} stage observations"
        print(f"{name:<44} {cost * 1e6:>14.1f} {share:>13.3%} {'yes' if share < TARGET_SHARE else 'NO':>6}")
    render = scrape_seconds(realistic_step(args.batch, args.k, len(STAGES)))
    print(f"\n/metrics render (per scrape, not per step): {render * 1e6:.0f} us")
    print(f"worst share {worst_share:.3%} of step time; target {TARGET_SHARE:.0%}: "
          f"{'met' if worst_share < TARGET_SHARE else 'NOT met'}")


if __name__ == "__main__":
    main()
