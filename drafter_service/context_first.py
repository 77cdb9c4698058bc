"""A synchronous engine's proposer (the CPU's): each step drafted at once from the requests' own contexts in this
process, the drafter service asked alongside and waited for only where its memory drafts better.

A synchronous engine waits for a step's drafts before its forward, and the service's round trip costs 1.7-2.6 ms a
step on the 2-core machine (docs/BENCHMARKS.md, rounds 33 and 35). For most traffic the service answers what a
request's own context gives: its rule is the one drafter_service/local.py runs here; only its memory of earlier
outputs, shared by every verifier, adds drafts of its own. So each step's drafts come from the own store at once, and
the service is asked on the same contexts without waiting; its answer is read when the next step asks.

The next step's context also tells how many tokens each draft would have had accepted: the tokens the step emitted
are the accepted drafts and one more. A request whose service drafts would have had more accepted than its own has
its steps wait for the service's answer from then on, until PATIENCE waited steps in a row gain nothing. Once the
service has gained anything (its memory is on), each request's first step waits for it too (a repeated prompt's
output is in the memory from its first token on), and so does every step while the running share of steps in which
its drafts gained, times the step's time, outweighs the wait: a gain found a step late costs about a step. Drafting
from the service's answer to the step before instead (round 33) lost a tenth of the memory's tokens a step: after
each rejected draft that answer no longer fits.

The service is asked on a thread of its own (service_asker.py, the drafter link's): its message built, sent and its
answer read while the engine's forward runs, so that the engine thread's propose stage is its own drafts and a hand-off
(0.07-0.08 against 0.14-0.17 ms a step with the client on the engine thread, docs/BENCHMARKS.md round 40). The service's
answer to a step not waited for counts when it comes within the client's deadline (--drafter-timeout-ms).

Like every proposer it never raises for the service: a dead, late or erroring service leaves the own drafts.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from drafter_service.ask_rule import matched
from drafter_service.batch import DraftRequest
from drafter_service.config import DrafterConfig
from drafter_service.local import LocalProposer
from drafter_service.service_asker import FELL_BACK, ServiceAsker

# Waited steps in a row in which the service's drafts gain nothing over the own ones before a request stops waiting
# for them: a wait costs ~2 ms of a 40-70 ms CPU step, one more accepted token a step's share of it.
PATIENCE = 8
RATE_STEPS = 32  # the steps the running means of the gain rate, the wait and the step time weigh most
ANSWER_SLACK_S = 0.05  # how much longer than the client's deadline a waiting step waits for the asker's answer


@dataclass(slots=True)
class _Drafted:
    """One request's drafts at a step, judged when the next step shows what it emitted."""

    context_len: int
    own: list[int]
    service: list[int] | None  # None: not known (the service missed the step, or its answer is not read yet)
    waited: bool


class ContextFirstProposer:
    """Proposer over `service` (a DrafterClient: propose, release, num_fallbacks, close; from now on used by its asker's
    thread alone) and an own store."""

    def __init__(self, service, own: LocalProposer | None = None) -> None:
        self.service = service
        self.own = own or LocalProposer(DrafterConfig(memory_scope="off"))  # the memory is the service's
        self.num_context_drafts = 0  # steps that waited for the service, missed it and drafted from the own store
        self.service_remembers = False  # whether the service's drafts ever beat the own ones
        self._waiting: dict[str, int] = {}  # requests that wait for the service: waited steps left without a gain
        self._drafted: dict[str, _Drafted] = {}  # each request's drafts at its last step
        self._step_id = 0
        self._unread: tuple[int, list[DraftRequest]] | None = None  # the last step not waited for, the requests wanting
        self._answers: dict[int, dict[str, list[int]] | None] = {}  # the service's, by step (None: it missed it)
        self._answered = threading.Condition()
        # Running means: of judged steps in which the service's drafts would have gained, of a wait for the service's
        # answer, and of the time from one step's propose to the next's.
        self._gain_rate, self._wait_s, self._step_s = 0.0, 0.002, 0.0
        self._last_propose: float | None = None
        self._asker = ServiceAsker(service, self._deliver)

    @property
    def num_fallbacks(self) -> int:
        """Steps the service's answer missed (exported as specd_drafter_fallbacks_total)."""
        return self.service.num_fallbacks

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        now = time.monotonic()
        if self._last_propose is not None:
            self._step_s += (now - self._last_propose - self._step_s) / RATE_STEPS
        self._last_propose = now
        self._read_unread()
        self._judge(requests)
        own = self.own.propose(requests)
        wanted = [r for r in requests if r.draft_limit > 0]
        waited = bool(wanted) and self._worth_waiting(wanted)
        self._step_id += 1
        # The own answer given to the asker is {}: what it hands back (the entries that differ) is all of the service's.
        self._asker.ask(self._step_id, list(requests), {} if wanted else None, [len(r.token_ids) for r in requests])
        service = None
        if waited:
            asked = time.monotonic()
            service = self._answer(self._step_id, wait=True)
            self._wait_s += (time.monotonic() - asked - self._wait_s) / RATE_STEPS
            self.num_context_drafts += service is None
        elif wanted:
            self._unread = (self._step_id, wanted)
        for r in wanted:
            self._drafted[r.request_id] = _Drafted(len(r.token_ids), own.get(r.request_id, []),
                                                   None if service is None else service.get(r.request_id, []), waited)
        return own if service is None else service

    def _worth_waiting(self, wanted: list[DraftRequest]) -> bool:
        if any(r.request_id in self._waiting for r in wanted):
            return True
        return self.service_remembers and (any(r.request_id not in self._drafted for r in wanted)  # first steps
                                           or self._gain_rate * self._step_s > self._wait_s)

    def release(self, request_ids: Sequence[str]) -> None:
        self.own.release(request_ids)
        self._asker.release(list(request_ids))
        for request_id in request_ids:
            self._waiting.pop(request_id, None)
            self._drafted.pop(request_id, None)

    def close(self) -> None:
        """Stops the asker's thread and closes the service's client."""
        self._asker.close()

    def _deliver(self, answer: tuple) -> None:
        """The asker's thread: the service's drafts for a step (all of them: the own answer it was given is {})."""
        step_id, _, drafts = answer
        with self._answered:
            self._answers = {step_id: drafts}  # only the newest step is ever read
            self._answered.notify_all()

    def _answer(self, step_id: int, wait: bool) -> dict[str, list[int]] | None:
        """The service's drafts for step_id; None where it missed the step (without `wait`: has not answered by now)."""
        if wait:
            with self._answered:
                self._answered.wait_for(lambda: step_id in self._answers, self.service.timeout_s + ANSWER_SLACK_S)
        drafts = self._answers.pop(step_id, FELL_BACK)  # one operation (the asker replaces the dict whole)
        return None if drafts is FELL_BACK else drafts

    def _read_unread(self) -> None:
        """The service's answer to the last step not waited for, if it is in by now (never waiting for it)."""
        if self._unread is None:
            return
        (step_id, wanted), self._unread = self._unread, None
        service = self._answer(step_id, wait=False)
        for r in wanted if service is not None else ():
            if (drafted := self._drafted.get(r.request_id)) is not None:
                drafted.service = service.get(r.request_id, [])

    def _judge(self, requests: Sequence[DraftRequest]) -> None:
        """Each request's last drafts against the tokens its step emitted: whether the service's would have gained."""
        judged = gained = False
        for r in requests:
            drafted = self._drafted.get(r.request_id)
            if drafted is None or drafted.service is None or len(r.token_ids) <= drafted.context_len:
                continue
            emitted, judged = r.token_ids[drafted.context_len:], True
            if matched(drafted.service, emitted) > matched(drafted.own, emitted):
                self._waiting[r.request_id] = PATIENCE
                self.service_remembers = gained = True
            elif drafted.waited and r.request_id in self._waiting:
                self._waiting[r.request_id] -= 1
                if not self._waiting[r.request_id]:
                    del self._waiting[r.request_id]
            drafted.service = None  # judged
        if judged:
            self._gain_rate += (gained - self._gain_rate) / RATE_STEPS
