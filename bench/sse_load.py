"""A closed-loop load of streaming chat completions over HTTP, from several client processes.

Each client sends its requests one after another (`stream: true`, usage included) and times what a user sees:
TTFT (send -> first event with text), the gaps between events (one event per verifier step that emitted text for
the request), the whole request, and the usage the last chunk reports. The client is a few lines of asyncio over a
raw socket, split over processes, so that at 256 clients it is not what limits the measurement (and it needs no
HTTP package on a machine that has none).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from dataclasses import dataclass, field


@dataclass
class StreamRecord:
    """One request as its client saw it; times in seconds."""

    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    latency: float = 0.0
    events: int = 0  # events that carried text
    completion_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0
    error: str = ""


async def _read_chunked(reader: asyncio.StreamReader):
    """The body of a chunked HTTP/1.1 response, chunk by chunk."""
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def stream_chat(host: str, port: int, body: bytes) -> StreamRecord:
    record = StreamRecord()
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        status = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        if b" 200 " not in status:
            record.error = status.decode().strip()
            return record
        buffer, last = b"", None
        async for data in _read_chunked(reader):
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                chunk = json.loads(event[6:])
                if "error" in chunk:
                    record.error = chunk["error"].get("message", "error")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    speculative = usage.get("speculative") or {}
                    record.completion_tokens = usage["completion_tokens"]
                    record.draft_tokens = speculative.get("draft_tokens", 0)
                    record.accepted_tokens = speculative.get("accepted_tokens", 0)
                    record.steps = speculative.get("steps", 0)
                if any(choice.get("delta", {}).get("content") for choice in chunk.get("choices", ())):
                    now = time.perf_counter()
                    if last is None:
                        record.ttft = now - started
                    else:
                        record.gaps.append(now - last)
                    last = now
                    record.events += 1
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        record.error = f"{type(error).__name__}: {error}"
    finally:
        writer.close()
        record.latency = time.perf_counter() - started
    return record


async def _clients(host: str, port: int, bodies: list[list[bytes]], start_at: float) -> list[StreamRecord]:
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def client(own: list[bytes]) -> list[StreamRecord]:
        return [await stream_chat(host, port, body) for body in own]

    per_client = await asyncio.gather(*(client(own) for own in bodies))
    return [record for records in per_client for record in records]


def _process(host: str, port: int, bodies: list[list[bytes]], start_at: float, results) -> None:
    results.send(asyncio.run(_clients(host, port, bodies, start_at)))


def run_load(host: str, port: int, bodies: list[bytes], clients: int,
             processes: int | None = None) -> tuple[list[StreamRecord], float]:
    """Every body once, `clients` at a time (client i sends bodies i, i + clients, ...), from up to `processes`
    processes (default: one per 32 clients, at most 8). Returns the records and the wall seconds."""
    processes = processes or min(8, -(-clients // 32))
    per_client = [bodies[i::clients] for i in range(clients)]
    start_at = time.time() + 0.5
    context = multiprocessing.get_context("fork")
    pipes, workers = [], []
    for p in range(processes):
        receiving, sending = context.Pipe(duplex=False)
        worker = context.Process(target=_process, args=(host, port, per_client[p::processes], start_at, sending))
        worker.start()
        pipes.append(receiving)
        workers.append(worker)
    records = [record for pipe in pipes for record in pipe.recv()]
    wall = max(time.time() - start_at, 1e-9)  # the last result arrives as the last request ends
    for worker in workers:
        worker.join()
    return records, wall


def chat_body(prompt: str, max_tokens: int, num_speculative_tokens: int | None, model: str = "default") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if num_speculative_tokens is not None:
        body["num_speculative_tokens"] = num_speculative_tokens
    return json.dumps(body).encode()
