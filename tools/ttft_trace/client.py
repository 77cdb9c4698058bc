"""The client of tools/ttft_trace/run.sh: 40 instruction prompts one at a time as streaming chat completions of 4
tokens to the gateway's HTTP port (argv[1]); prints the time to first token."""
import http.client
import json
import sys
import time

from bench.instruction_prompts import instruction_prompts


def first_token_ms(port: int, prompt: str) -> float:
    body = json.dumps({"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4,
                       "stream": True})
    connection = http.client.HTTPConnection("127.0.0.1", port)
    began, first = time.monotonic(), None
    connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = connection.getresponse()
    while line := response.readline():
        if first is None and line.startswith(b"data: {") and b'"content"' in line:
            first = time.monotonic()
    connection.close()
    return (first - began) * 1e3


def main() -> None:
    times = []
    for prompt in instruction_prompts(40, max_chars=1200):
        times.append(first_token_ms(int(sys.argv[1]), prompt))
        time.sleep(0.05)
    warm = sorted(times[5:])
    print(f"client TTFT ms p50 {warm[len(warm) // 2]:.2f} min {warm[0]:.2f} max {warm[-1]:.2f}")


if __name__ == "__main__":
    main()
