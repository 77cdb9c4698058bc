"""The in-process engine: schedule -> propose -> score -> verify -> update, one forward per step.

Driven from a single thread (the verifier runs it off the asyncio loop). add_request and abort may be
called from other threads: a lock guards the scheduler's state, and is never held during the forward.

Async scheduling (on CUDA by default): the forward and the verification are launched on the device
and their result is copied back only at the end of the step; in between, the next step is scheduled and
launched already, continuing each request from this step's result on the device: its last emitted token
and, where it scored drafts, how many were accepted, which shifts the next step's positions
(scheduler.schedule_ahead, previous_tokens.py). The drafter is never waited for there: the proposal for a step is
asked one step earlier, on the contexts known then, long enough to cover what the steps in flight may emit, and
collected without waiting when that step is launched; its drafts follow the tokens known since and the guessed
outcome of the step in flight (draft_lookahead.py). A proposal that is not back in time costs that step its drafts,
never time, so the drafter's round trip, the host's scheduling, packing and launching all overlap the device's
work instead of leaving it idle (synchronous steps, as on the CPU, still ask and wait). Output is unchanged: every draft is verified, and the same tokens are fed in the same order; a
request that a stop token ends has one more step computed and dropped.
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specd.sampling import InvalidParameter, SamplingParams
from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.block_manager import BlockManager
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.context_length import resolve_max_model_len
from verifier_service.engine.draft_lookahead import AskedAhead, continuations_after_known, guessed_drafts
from verifier_service.engine.draft_policy import DraftPolicy, DraftPolicyConfig
from verifier_service.engine.outputs import EngineLoad, FinishReason, RequestOutput
from verifier_service.engine.previous_tokens import continue_from
from verifier_service.engine.proposer import DraftRequest, PendingProposal, Proposer, begin
from verifier_service.engine.rejection_sampler import PendingVerification, VerifiedTokens, verify_async
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata
from verifier_service.engine.scheduler import Scheduler
from verifier_service.engine.stats import StepStats, StepStatsLog, count_spec_decoding, timed_stage

logger = logging.getLogger(__name__)


@dataclass
class LaunchedStep:
    """A step whose forward and verification are queued on the device; its tokens are not on the host yet."""

    batch: ScheduledBatch
    verification: PendingVerification | None  # None: no request had logits


class Engine:
    """Runs many requests at once; every step scores all drafts in one forward and verifies them.

    runner: anything with execute(batch) -> logits [batch.num_logits, vocab] (any float dtype) and num_blocks,
    block_size, vocab_size, max_model_len, device (a ModelRunner is built from config when None).
    proposer: where drafts come from (None = no speculation).
    """

    def __init__(self, config: EngineConfig, proposer: Proposer | None = None, runner=None) -> None:
        self.config = config
        self.runner = runner if runner is not None else _build_model_runner(config, proposer is not None)
        self.proposer = proposer
        self.vocab_size = self.runner.vocab_size
        self.device = torch.device(getattr(self.runner, "device", "cpu"))
        self.max_model_len = resolve_max_model_len(config, self.runner)  # a lone request always fits
        self.block_manager = BlockManager(self.runner.num_blocks, self.runner.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=self.max_model_len,
            num_speculative_tokens=config.num_speculative_tokens if proposer is not None else 0,
            max_speculative_tokens=config.speculative_tokens_limit if proposer is not None else 0,
            vocab_size=self.vocab_size, draft_policy=build_draft_policy(config))
        self.step_stats = StepStatsLog()
        self._lock = threading.Lock()
        self._arrivals = itertools.count()
        self._aborted: list[RequestOutput] = []  # reported by the next step
        self._released: list[str] = []  # to tell the proposer, from the step thread
        auto = self.device.type == "cuda"  # a CPU forward is synchronous: nothing to overlap
        self.async_scheduling = auto if config.async_scheduling is None else config.async_scheduling
        self._in_flight: LaunchedStep | None = None  # the step launched ahead (async scheduling)
        # The proposal for the step to launch behind self._in_flight, asked when that one was launched.
        self._next_proposal: tuple[LaunchedStep, AskedAhead | None] | None = None

    # -- requests ---------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Queue a request; raises InvalidParameter naming the bad field (the engine is left as it was)."""
        prompt = self._checked_prompt(prompt_token_ids)
        if not isinstance(params, SamplingParams):
            raise InvalidParameter("params", "must be a SamplingParams")
        if params.output_position_offset >= len(prompt):
            raise InvalidParameter("output_position_offset", f"must be less than the prompt's {len(prompt)} tokens "
                                   "(it counts the generated tokens the prompt ends with)")
        params.check_vocabulary(self.vocab_size)
        with self._lock:
            if request_id in self.scheduler.requests:
                raise InvalidParameter("request_id", f"{request_id!r} is already running")
            request = Request(request_id, prompt, params, next(self._arrivals))
            self.scheduler.add(request)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its KV blocks now; the next step reports it with finish_reason abort."""
        with self._lock:
            request = self.scheduler.abort(request_id)
            if request is None:
                return False
            self._aborted.append(RequestOutput(request_id, [], FinishReason.ABORT, request.usage(), seed=request.seed))
            self._released.append(request_id)
        return True

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return self.scheduler.has_unfinished_requests() or bool(self._aborted) or self._in_flight is not None

    def load(self) -> EngineLoad:
        with self._lock:
            return EngineLoad(len(self.scheduler.running), len(self.scheduler.waiting),
                              self.block_manager.num_used_blocks, self.block_manager.num_blocks)

    def take_step_stats(self) -> list[StepStats]:
        """Stats of the steps since the last call, oldest first (for exporters)."""
        return self.step_stats.take()

    # -- the step ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> propose -> score -> verify -> update (see the module docstring)."""
        self.step_stats.begin()
        launched, self._in_flight = self._in_flight, None
        try:
            if launched is None:
                batch, requests = self._schedule()
                self._propose(batch)
                launched = self._launch(batch, requests)
            if self.async_scheduling and launched.batch:
                self._in_flight = self._launch_ahead(launched)
                self.step_stats.current.scheduled_ahead = self._in_flight is not None
            return self._update(launched, self._collect(launched))
        except BaseException:
            self._in_flight = self._next_proposal = None  # the loop fails (aborts) every live request
            raise

    def _launch_ahead(self, previous: LaunchedStep) -> LaunchedStep | None:
        """Schedules and launches the next step, continuing from previous's result on the device, with drafts from
        the proposal asked when previous was launched (collected without waiting); first, on the contexts known
        now, asks for the step after the one launched here."""
        asked = self._take_proposal(previous)
        proposals = self._collect_ahead(asked.pending if asked is not None else None)
        upcoming = self._ask_ahead(previous)  # after the collection: asking reads (and drops) replies in hand
        batch, requests = self._schedule(previous.batch)
        if not batch:
            return None
        if previous.verification is not None:
            continue_from(batch, previous.batch, previous.verification)
        if proposals:
            with self._lock:
                slots = {request.request_id: request.num_draft_slots for request in requests}
                known = {r.request_id: (r.token_ids, r.num_tokens - r.num_pending_tokens) for r in requests}
                proposals = continuations_after_known(proposals, asked.context_lens, known)
                self.scheduler.add_drafts(batch, guessed_drafts(batch, previous.batch, proposals, slots))
        launched = self._launch(batch, requests)
        self._next_proposal = (launched, upcoming)
        return launched

    def _launch(self, batch: ScheduledBatch, requests: list[Request]) -> LaunchedStep:
        verification = self._score_greedy(batch, requests)
        if verification is None:
            verification = self._verify(batch, requests, self._score(batch))
        return LaunchedStep(batch, verification)

    @timed_stage("schedule")
    def _schedule(self, in_flight: ScheduledBatch | None = None) -> tuple[ScheduledBatch, list[Request]]:
        """This step's batch; with in_flight (a launched step without drafts), the one after it."""
        with self._lock:
            preemptions_before, skips_before = self.scheduler.num_preemptions, self._num_draft_skips()
            if in_flight is None:
                batch = self.scheduler.schedule()
            else:
                batch = self.scheduler.schedule_ahead(in_flight)
            self.step_stats.current.num_preemptions += self.scheduler.num_preemptions - preemptions_before
            self.step_stats.current.num_draft_skips += self._num_draft_skips() - skips_before
            return batch, [self.scheduler.requests[s.request_id] for s in batch.requests]

    def _num_draft_skips(self) -> int:
        policy = self.scheduler.draft_policy
        return policy.num_skipped if policy is not None else 0

    def _propose(self, batch: ScheduledBatch) -> None:
        with self._lock:
            wanted = self.scheduler.draft_requests(batch) if self.proposer is not None else []
        drafts = self._ask_and_wait(wanted)  # every step times its propose stage
        with self._lock:
            self.scheduler.add_drafts(batch, drafts)

    def _ask_ahead(self, in_flight: LaunchedStep) -> AskedAhead | None:
        """Asks for proposals on the contexts known now, covering what in_flight and the step launched behind it
        emit and the drafts of the step after those (Scheduler.lookahead_requests); None without a proposer or
        anything to ask."""
        if self.proposer is None:
            return None
        with self._lock:
            wanted = self.scheduler.lookahead_requests(in_flight.batch)
        if not wanted:
            return None
        pending = self._ask(wanted)
        return AskedAhead(pending, {r.request_id: len(r.token_ids) for r in wanted}) if pending else None

    def _take_proposal(self, in_flight: LaunchedStep) -> AskedAhead | None:
        """The proposal asked when in_flight was launched, for the step after it, if any."""
        asked, self._next_proposal = self._next_proposal, None
        return asked[1] if asked is not None and asked[0] is in_flight else None

    def _ask(self, wanted: list[DraftRequest]) -> PendingProposal | None:
        try:
            return begin(self.proposer, wanted)
        except Exception:  # noqa: BLE001 - a broken proposer costs speed, never a request
            logger.exception("proposer failed; decoding this step without drafts")
            self.step_stats.current.num_proposer_failures += 1
            return None

    @timed_stage("propose")
    def _ask_and_wait(self, wanted: list[DraftRequest]) -> dict[str, list[int]]:
        """A step scheduled after the one before was verified: its drafts, asked now and waited for (the propose
        stage: all the time the step spent on its drafts, a proposer that drafts as it is asked included)."""
        return self._answer(self._ask(wanted) if wanted else None)

    @timed_stage("propose")
    def _collect_ahead(self, pending: PendingProposal | None) -> dict[str, list[int]]:
        """A proposal asked a step earlier: what has come of it, without waiting (the propose stage: the time the
        step spent collecting it)."""
        return self._answer(pending, wait=False)

    def _answer(self, pending: PendingProposal | None, wait: bool = True) -> dict[str, list[int]]:
        """A proposal's drafts, waiting for them up to the proposer's deadline unless `wait` is False."""
        if pending is None:
            return {}
        try:
            return pending.result(wait=wait)
        except Exception:  # noqa: BLE001 - a broken proposer costs speed, never a request
            logger.exception("proposer failed; decoding this step without drafts")
            self.step_stats.current.num_proposer_failures += 1
            return {}

    @timed_stage("score")
    def _score(self, batch: ScheduledBatch) -> torch.Tensor | None:
        """Launches the forward (on CUDA the host returns before the device is done)."""
        if not batch:
            return None
        logits = self.runner.execute(batch)
        self._count_forward(batch, getattr(self.runner, "last_forward_path", "eager"))
        return logits

    @timed_stage("score")
    def _score_greedy(self, batch: ScheduledBatch, requests: list[Request]) -> PendingVerification | None:
        """Launches a greedy step that the runner verifies itself (a CUDA graph with its verdict inside);
        None where it cannot (then the forward's logits go through the rejection sampler). The graph judges
        the raw logits and returns only the tokens, so a request with penalties or a logit bias, or one that
        wants logprobs, takes the rejection sampler's path."""
        execute_greedy = getattr(self.runner, "execute_greedy", None)
        if execute_greedy is None or not batch or not all(r.params.greedy and not r.params.adjusts_logits
                                                          and r.params.logprobs is None
                                                          for r in requests):
            return None
        verdict = execute_greedy(batch)
        if verdict is None:
            return None
        self._count_forward(batch, "graph")  # a verdict comes only from a graph
        rows, continuation = verdict
        return PendingVerification(rows, list(range(len(requests))), len(requests), continuation)

    def _count_forward(self, batch: ScheduledBatch, path: str) -> None:
        """path: graph (a decode / verify step's CUDA graph), piecewise (engine/piecewise_graphs.py) or eager."""
        step, num_tokens = self.step_stats.current, batch.num_tokens
        step.forward_tokens.append(num_tokens)
        if path == "graph":  # a decode / verify step's graph: no prompt chunk, and no count on the hot path
            step.num_graph_replays += 1
            return
        step.num_prompt_tokens += num_tokens - sum(1 + r.num_draft_tokens for r in batch.requests)
        step.num_piecewise_replays += path == "piecewise"

    @timed_stage("verify")
    def _verify(self, batch: ScheduledBatch, requests: list[Request],
                logits: torch.Tensor | None) -> PendingVerification | None:  # logits: [batch.num_logits, vocab]
        """Launches rejection sampling for the whole batch."""
        if logits is None or batch.num_logits == 0:
            return None
        return verify_async(logits, SamplingMetadata.build(batch, requests, logits.device))

    @timed_stage("verify")
    def _collect(self, launched: LaunchedStep) -> VerifiedTokens:
        """Waits for a launched step's tokens: the step's one device-to-host copy."""
        if launched.verification is None:
            return VerifiedTokens([[] for _ in launched.batch.requests], [0] * len(launched.batch.requests))
        return launched.verification.result()

    @timed_stage("update")
    def _update(self, launched: LaunchedStep, verified: VerifiedTokens) -> list[RequestOutput]:
        batch = launched.batch
        with self._lock:
            outputs = self.scheduler.update(batch, verified)
            if self._in_flight is not None and launched.verification is not None:
                self._resolve_in_flight(launched.verification.batch_indices, verified)
            outputs = self._aborted + outputs
            self._aborted = []
            released, self._released = self._released + [o.request_id for o in outputs if o.finished], []
            self._record(batch, verified, outputs)
        if released and self.proposer is not None:
            self.proposer.release(released)
        self.step_stats.end()
        policy = self.scheduler.draft_policy
        if policy is not None and policy.learns:  # the step's cost and its drafts' fate, for later draft caps
            with self._lock:
                policy.observe(batch, verified.num_accepted, self.step_stats.current.seconds)
        return outputs

    def _resolve_in_flight(self, batch_indices: list[int], verified: VerifiedTokens) -> None:
        """The step launched ahead continues from this one: give its entries their real token and start."""
        for scheduled in self._in_flight.batch.requests:
            if scheduled.previous_token_row >= 0:
                index = batch_indices[scheduled.previous_token_row]
                scheduled.resolve_previous(verified.token_ids[index][-1], verified.num_accepted[index])

    def _record(self, batch: ScheduledBatch, verified: VerifiedTokens, outputs: list[RequestOutput]) -> None:
        step = self.step_stats.current
        step.num_output_tokens = sum(len(o.new_token_ids) for o in outputs)
        step.spec_decoding = count_spec_decoding([s.num_draft_tokens for s in batch.requests],
                                                 verified.num_accepted, [len(t) for t in verified.token_ids])
        step.num_running, step.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)

    # -- validation -------------------------------------------------------------------------------

    def _checked_prompt(self, prompt_token_ids: Sequence[int]) -> list[int]:
        prompt = list(prompt_token_ids)
        if not prompt:
            raise InvalidParameter("prompt_token_ids", "must not be empty")
        if len(prompt) >= self.max_model_len:
            raise InvalidParameter("prompt_token_ids", f"{len(prompt)} tokens leave no room for output "
                                   f"within max_model_len {self.max_model_len}")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt):
            raise InvalidParameter("prompt_token_ids", f"every id must be an int in [0, {self.vocab_size})")
        return prompt


def build_draft_policy(config: EngineConfig) -> DraftPolicy | None:
    """The drafting policy the config asks for (None: every decoding request drafts every step)."""
    if not config.adaptive_drafting:
        return None
    return DraftPolicy(DraftPolicyConfig(max_batch_size=config.max_draft_batch_size, goodput=config.draft_goodput))


def _build_model_runner(config: EngineConfig, drafts: bool):
    from verifier_service.runners import build_model_runner  # above the engine: it may start tensor-parallel ranks

    return build_model_runner(config, drafts)
