"""The drafter's gRPC client in a small process of its own, so that the engine's interpreter runs only the engine.

`client.py` keeps three threads busy per step (its reply reader, grpc's request consumer and its channel poller).
In the engine's process each of them takes the GIL from the engine thread at every message, and the engine's loop
waits behind them: at one client the stack drafted at 0.93x its speed without drafts, the same stack with the
drafter's rule in process at 1.37x (docs/BENCHMARKS.md, round 22). Here the engine thread only writes one pipe
message per step (each context's new tokens since the last) and reads the replies already there; the link process
holds every context, runs the client and answers each step with its drafts, or None for none (the client fell
back, or a newer step came in meanwhile: the link answers only the newest, so a slow drafter never builds a queue).

`DrafterLink` is a Proposer (verifier_service/engine/proposer.py) with `begin_propose`, like the client. A link
process that dies costs drafts, never a request: the engine decodes without them while a new one starts.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence

from drafter_service.batch import DraftRequest
from specd.serving import TlsConfig

logger = logging.getLogger(__name__)

_FELL_BACK = None  # the link's answer for a step that got no drafts


class _PendingStep:
    """A step sent to the link process: result() reads its answer."""

    def __init__(self, link: DrafterLink | None, step_id: int = 0, deadline: float = 0.0):
        self.link, self.step_id, self.deadline = link, step_id, deadline

    def result(self, wait: bool = True) -> dict[str, list[int]]:
        """Drafts per request id; {} (a counted fallback) when none came by the deadline (without `wait`: now)."""
        if self.link is None:
            return {}
        return self.link._finish(self, wait)  # noqa: SLF001 - the link's own helper


class DrafterLink:
    """Proposer backed by the drafter service, through a link process that holds the gRPC client."""

    def __init__(self, target: str, *, timeout_s: float = 0.005, tls: TlsConfig | None = None) -> None:
        """`timeout_s` is the per-step deadline (the CLI's --drafter-timeout-ms / 1000)."""
        self.target, self.timeout_s, self._tls = target, timeout_s, tls
        self.num_fallbacks = 0  # steps that wanted drafts and got none because of the drafter (or the link)
        self._step_id = 0
        self._sent: dict[str, int] = {}  # per request: tokens the link process holds
        self._answers: dict[int, dict[str, list[int]] | None] = {}  # read before their step was collected
        self._conn = self._process = None
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
        answer = self._answer(pending.step_id, pending.deadline if wait else 0.0)
        if answer is _FELL_BACK:
            self.num_fallbacks += 1
            return {}
        return answer

    def _answer(self, step_id: int, deadline: float):
        """The link's answer to step_id, reading answers off the pipe until it or `deadline`; _FELL_BACK if none."""
        if not self._usable():
            return _FELL_BACK
        try:
            while step_id not in self._answers:
                remaining = deadline - time.monotonic()
                if not self._conn.poll(max(remaining, 0.0)):
                    break
                answered_id, drafts = self._conn.recv()
                self._answers[answered_id] = drafts
        except (EOFError, OSError):
            self._lost("its pipe closed")
        answer = self._answers.pop(step_id, _FELL_BACK)
        for old in [i for i in self._answers if i < step_id]:  # steps never collected (an engine that failed one)
            del self._answers[old]
        return answer

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

    # ---- the link process's lifecycle ------------------------------------------------------------

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        conn, child = context.Pipe()
        process = context.Process(target=relay, args=(child, self.target, self.timeout_s, self._tls, os.getpid()),
                                  name="specd-drafter-link", daemon=True)
        process.start()
        child.close()
        self._conn, self._process = conn, process

    def _usable(self) -> bool:
        return self._conn is not None and self._starting is None

    def _send(self, message) -> bool:
        try:
            self._conn.send(message)
            return True
        except OSError:
            self._lost("its pipe broke")
            return False

    def _lost(self, why: str) -> None:
        """The link process is gone: decode without drafts while a new one starts (off the engine thread)."""
        if self._starting is not None:
            return
        logger.error("drafter link process lost (%s); decoding without drafts until a new one runs", why)
        self._conn = None
        self._sent.clear()  # a new link process holds no context: send each one whole
        self._answers.clear()

        def restart() -> None:
            self._start()
            self._starting = None
        self._starting = threading.Thread(target=restart, name="drafter-link-restart", daemon=True)
        self._starting.start()


def relay(conn, target: str, timeout_s: float, tls: TlsConfig | None, parent_pid: int) -> None:
    """The link process: applies the engine's messages and answers each step with the client's drafts."""
    from drafter_service.client import DrafterClient
    from specd import stop_signals

    stop_signals.die_with_parent(signal.SIGKILL, parent_pid)  # nothing of its state outlives the engine
    client = DrafterClient(target, timeout_s=timeout_s, tls=tls)
    contexts: dict[str, list[int]] = {}
    try:
        while True:
            messages = [conn.recv()]
            while conn.poll():  # everything the engine sent meanwhile: only the newest step is asked
                messages.append(conn.recv())
            steps = []
            for message in messages:
                if message[0] == "close":
                    return
                if message[0] == "release":
                    for request_id in message[1]:
                        contexts.pop(request_id, None)
                    client.release(message[1])
                else:
                    steps.append((message[1], _requests(contexts, message[2])))
            for step_id, _ in steps[:-1]:
                conn.send((step_id, _FELL_BACK))
            if steps:
                step_id, requests = steps[-1]
                fallbacks = client.num_fallbacks
                drafts = client.propose(requests)
                conn.send((step_id, drafts if client.num_fallbacks == fallbacks else _FELL_BACK))
    except (EOFError, OSError):
        return  # the engine is gone
    finally:
        client.close()


def _requests(contexts: dict[str, list[int]], rows) -> list[DraftRequest]:
    """The step's DraftRequests, each context brought up to date with the tokens sent."""
    requests = []
    for request_id, start, new_tokens, draft_limit, min_ngram, max_ngram, tenant_key in rows:
        tokens = contexts.setdefault(request_id, [])
        if start < len(tokens):  # sent afresh: a new list, since the client may still read the old one
            tokens = contexts[request_id] = tokens[:start]
        tokens += new_tokens
        requests.append(DraftRequest(request_id, tokens, draft_limit, min_ngram, max_ngram, tenant_key))
    return requests
