"""The gateway's CPU time per streamed token, with no model: a stepped fake verifier (one Serve message every STEP_S
seconds carrying one token for every live request, as a GPU verifier's steps do) behind a real `specd gateway`
process, and CLIENTS closed-loop streaming chat clients (bench/sse_load.py) sending REQUESTS requests of MAX_TOKENS.

    PYTHONPATH=.:tests python tools/gateway_cpu.py
    env: STEP_S=0.005 CLIENTS=64 REQUESTS=256 MAX_TOKENS=128 GATEWAY_PROCESSES=1,
         TRANSPORT=socket (the gateway's --verifier-transport: the fake verifier serves a Serve socket too),
         PYSPY=1 (with py-spy on PATH): also a raw profile of the gateway, thread by thread (PYSPY_S seconds, 5) in
         tools/gateway_cpu.txt,
         GATEWAY_PYTHON_ARGS="-m cProfile -o gateway.prof": the gateway's interpreter options,
         FLOOR=1: instead of the gateway, a bare uvicorn ASGI app sending one fixed chat chunk per request at each
         step, the same events on the same sockets: what any Python ASGI front end pays on this machine

Issue #34's target is <= 25 us of gateway CPU per streamed token at 64 clients (BENCHMARKS.md, round 23).
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import time
import urllib.request

import psutil

from bench.instruction_prompts import instruction_prompts
from bench.sse_load import chat_body, run_load

STEP_S = float(os.environ.get("STEP_S", "0.005"))
CLIENTS = int(os.environ.get("CLIENTS", "64"))
REQUESTS = int(os.environ.get("REQUESTS", "256"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "128"))
PORTS = (18401, 18400, 18402)  # the gateway's gRPC, HTTP and metrics ports


def stepped_verifier(port_pipe) -> None:
    """Serves specd.v1.Verifier: every STEP_S, the next token of README's text for each live request."""
    from transformers import AutoTokenizer

    from specd.default_model import resolve_model_path
    from specd.serving import GrpcServer, ServerConfig
    from specd.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
    from support.scripted_verifier import _columns
    from verifier_service.serve_socket import ServeSocket

    text = AutoTokenizer.from_pretrained(resolve_model_path("default"))(open("README.md").read())["input_ids"]

    def step(live: dict) -> list:
        items = []
        for request_id, entry in list(live.items()):
            request, sent = entry[0], entry[1] + 1
            entry[1] = sent
            last = sent >= request.sampling.max_tokens
            usage = common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=sent, steps=sent)
            message = verifier_pb2.VerifierGenerateResponse(token_ids=[text[(sent + len(request_id)) % len(text)]],
                                                            finish_reason="length" if last else "", usage=usage)
            items.append((request_id, message, None))
            if last:
                live.pop(request_id)
        return items

    class Stepped(verifier_pb2_grpc.VerifierServicer):
        serve_port = 0  # its Serve socket's, once it listens

        async def GetLoad(self, request, context):
            return verifier_pb2.LoadReport(model="default", max_model_len=8192, serve_port=self.serve_port)

        async def Serve(self, request_iterator, context):
            live: dict[str, list] = {}  # request id -> [request, tokens sent]

            async def read() -> None:
                async for message in request_iterator:
                    live.update({start.request.request_id: [start.request, 0] for start in message.starts})
                    for request_id in message.abort_request_ids:
                        live.pop(request_id, None)

            reader = asyncio.create_task(read())
            try:
                while True:
                    await asyncio.sleep(STEP_S)
                    if items := step(live):
                        yield _columns(items)
            finally:
                reader.cancel()

    async def serve() -> None:
        stepped = Stepped()
        server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, grace_seconds=0),
                            service_names=["specd.v1.Verifier"],
                            register=lambda s: verifier_pb2_grpc.add_VerifierServicer_to_server(stepped, s))
        await server.start()
        serve_socket = await ServeSocket(lambda messages: stepped.Serve(messages, None)).start("127.0.0.1", 0, None)
        stepped.serve_port = serve_socket.port
        await server.mark_ready()
        port_pipe.send(server.port)
        await asyncio.Event().wait()

    asyncio.run(serve())


def start_gateway(verifier_port: int) -> subprocess.Popen:
    grpc_port, http_port, metrics_port = PORTS
    gateway = subprocess.Popen(
        [sys.executable, *os.environ.get("GATEWAY_PYTHON_ARGS", "").split(), "-m", "specd_cli", "gateway",
         "--verifier-addr", f"127.0.0.1:{verifier_port}",
         "--host", "127.0.0.1", "--port", str(grpc_port), "--http-port", str(http_port),
         "--metrics-port", str(metrics_port), "--gateway-processes", os.environ.get("GATEWAY_PROCESSES", "1"),
         "--verifier-transport", os.environ.get("TRANSPORT", "socket")],
        stderr=subprocess.DEVNULL)
    wait_healthy()
    return gateway


def wait_healthy() -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORTS[1]}/health", timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the gateway did not become healthy")


def bare_sse_server() -> None:
    """FLOOR=1: uvicorn serving every POST as MAX_TOKENS chat chunks of one token, one per STEP_S tick, then usage."""
    import uvicorn

    event = ('data: {"id": "chatcmpl-%s", "object": "chat.completion.chunk", "created": 1764370000, "model": '
             '"SmolLM2-135M-Instruct", "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": null, '
             '"logprobs": null}], "usage": null}\n\n' % ("0" * 32)).encode()
    last = b'data: {"choices": [], "usage": {"completion_tokens": %d}}\n\ndata: [DONE]\n\n' % MAX_TOKENS
    tick: list[asyncio.Future] = []

    async def ticks() -> None:
        while True:
            await asyncio.sleep(STEP_S)
            if tick:
                tick.pop().set_result(None)

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        if scope["path"] == "/health":
            return await send({"type": "http.response.body", "body": b"ok"})
        for _ in range(MAX_TOKENS):
            if not tick:
                tick.append(asyncio.get_running_loop().create_future())
            await tick[0]
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": last})

    async def serve() -> None:
        asyncio.create_task(ticks())
        await uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=PORTS[1], log_level="warning",
                                           lifespan="off")).serve()

    asyncio.run(serve())


def cpu_seconds(process: psutil.Process) -> float:
    """User + system seconds of `process` and its children (the gateway's worker processes)."""
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def main() -> None:
    context = multiprocessing.get_context("fork")
    if os.environ.get("FLOOR"):
        verifier = gateway = context.Process(target=bare_sse_server, daemon=True)
        gateway.start()
        wait_healthy()
    else:
        receiving, sending = context.Pipe()
        verifier = context.Process(target=stepped_verifier, args=(sending,), daemon=True)
        verifier.start()
        gateway = start_gateway(receiving.recv())
    try:
        prompts = instruction_prompts(16, max_chars=400)
        bodies = [chat_body(prompts[i % len(prompts)], MAX_TOKENS, None) for i in range(REQUESTS)]
        http_port = PORTS[1]
        run_load("127.0.0.1", http_port, bodies[:CLIENTS], CLIENTS)  # warm-up
        process = psutil.Process(gateway.pid)
        spy = None
        if os.environ.get("PYSPY"):
            spy = subprocess.Popen(["py-spy", "record", "-o", "tools/gateway_cpu.txt", "-f", "raw", "-r", "400",
                                    "-p", str(gateway.pid), "--threads", "--nonblocking",
                                    "-d", os.environ.get("PYSPY_S", "5")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = cpu_seconds(process)
        records, wall = run_load("127.0.0.1", http_port, bodies, CLIENTS)
        spent = cpu_seconds(process) - before
        if spy is not None:
            spy.wait()
        tokens = sum(r.completion_tokens for r in records)
        print(f"clients {CLIENTS}, step {STEP_S * 1e3:.1f} ms: {tokens} tokens, {sum(r.events for r in records)} "
              f"events, {sum(1 for r in records if r.error)} errors, {wall:.1f} s, {tokens / wall:,.0f} tok/s, "
              f"gateway CPU {spent / tokens * 1e6:.0f} us/token ({spent / wall:.0%} of a core), "
              f"TTFT p50 {sorted(r.ttft for r in records)[len(records) // 2] * 1e3:.2f} ms")
    finally:
        gateway.terminate()
        if isinstance(gateway, subprocess.Popen):
            gateway.wait()  # its ports are free again for the next run
        verifier.terminate()


if __name__ == "__main__":
    main()
