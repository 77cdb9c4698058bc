"""Drafter acceptance on recorded greedy outputs: tokens per step, drafts per step, accepted / proposed.

    python -m bench.acceptance [--ks 4,8,16] [--workloads repeat-code,self-refine,extract] [--max-tokens 256]

Records (once) the default model's greedy outputs on three public workloads (bench/workload.py's WORKLOADS:
repeat HumanEval code, a self-refinement loop on HumanEval problems, a templated extraction step over
standard-library docs; 24 requests each), then replays them (propose up to k, accept the longest prefix that
equals the recording, plus one token) through:
- specd n-gram: the drafter's first rule (prompt lookup, k drafts whenever anything matches);
- specd: the drafter's evidence rule with its memory of earlier outputs (global scope; also without);
- with --tree-budgets: draft trees of those node budgets (drafter_service/tree.py, not served yet), at the
  drafter's chance threshold and at 0.05, and the tree ceiling: every candidate's whole continuation, which
  accepts what the best single candidate would in hindsight. Compare rows at equal drafts/step.
specd runs in-process on the store the drafter service uses (native when built). Propose time is per call at
batch 1, Python overhead included. bench/engine.py and bench/serve.py take their recorded workloads from here.

Recordings: made with specd's engine on the CPU in float32 (greedy output is token for token what plain decoding
gives, which the exactness tests check; drafting only makes the recording faster). Cached as JSON under
${SPECD_HOME:-~/.cache/specd}/drafter-acceptance/, keyed by the workload's text, the token limit and the model
folder, so an edited workload is recorded afresh; never in git.

Replay, per request: the prefill step emits the first recorded token without drafts; then each step asks the
proposer for up to k drafts (never more than the tokens left to emit, less one), accepts the longest prefix that
equals the recorded continuation, and emits one more recorded token (the target model's own), as greedy
verification does. Requests run one after another, in recording order, and are released when they end, so a
drafter with memory sees the earlier ones.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from bench.workload import WORKLOADS, Turn
from drafter_service.config import DrafterConfig
from drafter_service.local import LocalProposer
from drafter_service.state import SequenceStore
from drafter_service.tree import DraftTree
from specd import environment
from verifier_service.engine.proposer import DraftRequest, Proposer

@dataclass(frozen=True)
class Recording:
    """One request: what was asked, and what the model answered."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]


def cache_dir() -> Path:
    return environment.specd_home() / "drafter-acceptance"


def load_or_record(name: str, turns: list[Turn], max_tokens: int) -> list[Recording]:
    """The cached recordings of a workload, recording (minutes on the CPU) what is missing."""
    from specd.default_model import resolve_model_path

    model_path = resolve_model_path("default")
    key = hashlib.sha256(json.dumps([[t.user, t.follows, t.raw] for t in turns] + [max_tokens, model_path.name])
                         .encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.json"
    if path.exists():
        return [Recording(**r) for r in json.loads(path.read_text())]
    started = time.perf_counter()
    recordings = _record(turns, max_tokens, model_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.__dict__ for r in recordings]))
    print(f"recorded {name}: {len(recordings)} requests, "
          f"{sum(len(r.output_token_ids) for r in recordings)} tokens in {time.perf_counter() - started:.0f} s")
    return recordings


def _record(turns: list[Turn], max_tokens: int, model_path: Path) -> list[Recording]:
    from transformers import AutoTokenizer

    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine
    from specd.sampling import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engine = Engine(EngineConfig(model=str(model_path), device="cpu", dtype="float32", num_speculative_tokens=8),
                    proposer=LocalProposer())
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=(tokenizer.eos_token_id,))
    conversations: list[list[dict]] = []
    recordings = []
    for number, turn in enumerate(turns):
        history = conversations[turn.follows] if turn.follows is not None else []
        messages = history + [{"role": "user", "content": turn.user}]
        text = turn.user if turn.raw else tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                        tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        engine.add_request(f"record-{number}", list(prompt), params)
        output: list[int] = []
        while engine.has_unfinished_requests():
            for step_output in engine.step():
                output += step_output.new_token_ids
        answer = tokenizer.decode([t for t in output if t != tokenizer.eos_token_id])
        conversations.append(messages + [{"role": "assistant", "content": answer}])
        recordings.append(Recording(list(prompt), output))
    return recordings


@dataclass
class ReplayResult:
    """Totals over a workload."""

    tokens: int = 0  # emitted (recorded output tokens)
    steps: int = 0  # verifier steps, the prefill included
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # of them, accepted
    propose_seconds: float = 0.0  # time inside proposer.propose
    propose_calls: int = 0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps

    @property
    def proposed_per_step(self) -> float:
        return self.proposed / self.steps

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def propose_us(self) -> float:
        return self.propose_seconds / max(self.propose_calls, 1) * 1e6


class ChainDrafts:
    """A proposer's one chain of drafts a step; the step accepts its prefix that equals the recording."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer

    def step(self, request_id: str, context: list[int], wanted: int, truth: list[int]) -> tuple[int, int]:
        """(drafts proposed, of them accepted) for the step after `context`, whose target tokens are `truth`."""
        drafts = self.proposer.propose([DraftRequest(request_id, context, wanted)]).get(request_id, [])[:wanted]
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == truth[accepted]:
            accepted += 1
        return len(drafts), accepted

    def release(self, request_id: str) -> None:
        self.proposer.release([request_id])


class TreeDrafts:
    """A draft tree of at most `budget` nodes a step (drafter_service/tree.py, on the Python store; `threshold` as
    its draft_tree's); the step accepts the tree's longest path that equals the recording."""

    def __init__(self, config: DrafterConfig, budget: int, threshold: float | None = None) -> None:
        self.store, self.budget, self.threshold = SequenceStore(config), budget, threshold
        self._held: dict[str, int] = {}  # request id -> tokens the store holds

    def step(self, request_id: str, context: list[int], wanted: int, truth: list[int]) -> tuple[int, int]:
        held = self._held.get(request_id, 0)
        self.store.apply(request_id, held, context[held:])
        self._held[request_id] = len(context)
        tree = self.store.draft_tree(request_id, self.budget, wanted, self.threshold) if wanted > 0 else DraftTree()
        return len(tree), len(tree.accepted_path(truth))

    def release(self, request_id: str) -> None:
        self._held.pop(request_id, None)
        self.store.release(request_id)


def replay(drafts: ChainDrafts | TreeDrafts, recordings: list[Recording], k: int) -> ReplayResult:
    """Every recording through `drafts`, at most k drafts deep a step."""
    result = ReplayResult()
    for number, recording in enumerate(recordings):
        request_id = f"replay-{number}"
        output = recording.output_token_ids
        context = list(recording.prompt_token_ids) + output[:1]  # the prefill step's token
        emitted, result.steps = 1, result.steps + 1
        while emitted < len(output):
            wanted = min(k, len(output) - emitted - 1)
            started = time.perf_counter()
            proposed, accepted = drafts.step(request_id, context, wanted, output[emitted:emitted + wanted])
            result.propose_seconds += time.perf_counter() - started
            result.propose_calls += 1
            context += output[emitted:emitted + accepted + 1]  # in place: contexts only grow
            emitted += accepted + 1
            result.steps += 1
            result.proposed += proposed
            result.accepted += accepted
        result.tokens += len(output)
        drafts.release(request_id)
    return result


DRAFTERS = {  # name -> a factory of fresh proposers (memory starts empty for every workload and k)
    "specd n-gram": lambda: LocalProposer(DrafterConfig(drafting="ngram", memory_scope="off")),
    "specd, memory off": lambda: LocalProposer(DrafterConfig(memory_scope="off")),
    "specd": lambda: LocalProposer(DrafterConfig()),
}


def tree_rows(budgets: list[int]) -> list[tuple[str, int, float | None]]:
    """(row name, node budget, chance threshold) of the draft trees replayed (depth: the largest k): each budget
    at the drafter's threshold and at a low one, then the hindsight ceiling (every candidate's whole
    continuation: a tree accepts what the best of its candidates would)."""
    rows = [("specd tree", budget, None) for budget in budgets]
    rows += [("specd tree, chance>=0.05", budget, 0.05) for budget in budgets]
    return rows + [("tree ceiling", 10**6, 0.0)] if budgets else rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="4,8,16")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--tree-budgets", default="", help="node budgets of draft trees to replay beside the "
                        "chains (depth: the largest k), e.g. 8,16,32; the k column then shows the budget")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    budgets = [int(b) for b in args.tree_budgets.split(",") if b]
    print(f"{'workload':12s} {'k':>3s} {'drafter':24s} {'tokens/step':>11s} {'drafts/step':>11s} "
          f"{'accepted/proposed':>17s} {'propose us':>10s} {'vs n-gram':>9s}")
    for workload in args.workloads.split(","):
        recordings = load_or_record(workload, WORKLOADS[workload](), args.max_tokens)
        for k in ks:
            results = {name: replay(ChainDrafts(make()), recordings, k) for name, make in DRAFTERS.items()}
            baseline = results["specd n-gram"].tokens_per_step
            for name, r in results.items():
                print(f"{workload:12s} {k:3d} {name:24s} {r.tokens_per_step:11.2f} {r.proposed_per_step:11.2f} "
                      f"{r.acceptance:17.2f} {r.propose_us:10.1f} {r.tokens_per_step / baseline:8.2f}x")
        if budgets:  # the chain at the trees' low threshold, for rows at equal drafts/step
            r = replay(ChainDrafts(LocalProposer(DrafterConfig(min_draft_probability=0.05))), recordings, max(ks))
            print(f"{workload:12s} {max(ks):3d} {'specd, chance>=0.05':24s} {r.tokens_per_step:11.2f} "
                  f"{r.proposed_per_step:11.2f} {r.acceptance:17.2f} {r.propose_us:10.1f} {'':>9s}")
        for name, budget, threshold in tree_rows(budgets):
            r = replay(TreeDrafts(DrafterConfig(), budget, threshold), recordings, max(ks))
            print(f"{workload:12s} {budget if budget < 1000 else 'all':>3} {name:24s} {r.tokens_per_step:11.2f} "
                  f"{r.proposed_per_step:11.2f} {r.acceptance:17.2f} {r.propose_us:10.1f} {'':>9s}")
        print()


if __name__ == "__main__":
    main()
