"""The drafter link's second thread: asks the drafter service each newest step, for the link process (link.py).

The engine reads one pipe message per step where it can (each costs its thread a poll and two reads). The link waits
for the service's answer up to a window (link.py's StepClock: half a step) and then sends one of:

    (step_id, {}, drafts, True)       the service's drafts, in the window
    (step_id, own, None, True)        the link's own drafts; the service failed (or was past its deadline) in it
    (step_id, own, None, False)       the link's own drafts; the service's answer may follow as
    (step_id, None, changed, True)    the entries where the service's drafts differ from the own ([] = none), or
    (step_id, None, None, True)       the service failed, or was past its deadline

Nothing follows for a step once a newer one has been asked: the engine asks a step only after it has collected the
one before, so such an answer would only be read to be dropped. For the same reason a step still waiting to be asked
when a newer one comes is dropped: the service is asked the newest step only, and a slow service builds no queue.
"""
from __future__ import annotations

import threading

from drafter_service.batch import DraftRequest
from specd.serving import TlsConfig

_NOT_YET = object()  # no answer from the service for the step in the window (yet)


def differences(context: dict[str, list[int]], service: dict[str, list[int]]) -> dict[str, list[int]]:
    """The entries of `service` that differ from `context` ([] where only the context drafted): what the pipe carries."""
    changed = {request_id: tokens for request_id, tokens in service.items() if context.get(request_id) != tokens}
    changed.update((request_id, []) for request_id in context if request_id not in service)
    return changed


class ServiceAsker:
    """Asks the drafter service on a thread of its own, the newest step only, and sends its late answers down the pipe.

    The client (its deltas, its releases) is used from this thread alone; work is done in the order it came, except
    that a step still waiting when a newer one comes is dropped."""

    def __init__(self, target: str, timeout_s: float, tls: TlsConfig | None, send) -> None:
        from drafter_service.client import DrafterClient

        self._client, self._send = DrafterClient(target, timeout_s=timeout_s, tls=tls), send
        self._work: list[tuple] = []
        self._newest = 0  # the newest step asked: the engine has collected every step before it
        self._waited_for = 0  # the step whose answer the link's main thread waits for (0: none)
        self._answer = _NOT_YET  # the service's drafts for it (None: it failed)
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="drafter-asker", daemon=True)
        self._thread.start()

    def ask(self, step_id: int, requests: list[DraftRequest], context: dict[str, list[int]] | None) -> None:
        """Queue a step; `context` is the link's own answer to it (None: nobody wants drafts, so none is sent)."""
        with self._ready:
            self._newest = step_id
            self._work = [item for item in self._work if item[0] != "step"]  # the engine has collected those
            self._work.append(("step", step_id, requests, context))
            if context is not None:
                self._waited_for, self._answer = step_id, _NOT_YET
            self._ready.notify_all()

    def answer_within(self, step_id: int, window_s: float, context: dict[str, list[int]]) -> None:
        """Sends the asked step's answer: the service's drafts if they come within `window_s`, else the link's own
        (`context`); from then on, a late answer of the service is this thread's to send (after this one: the
        message goes while the lock is held, which the thread must take to learn that the wait is over)."""
        with self._ready:
            self._ready.wait_for(lambda: self._answer is not _NOT_YET, timeout=window_s)
            answer, self._waited_for, self._answer = self._answer, 0, _NOT_YET
            if answer is _NOT_YET:
                self._send((step_id, context, None, False))
            else:
                self._send((step_id, context, None, True) if answer is None else (step_id, {}, answer, True))

    def release(self, request_ids: list[str]) -> None:
        self._put(("release", request_ids))

    def close(self) -> None:
        self._put(("close",))
        self._thread.join(timeout=5)

    def _put(self, item: tuple) -> None:
        with self._ready:
            self._work.append(item)
            self._ready.notify_all()

    def _run(self) -> None:
        client = self._client
        try:
            while True:
                with self._ready:
                    self._ready.wait_for(lambda: self._work)
                    item = self._work.pop(0)
                if item[0] == "close":
                    return
                if item[0] == "release":
                    client.release(item[1])
                    continue
                _, step_id, requests, context = item
                fallbacks = client.num_fallbacks
                drafts = client.propose(requests)
                if context is not None:
                    self._answered(step_id, context, drafts if client.num_fallbacks == fallbacks else None)
        except (EOFError, OSError):
            return  # the engine is gone
        finally:
            client.close()

    def _answered(self, step_id: int, context: dict[str, list[int]], drafts: dict[str, list[int]] | None) -> None:
        """Hands the service's answer to the waiting main thread, or sends it late (if no newer step was asked)."""
        with self._ready:
            if self._waited_for == step_id:
                self._answer = drafts
                self._ready.notify_all()
                return
            late = step_id == self._newest
        if late:
            self._send((step_id, None, None if drafts is None else differences(context, drafts), True))
