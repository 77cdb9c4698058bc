"""Drafter acceptance on recorded greedy outputs: tokens per step, drafts per step, accepted / proposed.

    .venv/bin/python bench/drafter_acceptance.py [--ks 4,8,16] [--workloads repeat-code,self-refine,extract]
                                                 [--max-tokens 256] [--no-arctic]

Records (once; cached under ~/.cache/specd/drafter-acceptance, acceptance_recordings.py) the default
model's greedy outputs on three public workloads (acceptance_workloads.py: repeat HumanEval code, a
self-refinement loop on HumanEval problems, a templated extraction step over standard-library docs; 24
requests each), then replays them (acceptance_replay.py: propose up to k, accept the longest prefix that
equals the recording, plus one token) through:
- specd n-gram: the drafter before this change (prompt lookup, k drafts whenever anything matches);
- specd: the drafter's evidence rule with its memory of earlier outputs (global scope; also without);
- Arctic Inference 0.3.0's SuffixDecodingCache (arXiv 2411.04975, its defaults: max_spec_factor 1,
  min_token_prob 0.1, depth 64), with and without its cache of earlier responses (arctic_suffix.py).
specd runs in-process on the store the drafter service uses (native when built). Propose time is per
call at batch 1, Python overhead included, for every drafter alike.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from acceptance_recordings import load_or_record  # noqa: E402
from acceptance_replay import replay  # noqa: E402
from acceptance_workloads import WORKLOADS  # noqa: E402

from drafter_service.config import DrafterConfig  # noqa: E402
from drafter_service.local import LocalProposer  # noqa: E402


def drafters(with_arctic: bool) -> dict:
    """name -> a factory of fresh proposers (memory starts empty for every workload and k)."""
    named = {
        "specd n-gram (before)": lambda: LocalProposer(DrafterConfig(drafting="ngram", memory_scope="off")),
        "specd, memory off": lambda: LocalProposer(DrafterConfig(memory_scope="off")),
        "specd": lambda: LocalProposer(DrafterConfig()),
    }
    if with_arctic:
        from arctic_suffix import SuffixDecodingProposer

        named["Arctic suffix, no cache"] = lambda: SuffixDecodingProposer(max_cached_requests=0)
        named["Arctic suffix, cache"] = lambda: SuffixDecodingProposer()
    return named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="4,8,16")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--no-arctic", action="store_true", help="skip the Arctic Inference reference")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    named = drafters(not args.no_arctic)
    print(f"{'workload':12s} {'k':>3s} {'drafter':24s} {'tokens/step':>11s} {'drafts/step':>11s} "
          f"{'accepted/proposed':>17s} {'propose us':>10s} {'vs n-gram':>9s} {'vs Arctic':>9s}")
    for workload in args.workloads.split(","):
        recordings = load_or_record(workload, WORKLOADS[workload](), args.max_tokens)
        for k in ks:
            results = {name: replay(make(), recordings, k) for name, make in named.items()}
            baseline = results["specd n-gram (before)"].tokens_per_step
            arctic = results.get("Arctic suffix, cache")
            for name, r in results.items():
                versus_arctic = f"{r.tokens_per_step / arctic.tokens_per_step:8.2f}x" if arctic else ""
                print(f"{workload:12s} {k:3d} {name:24s} {r.tokens_per_step:11.2f} {r.proposed_per_step:11.2f} "
                      f"{r.acceptance:17.2f} {r.propose_us:10.1f} {r.tokens_per_step / baseline:8.2f}x {versus_arctic}")
        print()


if __name__ == "__main__":
    main()
