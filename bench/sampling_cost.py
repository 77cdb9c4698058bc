"""What penalties and logit bias cost the verify stage per step, beside batches that use none, in the same run.

The verify stage as the engine runs it (Engine._verify + _collect): SamplingMetadata.build for the scheduled
batch, then rejection_sampler.verify_async(...).result(), on logits of the default model's vocabulary
(random: the cost does not depend on the values). Every request decodes with k drafts after a prompt and an
output of --context tokens each; kinds: none (plain greedy), bias (a 10-token logit_bias), penalties
(presence, frequency and repetition), all (both). Each step's cost is the process's CPU time (all torch
threads), which a shared machine disturbs far less than wall time; the kinds are timed round-robin, so what
load there is falls on each alike. The table gives CPU ms per step, the fastest and the median of the
iterations (on a loaded machine the fastest is the better estimate of the work itself), and the ratio of
the medians to `none`.

    .venv/bin/python bench/sampling_cost.py [--iterations 50] [--context 256] [--temperature 0]
    cd OTHER_CHECKOUT && .venv/bin/python PATH/TO/bench/sampling_cost.py --plain-only
        # `none` on another checkout (its own environment: the editable install decides what is imported)
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

# As the services run (specd_cli/main.py): idle OpenMP threads sleep. Spinning ones would count as CPU time here,
# as much as the machine's other load makes them wait.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402 - after the wait policy, which OpenMP reads once

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.rejection_sampler import verify_async
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata
from verifier_service.engine.sampling_params import SamplingParams

VOCAB = 49152  # the default model's
KINDS = {
    "none": {},
    "bias": {"logit_bias": {t: 5.0 for t in range(100, 110)}},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2},
}
KINDS["all"] = {**KINDS["bias"], **KINDS["penalties"]}


def scheduled_step(batch_size: int, k: int, context: int, params: SamplingParams):
    """(batch, requests): batch_size requests that each feed their last token and k drafts."""
    generator = torch.Generator().manual_seed(0)
    requests, entries = [], []
    for i in range(batch_size):
        tokens = torch.randint(0, VOCAB, (2 * context + k,), generator=generator).tolist()
        request = Request(f"r{i}", tokens[:context], params, i)
        request.append_output(tokens[context:2 * context])
        drafts = tokens[2 * context:]
        requests.append(request)
        entries.append(ScheduledRequest(request.request_id, request.token_ids[-1:] + drafts, request.num_tokens - 1,
                                        [], k, k + 1))
    return ScheduledBatch(entries), requests


def verify_seconds(batch: ScheduledBatch, requests: list[Request], logits: torch.Tensor) -> float:
    """CPU seconds of one verify stage, as Engine._verify and _collect run it."""
    started = time.process_time()
    verify_async(logits, SamplingMetadata.build(batch, requests, logits.device)).result()
    return time.process_time() - started


def measure(batch_size: int, k: int, args: argparse.Namespace, kinds: list[str]) -> dict[str, list[float]]:
    """CPU seconds per step of each kind, every iteration, timed round-robin."""
    steps = {kind: scheduled_step(batch_size, k, args.context,
                                  SamplingParams(temperature=args.temperature, max_tokens=4 * args.context,
                                                 **KINDS[kind])) for kind in kinds}
    logits = torch.randn(batch_size * (k + 1), VOCAB)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for iteration in range(args.iterations + 3):
        for kind in kinds:
            seconds = verify_seconds(*steps[kind], logits)
            if iteration >= 3:  # warm-up
                times[kind].append(seconds)
    return times


def cell(times: list[float], baseline: list[float] | None) -> str:
    """'fastest / median' in ms, with the medians' ratio to the baseline's."""
    median = statistics.median(times)
    text = f"{1e3 * min(times):.2f} / {1e3 * median:.2f}"
    return text if baseline is None else f"{text} ({median / statistics.median(baseline):.1f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--context", type=int, default=256, help="prompt tokens, and as many output tokens")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--k", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--plain-only", action="store_true", help="time `none` only (for a checkout without penalties)")
    args = parser.parse_args()
    kinds = ["none"] if args.plain_only else list(KINDS)
    print(f"verify stage, CPU ms per step, fastest / median of {args.iterations}; temperature {args.temperature}, "
          f"context {args.context} + {args.context}, vocab {VOCAB}, {torch.get_num_threads()} threads")
    print("| batch | k | " + " | ".join(kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))
    for batch_size in args.batch_sizes:
        for k in args.k:
            result = measure(batch_size, k, args, kinds)
            cells = [cell(result[kind], None if kind == "none" else result["none"]) for kind in kinds]
            print(f"| {batch_size} | {k} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
