"""One request's path through the gateway: validate -> route to a verifier -> detokenize -> stop strings.

Both front ends (gateway/service.py for gRPC, gateway/openai/http.py for HTTP) call this; it knows neither.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from gateway.detokenizer import IncrementalDetokenizer
from gateway.logprobs import LogprobsAligner
from gateway.metrics import GatewayMetrics
from gateway.request import GenerationRequest, TextChunk, Usage, VerifierChunk
from gateway.router import ReplicaPin, Router, UpstreamError
from gateway.stats import RequestStats
from gateway.stop import StopStringMatcher
from gateway.token_text import TokenTexts
from gateway.tokenizer import Tokenizer
from gateway.validation import RequestFields, text_chars, validate, validate_model_name
from specd.serving import MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)

# JSON may spend up to 6 bytes on a byte of text ("\u0001"); the rest of a body is small.
_JSON_BYTES_PER_TEXT_BYTE = 6
_BODY_OVERHEAD_BYTES = 2**20
# Requests with at most this much text are tokenized on the event loop: about 0.1-1 ms of tokenizing (a server core
# / the 2-core development machine), against 0.3-0.5 ms of time to first token for the worker thread's round trip.
INLINE_TEXT_CHARS = 2048


class Pipeline:
    """The gateway's request logic, shared by the gRPC and HTTP front ends."""

    def __init__(self, tokenizer: Tokenizer, router: Router, metrics: GatewayMetrics,
                 model_max_len: int, model_name: str, log_requests: bool = False) -> None:
        """`model_max_len` is the context length used until a verifier reports its own."""
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)  # for logprobs
        self.router = router
        self.metrics = metrics
        self._model_max_len = model_max_len
        self.model_name = model_name
        self.log_requests = log_requests

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Names the HTTP `model` field accepts: the served name, the folder name, and "default"."""
        names = [self.model_name, self.tokenizer.model_path.name, "default"]
        reported = {r.load.model for r in self.router.replicas if r.load.model}
        return tuple(dict.fromkeys([*names, *sorted(reported)]))

    def max_model_len(self) -> int:
        return self.router.max_model_len() or self._model_max_len

    def max_body_bytes(self) -> int:
        """The largest HTTP body worth reading: one holding as much text as the context can (gRPC's
        message cap at most)."""
        text_bytes = self.tokenizer.max_token_bytes * self.max_model_len()
        return min(MAX_MESSAGE_BYTES, _BODY_OVERHEAD_BYTES + _JSON_BYTES_PER_TEXT_BYTE * text_bytes)

    async def validate(self, fields: RequestFields, tenant_key: str = "") -> GenerationRequest:
        """The validated request for `tenant_key` (gateway/tenant.py); raises RequestError naming the bad field.

        Tokenizing a long text runs on a worker thread (the tokenizer releases the GIL), so it does not hold up
        the event loop and every other request on it; a short one runs here, where it costs less than the hop to
        the thread and back (INLINE_TEXT_CHARS)."""
        if text_chars(fields) <= INLINE_TEXT_CHARS:
            request = validate(fields, self.tokenizer, self.max_model_len())
        else:
            request = await asyncio.to_thread(validate, fields, self.tokenizer, self.max_model_len())
        return request.with_sampling(tenant_key=tenant_key)

    async def warm_up(self) -> None:
        """Validates a chat request and a plain prompt once on the worker thread, so that no client's first request
        pays for what happens once per process: compiling the chat template (5 ms on a small CPU, a first request
        through each of several gateway processes 15-30 ms slower than the next), the worker thread's start."""
        requests = [RequestFields(prompt="Hello")]
        if self.tokenizer.has_chat_template:
            requests.append(RequestFields(messages=[{"role": "user", "content": "Hello"}]))
        for fields in requests:
            await asyncio.to_thread(validate, fields, self.tokenizer, self.max_model_len())

    def check_model(self, model: str | None) -> None:
        """Raises RequestError when the HTTP `model` field names a model not served here."""
        validate_model_name(model, self.served_model_names)

    async def generate(self, request: GenerationRequest, deadline: float | None = None,
                       pin: ReplicaPin | None = None) -> AsyncIterator[TextChunk]:
        """Text chunks for `request`; the last has finish_reason and usage. Requests with the same `pin` go to
        the same verifier replica (router.py).

        Raises UpstreamError when no verifier can serve it. Closing the iterator early cancels the
        verifier call.
        """
        stats = RequestStats(prompt_tokens=len(request.prompt_token_ids))
        logprobs = LogprobsAligner(self.token_texts) if request.sampling.logprobs is not None else None
        run = _Run(request, IncrementalDetokenizer(self.tokenizer.backend), stats, logprobs)
        request_id = uuid.uuid4().hex
        seed_reported = False
        try:
            async with aclosing(self.router.generate(request_id, request, deadline, pin)) as chunks:
                stats.dispatched()
                async for chunk in chunks:
                    out = run.step(chunk)
                    if out.finish_reason:
                        stats.finished(out.finish_reason)
                        self._log(request_id, run, out.finish_reason)
                    if out.finish_reason or out.text or out.token_ids:
                        if not seed_reported:  # on the first chunk only (a resumed stream reports it again)
                            out.seed, seed_reported = run.seed, True
                        yield out
                    if out.finish_reason:
                        return
            raise UpstreamError(grpc.StatusCode.INTERNAL, "the verifier stream ended without a finish_reason")
        except UpstreamError as error:
            stats.finished(error_code=error.code.name)
            raise
        except BaseException:  # client gone (GeneratorExit / CancelledError), or its gRPC deadline passed
            if stats.finish_time is None and deadline_passed(deadline):
                stats.finished(error_code=grpc.StatusCode.DEADLINE_EXCEEDED.name)
            elif stats.finish_time is None:
                stats.finished("abort")
            raise
        finally:
            self.metrics.record(stats)

    def _log(self, request_id: str, run: "_Run", finish_reason: str) -> None:
        if self.log_requests:
            logger.info("request %s: prompt %r -> %r (%s)", request_id,
                        self.tokenizer.decode(list(run.request.prompt_token_ids)), run.text, finish_reason)


# A client whose deadline passes cancels the call itself, and it does so before the gateway's own deadline: the
# server's deadline runs from the request's arrival, the client's from its sending. A cancel this close to the
# deadline is the deadline (with 1 ms, one such request in two was counted as a client abort on a busy machine).
DEADLINE_SLACK_S = 0.1


def deadline_passed(deadline: float | None) -> bool:
    """Whether an event-loop time has come, or nearly (DEADLINE_SLACK_S): a handler cancelled then met its deadline."""
    return deadline is not None and asyncio.get_running_loop().time() >= deadline - DEADLINE_SLACK_S


class _Run:
    """The per-request state that turns verifier steps into client text."""

    def __init__(self, request: GenerationRequest, detokenizer: IncrementalDetokenizer,
                 stats: RequestStats, logprobs: LogprobsAligner | None = None) -> None:
        self.request = request
        self.detokenizer = detokenizer
        self.logprobs = logprobs  # None: the request did not ask
        self.stop = StopStringMatcher(request.stop)
        self.stats = stats
        self.usage = Usage(len(request.prompt_token_ids), 0, 0, 0, 0)  # the verifier's counts so far
        self.seed: int | None = None  # as the verifier reported it
        self._sent: list[str] = []  # the text sent so far, piece by piece (joined only when requests are logged)

    def step(self, chunk: VerifierChunk) -> TextChunk:
        """The client's chunk for one verifier step (run for every request at every step: kept lean)."""
        ids = chunk.token_ids
        self.stats.tokens_arrived(len(ids))
        if chunk.seed is not None:
            self.seed = chunk.seed
        self.usage = chunk.usage or self.usage
        pieces = self.detokenizer.pieces(ids)
        text = self.stop.feed("".join(pieces))
        if self.logprobs is not None:
            self.logprobs.add(pieces, chunk.logprobs)
        if self.stop.stopped:
            # The gateway ends the request itself: the verifier's counts so far are its totals.
            out = TextChunk(text, ids, "stop", self.usage, self._logprobs_sent(text, stopped=True))
        elif chunk.finish_reason:
            text += self.stop.flush()
            out = TextChunk(text, ids, chunk.finish_reason, self.usage, self._logprobs_sent(text, finished=True))
        else:
            out = TextChunk(text, ids, logprobs=self._logprobs_sent(text))
        self._sent.append(text)
        return out

    @property
    def text(self) -> str:
        return "".join(self._sent)

    def _logprobs_sent(self, text: str, finished: bool = False, stopped: bool = False) -> list | None:
        if self.logprobs is None:
            return None
        return self.logprobs.sent(text, finished=finished or stopped, stopped=stopped)
