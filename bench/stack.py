"""The whole stack against its own engine, side by side in one run, as users meet it.

    python -m bench.stack                                   # the default model, CPU or GPU, 1 and 16 clients
    python -m bench.stack --clients 1 16 64 256 --num-requests 512          # the GPU table of docs/BENCHMARKS.md
    python -m bench.stack --clients 1 --ks 0 4 --hf 0 4 10                  # plus Hugging Face at batch 1

It starts `specd up` (the default model's real weights unless --model says otherwise; drafter memory off unless
--draft-memory-scope, so repeated prompts do not help) and sends chat completions of ordinary instruction traffic
(bench/instruction_prompts.py) as streaming HTTP requests from closed-loop clients (bench/sse_load.py), greedy,
`--max-tokens` each, at each client count with speculation off (num_speculative_tokens 0) and on (each k of --ks).
Then the engine alone runs in this process on exactly the same requests (the gateway's own tokenization of the
same messages, the verifier's own engine config, the drafter's rule in process), as many at a time as there were
clients. Each row reports output tok/s, TTFT and inter-event latency (one event per step that emitted text for the
request) p50 / p99, the verifier's own mean time to first token (a request's arrival there to its first tokens
leaving it: the rest of TTFT is the gateway and the network), request latency p50 / p99, errors, the verifier's
stalls among its steps (specd_step_stalls_total: steps over 10x their kind's median), tokens per step
and accepted / proposed, the verifier's mean step and its stage means per step, the forward passes by path (CUDA graph, piecewise
graphs, eager) and each process's CPU microseconds per output token; ratios to the engine alone, to speculation off
and, at one client, to Hugging Face generate (--hf: plain greedy against k = 0, the best prompt lookup against
k > 0). Results go to --out as JSON lines; a short table is printed last.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

try:
    from specd.openmp import apply_wait_policy
except ImportError:  # a tree from before specd/openmp.py, measured as the baseline
    def apply_wait_policy() -> None:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

apply_wait_policy()  # the engine alone and Hugging Face run under the services' OpenMP policy (before torch loads)

from bench.instruction_prompts import instruction_prompts  # noqa: E402
from bench.sse_load import StreamRecord, chat_body, run_load  # noqa: E402

STAGES = ("schedule", "propose", "score", "verify", "update")
PATHS = ("graph", "piecewise", "eager")  # how a forward pass ran (specd_forward_passes_total's path)
SERVICES = ("gateway", "verifier", "drafter")
# The command's module: specd_cli, or specd.cli in a tree from before it (measured as the baseline).
CLI_MODULE = "specd_cli" if importlib.util.find_spec("specd_cli") is not None else "specd.cli"


@dataclass
class Row:
    label: str
    clients: int
    k: int
    tokens: int = 0
    wall: float = 0.0
    requests: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    verifier_ttft_ms: float = float("nan")  # mean, from a request's arrival at the verifier to its first tokens out
    gaps: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    stage_ms: dict[str, float] = field(default_factory=dict)  # mean per engine step
    step_ms: float = float("nan")  # the engine's mean step (specd_step_seconds), whatever its stages
    late: float = float("nan")  # share of the engine's steps whose drafts the drafter did not deliver in time
    own: float = float("nan")  # share of the engine's steps its drafter link drafted from its own copy instead
    unasked: float = float("nan")  # share whose drafter service the link did not ask (SPECD_DRAFTER_PROBE_STEPS)
    stalls: int = 0  # the verifier's steps over 10x their kind's median (specd_step_stalls_total)
    engine_steps: int = 0  # the verifier's steps (specd_step_seconds_count)
    forwards: dict[str, float] = field(default_factory=dict)  # forward passes by path: graph, piecewise, eager
    cpu_us_per_token: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0


# ---- the stack's processes and metrics -------------------------------------------------------------------------

def _parents() -> dict[int, int]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return table


def _service_of(pid: int) -> str | None:
    try:
        names = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return None
    return next((s for s in SERVICES if s in names), None) if CLI_MODULE in names else None


def cpu_seconds(supervisor_pid: int) -> dict[str, float]:
    """User + system CPU seconds per service of a running `specd up`: each service process with every process it
    started (gateway workers, tensor-parallel ranks) summed in. Processes that ended meanwhile are not counted."""
    ticks, parents = os.sysconf("SC_CLK_TCK"), _parents()
    totals = dict.fromkeys(SERVICES, 0.0)
    for service_pid in [pid for pid, ppid in parents.items() if ppid == supervisor_pid]:
        service, family, frontier = _service_of(service_pid), [service_pid], [service_pid]
        while frontier:
            parent = frontier.pop()
            children = [pid for pid, ppid in parents.items() if ppid == parent]
            family += children
            frontier += children
        for pid in family if service is not None else ():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            totals[service] += (int(fields[11]) + int(fields[12])) / ticks
    return totals


def verifier_counters(metrics_url: str) -> dict[str, float]:
    """The verifier's step-stage sums, step count, and draft counters (for per-run deltas)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "specd_step_stage_seconds_sum":
                values[sample.labels["stage"]] = sample.value
            elif sample.name == "specd_step_seconds_count":
                values["steps"] = sample.value
            elif sample.name == "specd_step_seconds_sum":
                values["step seconds"] = sample.value
            elif sample.name == "specd_step_stalls_total":
                values["stalls"] = sample.value
            elif sample.name in ("specd_verifier_time_to_first_token_seconds_sum",
                                 "specd_verifier_time_to_first_token_seconds_count"):
                values[sample.name] = sample.value
            elif sample.name == "specd_forward_passes_total":
                values[f"forwards {sample.labels['path']}"] = sample.value
            elif sample.name in ("specd_spec_decode_num_draft_tokens_total",
                                 "specd_spec_decode_num_accepted_tokens_total", "specd_drafter_fallbacks_total",
                                 "specd_drafter_context_drafts_total", "specd_drafter_unasked_steps_total"):
                values[sample.name] = sample.value
    return values


def start_stack(args, port_offset: int) -> subprocess.Popen:
    """`specd up`, its output (every service's log) in --stack-log; returns once it is ready."""
    argv = [sys.executable, "-m", CLI_MODULE, "up", "--port-offset", str(port_offset), "--host", "127.0.0.1",
            "--model", args.model, "--device", args.device, "--draft-memory-scope", args.draft_memory_scope,
            "--max-speculative-tokens", str(max(max(args.ks), 1))] + args.stack_args
    log = open(args.stack_log, "w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    while process.poll() is None:
        if "specd: ready" in Path(args.stack_log).read_text():
            return process
        time.sleep(0.5)
    raise RuntimeError(f"specd up exited with {process.returncode} before it was ready (log: {args.stack_log})")


# ---- runs ------------------------------------------------------------------------------------------------------

def stack_run(args, stack, http_port: int, metrics_url: str, prompts: list[str], clients: int, k: int) -> Row:
    bodies = [chat_body(prompt, args.max_tokens, k) for prompt in prompts[:_num_requests(args, clients)]]
    before_cpu, before = cpu_seconds(stack.pid), verifier_counters(metrics_url)
    records, wall = run_load("127.0.0.1", http_port, bodies, clients)
    after_cpu, after = cpu_seconds(stack.pid), verifier_counters(metrics_url)
    row = Row("stack", clients, k, wall=wall)
    _add_records(row, records)
    steps = max(after.get("steps", 0) - before.get("steps", 0), 1)
    row.stage_ms = {s: 1000 * (after.get(s, 0) - before.get(s, 0)) / steps for s in STAGES}
    row.step_ms = 1000 * (after.get("step seconds", 0) - before.get("step seconds", 0)) / steps
    fallbacks, own = "specd_drafter_fallbacks_total", "specd_drafter_context_drafts_total"
    row.late = (after.get(fallbacks, 0) - before.get(fallbacks, 0)) / steps
    row.own = (after.get(own, 0) - before.get(own, 0)) / steps
    unasked = "specd_drafter_unasked_steps_total"
    row.unasked = (after.get(unasked, 0) - before.get(unasked, 0)) / steps
    row.stalls, row.engine_steps = int(after.get("stalls", 0) - before.get("stalls", 0)), int(steps)
    row.cpu_us_per_token = {s: 1e6 * (after_cpu[s] - before_cpu[s]) / max(row.tokens, 1) for s in SERVICES}
    row.forwards = {path: after.get(f"forwards {path}", 0) - before.get(f"forwards {path}", 0) for path in PATHS}
    first = "specd_verifier_time_to_first_token_seconds"
    firsts = after.get(f"{first}_count", 0) - before.get(f"{first}_count", 0)
    if firsts:
        row.verifier_ttft_ms = 1000 * (after.get(f"{first}_sum", 0) - before.get(f"{first}_sum", 0)) / firsts
    return row


def _add_records(row: Row, records: list[StreamRecord]) -> None:
    for record in records:
        row.requests += 1
        if record.error:
            row.errors += 1
            continue
        row.tokens += record.completion_tokens
        row.steps += record.steps
        row.draft_tokens += record.draft_tokens
        row.accepted_tokens += record.accepted_tokens
        row.latency.append(record.latency)
        row.gaps += record.gaps
        if record.ttft is not None:
            row.ttft.append(record.ttft)


def _num_requests(args, clients: int) -> int:
    return max(args.num_requests, 2 * clients) if clients > 1 else args.batch1_requests


def verifier_engine(verifier_options: list[str], draft_memory_scope: str = "off"):
    """The engine `specd verifier VERIFIER_OPTIONS` runs, warmed up, with the drafter's rule in this process."""
    from drafter_service.config import DrafterConfig
    from drafter_service.local import LocalProposer
    from specd_cli.main import build_parser
    from specd.options import options_from_args
    from verifier_service.config import verifier_config_from_options
    from verifier_service.engine.engine import Engine
    from verifier_service.runners import build_model_runner
    from verifier_service.engine.start_up_objects import freeze as freeze_start_up_objects
    from verifier_service.engine.warm_up import warm_up

    options = options_from_args(build_parser().parse_args(["verifier", *verifier_options]))
    config = verifier_config_from_options(options).engine
    engine = Engine(config, LocalProposer(DrafterConfig(memory_scope=draft_memory_scope)),
                    build_model_runner(config, drafts=True))
    warm_up(engine)
    freeze_start_up_objects()
    return engine


def engine_runs(args, prompts: list[str], verifier_options: list[str]) -> list[Row]:
    """The engine alone in this process, closed loop, on the stack's requests (the gateway's tokenization)."""
    from gateway.tokenizer import Tokenizer
    from specd.default_model import resolve_model_path

    tokenizer = Tokenizer(resolve_model_path(args.model))
    prompt_ids = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    # One engine for every run, each request asking its k, as the stack's one verifier serves them (its prefix
    # cache and the drafter's memory carry over from run to run alike).
    engine = verifier_engine(verifier_options, args.draft_memory_scope)
    rows = []
    for clients in args.clients:
        for k in args.ks:
            for _ in range(args.passes):
                for where in ("main", "thread") if args.engine_on == "both" else (args.engine_on,):
                    rows.append(_on(where, _closed_loop, engine, prompt_ids[:_num_requests(args, clients)], clients,
                                    k, args.max_tokens, tokenizer.eos_token_ids))
                    rows[-1].label += "/thread" if where == "thread" else ""
    return rows


def _on(where: str, run, *args):
    """run(*args) on this thread, or on a thread of its own as the verifier's engine process runs its engine."""
    if where == "main":
        return run(*args)
    result = []
    thread = threading.Thread(target=lambda: result.append(run(*args)), name="engine-loop")
    thread.start()
    thread.join()
    return result[0]


def _closed_loop(engine, prompts: list[list[int]], clients: int, k: int, max_tokens: int, eos) -> Row:
    from specd.sampling import SamplingParams

    row, pending = Row("engine", clients, k), list(enumerate(prompts))[::-1]
    live: dict[str, list[float]] = {}  # request id -> [sent, last output time]
    started = time.perf_counter()

    def add() -> None:
        index, prompt = pending.pop()
        engine.add_request(str(index), prompt, SamplingParams(max_tokens=max_tokens, num_speculative_tokens=k,
                                                              stop_token_ids=tuple(eos)))
        live[str(index)] = [time.perf_counter(), 0.0]

    while pending and len(live) < clients:
        add()
    while live:
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            sent, last = live[output.request_id]
            if output.new_token_ids:
                (row.gaps.append(now - last) if last else row.ttft.append(now - sent))
                live[output.request_id][1] = now
            if output.finished:
                del live[output.request_id]
                row.requests += 1
                row.tokens += output.usage.completion_tokens
                row.steps += output.usage.steps
                row.draft_tokens += output.usage.draft_tokens
                row.accepted_tokens += output.usage.accepted_tokens
                row.latency.append(now - sent)
                if pending:
                    add()
    row.wall = time.perf_counter() - started
    stats = engine.take_step_stats()
    if stats:
        row.stage_ms = {s: 1000 * sum(st.stage_seconds.get(s, 0.0) for st in stats) / len(stats) for s in STAGES}
        graph, piecewise = (sum(st.num_graph_replays for st in stats), sum(st.num_piecewise_replays for st in stats))
        row.forwards = {"graph": graph, "piecewise": piecewise,
                        "eager": sum(len(st.forward_tokens) for st in stats) - graph - piecewise}
    return row


def hf_runs(args, prompts: list[str]) -> list[Row]:
    """Hugging Face generate at batch 1, greedy, on the same chat token ids: plain (K = 0) or prompt lookup decoding
    with each K of --hf (float32 on the CPU, bfloat16 on CUDA, as the verifier's default dtype)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gateway.tokenizer import Tokenizer
    from specd.default_model import resolve_model_path

    path = resolve_model_path(args.model)
    device = "cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    model = model.to(device).eval()
    tokenizer = Tokenizer(path)
    ids = [torch.tensor([tokenizer.encode_chat([{"role": "user", "content": p}])], device=device) for p in prompts]
    rows = []
    for lookup in args.hf:
        extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        row = Row("hf", 1, lookup)
        with torch.inference_mode():
            model.generate(ids[0], max_new_tokens=4, do_sample=False, **extra)  # one-off set-up, as the stack's warm-up
            started = time.perf_counter()
            for prompt in ids:
                output = model.generate(prompt, max_new_tokens=args.max_tokens, do_sample=False,
                                        eos_token_id=list(tokenizer.eos_token_ids), **extra)
                row.tokens += output.shape[1] - prompt.shape[1]
                row.requests += 1
        row.wall = time.perf_counter() - started
        rows.append(row)
    return rows


# ---- the table -------------------------------------------------------------------------------------------------

def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


def print_table(rows: list[Row], flush: bool = False) -> None:
    engine = {(r.clients, r.k): r for r in rows if r.label == "engine"}
    plain = {(r.label.split()[0], r.clients): r for r in rows if r.k == 0}
    hf = {r.k: r.tokens_per_second for r in rows if r.label == "hf"}
    hf_best = {0: hf.get(0), 1: max((v for k, v in hf.items() if k), default=None)}  # plain; best prompt lookup
    print(f"\n{'run':<18}{'tok/s':>9}{'/engine':>8}{'/k=0':>6}{'/HF':>6}{'TTFT p50/p99':>14}{'ver TTFT':>9}"
          f"{'gap p50/p99':>13}"
          f"{'req p50/p99':>14}{'err':>5}{'stalls/steps':>13}{'tok/step':>9}{'acc/prop':>9}{'late':>6}{'own':>6}{'unasked':>8}{'step ms':>8}  {'stage ms propose/score/verify':<30}"
          f"{'CPU us/token gw/ver/dr':>24}{'forwards graph/piece/eager':>28}")
    for r in rows:
        versus_engine = engine.get((r.clients, r.k))
        versus_plain = plain.get((r.label.split()[0], r.clients))
        cpu = "/".join(f"{r.cpu_us_per_token[s]:.0f}" for s in SERVICES) if r.cpu_us_per_token else "-"
        stalls = f"{r.stalls}/{r.engine_steps}" if r.engine_steps else "-"
        stages = "/".join(f"{r.stage_ms.get(s, 0):.2f}" for s in ("propose", "score", "verify"))
        forwards = "/".join(f"{r.forwards.get(p, 0):.0f}" for p in PATHS) if r.forwards else "-"
        versus_hf = hf_best[min(r.k, 1)] if r.clients == 1 and r.label != "hf" else None
        print(f"{r.label + f' c={r.clients} k={r.k}':<18}{r.tokens_per_second:>9.0f}"
              f"{r.tokens_per_second / versus_engine.tokens_per_second if versus_engine and r.label.startswith('stack') else float('nan'):>8.2f}"
              f"{r.tokens_per_second / versus_plain.tokens_per_second if versus_plain and r.k else float('nan'):>6.2f}"
              f"{r.tokens_per_second / versus_hf if versus_hf else float('nan'):>6.1f}"
              f"{_p(r.ttft, 50):>7.1f}/{_p(r.ttft, 99):<6.0f}{r.verifier_ttft_ms:>9.1f}"
              f"{_p(r.gaps, 50):>6.2f}/{_p(r.gaps, 99):<6.1f}"
              f"{_p(r.latency, 50):>7.0f}/{_p(r.latency, 99):<6.0f}{r.errors:>5}{stalls:>13}"
              f"{r.tokens / max(r.steps, 1):>9.2f}{r.accepted_tokens / max(r.draft_tokens, 1):>9.2f}{r.late:>6.2f}{r.own:>6.2f}{r.unasked:>8.2f}{r.step_ms:>8.2f}  "
              f"{stages:<30}{cpu:>24}{forwards:>28}",
              flush=flush)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 4], help="0 = speculation off")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-requests", type=int, default=64, help="requests per run with several clients "
                                                                     "(at least 2 per client)")
    parser.add_argument("--batch1-requests", type=int, default=12, help="requests per run with one client")
    parser.add_argument("--draft-memory-scope", default="off", choices=["global", "per-key", "off"])
    parser.add_argument("--passes", type=int, default=1, help="run each client count and k this many times over the "
                                                               "same prompts (with drafter memory: later passes draft "
                                                               "from earlier outputs)")
    parser.add_argument("--port-offset", type=int, default=800)
    parser.add_argument("--no-engine", action="store_true", help="the stack only")
    parser.add_argument("--no-stack", action="store_true", help="the engine alone only")
    parser.add_argument("--engine-on", default="main", choices=["main", "thread", "both"],
                        help="the thread the engine alone runs on: this process's main thread, one of its own (as in "
                             "the verifier's engine process), or both in turn")
    parser.add_argument("--out", default="stack_results.jsonl")
    parser.add_argument("--stack-log", default="stack.log", help="where `specd up` writes its services' logs")
    parser.add_argument("--hf", type=int, nargs="*", default=None, metavar="K",
                        help="also Hugging Face generate at batch 1 on the same requests, for each K given: 0 = plain "
                             "greedy, else prompt lookup with prompt_lookup_num_tokens=K")
    parser.add_argument("stack_args", nargs="*", help="more `specd up` options, after --")
    return parser.parse_args()


def stack_runs(args, prompts: list[str]) -> list[Row]:
    """Every client count and k through `specd up`, its table printed as each run ends."""
    from specd.options import GATEWAY_PORTS, VERIFIER_PORTS

    rows: list[Row] = []
    stack = start_stack(args, args.port_offset)
    try:
        http_port = GATEWAY_PORTS[1] + args.port_offset
        metrics_url = f"http://127.0.0.1:{VERIFIER_PORTS[1] + args.port_offset}/metrics"
        for clients in args.clients:
            for k in args.ks:
                for run in range(args.passes):
                    rows.append(stack_run(args, stack, http_port, metrics_url, prompts, clients, k))
                    rows[-1].label += f" {run + 1}" if args.passes > 1 else ""
                    print_table(rows[-1:], flush=True)
    finally:
        os.killpg(stack.pid, 2)
        stack.wait(timeout=60)
    return rows


def main() -> None:
    args = parse_args()
    prompts = instruction_prompts(max(_num_requests(args, c) for c in args.clients))
    rows: list[Row] = []
    if not args.no_stack:
        rows += stack_runs(args, prompts)
    if not args.no_engine:
        verifier_options = ["--model", args.model, "--device", args.device,
                            "--max-speculative-tokens", str(max(max(args.ks), 1)), *args.stack_args]
        rows += engine_runs(args, prompts, verifier_options)
    if args.hf is not None:
        rows += hf_runs(args, prompts[:args.batch1_requests])
    with open(args.out, "w") as out:
        for row in rows:
            out.write(json.dumps({**asdict(row), "tokens_per_second": row.tokens_per_second}) + "\n")
    print_table(rows)


if __name__ == "__main__":
    main()
