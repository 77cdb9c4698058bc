"""The drafter's gRPC client in a small process of its own, so that the engine's interpreter runs only the engine.

`client.py` keeps three threads busy per step (its reply reader, grpc's request consumer and its channel poller).
In the engine's process each of them takes the GIL from the engine thread at every message, and the engine's loop
waits behind them: at one client the stack drafted at 0.93x its speed without drafts, the same stack with the
drafter's rule in process at 1.37x (docs/BENCHMARKS.md, round 22). Here the engine thread only writes one pipe
message per step (each context's new tokens since the last) and reads the replies already there, in one system call
(specd/pipe_frames.py: the propose stage at one client fell from 0.07-0.08 to 0.03 ms on an H200, round 41).

The link process answers each step at once from its own copy of the contexts: the drafter's rule over each request's
own context (drafter_service/local.py, no memory), a pipe hop away. Where it asks the drafter service too (every
step by default; under SPECD_DRAFTER_PROBE_STEPS=N where ask_rule.py finds that the service adds), it answers again
with the service's answer, as the entries where it differs (its memory of earlier outputs), or None where it failed
or was past its deadline; not at all once a newer step has been asked (service_asker.py). A step not asked has the
own answer as its final one. A GPU step of a small model takes under a millisecond, about what the service's round
trip takes (through two processes and gRPC): the service's answer missed 26-63% of the steps at one client (round
31). The own answer is there in time, so a late or dead drafter
service costs the memory's drafts, not the context's.

`DrafterLink` is a Proposer (verifier_service/engine/proposer.py) with `begin_propose`, like the client. A link
process that dies costs drafts, never a request: the engine decodes without them while a new one starts.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from drafter_service.batch import DraftRequest
from drafter_service.service_asker import CONTEXT, OWN_ONLY
from specd import environment
from specd.pipe_frames import PipeReader, pickled
from specd.serving import TlsConfig

logger = logging.getLogger(__name__)

@dataclass
class _StepAnswers:
    """What came back for one step: the link's own drafts and the service's differences from them."""

    context: dict[str, list[int]] | None = None  # the link's own drafts
    service: dict[str, list[int]] | None = None  # entries where the service's drafts differ ([] = none)
    service_done: bool = False  # the service answered, or the link gave up on it


_NOTHING_YET = _StepAnswers()  # read only
_UNASKED: dict[str, list[int]] = {}  # the service's differences at a step it was not asked (read only)


class _PendingStep:
    """A step sent to the link process: result() reads its answer."""

    def __init__(self, link: DrafterLink | None, step_id: int = 0, deadline: float = 0.0):
        self.link, self.step_id, self.deadline = link, step_id, deadline

    def result(self, wait: bool = True) -> dict[str, list[int]]:
        """Drafts per request id: the service's where it answered by the deadline (without `wait`: by now), else the
        link's own; {} when neither came."""
        if self.link is None:
            return {}
        return self.link._finish(self, wait)  # noqa: SLF001 - the link's own helper


class DrafterLink:
    """Proposer backed by the drafter service, through a link process that holds the gRPC client."""

    def __init__(self, target: str, *, timeout_s: float = 0.005, tls: TlsConfig | None = None,
                 probe_steps: int | None = None) -> None:
        """`timeout_s` is the per-step deadline (the CLI's --drafter-timeout-ms / 1000); `probe_steps`: the service is
        asked at least one step in this many (ask_rule.py; None: SPECD_DRAFTER_PROBE_STEPS, 1 asks every step)."""
        self.target, self.timeout_s, self._tls = target, timeout_s, tls
        self.probe_steps = environment.drafter_probe_steps() if probe_steps is None else probe_steps
        self.num_fallbacks = 0  # steps that wanted drafts and missed the service's answer (or the link's)
        self.num_context_drafts = 0  # of those, steps drafted from the link's own copy of the contexts
        self.num_unasked = 0  # steps that wanted drafts and whose service was not asked (the own drafts final)
        self._step_id = 0
        self._sent: dict[str, int] = {}  # per request: tokens the link process holds
        self._answers: dict[int, _StepAnswers] = {}  # read before their step was collected
        self._conn = self._reader = self._process = None
        self._starting: threading.Thread | None = None
        self._start()

    # ---- engine thread -------------------------------------------------------------------------

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        return self.begin_propose(requests).result()

    def begin_propose(self, requests: Sequence[DraftRequest]) -> _PendingStep:
        """Sends the step's new tokens and questions to the link process now (one pipe message); never raises."""
        wanted = any(r.draft_limit > 0 for r in requests)
        if not requests or not self._usable():
            self.num_fallbacks += wanted
            return _PendingStep(None)
        self._step_id += 1
        rows = []
        for r in requests:
            end = len(r.token_ids)
            start = self._sent.get(r.request_id, 0)
            start = start if start <= end else 0  # the context shrank: afresh
            rows.append((r.request_id, start, list(r.token_ids[start:end]), r.draft_limit, r.min_ngram,
                         r.max_ngram, r.tenant_key))
            self._sent[r.request_id] = end
        if not self._send(("step", self._step_id, rows)):
            self.num_fallbacks += wanted
            return _PendingStep(None)
        if not wanted:
            return _PendingStep(None)
        return _PendingStep(self, self._step_id, time.monotonic() + self.timeout_s)

    def _finish(self, pending: _PendingStep, wait: bool) -> dict[str, list[int]]:
        answers = self._read(pending.step_id, pending.deadline if wait else 0.0)
        if answers.service is not None:
            self.num_unasked += answers.service is _UNASKED
            return _merged(answers.context or {}, answers.service)
        self.num_fallbacks += 1
        if answers.context is None:
            return {}
        self.num_context_drafts += 1
        return answers.context

    def _read(self, step_id: int, deadline: float) -> _StepAnswers:
        """The step's answers, reading the pipe until the service's is in or `deadline` has passed."""
        if not self._usable():
            return _StepAnswers()
        try:
            while True:
                for answered_id, source, drafts in self._reader.available():
                    answers = self._answers.setdefault(answered_id, _StepAnswers())
                    if source == CONTEXT:
                        answers.context = drafts
                    elif source == OWN_ONLY:
                        answers.context, answers.service, answers.service_done = drafts, _UNASKED, True
                    else:
                        answers.service, answers.service_done = drafts, True
                if self._answers.get(step_id, _NOTHING_YET).service_done:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0.0 or not self._reader.wait(remaining):
                    break
        except (EOFError, OSError):
            self._lost("its pipe closed")
        answers = self._answers.pop(step_id, _StepAnswers())
        for old in [i for i in self._answers if i < step_id]:  # steps never collected (an engine that failed one)
            del self._answers[old]
        return answers

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget finished or aborted requests (here, in the link process and on the drafter)."""
        held = [i for i in request_ids if self._sent.pop(i, None) is not None]
        if held and self._usable():
            self._send(("release", held))

    def close(self) -> None:
        conn, process = self._conn, self._process
        if conn is not None:
            try:
                conn.send(("close",))
            except OSError:
                pass
        if process is not None:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
        if conn is not None:
            conn.close()
            self._reader.close()

    # ---- the link process's lifecycle ------------------------------------------------------------

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        conn, child = context.Pipe()
        process = context.Process(target=relay, args=(child, self.target, self.timeout_s, self._tls, os.getpid(),
                                                      self.probe_steps),
                                  name="specd-drafter-link", daemon=True)
        process.start()
        child.close()
        self._conn, self._reader, self._process = conn, PipeReader(conn), process

    def _usable(self) -> bool:
        return self._conn is not None and self._starting is None

    def _send(self, message) -> bool:
        try:
            self._conn.send_bytes(pickled(message))
            return True
        except OSError:
            self._lost("its pipe broke")
            return False

    def _lost(self, why: str) -> None:
        """The link process is gone: decode without drafts while a new one starts (off the engine thread)."""
        if self._starting is not None:
            return
        logger.error("drafter link process lost (%s); decoding without drafts until a new one runs", why)
        self._conn.close()
        self._reader.close()
        self._conn = self._reader = None
        self._sent.clear()  # a new link process holds no context: send each one whole
        self._answers.clear()

        def restart() -> None:
            self._start()
            self._starting = None
        self._starting = threading.Thread(target=restart, name="drafter-link-restart", daemon=True)
        self._starting.start()


def _merged(context: dict[str, list[int]], differences: dict[str, list[int]]) -> dict[str, list[int]]:
    """The service's drafts: the link's own, with the entries where the service's differ."""
    drafts = {**context, **differences}
    return {request_id: tokens for request_id, tokens in drafts.items() if tokens}


def relay(conn, target: str, timeout_s: float, tls: TlsConfig | None, parent_pid: int, probe_steps: int) -> None:
    """The link process: applies the engine's messages, answers each step from its own copy of the contexts at
    once, and where ask_rule.py asks the service, again with its drafts (`ServiceAsker`)."""
    from drafter_service.ask_rule import AskRule
    from drafter_service.client import DrafterClient
    from drafter_service.config import DrafterConfig
    from drafter_service.local import LocalProposer
    from drafter_service.service_asker import ServiceAsker
    from specd import stop_signals

    stop_signals.die_with_parent(signal.SIGKILL, parent_pid)  # nothing of its state outlives the engine
    # The own answer must not wait out the default 5 ms switch interval behind a gRPC thread building a message.
    sys.setswitchinterval(0.0002)
    sender = _Sender(conn)
    own = LocalProposer(DrafterConfig(memory_scope="off"))  # the memory is the service's, shared by every verifier
    rule = AskRule(probe_steps)

    def answered(answer) -> None:  # the asker's thread
        rule.heard(answer[0], answer[2])
        sender.send(answer)
    asker = ServiceAsker(DrafterClient(target, timeout_s=timeout_s, tls=tls), answered)
    contexts: dict[str, DraftRequest] = {}  # each request at its last step
    try:
        while (message := conn.recv())[0] != "close":
            if message[0] == "release":
                # Their whole contexts, so that the service holds the tokens of steps it was not asked
                last = [replace(contexts.pop(i), draft_limit=0) for i in message[1] if i in contexts]
                own.release(message[1])
                rule.release(message[1])
                asker.release(message[1], last)
                continue
            step_id, requests = message[1], _requests(contexts, message[2])
            drafts = {request_id: tokens for request_id, tokens in own.propose(requests).items() if tokens}
            wanted = any(r.draft_limit > 0 for r in requests)
            if not rule.should_ask(requests, drafts):
                if wanted:
                    sender.send((step_id, OWN_ONLY, drafts))
                continue
            if wanted:
                sender.send((step_id, CONTEXT, drafts))
            brings_new = rule.asked(step_id, requests, drafts)
            # Each context's length now: the lists grow in place with the next steps' tokens before the asker sends
            # this one, and what the service holds at first sight is the prompt, the rest the output it remembers
            asker.ask(step_id, requests, drafts if wanted else None, [len(r.token_ids) for r in requests],
                      keep=brings_new)
    except (EOFError, OSError):
        return  # the engine is gone
    finally:
        asker.close()


class _Sender:
    """The link's end of the pipe, shared by its two threads."""

    def __init__(self, conn) -> None:
        self._conn, self._lock = conn, threading.Lock()

    def send(self, message) -> None:
        payload = pickled(message)
        with self._lock:
            self._conn.send_bytes(payload)


def _requests(contexts: dict[str, DraftRequest], rows) -> list[DraftRequest]:
    """The step's DraftRequests, each context brought up to date with the tokens sent."""
    requests = []
    for request_id, start, new_tokens, draft_limit, min_ngram, max_ngram, tenant_key in rows:
        last = contexts.get(request_id)
        tokens = [] if last is None else last.token_ids
        if start < len(tokens):  # sent afresh: a new list, since the client may still read the old one
            tokens = tokens[:start]
        tokens += new_tokens
        request = contexts[request_id] = DraftRequest(request_id, tokens, draft_limit, min_ngram, max_ngram, tenant_key)
        requests.append(request)
    return requests
