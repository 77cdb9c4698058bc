"""Continuous batching with chunked prefill, draft slots, prefix caching and preemption.

A pair of calls, as in vLLM V1: schedule() picks this step's tokens, update() applies what the
verifier accepted. Each running request feeds tokens[num_computed:] (a prompt chunk, or just its last
sampled token) and, when decoding, up to k draft slots whose KV blocks are reserved here before the
proposer runs; add_drafts() then puts the actual drafts (maybe fewer) into the batch.

Async scheduling: schedule_ahead(in_flight) plans the next step while `in_flight` still runs. Each request
of it that gets logits will emit between 1 and d + 1 tokens (d = its drafts in flight), so it is advanced
now by one placeholder (request.PENDING_TOKEN) for the last of them, at the position it has if no draft is
accepted; the device adds the accepted count to the positions (previous_tokens.py), and update() later puts
the real tokens in place. Its KV blocks are reserved for the worst case (all d accepted), its draft slots
capped so that max_tokens and max_model_len hold in that case, and a request that may reach its length
limit within the step in flight is not scheduled ahead. A step scheduled ahead preempts nobody (a preempted
request would lose its tokens in flight). A request stopped by a stop token in update() may already be in
the step scheduled ahead: that step's result for it is dropped (work wasted, output exact).

Draft slots: every decoding request gets min(its k, max_speculative_tokens, the draft policy's cap for the
step's batch size: none above 32 running requests, or what pays in measured goodput, draft_policy.py) slots; the proposer fills as many as its
evidence supports.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.block_manager import BlockManager
from verifier_service.engine.draft_policy import DraftPolicy
from verifier_service.engine.outputs import FinishReason, RequestOutput, TokenLogprobs
from verifier_service.engine.proposer import DraftRequest
from verifier_service.engine.request import Request, RequestStatus

if TYPE_CHECKING:
    from verifier_service.engine.rejection_sampler import VerifiedTokens


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, num_speculative_tokens: int, vocab_size: int,
                 draft_policy: DraftPolicy | None = None, max_speculative_tokens: int | None = None) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.num_speculative_tokens = num_speculative_tokens  # k of requests that do not ask for one
        # The most draft slots a request gets (larger asks are clamped; 0 turns speculation off).
        self.max_speculative_tokens = (num_speculative_tokens if max_speculative_tokens is None
                                       else max_speculative_tokens)
        self.vocab_size = vocab_size
        self.draft_policy = draft_policy  # None: every decoding request may draft in every step
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()  # FCFS; preempted requests go back to the front
        self.running: list[Request] = []  # oldest first, so the newest is preempted first
        self.num_preemptions = 0  # since start (stats read the difference per step)

    def add(self, request: Request) -> None:
        k = request.params.num_speculative_tokens
        request.num_speculative_tokens = min(self.num_speculative_tokens if k is None else k,
                                             self.max_speculative_tokens)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Finish a request now and free its blocks at once; None if it is unknown or finished."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
            self.block_manager.free(request.block_table)
        request.status, request.finish_reason = RequestStatus.FINISHED, FinishReason.ABORT
        return request

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- schedule ---------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        """This step's tokens for running requests first (oldest first), then newly admitted ones."""
        return self._schedule(ahead=False)

    def schedule_ahead(self, in_flight: ScheduledBatch) -> ScheduledBatch:
        """The next step's batch while in_flight runs; see the module docstring."""
        for scheduled in in_flight.requests:
            request = self.requests.get(scheduled.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted while it ran
            request.num_computed_tokens = scheduled.context_len - scheduled.num_draft_tokens
            if scheduled.num_logits:
                request.append_pending_token(scheduled.token_ids[scheduled.num_tokens - scheduled.num_draft_tokens:])
        return self._schedule(ahead=True)

    def lookahead_requests(self, in_flight: ScheduledBatch) -> list[DraftRequest]:
        """What to ask the proposer before scheduling ahead of in_flight (draft_lookahead.py): for each of its
        requests that emits tokens and may draft, the context known now and (d + 1) + (k + 1) + k tokens, enough
        to guess what in_flight emits (d = its drafts there), what the step scheduled behind it emits (k drafts at
        most), and the k drafts of the step after those, whose launch collects the answer."""
        if self.draft_policy is not None and not self.draft_policy.batch_allows_drafts(len(self.running)):
            return []
        wanted = []
        cap = self._draft_cap
        for scheduled in in_flight.requests:
            request = self.requests.get(scheduled.request_id)
            if request is None or request.status != RequestStatus.RUNNING or not scheduled.num_logits:
                continue
            k = min(self._max_drafts(request, extra=scheduled.num_draft_tokens + 1),
                    cap(request.num_speculative_tokens, count=False))
            if k > 0:
                params = request.params
                wanted.append(DraftRequest(request.request_id, request.token_ids,
                                           scheduled.num_draft_tokens + 1 + 2 * k + 1,
                                           params.min_ngram, params.max_ngram, params.tenant_key))
        return wanted

    def _schedule(self, ahead: bool) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if ahead and self._may_end_in_flight(request):
                index += 1  # the step in flight may finish it: wait for its tokens
                continue
            num_tokens, num_slots = self._plan(request, request.num_computed_tokens, budget)
            # Reserve for the worst case: the step in flight accepts all its drafts (0 when none is in flight).
            if self._grow(request, num_tokens + num_slots + request.num_pending_drafts):
                scheduled.append(self._scheduled(request, num_tokens, num_slots))
                budget -= num_tokens + num_slots
                index += 1
                continue
            if ahead:
                return ScheduledBatch(scheduled)  # out of blocks: the synchronous step after this one preempts
            victim = self.running.pop()  # out of blocks: recompute the newest request later
            self._preempt(victim)
            preempted = True
            if victim is request:
                break
        if not preempted:  # admitting while preempting would only thrash
            scheduled += self._admit(budget)
        return ScheduledBatch(scheduled)

    def _may_end_in_flight(self, request: Request) -> bool:
        """The tokens in flight may reach max_tokens or max_model_len (a stop token is only known later)."""
        return request.num_pending_tokens > 0 and self._at_length_limit(request, extra=request.num_pending_drafts)

    def _at_length_limit(self, request: Request, extra: int = 0) -> bool:
        """Whether the request has (with `extra` more tokens would have) reached max_tokens or max_model_len."""
        return (request.num_output_tokens + extra >= request.params.max_tokens
                or request.num_tokens + extra >= self.max_model_len)

    def _admit(self, budget: int) -> list[ScheduledRequest]:
        scheduled = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            # Leave at least the last token to compute: its logits choose the next token.
            cached = self.block_manager.find_cached_prefix(request.token_ids[:-1])
            num_cached_tokens = len(cached) * self.block_manager.block_size
            num_tokens, num_slots = self._plan(request, num_cached_tokens, budget)
            num_new_blocks = self.block_manager.blocks_needed(
                num_cached_tokens + num_tokens + num_slots) - len(cached)
            num_revived = sum(1 for b in cached if self.block_manager.blocks[b].ref_count == 0)
            if not self.block_manager.can_allocate(num_new_blocks + num_revived):
                break  # FCFS: nobody overtakes the oldest waiting request
            self.waiting.popleft()
            self.block_manager.share(cached)
            request.block_table = cached + self.block_manager.allocate(num_new_blocks)
            request.num_hashed_blocks = len(cached)
            request.num_computed_tokens = num_cached_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(self._scheduled(request, num_tokens, num_slots))
            budget -= num_tokens + num_slots
        return scheduled

    def _plan(self, request: Request, num_computed: int, budget: int) -> tuple[int, int]:
        """(tokens to feed, draft slots): a prompt chunk, or the last token plus up to k drafts."""
        num_remaining = request.num_tokens - num_computed
        num_tokens = min(num_remaining, budget)
        if num_remaining > 1:
            return num_tokens, 0
        cap = self._draft_cap(request.num_speculative_tokens)
        if cap <= 0:
            return num_tokens, 0  # the policy first: a large batch (the common case) needs no per-request caps
        max_drafts = min(cap, self._max_drafts(request, extra=request.num_pending_drafts))
        return num_tokens, max(0, min(max_drafts, budget - 1))

    def _draft_cap(self, k: int, count: bool = True) -> int:
        """The drafts the policy lets a request asking k have in a step of the running batch (draft_policy.py);
        with `count`, a request held back counts in the policy's num_skipped."""
        if k <= 0 or self.draft_policy is None:
            return k
        if count:
            return self.draft_policy.allowed_drafts(len(self.running), k)
        return self.draft_policy.cap(len(self.running), k)

    def _max_drafts(self, request: Request, extra: int = 0) -> int:
        """k, capped so that max_tokens and max_model_len are never exceeded (k drafts emit k + 1), even if
        `extra` more tokens come first (those a step in flight may emit beyond its placeholder)."""
        k = request.num_speculative_tokens
        if k <= 0:
            return 0
        return min(k, request.params.max_tokens - request.num_output_tokens - extra - 1,
                   self.max_model_len - request.num_tokens - extra - 1)

    def _grow(self, request: Request, num_new_slots: int) -> bool:
        """Make the block table cover num_new_slots more positions; False if blocks ran out."""
        needed = self.block_manager.blocks_needed(request.num_computed_tokens + num_new_slots)
        missing = needed - len(request.block_table)
        if missing <= 0:
            return True
        if not self.block_manager.can_allocate(missing):
            return False
        request.block_table += self.block_manager.allocate(missing)
        return True

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request.block_table)
        request.reset_for_recompute()
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _scheduled(self, request: Request, num_tokens: int, num_slots: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        request.num_draft_slots = num_slots
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=request.token_ids[start:start + num_tokens],
            start_position=start,
            block_table=list(request.block_table),
            num_draft_tokens=0,
            num_logits=1 if start + num_tokens == request.num_tokens else 0,
        )

    # -- drafts -----------------------------------------------------------------------------------

    def draft_requests(self, batch: ScheduledBatch) -> list[DraftRequest]:
        """What to ask the proposer for: requests of this batch that have draft slots."""
        wanted = []
        for scheduled in batch.requests:
            request = self.requests.get(scheduled.request_id)
            if request is not None and request.num_draft_slots:  # None: aborted since it was scheduled
                params = request.params
                wanted.append(DraftRequest(request.request_id, request.token_ids, request.num_draft_slots,
                                           params.min_ngram, params.max_ngram, params.tenant_key))
        return wanted

    def add_drafts(self, batch: ScheduledBatch, drafts: Mapping[str, Sequence[int]]) -> None:
        """Append each request's drafts (at most its reserved slots; cut at an id outside the vocabulary)."""
        if not drafts:
            return  # no request drafted (the usual large-batch step): nothing to append
        for scheduled in batch.requests:
            draft = drafts.get(scheduled.request_id)
            if not draft:
                continue
            request = self.requests.get(scheduled.request_id)
            draft = list(draft)[:request.num_draft_slots if request else 0]
            valid = next((i for i, t in enumerate(draft) if not 0 <= t < self.vocab_size), len(draft))
            scheduled.token_ids = scheduled.token_ids + draft[:valid]
            scheduled.num_draft_tokens = valid
            scheduled.num_logits += valid

    # -- update -----------------------------------------------------------------------------------

    def update(self, batch: ScheduledBatch, verified: VerifiedTokens) -> list[RequestOutput]:
        """Advance each request by what was computed and accepted; finish those that stop."""
        outputs = []
        for index, scheduled in enumerate(batch.requests):
            request = self.requests.get(scheduled.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            num_accepted = verified.num_accepted[index]
            request.num_computed_tokens = (scheduled.start_position + scheduled.num_tokens
                                           - scheduled.num_draft_tokens + num_accepted)
            if scheduled.num_logits:
                logprobs = verified.logprobs[index] if verified.logprobs is not None else None
                outputs.append(self._emit(request, scheduled, verified.token_ids[index], num_accepted, logprobs))
            self._cache_blocks(request)
            if request.is_finished:
                self._finish(request)
        return outputs

    def _emit(self, request: Request, scheduled: ScheduledRequest, token_ids: list[int],
              num_accepted: int, logprobs: list[TokenLogprobs] | None = None) -> RequestOutput:
        params = request.params
        if request.num_pending_tokens:  # advanced by schedule_ahead: the real token replaces the placeholder
            request.drop_pending_token()
        token_ids = token_ids[:min(params.max_tokens - request.num_output_tokens,
                                   self.max_model_len - request.num_tokens)]
        stop_at = None
        if request.stop_token_ids:  # most requests have none (ignore_eos) or stop on EOS: skip the scan
            stop_at = next((i for i, t in enumerate(token_ids) if t in request.stop_token_ids), None)
        if stop_at is not None:
            token_ids = token_ids[:stop_at + 1]  # the stop token is output, nothing after it
        request.append_output(token_ids)
        if stop_at is not None:
            request.finish_reason = FinishReason.STOP
        elif self._at_length_limit(request):
            request.finish_reason = FinishReason.LENGTH
        request.num_draft_tokens += scheduled.num_draft_tokens
        request.num_accepted_tokens += min(num_accepted, len(token_ids))
        request.num_steps += 1
        if request.finish_reason is not None:
            request.status = RequestStatus.FINISHED
        if logprobs is not None:  # cut where the tokens were (max_tokens, stop token)
            logprobs = logprobs[:len(token_ids)]
        return RequestOutput(request.request_id, token_ids, request.finish_reason, request.usage(), logprobs,
                             request.seed)

    def _cache_blocks(self, request: Request) -> None:
        if (not self.block_manager.enable_prefix_caching
                or request.num_computed_tokens // self.block_manager.block_size <= request.num_hashed_blocks):
            return  # nothing to hash: skip copying the token list (O(context) per step when caching is off)
        computed = request.token_ids[:request.num_computed_tokens]
        request.num_hashed_blocks = self.block_manager.cache_full_blocks(
            request.block_table, computed, request.num_hashed_blocks)

    def _finish(self, request: Request) -> None:
        self.running.remove(request)
        del self.requests[request.request_id]
        self.block_manager.free(request.block_table)
