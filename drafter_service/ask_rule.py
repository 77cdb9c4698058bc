"""Which steps the drafter link asks the drafter service: a request's first step, every step of a request whose
service drafts lately predicted it better than the link's own, and one step in `probe_steps` otherwise
(SPECD_DRAFTER_PROBE_STEPS: 1, the default, asks every step; 8 is the rule this file was written for, experimental
until it is measured on a GPU, docs/BENCHMARKS.md round 47).

Asking costs the host about 1 ms of CPU a step, in the link process and the drafter together, where the link's own
drafts cost 0.1-0.2 ms (tools/link_rhythm.py on the 2-core machine, docs/BENCHMARKS.md rounds 46-47); on a GPU host
that CPU is spent beside the engine thread while it launches the step. For most traffic the service answers what the
link already drafted: its rule over the same context is the link's, and only its memory of earlier outputs (or a
drafting rule configured otherwise) adds drafts of its own. So the service is asked where it has shown it adds:
- a request's first step, whether or not it wants drafts: the service takes what it holds of a context at first
  sight for its prompt, and remembers the rest at release as its output (the asker sends such a step even once a
  newer one is asked);
- a request's steps until the service has answered one of them, since a repeated prompt's output is in the memory
  from its first token on;
- every step of a request whose service drafts matched more of the tokens it went on with than the own ones did,
  until PATIENCE of its asks in a row had service drafts that went wrong no later than the own ones (a tie where
  both matched all they drafted counts for neither);
- once the service has gained for any request, every step of a request whose own drafts fall short of its draft
  limit (a repeated output's earlier copy is told apart from others only some tokens in, and where the own rule runs
  out the service's memory may go on: on the 2-core machine a second pass over the same prompts made 3.20 tokens a
  step with probes alone, 3.55 asking where the own rule drafted nothing, 3.99 where it drafted short of the limit,
  against 4.09 asking every step; a step is asked for all its requests, so with a memory that helps, a batch of 16
  has one short somewhere nearly every step and the rule saves little there);
- one step in `probe_steps` otherwise, which finds a memory that starts to help and keeps the service's copies of the
  contexts at most that many steps behind (a released request's last tokens go to the service before its release,
  drafter_service/client.py, so the memory keeps its output whole).
A step not asked is answered by the own drafts alone, at once and finally.

The asked step's two answers are judged against the tokens the request went on with as soon as that shows which
matched more of them.
"""
from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass

from drafter_service.batch import DraftRequest

PROBE_STEPS = 8  # the experimental setting: a memory that starts to help is found up to this many steps late
PATIENCE = 8  # asks in a row whose service drafts went wrong, gaining nothing, before its steps are not all asked


@dataclass(slots=True)
class _Asked:
    """A request's drafts at an asked step, to be judged against the tokens it went on with."""

    step_id: int
    context_len: int
    own: list[int]
    service: list[int] | None = None  # None until the service's answer to the step is heard


class AskRule:
    """The link process's: its main thread asks should_ask / asked / release, its asker thread tells heard."""

    def __init__(self, probe_steps: int, patience: int = PATIENCE) -> None:
        self.probe_steps, self.patience = probe_steps, patience
        self._judging = probe_steps > 1  # with 1 every step that wants drafts is asked: nothing to judge
        self._asked: dict[str, _Asked] = {}  # per request: its drafts at an asked step, not judged yet
        self._seen: set[str] = set()  # requests the service has answered for at least once
        self._sighted: set[str] = set()  # requests in a step asked (the asker sends every step that brings one)
        self._gaining: dict[str, int] = {}  # requests whose service drafts gained: asks left whose drafts may go wrong
        self._since_ask = 0
        self._service_gained = False  # whether the service's drafts ever gained (its memory helps this traffic)
        self._heard: queue.SimpleQueue[tuple[int, dict[str, list[int]] | None]] = queue.SimpleQueue()

    def heard(self, step_id: int, differences: dict[str, list[int]] | None) -> None:
        """The asker's thread: the service's answer to a step (the entries where it differs from the own drafts), or
        None where it missed the step."""
        if self._judging:
            self._heard.put((step_id, differences))

    def should_ask(self, requests: Sequence[DraftRequest], own: dict[str, list[int]]) -> bool:
        """Whether the service is asked this step, given the own drafts for it."""
        if not self._judging:  # every step that wants drafts or brings the service a request it has not seen
            return any(r.draft_limit > 0 or r.request_id not in self._sighted for r in requests)
        self._take_answers()
        self._judge(requests)
        self._since_ask += 1
        wanted = [r.request_id for r in requests if r.draft_limit > 0]
        ask = (any(r.request_id not in self._sighted for r in requests)
               or any(i not in self._seen or i in self._gaining for i in wanted)
               or (self._service_gained and any(len(own.get(r.request_id, ())) < r.draft_limit for r in requests))
               or (bool(wanted) and self._since_ask >= self.probe_steps))
        if ask:
            self._since_ask = 0
        return ask

    def asked(self, step_id: int, requests: Sequence[DraftRequest], own: dict[str, list[int]]) -> bool:
        """Keeps an asked step's own drafts to judge the service's against (a drafts pair already answered stays
        until it is judged); returns whether the step brings the service a request it has not seen, which the asker
        must send even once a newer step is asked."""
        brings_new = False
        for r in requests:
            if r.request_id not in self._sighted:
                self._sighted.add(r.request_id)
                brings_new = True
            if self._judging and r.draft_limit > 0:
                kept = self._asked.get(r.request_id)
                if kept is None or kept.service is None:
                    self._asked[r.request_id] = _Asked(step_id, len(r.token_ids), own.get(r.request_id, []))
        return brings_new

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._asked.pop(request_id, None)
            self._seen.discard(request_id)
            self._sighted.discard(request_id)
            self._gaining.pop(request_id, None)

    def _take_answers(self) -> None:
        while True:
            try:
                step_id, differences = self._heard.get_nowait()
            except queue.Empty:
                return
            if differences is None:  # missed: the pair is replaced at the next ask
                continue
            for request_id, kept in self._asked.items():
                if kept.step_id == step_id and kept.service is None:
                    kept.service = differences.get(request_id, kept.own)
                    self._seen.add(request_id)

    def _judge(self, requests: Sequence[DraftRequest]) -> None:
        for r in requests:
            kept = self._asked.get(r.request_id)
            if kept is None or kept.service is None:
                continue
            if len(r.token_ids) < kept.context_len:  # the context was rewritten
                del self._asked[r.request_id]
                continue
            went_on = r.token_ids[kept.context_len:]
            own, service = matched(kept.own, went_on), matched(kept.service, went_on)
            # A count is known once its drafts stopped matching or ran out
            own_known = own < len(went_on) or own == len(kept.own)
            service_known = service < len(went_on) or service == len(kept.service)
            gained = own_known and service > own
            if not gained and not (own_known and service_known):
                continue  # not yet known
            del self._asked[r.request_id]
            if gained:
                self._gaining[r.request_id] = self.patience
                self._service_gained = True
            elif service < len(kept.service) and r.request_id in self._gaining:  # its drafts went wrong, no later
                self._gaining[r.request_id] -= 1
                if not self._gaining[r.request_id]:
                    del self._gaining[r.request_id]


def matched(drafts: list[int], went_on: Sequence[int]) -> int:
    """How many of `drafts` the tokens a request went on with match, from the start."""
    count = 0
    for draft, token in zip(drafts, went_on):
        if draft != token:
            break
        count += 1
    return count
