"""The CPU a gateway spends per received Serve message, whatever it carries: a grpc.aio server streams N
Serve-shaped messages (PER requests, one token each) every STEP seconds; a client reads them with grpc.aio, or
with the sync API on a thread handing each message to its event loop, and its CPU per message is printed.

    PYTHONPATH=. python tools/grpc_message_cost.py        env: STEP=0.005 N=600 PER=16

BENCHMARKS.md round 27: 180-280 us a message on the 2-core development machine, either way.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading

import grpc
import psutil

from specd.v1 import verifier_pb2, verifier_pb2_grpc

STEP, N, PER = float(os.environ.get("STEP", "0.005")), int(os.environ.get("N", "600")), int(os.environ.get("PER", "16"))


def serve(port_pipe) -> None:
    message = verifier_pb2.ServeResponse(
        request_ids=[f"{i:032x}" for i in range(PER)], token_counts=[1] * PER, token_ids=list(range(PER)),
        finish_reasons=[""] * PER, prompt_tokens=[10] * PER, completion_tokens=[5] * PER, draft_tokens=[0] * PER,
        accepted_tokens=[0] * PER, steps=[5] * PER, num_speculative_tokens=[0] * PER)

    class Stepped(verifier_pb2_grpc.VerifierServicer):
        async def Serve(self, request_iterator, context):
            for _ in range(N):
                await asyncio.sleep(STEP)
                yield message

    async def main() -> None:
        server = grpc.aio.server()
        verifier_pb2_grpc.add_VerifierServicer_to_server(Stepped(), server)
        port_pipe.send(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


async def read_with_aio(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Serve()
        await call.write(verifier_pb2.ServeRequest())
        return sum([len(message.request_ids) async for message in call])


async def read_on_a_thread(port: int) -> int:
    loop, received = asyncio.get_running_loop(), []
    done = loop.create_future()

    def read() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            for message in verifier_pb2_grpc.VerifierStub(channel).Serve(iter([verifier_pb2.ServeRequest()])):
                loop.call_soon_threadsafe(received.append, len(message.request_ids))
        loop.call_soon_threadsafe(done.set_result, None)

    threading.Thread(target=read, daemon=True).start()
    await done
    return sum(received)


def main() -> None:
    context = multiprocessing.get_context("fork")
    for name, read in [("grpc.aio", read_with_aio), ("sync on a thread", read_on_a_thread)] * 2:
        receiving, sending = context.Pipe()
        server = context.Process(target=serve, args=(sending,), daemon=True)
        server.start()
        port, me = receiving.recv(), psutil.Process()
        before = sum(me.cpu_times()[:2])
        asyncio.run(read(port))
        spent = sum(me.cpu_times()[:2]) - before
        print(f"{name:>17}: {N} messages of {PER} requests every {STEP * 1e3:.0f} ms, "
              f"client CPU {spent / N * 1e6:.0f} us a message (its channel's set-up included)")
        server.terminate()


if __name__ == "__main__":
    main()
