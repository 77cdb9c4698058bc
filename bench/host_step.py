"""The host's work per engine step, with the model's share made negligible: a 2-layer random Qwen3 with a 4k
vocabulary (make_random_model.py's qwen3-tiny) on the CPU, one torch thread, many requests decoding at once;
ms per decode step after the prefill. It times scheduling, input packing, sampling metadata, verification and
update: the work that async scheduling must hide behind the device on a GPU. To compare two checkouts, run
each with its own code first on the path:

    .venv/bin/python bench/host_step.py --rows 1,16,256 --mode greedy
    (cd OTHER && PYTHONPATH=$PWD /work/main/.venv/bin/python /work/main/bench/host_step.py --rows 1,16,256)
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_random_model  # noqa: E402


def ms_per_step(model: Path, rows: int, temperature: float, speculation: bool, steps: int = 100) -> float:
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine
    from verifier_service.engine.sampling_params import SamplingParams

    config = EngineConfig(model=str(model), device="cpu", dtype="float32", block_size=16, kv_cache_bytes=2 << 30,
                          max_num_seqs=256, max_num_batched_tokens=16384, max_model_len=2048,
                          num_speculative_tokens=4 if speculation else 0, adaptive_drafting=True,
                          enable_prefix_caching=False)
    proposer = None
    if speculation:  # the in-process drafter, drafting where the adaptive policy lets it (gpu_throughput.py's
        from drafter_service.local import LocalProposer  # compiled+ngram-adaptive)

        proposer = LocalProposer()
    engine, rng = Engine(config, proposer), random.Random(0)
    for i in range(rows):
        prompt = [rng.randint(0, 4000) for _ in range(rng.randint(20, 60))]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=steps + 10, temperature=temperature,
                                                           ignore_eos=True))
    for _ in range(3):  # the prefill
        engine.step()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - started) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16,256")
    parser.add_argument("--mode", default="greedy", choices=["greedy", "sampled"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speculation", default="off", choices=["off", "on", "both"],
                        help="n-gram drafts with the adaptive policy (k = 4), as gpu_throughput's ngram-adaptive")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp)
        make_random_model.main("qwen3-tiny", str(model))
        temperature = 0.0 if args.mode == "greedy" else 0.6
        modes = {"off": [False], "on": [True], "both": [False, True]}[args.speculation]
        for rows in [int(r) for r in args.rows.split(",")]:
            for speculation in modes:
                times = [ms_per_step(model, rows, temperature, speculation) for _ in range(args.rounds)]
                print(f"{args.mode} rows={rows} speculation={'on' if speculation else 'off'}: "
                      + " / ".join(f"{t:.2f}" for t in times) + " ms per step")


if __name__ == "__main__":
    main()
