"""CPU seconds per generated token, per process: the stack's services against the engine alone.

On a machine shared with other work, wall-clock tokens/s moves by tens of percent from run to run; the CPU
time a process spends per token barely does, and it shows where the stack's extra cycles go (the gateway,
the drafter, the verifier's own threads beside the engine). `CpuMeter` reads each `specd up` service's
user + system time through psutil; `engine_alone` runs the verifier's engine in this process on the same
prompts (the drafter's n-gram index in process, no RPC), as bench/engine.py does.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

# The engine alone runs under the OpenMP wait policy the services get from specd_cli/main.py (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
SERVICES = ("gateway", "verifier", "drafter")


@dataclass
class CpuRow:
    """One run: CPU ms per token per process, wall tokens/s, and the 1-minute load average when it began."""

    label: str
    ms_per_token: dict[str, float]
    tokens_per_second: float
    load_average: float


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@dataclass
class CpuMeter:
    """The processes of a running `specd up` (found by their subcommand) plus this client process."""

    processes: dict[str, psutil.Process]
    rows: list[CpuRow] = field(default_factory=list)

    @classmethod
    def of_stack(cls, supervisor_pid: int) -> CpuMeter:
        processes = {"client": psutil.Process()}
        for child in psutil.Process(supervisor_pid).children(recursive=True):
            name = next((s for s in SERVICES if s in child.cmdline()), None)
            if name is not None:
                processes[name] = child
        return cls(processes)

    def start(self) -> tuple[dict[str, float], float]:
        """Snapshot before a run: CPU seconds per process, and the load average."""
        return {name: _cpu_seconds(p) for name, p in self.processes.items()}, os.getloadavg()[0]

    def record(self, label: str, before: tuple[dict[str, float], float], tokens: int, wall_seconds: float) -> None:
        cpu, load = before
        per_token = {name: 1000 * (_cpu_seconds(p) - cpu[name]) / max(tokens, 1) for name, p in self.processes.items()}
        self.rows.append(CpuRow(label, per_token, tokens / wall_seconds, load))


def engine_alone(model: str, device: str, texts: list[str], max_tokens: int, ks: tuple[int, ...]) -> list[CpuRow]:
    """The verifier's engine in this process at batch 1, greedy, per k: CPU ms per token (all of this
    process's threads, torch's included) and tokens/s."""
    from transformers import AutoTokenizer

    from drafter_service.config import DrafterConfig
    from drafter_service.local import LocalProposer
    from specd.default_model import resolve_model_path
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine
    from verifier_service.runners import build_model_runner
    from specd.sampling import SamplingParams

    device = "cpu" if device == "auto" else device  # the stack's auto on a machine without CUDA
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    config = EngineConfig(model=model, device=device, dtype="float32" if device == "cpu" else "bfloat16",
                          num_speculative_tokens=max(ks))
    runner = build_model_runner(config)
    rows = []
    for k in ks:
        proposer = LocalProposer(DrafterConfig())  # the stack's drafter rule, in this process
        engine = Engine(config, proposer=proposer if k else None, runner=runner)

        def generate(prompt: list[int], tokens: int) -> int:
            engine.add_request("bench", prompt, SamplingParams(max_tokens=tokens, num_speculative_tokens=k))
            count = 0
            while engine.has_unfinished_requests():
                count += sum(len(output.new_token_ids) for output in engine.step())
            return count

        generate(prompts[0][:32], 8)  # warm-up, as the stack was warmed
        load, cpu, started = os.getloadavg()[0], time.process_time(), time.perf_counter()
        tokens = sum(generate(prompt, max_tokens) for prompt in prompts)
        wall = time.perf_counter() - started
        rows.append(CpuRow(f"engine alone k={k}", {"engine": 1000 * (time.process_time() - cpu) / tokens},
                           tokens / wall, load))
    return rows


def print_cpu_table(rows: list[CpuRow]) -> None:
    """CPU ms per token by process, the sum, and wall tokens/s with the load average it ran under."""
    names = [n for n in ("gateway", "verifier", "drafter", "engine", "client") if any(n in r.ms_per_token for r in rows)]
    print(f"\n{'batch 1, CPU ms per token':<26}" + "".join(f"{n:>10}" for n in names)
          + f"{'services':>10}{'tok/s':>8}{'load avg':>9}")
    for row in rows:
        services = sum(v for n, v in row.ms_per_token.items() if n != "client")
        cells = "".join(f"{row.ms_per_token[n]:>10.2f}" if n in row.ms_per_token else f"{'-':>10}" for n in names)
        print(f"{row.label:<26}{cells}{services:>10.2f}{row.tokens_per_second:>8.1f}{row.load_average:>9.2f}")
