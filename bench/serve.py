"""End-to-end serving benchmark: concurrent streaming gRPC clients against the whole stack.

    python -m bench.serve                      # starts `specd up` on offset ports, then measures
    python -m bench.serve --addr HOST:PORT --verifier-metrics http://HOST:9461/metrics
    python -m bench.serve --device cuda --num-prompts 32 --batch1-prompts 8 --concurrency 1 32   # GPU
    python -m bench.serve --workload extract --drafting ngram --skip-hf   # recorded requests, old drafter

For each concurrency level it runs the workload with speculation off and on (and at batch 1 each
--extra-k as the requests' own num_speculative_tokens, on the same server) and prints tokens/s,
mean acceptance length (completion tokens / verifier steps), TTFT and per-token inter-token latency
percentiles. --workload takes bench/acceptance.py's recorded requests (token ids, each to its
recorded length or EOS) instead of the default repeat-this-code prompts; --drafting picks the stack's
drafter rule. At batch 1 it also runs Hugging Face `generate`, plain and with
`prompt_lookup_num_tokens`, on the same model, prompts and device, and estimates what the gRPC hops cost: the client's time between messages
(one message per step at batch 1) against the verifier's own step time from its metrics.

When it starts the stack itself it also prints, at batch 1, each service's CPU seconds per generated token
(gateway, verifier, drafter, and this client) next to the engine alone in this process on the same prompts
(bench/cpu_cost.py): CPU time barely moves when other work shares the machine, wall time does.
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, field

import grpc
import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.cpu_cost import CpuMeter, engine_alone, print_cpu_table
from bench.workload import prompts as workload_prompts
from specd.options import GATEWAY_PORTS, VERIFIER_PORTS
from specd.v1 import gateway_pb2, gateway_pb2_grpc


@dataclass
class RunResult:
    label: str
    wall_seconds: float
    completion_tokens: int = 0
    steps: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)  # per token: gap between messages / tokens in the message
    message_gaps: list[float] = field(default_factory=list)  # client-observed time between messages

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.wall_seconds

    @property
    def mean_acceptance_length(self) -> float:
        return self.completion_tokens / self.steps if self.steps else float("nan")


async def _one_stream(stub, prompt: str | list[int], max_tokens: int, k: int, result: RunResult) -> None:
    if isinstance(prompt, tuple):  # a recorded request: (token ids, its own max_tokens)
        prompt, max_tokens = prompt
    text_or_ids = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
    request = gateway_pb2.GenerateRequest(**text_or_ids, max_tokens=max_tokens, temperature=0.0,
                                          num_speculative_tokens=k)
    started = last = time.perf_counter()
    async for response in stub.Generate(request):
        now = time.perf_counter()
        if response.token_ids:
            if last == started:
                result.ttft.append(now - started)
            else:
                result.message_gaps.append(now - last)
                result.itl += [(now - last) / len(response.token_ids)] * len(response.token_ids)
            last = now
        if response.finish_reason:
            result.completion_tokens += response.usage.completion_tokens
            result.steps += response.usage.steps


async def run_workload(address: str, prompts: list[str], concurrency: int, max_tokens: int, k: int) -> RunResult:
    """Every prompt once, `concurrency` streams at a time."""
    result = RunResult(f"specd k={k} c={concurrency}", 0.0)
    queue: asyncio.Queue = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def client() -> None:
            while not queue.empty():
                await _one_stream(stub, queue.get_nowait(), max_tokens, k, result)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        result.wall_seconds = time.perf_counter() - started
    return result


def stage_seconds(metrics_url: str) -> dict[str, float]:
    """Total seconds per engine step stage, the number of steps under "steps", and forward passes replayed from
    decode / verify CUDA graphs, from the model's captured pieces or run eagerly under "graph" / "piecewise" / "eager",
    from the verifier's metrics."""
    totals: dict[str, float] = {"steps": 0.0, "graph": 0.0, "piecewise": 0.0, "eager": 0.0}
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=10).text):
        for sample in family.samples:
            stage = sample.labels.get("stage")
            if sample.name == "specd_step_stage_seconds_sum":
                totals[stage] = totals.get(stage, 0.0) + sample.value
            elif sample.name == "specd_step_stage_seconds_count" and stage == "update":
                totals["steps"] += sample.value  # every step updates once (specd_step_tokens counts forward passes)
            elif sample.name == "specd_forward_passes_total":
                totals[sample.labels["path"]] += sample.value
    return totals


def hf_generate(model_path: str, prompts: list[str], max_tokens: int, lookup_tokens: int,
                device: str = "cpu") -> list[RunResult]:
    """Hugging Face generate at batch 1, plain and with prompt lookup decoding (float32 on the CPU, bfloat16
    on CUDA, as the verifier's default dtype)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    results = []
    for lookup in (0, lookup_tokens):
        extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        result = RunResult(f"HF generate {device}" + (f" prompt_lookup_num_tokens={lookup}" if lookup else ""), 0.0)
        with torch.inference_mode():  # the first generate pays one-off set-up; the stack was warmed too
            model.generate(tokenizer(prompts[0], return_tensors="pt").input_ids.to(device), max_new_tokens=4,
                           do_sample=False, **extra)
        started = time.perf_counter()
        for prompt in prompts:
            input_ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
            with torch.inference_mode():
                output = model.generate(input_ids, max_new_tokens=max_tokens, do_sample=False, **extra)
            result.completion_tokens += output.shape[1] - input_ids.shape[1]
        result.wall_seconds = time.perf_counter() - started
        results.append(result)
    return results


def start_stack(port_offset: int, k: int, device: str = "auto", drafting: str = "evidence") -> subprocess.Popen:
    """`specd up` on offset ports; returns once it prints `specd: ready`."""
    argv = [sys.executable, "-m", "specd_cli", "up", "--port-offset", str(port_offset), "--host", "127.0.0.1",
            "--num-speculative-tokens", str(k), "--device", device, "--drafting", drafting]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    if process.stdout.readline().strip() != "specd: ready":
        process.kill()
        raise RuntimeError("specd up did not become ready")
    return process


def _percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    p50, p90, p99 = np.percentile(np.array(values) * 1000, [50, 90, 99])
    return f"{p50:.0f}/{p90:.0f}/{p99:.0f}"


def print_table(results: list[RunResult]) -> None:
    print(f"\n{'run':<44} {'tok/s':>7} {'accept len':>10} {'TTFT ms p50/90/99':>18} {'ITL ms p50/90/99':>17}")
    for r in results:
        print(f"{r.label:<44} {r.tokens_per_second:>7.1f} {r.mean_acceptance_length:>10.2f} "
              f"{_percentiles(r.ttft):>18} {_percentiles(r.itl):>17}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--addr", help="gateway HOST:PORT of a running stack (default: start one)")
    parser.add_argument("--verifier-metrics", help="verifier /metrics URL (with --addr)")
    parser.add_argument("--port-offset", type=int, default=700, help="where to start the stack")
    parser.add_argument("--num-prompts", type=int, default=5)
    parser.add_argument("--batch1-prompts", type=int, default=0,
                        help="run concurrency 1 and HF generate on the first N prompts only (0 = all)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="the stack's --device; HF generate runs there too (cuda: bfloat16)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--extra-k", type=int, nargs="*", default=[],
                        help="at batch 1, also run requests asking for these k (per request) on the same server")
    parser.add_argument("--hf-lookup-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens (its default 10)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--workload", default="humaneval", help="humaneval, or a workload of bench/acceptance.py")
    parser.add_argument("--drafting", default="evidence", choices=["evidence", "ngram"], help="the stack's drafter rule")
    parser.add_argument("--skip-engine", action="store_true", help="no engine-alone runs beside the stack's")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.workload == "humaneval":
        source, prompts = workload_prompts(args.num_prompts)
    else:
        from bench.acceptance import load_or_record
        from bench.workload import WORKLOADS

        source = f"{args.workload} recordings (each to its recorded length or EOS)"
        recordings = load_or_record(args.workload, WORKLOADS[args.workload](), 256)[:args.num_prompts]
        prompts = [(r.prompt_token_ids, len(r.output_token_ids)) for r in recordings]
        args.skip_hf = args.skip_engine = True  # both take text prompts
    print(f"workload: {len(prompts)} prompts from {source}; max_tokens {args.max_tokens}; drafting {args.drafting}")
    stack, meter = None, None
    if args.addr is None:
        stack = start_stack(args.port_offset, args.num_speculative_tokens, args.device, args.drafting)
        meter = CpuMeter.of_stack(stack.pid)
        args.addr = f"127.0.0.1:{GATEWAY_PORTS[0] + args.port_offset}"
        args.verifier_metrics = f"http://127.0.0.1:{VERIFIER_PORTS[1] + args.port_offset}/metrics"
    try:
        results = run_all(args, prompts, meter)
    finally:
        if stack is not None:
            stack.terminate()
            stack.wait()
    if meter is not None:
        if not args.skip_engine:
            meter.rows += engine_alone(args.model, args.device, batch1_prompts(args, prompts), args.max_tokens,
                                       (0, args.num_speculative_tokens))
        print_cpu_table(meter.rows)
    if not args.skip_hf:
        from specd.default_model import resolve_model_path

        import torch

        device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        hf_runs = hf_generate(str(resolve_model_path(args.model)), batch1_prompts(args, prompts), args.max_tokens,
                              args.hf_lookup_tokens, device)
        results += hf_runs
        hf = hf_runs[-1]
        spec_batch1 = next(r for r in results if r.label.startswith(f"specd k={args.num_speculative_tokens} c=1"))
        print(f"batch 1: specd / HF prompt lookup = {spec_batch1.tokens_per_second / hf.tokens_per_second:.2f}x")
    print_ratios(results, args.num_speculative_tokens)
    print_table(results)


def print_ratios(results: list[RunResult], k: int) -> None:
    """Speculation on / off per concurrency, and each per-request k / the server's k at batch 1."""
    by_label = {r.label: r.tokens_per_second for r in results}
    for label, value in by_label.items():
        if label.startswith("specd k=0 "):
            on = by_label.get(label.replace("k=0 ", f"k={k} "))
            if on:
                print(f"{label[len('specd k=0 '):]}: speculation on / off = {on / value:.2f}x")
        elif label.startswith("specd k=") and label.endswith(" c=1") and not label.startswith(f"specd k={k} "):
            print(f"batch 1: {label.split()[1]} / k={k} = {value / by_label[f'specd k={k} c=1']:.2f}x")


def run_all(args: argparse.Namespace, prompts: list[str], meter: CpuMeter | None = None) -> list[RunResult]:
    # warm the path (a prompt of no workload: the drafter's memory must not learn a measured request)
    asyncio.run(run_workload(args.addr, ["Hello, world."], 1, 8, args.num_speculative_tokens))
    results = []
    for concurrency in args.concurrency:
        extra = [k for k in args.extra_k if k not in (0, args.num_speculative_tokens)] if concurrency == 1 else []
        for k in (0, args.num_speculative_tokens, *extra):
            before = stage_seconds(args.verifier_metrics) if args.verifier_metrics else None
            chosen = batch1_prompts(args, prompts) if concurrency == 1 else prompts
            cpu_before = meter.start() if meter is not None and concurrency == 1 else None
            result = asyncio.run(run_workload(args.addr, chosen, concurrency, args.max_tokens, k))
            results.append(result)
            if cpu_before is not None:
                meter.record(f"stack k={k}", cpu_before, result.completion_tokens, result.wall_seconds)
            if before is not None and concurrency == 1:
                report_hop_cost(result, before, stage_seconds(args.verifier_metrics))
    return results


def batch1_prompts(args: argparse.Namespace, prompts: list[str]) -> list[str]:
    """The prompts of batch-1 runs (fewer than the batched runs' when --batch1-prompts says so)."""
    return prompts[:args.batch1_prompts] if args.batch1_prompts else prompts


def report_hop_cost(result: RunResult, before: dict[str, float], after: dict[str, float]) -> None:
    """At batch 1 the engine works only for this client: wall time beyond its step time is the hops' cost
    (gateway tokenize / route / detokenize, two gRPC hops, the engine thread hand-off). Also the engine's
    mean ms per step in each stage (propose: waiting for the drafter; verify: waiting for the device), and how
    many forwards replayed a CUDA graph (on a GPU, eager decode / verify steps mean a shape was not captured)."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    steps, graph, piecewise, eager = (delta.pop(name) for name in ("steps", "graph", "piecewise", "eager"))
    engine_seconds = sum(delta.values())
    overhead = result.wall_seconds - engine_seconds
    stages = ", ".join(f"{name} {1000 * value / max(steps, 1):.3f}" for name, value in delta.items())
    print(f"{result.label}: {steps:.0f} steps, engine {engine_seconds:.2f} s "
          f"({1000 * engine_seconds / max(steps, 1):.1f} ms/step: {stages}), client wall "
          f"{result.wall_seconds:.2f} s, outside the engine {100 * overhead / result.wall_seconds:.1f}%; "
          f"forwards {graph:.0f} replayed from CUDA graphs, {piecewise:.0f} from the pieces, {eager:.0f} eager")


if __name__ == "__main__":
    main()
