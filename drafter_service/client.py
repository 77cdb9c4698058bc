"""The engine's Proposer over the drafter's batched bidirectional stream (specd.v1.Drafter/Propose).

Each `propose()` sends one (columnar) ProposeRequest carrying every sequence's delta (start = tokens already
sent on this stream, new_token_ids = the rest; start = 0 with the whole context on first sight,
after a resync answer, or on a new stream) and waits at most `timeout_s` for the reply with its
step_id. Whatever goes wrong (drafter down, late, erroring, stream broken) the step gets no drafts
and `num_fallbacks` grows by one (exported by the verifier as specd_drafter_fallbacks_total);
`propose()` never raises and never waits past its deadline.

Threads: `propose()` and `release()` run on one thread, the engine's or its asker's (service_asker.py), which owns
all delta bookkeeping.
A background thread owns the connection: it waits for the channel (grpc core reconnects with
exponential backoff, `initial_backoff_s` doubling-ish up to `max_backoff_s`), runs one stream at a
time with grpc's sync API, and hands replies to the engine thread through a queue. Protobuf
messages are built on grpc's request-consuming thread, so a long first-sight context does not
delay the engine; this relies on the engine only appending to a request's token_ids.

A reply whose step_id is not the one awaited (it came after its deadline) is dropped, but its
resync answers are still honoured. A new stream starts empty on the drafter, so every sequence is
re-sent whole on it.

`begin_propose()` sends a step and returns at once; its `result()` waits for the reply (up to `timeout_s`
after it was sent), so the engine can ask for the next step's drafts the moment the contexts are known and
do its other work while the drafter answers. `propose()` is the two back to back.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from specd.serving import TlsConfig, open_channel
from specd.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_service.batch import DraftRequest

logger = logging.getLogger(__name__)

_STREAM_ENDED = object()  # put on the reply queue when a stream breaks, so a waiting step stops


@dataclass(frozen=True)
class _Step:
    """One ProposeRequest to send, as columns over `requests` (grpc's request consumer builds the protobuf)."""

    step_id: int
    requests: Sequence[DraftRequest] = ()
    starts: Sequence[int] = ()  # per request: tokens of token_ids the drafter already holds
    ends: Sequence[int] = ()  # per request: context length at this step (token_ids may grow after propose())
    released_ids: Sequence[str] = ()


def _step_to_pb(step: _Step) -> drafter_pb2.ProposeRequest:
    """The columnar ProposeRequest of a step (protos/specd/v1/drafter.proto)."""
    requests = step.requests
    new_token_ids: list[int] = []
    for request, start, end in zip(requests, step.starts, step.ends):
        new_token_ids += request.token_ids[start:end]
    return drafter_pb2.ProposeRequest(
        step_id=step.step_id,
        released_sequence_ids=step.released_ids,
        sequence_ids=[r.request_id for r in requests],
        starts=step.starts,
        new_token_counts=[end - start for start, end in zip(step.starts, step.ends)],
        new_token_ids=new_token_ids,
        draft_limits=[r.draft_limit for r in requests],
        min_ngrams=[r.min_ngram for r in requests],
        max_ngrams=[r.max_ngram for r in requests],
        tenant_keys=[r.tenant_key if start == 0 else "" for r, start in zip(requests, step.starts)],
    )


def _drafts_from_pb(requests: Sequence[DraftRequest],
                    reply: drafter_pb2.ProposeResponse) -> dict[str, list[int]]:
    """Drafts per request id from a reply's columns (requests in the order they were sent)."""
    tokens = list(reply.draft_token_ids)
    drafts, position = {}, 0
    for request, count in zip(requests, reply.draft_counts):
        if count:
            drafts[request.request_id] = tokens[position:position + count]
            position += count
    return drafts


class _Stream:
    """One connection's outgoing queue; `None` in it ends the request iterator."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.outbox: queue.SimpleQueue[_Step | None] = queue.SimpleQueue()

    def requests(self):
        while (step := self.outbox.get()) is not None:
            yield _step_to_pb(step)


class _PendingStep:
    """A step sent to the drafter (or one that could not be): result() waits for its drafts."""

    def __init__(self, client: DrafterClient, requests: list[DraftRequest], fallback: bool = False,
                 generation: int = -1, step_id: int = 0, deadline: float = 0.0) -> None:
        self.client, self.requests, self.fallback = client, requests, fallback
        self.generation, self.step_id, self.deadline = generation, step_id, deadline

    def result(self, wait: bool = True) -> dict[str, list[int]]:
        """Drafts per request id; {} (a counted fallback) when the drafter cannot answer in time (or, without
        `wait`, has not answered yet)."""
        try:
            return self.client._finish(self, wait)  # noqa: SLF001 - the client's own helper
        except Exception:  # noqa: BLE001 - a drafter problem must never fail a request
            logger.exception("drafter client failed a step; decoding without drafts")
            self.client.num_fallbacks += 1
            return {}


class DrafterClient:
    """Proposer (verifier_service/engine/proposer.py) backed by a remote drafter."""

    def __init__(self, target: str = "127.0.0.1:50071", *, timeout_s: float = 0.005,
                 tls: TlsConfig | None = None, server_name: str | None = None,
                 initial_backoff_s: float = 0.05, max_backoff_s: float = 2.0) -> None:
        """`timeout_s` is the per-step deadline (the CLI's --drafter-timeout-ms / 1000)."""
        self.target = target
        self.timeout_s = timeout_s
        self.num_fallbacks = 0  # steps that wanted drafts and got none because of the drafter
        self.num_stale_replies = 0  # replies that came after their step's deadline
        self._replies: queue.SimpleQueue = queue.SimpleQueue()  # (generation, response | _STREAM_ENDED)
        self._stream: _Stream | None = None  # set and cleared by the connection thread only
        self._generation_seen = -1
        self._sent_lengths: dict[str, int] = {}  # per sequence: tokens the current stream holds
        self._step_id = 0
        self._closed = threading.Event()
        initial_ms, max_ms = int(initial_backoff_s * 1000), int(max_backoff_s * 1000)
        backoff = [("grpc.initial_reconnect_backoff_ms", initial_ms),
                   ("grpc.min_reconnect_backoff_ms", initial_ms), ("grpc.max_reconnect_backoff_ms", max_ms)]
        self._channel = open_channel(target, tls, asynchronous=False, server_name=server_name,
                                     extra_options=backoff)
        self._max_backoff_s = max_backoff_s
        self._initial_backoff_s = initial_backoff_s
        self._thread = threading.Thread(target=self._connection_loop, name="drafter-client", daemon=True)
        self._thread.start()

    # ---- engine thread -------------------------------------------------------------------------

    def propose(self, requests: Sequence[DraftRequest],
                ends: Sequence[int] | None = None) -> dict[str, list[int]]:
        """Drafts per request id; {} (a counted fallback) when the drafter cannot answer in time."""
        return self.begin_propose(requests, ends).result()

    def begin_propose(self, requests: Sequence[DraftRequest], ends: Sequence[int] | None = None) -> _PendingStep:
        """Sends the step now; the returned proposal's result() waits for its reply (never raises). ends: each
        request's context length at its step (None: len(token_ids) now), where another thread asks for the step
        while the engine appends to the contexts."""
        try:
            return self._begin(list(requests), ends)
        except Exception:  # noqa: BLE001 - a drafter problem must never fail a request
            logger.exception("drafter client failed to send a step; decoding without drafts")
            return _PendingStep(self, [], fallback=True)

    def _begin(self, requests: list[DraftRequest], ends: Sequence[int] | None = None) -> _PendingStep:
        wanted = any(r.draft_limit > 0 for r in requests)
        if not requests:
            return _PendingStep(self, [])
        stream = self._current_stream()
        # Late replies first: their resync answers change this step's deltas.
        if stream is None or not self._drain_replies(stream.generation):
            return _PendingStep(self, [], fallback=wanted)
        self._step_id += 1
        stream.outbox.put(self._step(self._step_id, requests, ends))
        if not wanted:
            return _PendingStep(self, [])
        return _PendingStep(self, requests, generation=stream.generation, step_id=self._step_id,
                            deadline=time.monotonic() + self.timeout_s)

    def _finish(self, pending: _PendingStep, wait: bool = True) -> dict[str, list[int]]:
        if pending.fallback:
            self.num_fallbacks += 1
            return {}
        if not pending.requests:
            return {}
        reply = self._await_reply(pending.generation, pending.step_id, pending.deadline if wait else 0.0)
        if reply is None:
            self.num_fallbacks += 1
            return {}
        return _drafts_from_pb(pending.requests, reply)

    def release(self, request_ids: Sequence[str], last: Sequence[DraftRequest] = ()) -> None:
        """Tell the drafter to forget finished or aborted requests (sent right away). `last`: those requests at their
        last step (draft limit 0); the tokens of theirs the drafter has not been sent go first, so that its memory
        keeps their outputs whole (a caller that does not ask every step, drafter_service/ask_rule.py)."""
        stream = self._current_stream()
        sent = self._sent_lengths
        behind = [r for r in last if sent.get(r.request_id, 0) < len(r.token_ids)]
        if behind and stream is not None:
            stream.outbox.put(self._step(0, behind))  # step_id 0: nobody awaits its reply
        held = [i for i in request_ids if sent.pop(i, None) is not None]
        if held and stream is not None:
            stream.outbox.put(_Step(0, released_ids=held))

    def _current_stream(self) -> _Stream | None:
        stream = self._stream
        if stream is not None and stream.generation != self._generation_seen:
            self._generation_seen = stream.generation
            self._sent_lengths.clear()  # a new stream holds nothing: send every context whole
        return stream

    def _step(self, step_id: int, requests: Sequence[DraftRequest], ends: Sequence[int] | None = None) -> _Step:
        """Each request's delta: what this stream has not been sent yet (all of it on first sight)."""
        sent, requests = self._sent_lengths, list(requests)  # the engine may reuse its list
        ends = [len(r.token_ids) for r in requests] if ends is None else list(ends)
        starts = [sent.get(r.request_id, 0) for r in requests]
        starts = [start if start <= end else 0 for start, end in zip(starts, ends)]  # shrank: afresh
        sent.update(zip([r.request_id for r in requests], ends))
        return _Step(step_id, requests, starts, ends)

    def _drain_replies(self, generation: int) -> bool:
        """Handle replies that came after their deadline; False if the stream has ended meanwhile."""
        while True:
            try:
                reply = self._accept(generation, *self._replies.get_nowait())
            except queue.Empty:
                return True
            if reply is _STREAM_ENDED:
                return False
            self._count_if_stale(reply, awaited=None)

    def _await_reply(self, generation: int, step_id: int, deadline: float):
        """The step's reply, waiting until `deadline` at most; past it (a step asked ahead and collected
        after the step in flight), replies already in hand are still read: they cost no waiting."""
        while True:
            remaining = deadline - time.monotonic()
            try:
                item = self._replies.get(timeout=remaining) if remaining > 0 else self._replies.get_nowait()
            except queue.Empty:
                return None
            reply = self._accept(generation, *item)
            if reply is _STREAM_ENDED:
                return None
            if reply is not None and reply.step_id == step_id:
                return reply
            self._count_if_stale(reply, awaited=step_id)

    def _count_if_stale(self, reply, awaited: int | None) -> None:
        if reply is not None and reply is not _STREAM_ENDED and reply.step_id not in (0, awaited):
            self.num_stale_replies += 1

    def _accept(self, generation: int, reply_generation: int, reply):
        """Apply a reply's resync answers; returns it, or None if it belongs to an older stream."""
        if reply_generation != generation:
            return None
        if reply is _STREAM_ENDED:
            return reply
        for sequence_id in reply.resync_sequence_ids:
            self._sent_lengths.pop(sequence_id, None)
        return reply

    # ---- connection thread ---------------------------------------------------------------------

    def _connection_loop(self) -> None:
        stub = drafter_pb2_grpc.DrafterStub(self._channel)
        generation, backoff = 0, self._initial_backoff_s
        while not self._closed.is_set():
            if not self._wait_until_ready():
                continue
            generation += 1
            answered = self._run_stream(stub, _Stream(generation))
            # A stream that dies before answering anything must not be retried in a tight loop.
            backoff = self._initial_backoff_s if answered else min(backoff * 2, self._max_backoff_s)
            self._closed.wait(0 if answered else backoff)

    def _wait_until_ready(self) -> bool:
        try:
            grpc.channel_ready_future(self._channel).result(timeout=0.5)
            return True
        except grpc.FutureTimeoutError:
            return False
        except Exception:  # noqa: BLE001 - the channel was closed under us
            self._closed.wait(self._initial_backoff_s)
            return False

    def _run_stream(self, stub: drafter_pb2_grpc.DrafterStub, stream: _Stream) -> bool:
        """Runs one stream until it breaks; True if it answered at least once."""
        answered = False
        call = stub.Propose(stream.requests())
        self._stream = stream
        logger.info("drafter stream %d open to %s", stream.generation, self.target)
        try:
            for response in call:
                answered = True
                self._replies.put((stream.generation, response))
        except grpc.RpcError as error:
            if not self._closed.is_set():
                logger.warning("drafter stream to %s broke (%s); decoding without drafts until it "
                               "is back", self.target, error.code())
        finally:
            self._stream = None
            stream.outbox.put(None)  # ends grpc's request-consuming thread
            self._replies.put((stream.generation, _STREAM_ENDED))
        return answered

    def close(self) -> None:
        """Stop the connection thread and close the channel."""
        self._closed.set()
        stream = self._stream
        if stream is not None:
            stream.outbox.put(None)
        self._channel.close()
        self._thread.join(timeout=5)
