"""The gateway's CPU time per streamed token, with no model: a stepped fake verifier (one ServeResponse every STEP_S
seconds carrying one token for every live request, as a GPU verifier's steps do) behind a real `specd gateway`
process, and CLIENTS closed-loop streaming chat clients (bench/sse_load.py) sending REQUESTS requests of MAX_TOKENS.

    PYTHONPATH=.:tests python tools/gateway_cpu.py   # env: STEP_S=0.005 CLIENTS=64 REQUESTS=256 MAX_TOKENS=128 GATEWAY_PROCESSES=1
    PYSPY=1 ... (with py-spy installed)                      # also a 5 s raw profile of the gateway, tools/gateway_cpu.txt

Issue #34's target is <= 25 us of gateway CPU per streamed token at 64 clients (BENCHMARKS.md, round 23).
"""
import asyncio, json, multiprocessing, os, subprocess, sys, time, urllib.request
import psutil

STEP_S = float(os.environ.get("STEP_S", "0.005"))
CLIENTS = int(os.environ.get("CLIENTS", "64"))
REQUESTS = int(os.environ.get("REQUESTS", "256"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "128"))


def fake_verifier(port_pipe):
    import grpc
    from specd.serving import GrpcServer, ServerConfig
    from specd.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
    from support.scripted_verifier import _columns
    from transformers import AutoTokenizer
    from specd.default_model import resolve_model_path
    tok = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    text = open("README.md").read()
    TOKENS = tok(text)["input_ids"][:2000]

    class Stepped(verifier_pb2_grpc.VerifierServicer):
        async def GetLoad(self, request, context):
            return verifier_pb2.LoadReport(num_running=0, num_waiting=0, kv_cache_usage=0.0, model="default",
                                           max_model_len=8192)

        async def Serve(self, request_iterator, context):
            live = {}  # request id -> [request, sent]
            async def read():
                async for message in request_iterator:
                    for start in message.starts:
                        live[start.request.request_id] = [start.request, 0]
                    for rid in message.abort_request_ids:
                        live.pop(rid, None)
            reader = asyncio.create_task(read())
            try:
                while True:
                    await asyncio.sleep(STEP_S)
                    items = []
                    for rid, entry in list(live.items()):
                        request, sent = entry
                        limit = request.sampling.max_tokens
                        token = TOKENS[(sent + len(rid)) % len(TOKENS)]
                        sent += 1
                        entry[1] = sent
                        last = sent >= limit
                        usage = common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=sent,
                                                 steps=sent, num_speculative_tokens=0)
                        items.append((rid, verifier_pb2.VerifierGenerateResponse(
                            token_ids=[token], finish_reason="length" if last else "", usage=usage), None))
                        if last:
                            live.pop(rid)
                    if items:
                        yield _columns(items)
            finally:
                reader.cancel()

    async def main():
        server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, grace_seconds=0), service_names=["specd.v1.Verifier"],
                            register=lambda s: verifier_pb2_grpc.add_VerifierServicer_to_server(Stepped(), s))
        await server.start(); await server.mark_ready()
        port_pipe.send(server.port)
        await asyncio.Event().wait()
    asyncio.run(main())


if __name__ == "__main__":
    from bench.sse_load import run_load, chat_body
    from bench.instruction_prompts import instruction_prompts
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe()
    vp = ctx.Process(target=fake_verifier, args=(b,), daemon=True); vp.start()
    vport = a.recv()
    http, grpcp, mport = 18400, 18401, 18402
    gw = subprocess.Popen([sys.executable, "-m", "specd_cli", "gateway", "--verifier-addr", f"127.0.0.1:{vport}",
                           "--host", "127.0.0.1", "--port", str(grpcp), "--http-port", str(http), "--metrics-port", str(mport),
                           "--gateway-processes", os.environ.get("GATEWAY_PROCESSES", "1")], stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=1); break
        except Exception:
            time.sleep(0.2)
    prompts = instruction_prompts(16, max_chars=400)
    bodies = [chat_body(prompts[i % 16], MAX_TOKENS, None) for i in range(REQUESTS)]
    run_load("127.0.0.1", http, bodies[:CLIENTS], CLIENTS)  # warm-up
    proc = psutil.Process(gw.pid)
    def cpu(): 
        t = proc.cpu_times(); c = sum(sum(x.cpu_times()[:2]) for x in proc.children(recursive=True))
        return t.user + t.system + c
    c0 = cpu()
    if os.environ.get("PYSPY"):
        spy = subprocess.Popen(["py-spy", "record", "-o", "tools/gateway_cpu.txt", "-f", "raw", "-p", str(gw.pid), "-r", "200", "--nonblocking", "-d", "5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records, wall = run_load("127.0.0.1", http, bodies, CLIENTS)
    c1 = cpu()
    if os.environ.get("PYSPY"):
        spy.wait()
    tokens = sum(r.completion_tokens for r in records)
    events = sum(r.events for r in records)
    errors = sum(1 for r in records if r.error)
    print(f"clients {CLIENTS} step {STEP_S*1e3:.1f} ms: {tokens} tokens, {events} events, {errors} errors, {wall:.1f} s, "
          f"{tokens/wall:.0f} tok/s, gateway CPU {(c1-c0)/tokens*1e6:.0f} us/token ({(c1-c0)/wall*100:.0f}% of a core)")
    gw.terminate(); gw.wait(); vp.terminate()
