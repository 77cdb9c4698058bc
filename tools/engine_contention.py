"""Does the engine thread's host work slow down when the machine's other CPUs are busy, and does it matter which?

    python tools/engine_contention.py MODEL CPU [DEVICE]

The engine alone (bench/stack.py's closed loop: 64 clients, speculation off, 600 instruction prompts, 128 tokens),
its thread pinned to CPU once warmed up, three times over one engine: the machine quiet; one busy Python loop on every other CPU
(CPU's hyperthread sibling included); and on every CPU but CPU and its siblings. Prints tok/s and the engine's stage
means per step for each.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.instruction_prompts import instruction_prompts
from bench.stack import _closed_loop


def siblings(cpu: int) -> set[int]:
    text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    found = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def burners(cpus: list[int]) -> list[subprocess.Popen]:
    return [subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", "while True: pass"]) for c in cpus]


def main() -> None:
    model, cpu, device = sys.argv[1], int(sys.argv[2]), (sys.argv[3:] or ["cuda"])[0]
    requests = int(os.environ.get("REQUESTS", 600))
    from drafter_service.config import DrafterConfig
    from drafter_service.local import LocalProposer
    from gateway.tokenizer import Tokenizer
    from specd.options import options_from_args
    from specd_cli.main import build_parser
    from verifier_service.config import verifier_config_from_options
    from verifier_service.engine.engine import Engine
    from verifier_service.engine.warm_up import warm_up
    from verifier_service.runners import build_model_runner

    options = options_from_args(build_parser().parse_args(["verifier", "--model", model, "--device", device]))
    config = verifier_config_from_options(options).engine
    tokenizer = Tokenizer(model)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in instruction_prompts(requests)]
    engine = Engine(config, LocalProposer(DrafterConfig(memory_scope="off")), build_model_runner(config, drafts=True))
    warm_up(engine)
    os.sched_setaffinity(0, {cpu})  # this thread alone (the engine's), so the warm-up compiled on every CPU
    others = sorted(set(range(os.cpu_count())) - {cpu})
    print(f"engine on CPU {cpu}, its siblings {sorted(siblings(cpu))}", flush=True)
    for name, busy in (("quiet", []), ("every other CPU busy", others),
                       ("every CPU but its core busy", sorted(set(others) - siblings(cpu)))):
        loops = burners(busy)
        try:
            row = _closed_loop(engine, prompts, 64, 0, int(os.environ.get("MAX_TOKENS", 128)), tokenizer.eos_token_ids)
        finally:
            for loop in loops:
                loop.kill()
        stages = " ".join(f"{k} {v:.2f}" for k, v in row.stage_ms.items())
        print(f"| {name} ({len(busy)} busy loops) | {row.tokens_per_second:.0f} tok/s | {stages} |", flush=True)


if __name__ == "__main__":
    main()
