"""One request's state inside the engine."""
from __future__ import annotations

import secrets
from collections.abc import Sequence
from enum import Enum

from specd.sampling import SamplingParams
from verifier_service.engine.outputs import FinishReason, RequestUsage


PENDING_TOKEN = 0  # stands for a token sampled on the device but not yet seen by the host (a valid id)


class RequestStatus(str, Enum):
    WAITING = "waiting"  # not admitted yet, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds KV blocks and takes part in steps
    FINISHED = "finished"


class Request:
    """Prompt, generated tokens and how much of them the KV cache holds.

    The sequence is prompt_token_ids + output_token_ids. The first num_computed_tokens of it have their
    KV in the cache; the rest (a prompt not yet prefilled, or just the last sampled token) is fed next.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_index: int) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.token_ids = list(prompt_token_ids)  # prompt + output, kept in step with output_token_ids
        self.params = params
        self.arrival_index = arrival_index  # FCFS order
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0  # leading blocks registered in the prefix cache
        self.num_draft_slots = 0  # KV slots reserved for drafts in the current step
        self.num_pending_tokens = 0  # trailing outputs that are placeholders for tokens still on the device
        self.pending_draft_ids: list[int] = []  # drafts in flight: the step on the device emits a prefix of them
        self.num_speculative_tokens = 0  # its k, as the scheduler clamped it (Scheduler.add)
        self.stop_token_ids = frozenset() if params.ignore_eos else frozenset(params.stop_token_ids)
        self.seed = sampling_seed(params)
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_steps = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.token_ids.extend(token_ids)

    @property
    def num_pending_drafts(self) -> int:
        """The step on the device may emit this many more tokens than its placeholder stands for."""
        return len(self.pending_draft_ids)

    def append_pending_token(self, draft_ids: Sequence[int] = ()) -> None:
        """A placeholder for the last token of a step still on the device (async scheduling), which scored
        draft_ids for this request: it emits a prefix of them and then one token, which this placeholder stands
        for (at the position it has if none of the drafts is accepted)."""
        self.append_output([PENDING_TOKEN])
        self.num_pending_tokens += 1
        self.pending_draft_ids = list(draft_ids)

    def drop_pending_token(self) -> None:
        """Takes the placeholder back before the real tokens are appended."""
        self.output_token_ids.pop()
        self.token_ids.pop()
        self.num_pending_tokens -= 1
        self.pending_draft_ids = []

    def reset_for_recompute(self) -> None:
        """After preemption: the KV cache holds nothing; prompt + output are prefilled again later."""
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table = []
        self.num_hashed_blocks = 0
        self.num_draft_slots = 0

    def usage(self) -> RequestUsage:
        return RequestUsage(
            prompt_tokens=len(self.prompt_token_ids),
            completion_tokens=len(self.output_token_ids) - self.num_pending_tokens,  # placeholders are not output
            draft_tokens=self.num_draft_tokens,
            accepted_tokens=self.num_accepted_tokens,
            steps=self.num_steps,
            num_speculative_tokens=self.num_speculative_tokens,
        )


def sampling_seed(params: SamplingParams) -> int | None:
    """The seed a request samples with: its own, else a random one drawn at arrival (63 bits, so it fits any
    client's signed 64-bit integer) and reported back, so any sampled output can be reproduced. Greedy
    requests without a seed need none."""
    if params.seed is not None or params.greedy:
        return params.seed
    return secrets.randbits(63)
