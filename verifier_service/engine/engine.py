"""The in-process engine: schedule -> propose -> score -> verify -> update, one forward per step.

Driven from a single thread (the verifier runs it off the asyncio loop). add_request and abort may be
called from other threads: a lock guards the scheduler's state, and is never held during the forward.

Async scheduling (on CUDA by default): the forward and the verification are launched on the device
and their result is copied back only at the end of the step; in between, when the step has no drafts
and the next one will not draft either (no proposer, or more running requests than draft at all), the
next step is scheduled and launched already, feeding it the tokens this step samples straight from the
device (scheduler.schedule_ahead, previous_tokens.py). The host's scheduling, packing and launching
then overlap the device's work instead of leaving it idle. Output is unchanged: the same forwards run
in the same order; a request that a stop token ends has one more token computed and dropped.
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verifier_service.engine.batch import ScheduledBatch
from verifier_service.engine.block_manager import BlockManager
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.draft_policy import DraftPolicy, DraftPolicyConfig
from verifier_service.engine.outputs import EngineLoad, FinishReason, RequestOutput
from verifier_service.engine.proposer import Proposer
from verifier_service.engine.rejection_sampler import PendingVerification, VerifiedTokens, verify_async
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata
from verifier_service.engine.sampling_params import InvalidParameter, SamplingParams
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

    runner: anything with execute(batch) -> logits [batch.num_logits, vocab] float32 and num_blocks,
    block_size, vocab_size, max_model_len, device (a ModelRunner is built from config when None).
    proposer: where drafts come from (None = no speculation).
    """

    def __init__(self, config: EngineConfig, proposer: Proposer | None = None, runner=None) -> None:
        self.config = config
        self.runner = runner if runner is not None else build_model_runner(config)
        self.proposer = proposer
        self.vocab_size = self.runner.vocab_size
        self.device = torch.device(getattr(self.runner, "device", "cpu"))
        self.max_model_len = min(config.max_model_len or self.runner.max_model_len, self.runner.max_model_len,
                                 self.runner.num_blocks * self.runner.block_size)  # a lone request always fits
        self.block_manager = BlockManager(self.runner.num_blocks, self.runner.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=self.max_model_len,
            num_speculative_tokens=config.num_speculative_tokens if proposer is not None else 0,
            vocab_size=self.vocab_size, draft_policy=build_draft_policy(config))
        self.step_stats = StepStatsLog()
        self._lock = threading.Lock()
        self._arrivals = itertools.count()
        self._aborted: list[RequestOutput] = []  # reported by the next step
        self._released: list[str] = []  # to tell the proposer, from the step thread
        auto = self.device.type == "cuda"  # a CPU forward is synchronous: nothing to overlap
        self.async_scheduling = auto if config.async_scheduling is None else config.async_scheduling
        self._in_flight: LaunchedStep | None = None  # the step launched ahead (async scheduling)

    # -- requests ---------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Queue a request; raises InvalidParameter naming the bad field (the engine is left as it was)."""
        prompt = self._checked_prompt(prompt_token_ids)
        if not isinstance(params, SamplingParams):
            raise InvalidParameter("params", "must be a SamplingParams")
        with self._lock:
            if request_id in self.scheduler.requests:
                raise InvalidParameter("request_id", f"{request_id!r} is already running")
            request = Request(request_id, prompt, params, next(self._arrivals), self.device)
            self.scheduler.add(request)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its KV blocks now; the next step reports it with finish_reason abort."""
        with self._lock:
            request = self.scheduler.abort(request_id)
            if request is None:
                return False
            self._aborted.append(RequestOutput(request_id, [], FinishReason.ABORT, request.usage()))
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
            if self._may_schedule_ahead(launched):
                self._in_flight = self._launch_ahead(launched)
                self.step_stats.current.scheduled_ahead = self._in_flight is not None
            return self._update(launched.batch, self._collect(launched))
        except BaseException:
            self._in_flight = None  # the loop fails (aborts) every live request after a failed step
            raise

    def _may_schedule_ahead(self, launched: LaunchedStep) -> bool:
        """Whether the next step can run without this one's tokens on the host (no drafts either side)."""
        if not self.async_scheduling or not launched.batch:
            return False
        if launched.verification is not None and launched.verification.metadata.has_drafts:
            return False  # how many tokens it emits is known only after verification
        with self._lock:
            return self.proposer is None or not self.scheduler.may_draft()

    def _launch_ahead(self, previous: LaunchedStep) -> LaunchedStep | None:
        """Schedules and launches the next step, fed previous's sampled tokens on the device."""
        batch, requests = self._schedule(previous.batch)
        if not batch:
            return None
        if previous.verification is not None:
            indices = previous.verification.metadata.batch_indices
            rows = {previous.batch.requests[index].request_id: row for row, index in enumerate(indices)}
            for scheduled in batch.requests:  # a request that got a token last step feeds it first now
                scheduled.previous_token_row = rows.get(scheduled.request_id, -1)
            batch.previous_tokens = previous.verification.first_tokens
        return self._launch(batch, requests)

    def _launch(self, batch: ScheduledBatch, requests: list[Request]) -> LaunchedStep:
        return LaunchedStep(batch, self._verify(batch, requests, self._score(batch)))

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

    @timed_stage("propose")
    def _propose(self, batch: ScheduledBatch) -> None:
        with self._lock:
            wanted = self.scheduler.draft_requests(batch) if self.proposer is not None else []
        drafts = {}
        if wanted:
            try:
                drafts = self.proposer.propose(wanted)
            except Exception:  # noqa: BLE001 - a broken proposer costs speed, never a request
                logger.exception("proposer failed; decoding this step without drafts")
                self.step_stats.current.num_proposer_failures += 1
        with self._lock:
            self.scheduler.add_drafts(batch, drafts)

    @timed_stage("score")
    def _score(self, batch: ScheduledBatch) -> torch.Tensor | None:
        """Launches the forward (on CUDA the host returns before the device is done)."""
        self.step_stats.current.forward_tokens.append(batch.num_tokens)
        return self.runner.execute(batch) if batch else None

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
    def _update(self, batch: ScheduledBatch, verified: VerifiedTokens) -> list[RequestOutput]:
        with self._lock:
            outputs = self.scheduler.update(batch, verified)
            outputs = self._aborted + outputs
            self._aborted = []
            released, self._released = self._released + [o.request_id for o in outputs if o.finished], []
            self._record(batch, verified, outputs)
        if released and self.proposer is not None:
            self.proposer.release(released)
        self.step_stats.end()
        return outputs

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
    return DraftPolicy(DraftPolicyConfig(max_batch_size=config.max_draft_batch_size))


def build_model_runner(config: EngineConfig):
    """The real model runner for config (imported here so engine logic loads without a model)."""
    from specd.default_model import resolve_model_path
    from verifier_service.engine.model_runner import ModelRunner

    runner = ModelRunner(resolve_model_path(config.model), device=config.device, dtype=config.dtype,
                         block_size=config.block_size, kv_cache_bytes=config.kv_cache_bytes or None,
                         gpu_memory_utilization=config.kv_cache_memory_fraction,
                         max_model_len=config.max_model_len or None, compile_model=config.compile_model)
    if not config.enforce_eager:  # decode and verify steps replay CUDA graphs (a no-op off CUDA / flash-attn)
        runner.capture_cuda_graphs(config.max_num_seqs, [1, config.num_speculative_tokens + 1])
    return runner
