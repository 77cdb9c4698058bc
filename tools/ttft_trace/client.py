"""The client of tools/ttft_trace/run.sh: 40 instruction prompts one at a time as streaming chat completions of 4
tokens to the gateway's HTTP port (argv[1]) through bench.sse_load, on one kept-open connection; prints the time to
first token."""
import asyncio
import sys

from bench.instruction_prompts import instruction_prompts
from bench.sse_load import Connection, chat_body, stream_chat


async def main(port: int) -> None:
    times, connection = [], Connection("127.0.0.1", port)  # kept open, as an SDK client keeps it
    for prompt in instruction_prompts(40, max_chars=1200):
        record = await stream_chat(connection, chat_body(prompt, 4, None))
        times.append(record.ttft * 1e3)
        await asyncio.sleep(0.05)
    connection.close()
    warm = sorted(times[5:])
    print(f"client TTFT ms p50 {warm[len(warm) // 2]:.2f} min {warm[0]:.2f} max {warm[-1]:.2f}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
