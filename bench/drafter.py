"""Drafter latency: server-side propose time per batch, and the verifier client's round trip.

    python -m bench.drafter [--steps 200] [--batches 1,64,256] [--contexts 4096,32768]
                                      [--store native|python] [--memory-tokens 1000000] [--drafting evidence|ngram]

Every sequence holds a context of the given length (random ids over the default model's vocabulary
that keep copying earlier spans, see Workload); each step appends 1 to 4 accepted tokens per
sequence and asks for 4 drafts, as a verifier step does. Before the first step, finished requests of the
same kind (64-token prompts, 1024-token outputs) fill the drafter's memory of earlier outputs with
--memory-tokens tokens (its default budget), so every proposal also searches a full memory.

- server: DrafterSession.step on a decoded batch (the domain work; wall time, and the thread's CPU
  time, which leaves out time spent waiting for a core on a shared machine), and the whole handler
  body (protobuf -> domain -> step -> protobuf), in this process, per batch. Both run on the sequence
  store --store names (default: native when built, as the drafter picks; drafter_service/stores.py);
  the drafter process of the round trip runs it too.
- round trip: DrafterClient.propose() against a drafter in its own process over loopback gRPC,
  per batch, as the engine thread sees it.
The first step, which carries whole contexts, is reported separately (sync) and not in the percentiles.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.local_stack import REPO_ROOT, free_port, wait_serving
from drafter_service import convert
from drafter_service.batch import DraftRequest, ProposeBatch, SequenceDelta
from drafter_service.client import DrafterClient, _Step, _step_to_pb
from drafter_service.config import DrafterConfig
from drafter_service.drafter import Drafter
from drafter_service.stores import resolve_backend
from specd import environment

VOCAB = 49152
NUM_DRAFT_TOKENS = 4


class Workload:
    """Contexts of random ids that keep copying earlier spans: the case prompt lookup is for.

    Every context ends in a 16-token copy of an earlier span, and each step appends 1 to 4 accepted
    tokens that continue the copy (one in 8 is a random id, which restarts the copy elsewhere). So
    the drafter finds matches at the same rate at every context length, and work per step is equal.
    """

    def __init__(self, num_sequences: int, length: int, rng: random.Random) -> None:
        self.rng = rng
        self.contexts: list[list[int]] = []
        self.sources: list[int] = []  # per sequence: the position the copy continues from
        for _ in range(num_sequences):
            tokens = [rng.randrange(VOCAB) for _ in range(length - 16)]
            start = rng.randrange(len(tokens) // 2)
            self.contexts.append(tokens + tokens[start:start + 16])
            self.sources.append(start + 16)

    def grow(self) -> None:
        rng = self.rng
        for i, tokens in enumerate(self.contexts):
            for _ in range(rng.randint(1, 4)):
                if rng.randrange(8) == 0:
                    tokens.append(rng.randrange(VOCAB))
                    self.sources[i] = rng.randrange(len(tokens) // 2)
                else:
                    tokens.append(tokens[self.sources[i]])
                    self.sources[i] += 1


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    """(p50, p90, p99) in milliseconds."""
    quantiles = statistics.quantiles(samples, n=100, method="inclusive")
    return quantiles[49] * 1e3, quantiles[89] * 1e3, quantiles[98] * 1e3


def earlier_requests(memory_tokens: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) of finished requests whose outputs add up to memory_tokens."""
    count = memory_tokens // 1024
    return [([rng.randrange(VOCAB) for _ in range(64)], Workload(1, 1024, rng).contexts[0]) for _ in range(count)]


def fill_memory(session, requests: list[tuple[list[int], list[int]]]) -> None:
    """Each request as a verifier sends it: first sight (the prompt), its output, then its release."""
    for number, (prompt, output) in enumerate(requests):
        sequence_id = f"earlier-{number}"
        session.step(ProposeBatch.from_deltas(0, [SequenceDelta(sequence_id, 0, prompt, 0)]))
        session.step(ProposeBatch.from_deltas(0, [SequenceDelta(sequence_id, len(prompt), output, 0)]))
        session.step(ProposeBatch.from_deltas(0, [], released_sequence_ids=[sequence_id]))


def bench_server(num_sequences: int, length: int, steps: int, rng: random.Random, config: DrafterConfig,
                 store: str, earlier: list) -> dict:
    session = Drafter(config, store).open_session()
    fill_memory(session, earlier)
    workload = Workload(num_sequences, length, rng)
    contexts = workload.contexts
    sent = [0] * num_sequences
    domain, domain_cpu, handler, proposed = [], [], [], 0
    for step in range(steps + 1):
        requests = [DraftRequest(str(i), t, NUM_DRAFT_TOKENS) for i, t in enumerate(contexts)]
        ends = [len(t) for t in contexts]
        message = _step_to_pb(_Step(step + 1, requests, sent, ends))  # exactly what the client sends
        sent = ends
        started = time.perf_counter()
        batch = convert.batch_from_pb(message)
        decoded, decoded_cpu = time.perf_counter(), time.thread_time()
        drafts = session.step(batch)
        stepped, stepped_cpu = time.perf_counter(), time.thread_time()
        convert.drafts_to_pb(drafts).SerializeToString()
        finished = time.perf_counter()
        if step == 0:
            sync = finished - started
        else:
            domain.append(stepped - decoded)
            domain_cpu.append(stepped_cpu - decoded_cpu)
            handler.append(finished - started)
            proposed += drafts.num_proposed_tokens
        workload.grow()
    session.close()
    return {"sync": sync, "domain": percentiles(domain), "domain_cpu": percentiles(domain_cpu),
            "handler": percentiles(handler), "memory": session._drafter.store.memory_tokens,
            "hit": proposed / (steps * num_sequences * NUM_DRAFT_TOKENS)}


def start_drafter(port: int, store: str, drafting: str) -> subprocess.Popen:
    """A drafter in its own process, returned once SERVING (its output in a temporary log)."""
    log_path = Path(tempfile.mkdtemp(prefix="specd-bench-drafter-")) / "drafter.log"
    code = ("from drafter_service.server import run; from drafter_service.config import DrafterConfig; "
            f"run(DrafterConfig(port={port}, metrics_port=None, max_tokens_held=10**9, drafting={drafting!r}))")
    with open(log_path, "ab") as log:
        process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, environment.DRAFTER_STORE: store})
    wait_serving(f"127.0.0.1:{port}", process, log_path, timeout=30)
    return process


def bench_round_trip(address: str, num_sequences: int, length: int, steps: int,
                     rng: random.Random, earlier: list) -> dict:
    client = DrafterClient(address, timeout_s=30.0)  # measure the real latency, not the deadline
    workload = Workload(num_sequences, length, rng)
    contexts = workload.contexts
    prefix = f"{num_sequences}x{length}-"
    try:
        while client._stream is None:  # wait for the background connection
            time.sleep(0.01)
        for number, (prompt, output) in enumerate(earlier):  # as in fill_memory, through the client
            request_id = f"{prefix}earlier-{number}"
            client.propose([DraftRequest(request_id, prompt, 0)])
            client.propose([DraftRequest(request_id, prompt + output, 0)])
            client.release([request_id])
        samples = []
        for step in range(steps + 1):
            requests = [DraftRequest(prefix + str(i), t, NUM_DRAFT_TOKENS) for i, t in enumerate(contexts)]
            started = time.perf_counter()
            client.propose(requests)
            elapsed = time.perf_counter() - started
            if step == 0:
                sync = elapsed
            else:
                samples.append(elapsed)
            workload.grow()
        client.release([r.request_id for r in requests])
        return {"sync": sync, "rtt": percentiles(samples), "fallbacks": client.num_fallbacks}
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--contexts", default="4096,32768")
    parser.add_argument("--store", default=resolve_backend(), choices=("native", "python"))
    parser.add_argument("--memory-tokens", type=int, default=DrafterConfig().max_memory_tokens)
    parser.add_argument("--drafting", default="evidence", choices=("evidence", "ngram"))
    args = parser.parse_args()
    config = DrafterConfig(max_tokens_held=10**9, drafting=args.drafting)
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    rng = random.Random(0)

    earlier = earlier_requests(args.memory_tokens, rng)
    print(f"server side, per batch, {args.store} store, drafting {args.drafting} (ms; p50 / p90 / p99), "
          f"memory filled by {len(earlier)} earlier requests")
    print(f"{'seqs':>5} {'context':>8} {'first sync':>11} {'propose (domain)':>24} "
          f"{'propose CPU time':>24} {'handler (with protobuf)':>24} {'draft hit':>9} {'memory tokens':>13}")
    for length in contexts:
        for num_sequences in batches:
            r = bench_server(num_sequences, length, args.steps, rng, config, args.store, earlier)
            print(f"{num_sequences:>5} {length:>8} {r['sync'] * 1e3:>9.1f}ms "
                  f"{'%.3f / %.3f / %.3f' % r['domain']:>24} {'%.3f / %.3f / %.3f' % r['domain_cpu']:>24} "
                  f"{'%.3f / %.3f / %.3f' % r['handler']:>24} "
                  f"{r['hit']:>9.2f} {r['memory']:>13,}")

    port = free_port()
    process = start_drafter(port, args.store, args.drafting)
    try:
        print("\nclient round trip (DrafterClient.propose over loopback, drafter in its own process; ms)")
        print(f"{'seqs':>5} {'context':>8} {'first sync':>11} {'p50 / p90 / p99':>24} {'fallbacks':>9}")
        for length in contexts:
            for num_sequences in batches:
                r = bench_round_trip(f"127.0.0.1:{port}", num_sequences, length, args.steps, rng, earlier)
                print(f"{num_sequences:>5} {length:>8} {r['sync'] * 1e3:>9.1f}ms "
                      f"{'%.3f / %.3f / %.3f' % r['rtt']:>24} {r['fallbacks']:>9}")
    finally:
        process.terminate()
        process.wait()


if __name__ == "__main__":
    main()
