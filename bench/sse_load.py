"""A closed-loop load of streaming chat completions over HTTP, from several client processes.

Each client sends requests one after another (`stream: true`, usage included) over its own keep-alive connection, as
an SDK's connection pool does, and times what a user sees: TTFT (send -> first event with text), the gaps between
events (one event per verifier step that emitted text for the request), the whole request, and the usage the last
chunk reports. The clients take the requests from one shared queue, in order, as vLLM's benchmark_serving does with
--max-concurrency: whichever client is free sends the next one, so every client stays busy until the queue is empty
(with a fixed share each, the clients whose requests ran short would sit idle while the rest finished theirs). The
client is a few lines of asyncio over a raw socket, split over processes, so that at 256 clients it is not what
limits the measurement (and it needs no HTTP package on a machine that has none).
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


class Connection:
    """One client's HTTP/1.1 connection to the gateway, opened on first use and again after the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[bytes, dict[bytes, bytes]]:
        """Sends the request; returns the status line and the headers (names lower-cased)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        status, headers = await self.reader.readline(), {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        return status, headers

    async def chunks(self, headers: dict[bytes, bytes]):
        """The response's body, as it arrives: chunk by chunk, or whole with a content-length."""
        if headers.get(b"transfer-encoding") != b"chunked":
            yield await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
            return
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return
            yield data[:-2]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def stream_chat(connection: Connection, body: bytes) -> StreamRecord:
    """One streaming chat completion on `connection`, left open for the next one (unless the server closed it)."""
    record = StreamRecord()
    started = time.perf_counter()
    try:
        status, headers = await connection.post("/v1/chat/completions", body)
        buffer, last = b"", None
        async for data in connection.chunks(headers):
            if b" 200 " not in status:
                record.error = f"{status.decode().strip()}: {data[:200].decode(errors='replace')}"
                continue
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
        if headers.get(b"connection") == b"close":
            connection.close()
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        record.error = f"{type(error).__name__}: {error}"
        connection.close()
    record.latency = time.perf_counter() - started
    return record


async def _clients(host: str, port: int, bodies: list[bytes], clients: int, taken, start_at: float
                   ) -> list[tuple[int, StreamRecord]]:
    await asyncio.sleep(max(0.0, start_at - time.time()))

    def take() -> int | None:  # the next request of the queue shared by every process's clients
        with taken.get_lock():
            index, taken.value = taken.value, taken.value + 1
        return index if index < len(bodies) else None

    async def client() -> list[tuple[int, StreamRecord]]:
        connection, records = Connection(host, port), []
        while (index := take()) is not None:
            records.append((index, await stream_chat(connection, bodies[index])))
        connection.close()
        return records

    per_client = await asyncio.gather(*(client() for _ in range(clients)))
    return [record for records in per_client for record in records]


def _process(host: str, port: int, bodies: list[bytes], clients: int, taken, start_at: float, results) -> None:
    results.send(asyncio.run(_clients(host, port, bodies, clients, taken, start_at)))


def run_load(host: str, port: int, bodies: list[bytes], clients: int,
             processes: int | None = None) -> tuple[list[StreamRecord], float]:
    """Every body once, in order, from one queue that `clients` closed-loop clients take from, spread over up to
    `processes` processes (default: one per 32 clients, at most 8). Returns the records (in the bodies' order) and
    the wall seconds."""
    processes = processes or min(8, -(-clients // 32))
    context = multiprocessing.get_context("fork")
    taken = context.Value("l", 0)
    start_at = time.time() + 0.5
    pipes, workers = [], []
    for p in range(processes):
        receiving, sending = context.Pipe(duplex=False)
        own_clients = clients // processes + (p < clients % processes)
        worker = context.Process(target=_process, args=(host, port, bodies, own_clients, taken, start_at, sending))
        worker.start()
        pipes.append(receiving)
        workers.append(worker)
    records = sorted(record for pipe in pipes for record in pipe.recv())
    wall = max(time.time() - start_at, 1e-9)  # the last result arrives as the last request ends
    for worker in workers:
        worker.join()
    return [record for _, record in records], wall


def chat_body(prompt: str, max_tokens: int, num_speculative_tokens: int | None, model: str = "default") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if num_speculative_tokens is not None:
        body["num_speculative_tokens"] = num_speculative_tokens
    return json.dumps(body).encode()
