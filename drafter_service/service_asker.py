"""A thread that asks the drafter service each newest step and hands its answer on: the drafter link's second thread
(down its pipe), and the CPU proposer's (drafter_service/context_first.py, to the engine thread).

The link process (link.py) answers every step from its own copy of the contexts first; this thread then sends what
the service answered differently (its memory's drafts), or FELL_BACK where the service failed or was past its
deadline. Nothing is sent for a step once a newer one has been asked: the engine asks a step only after it has
collected the one before, so such an answer would only be read to be dropped. For the same reason a step still
waiting to be asked when a newer one comes is dropped: the service is asked the newest step only, and a slow
service builds no queue.
"""
from __future__ import annotations

import queue
import threading

from drafter_service.batch import DraftRequest

# The link's pipe carries (step_id, source, drafts): CONTEXT, the link's own drafts, at once; then SERVICE, the entries
# where the service's differ, or FELL_BACK. OWN_ONLY: the link's own drafts at a step the service was not asked.
CONTEXT, SERVICE, OWN_ONLY = "context", "service", "own"
FELL_BACK = None  # the service's answer for a step it did not answer in time


def differences(context: dict[str, list[int]], service: dict[str, list[int]]) -> dict[str, list[int]]:
    """The entries of `service` that differ from `context` ([] where only the context drafted): what the pipe carries."""
    changed = {request_id: tokens for request_id, tokens in service.items() if context.get(request_id) != tokens}
    changed.update((request_id, []) for request_id in context if request_id not in service)
    return changed


class ServiceAsker:
    """Asks the drafter service on a thread of its own, the newest step only, and sends its answers down the pipe.

    The client (its deltas, its releases) is used from this thread alone; work is done in the order it came, except
    that a step still waiting when a newer one comes is dropped."""

    def __init__(self, client, send) -> None:
        """client: a DrafterClient, used from this thread alone from now on; send: called with each answer."""
        self._client, self._send = client, send
        self._work: queue.SimpleQueue[tuple] = queue.SimpleQueue()  # a put costs the asking thread ~1 us
        self._newest = 0  # the newest step asked: the engine has collected every step before it
        self._thread = threading.Thread(target=self._run, name="drafter-asker", daemon=True)
        self._thread.start()

    def ask(self, step_id: int, requests: list[DraftRequest], context: dict[str, list[int]] | None,
            ends: list[int] | None = None, keep: bool = False) -> None:
        """Queue a step; `context` is the own answer to it (None: nobody wants drafts, so none is sent); ends: each
        context's length at the step, where the contexts' lists grow meanwhile (None: they do not); keep: sent even
        once a newer step is asked (without waiting for its answer), as a step that brings the service a request's
        prompt must be."""
        self._newest = step_id
        self._work.put(("step", step_id, requests, context, ends, keep))

    def release(self, request_ids: list[str], last: list[DraftRequest] = ()) -> None:
        """`last`: those requests at their last step, whose tokens the service has not been sent go to it first."""
        self._work.put(("release", request_ids, last))

    def close(self) -> None:
        self._work.put(("close",))
        self._thread.join(timeout=5)

    def _next_work(self) -> list[tuple]:
        """What came since the last look, in order, without the steps a newer step makes moot."""
        work = [self._work.get()]
        while True:
            try:
                work.append(self._work.get_nowait())
            except queue.Empty:
                break
        newest = max((i for i, item in enumerate(work) if item[0] == "step"), default=None)
        return [item for i, item in enumerate(work) if item[0] != "step" or i == newest or item[5]]

    def _run(self) -> None:
        client = self._client
        try:
            while True:
                for item in self._next_work():
                    if item[0] == "close":
                        return
                    if item[0] == "release":
                        client.release(item[1], item[2])
                        continue
                    _, step_id, requests, context, ends, _ = item
                    if step_id != self._newest:  # kept, but a newer step is asked: its answer would be read in vain
                        client.begin_propose(requests, ends)
                        continue
                    fallbacks = client.num_fallbacks
                    drafts = client.propose(requests, ends)
                    if context is not None and step_id == self._newest:  # an older step's answer is read in vain
                        answered = client.num_fallbacks == fallbacks
                        self._send((step_id, SERVICE, differences(context, drafts) if answered else FELL_BACK))
        except (EOFError, OSError):
            return  # the engine is gone
        finally:
            client.close()
