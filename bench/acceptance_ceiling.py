"""The ceiling of copy drafting on the recorded workloads: tokens per step if every step copied the best
earlier occurrence in hindsight.

    .venv/bin/python bench/acceptance_ceiling.py [--ks 8,16] [--workloads repeat-code,self-refine,extract]

A drafter of the prompt-lookup family (specd's n-gram and evidence rules, SuffixDecoding) proposes one chain:
what followed an earlier occurrence of the context's last n tokens. Replayed through the same loop as
bench/drafter_acceptance.py (acceptance_replay.replay: batch 1, up to k drafts, the longest prefix equal to
the recording accepted, plus one token), this takes at every step the occurrence whose continuation agrees
longest with the recorded future - which no drafter can know - among the occurrences matching at least n
tokens: in the sequence's own context (continued periodically past its end, as the n-gram drafter does), and
with "memory" also in every earlier request's prompt and output (more than specd's memory holds). So no single-chain copy drafter that needs an n-token
match can beat the n-token row; the 1-token row bounds them all.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from acceptance_recordings import Recording, load_or_record  # noqa: E402
from acceptance_replay import replay  # noqa: E402
from acceptance_workloads import WORKLOADS  # noqa: E402

from verifier_service.engine.proposer import DraftRequest  # noqa: E402


def agreement(copy: list[int], future: list[int]) -> int:
    count = 0
    while count < len(future) and count < len(copy) and copy[count] == future[count]:
        count += 1
    return count


def best_copy(context: list[int], sources: list[list[int]], future: list[int], n: int) -> int:
    """The most future tokens any occurrence of context's last n tokens would have drafted."""
    tail, best = context[-n:], 0
    if not future:
        return 0
    for source in [context, *sources]:
        for position in range(n, len(source)):
            if source[position - n:position] != tail:
                continue
            after = source[position:position + len(future)]
            if source is context:  # periodic past the context's end
                after = (after * (len(future) // len(after) + 1))[:len(future)]
            best = max(best, agreement(after, future))
            if best == len(future):
                return best
    return best


class HindsightProposer:
    """Drafts what the best earlier occurrence would have (the part of it the recording confirms), for replay():
    it knows the recordings, which replay() runs in order, one request at a time, releasing each at its end."""

    def __init__(self, recordings: list[Recording], n: int, with_memory: bool) -> None:
        self._recordings, self._n, self._with_memory = recordings, n, with_memory
        self._current, self._earlier = 0, []

    def propose(self, requests: list[DraftRequest]) -> dict[str, list[int]]:
        (request,) = requests
        recording = self._recordings[self._current]
        emitted = len(request.token_ids) - len(recording.prompt_token_ids)
        future = recording.output_token_ids[emitted:emitted + request.num_draft_tokens]
        context = list(request.token_ids)
        sources = self._earlier if self._with_memory else []
        return {request.request_id: future[:best_copy(context, sources, future, self._n)]}

    def release(self, request_ids: list[str]) -> None:
        recording = self._recordings[self._current]
        self._earlier.append(list(recording.prompt_token_ids) + recording.output_token_ids)
        self._current += 1


def ceiling(recordings: list[Recording], k: int, n: int, with_memory: bool) -> float:
    return replay(HindsightProposer(recordings, n, with_memory), recordings, k).tokens_per_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ks", default="8,16")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    print("| workload | k | match of at least | own context | own context + every earlier request |")
    print("|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        recordings = load_or_record(workload, WORKLOADS[workload](), args.max_tokens)
        for k in (int(k) for k in args.ks.split(",")):
            for n in (1, 2):
                print(f"| {workload} | {k} | {n} token{'s' if n > 1 else ''} | {ceiling(recordings, k, n, False):.2f} "
                      f"| {ceiling(recordings, k, n, True):.2f} |", flush=True)


if __name__ == "__main__":
    main()
