"""Reading an HTTP body: a size cap whatever the framing, media types, JSON that nests too deep, and
every refusal an OpenAI error object counted in specd_request_errors_total."""
import asyncio
import socket

import pytest

pytestmark = pytest.mark.asyncio(loop_scope="session")


def status_after_sending(port: int, head: bytes, body: bytes) -> int:
    """Sends `head` and `body`, leaves the connection open, and waits for the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head + body)
        status_line = connection.makefile("rb").readline()  # a server still reading times out here
    return int(status_line.split()[1])


async def test_a_chunked_body_is_not_read_past_the_cap(stack):
    """One chunk declared far larger than the cap, and a little more than the cap sent: the server must
    answer 413 without waiting for the rest (it used to read chunked bodies to their end)."""
    cap = stack.gateway.pipeline.max_body_bytes()
    before = stack.errors_counted("RESOURCE_EXHAUSTED")
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n" % (1 << 30))
    status = await asyncio.to_thread(status_after_sending, stack.gateway.http_port, head, b" " * (cap + 1))
    assert status == 413
    assert stack.errors_counted("RESOURCE_EXHAUSTED") == before + 1


async def test_a_declared_length_over_the_cap_is_413_before_the_body_is_sent(stack):
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (stack.gateway.pipeline.max_body_bytes() + 1))
    assert await asyncio.to_thread(status_after_sending, stack.gateway.http_port, head, b"{") == 413


async def test_the_cap_is_what_the_context_can_hold_in_json_text(stack, tokenizer):
    context = stack.gateway.pipeline.max_model_len()
    assert stack.gateway.pipeline.max_body_bytes() == 2**20 + 6 * tokenizer.max_token_bytes * context


async def test_media_types_are_case_insensitive(client):
    response = await client.post("/v1/completions", content=b'{"model": "default", "prompt": "Hi"}',
                                 headers={"content-type": "Application/JSON; charset=UTF-8"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("where", [
    "prompt", "stop", "messages", "unknown", "stream_options",
])
@pytest.mark.parametrize("depth", [500, 990, 1000, 100_000])
async def test_deeply_nested_json_is_a_400_never_a_500(client, stack, where, depth):
    nested = "[" * depth + "]" * depth
    path = "/v1/chat/completions" if where == "messages" else "/v1/completions"
    body = ('{"model": "default", "prompt": "Hi", "%s": %s}' % (where, nested) if where != "messages"
            else '{"model": "default", "messages": [{"role": "user", "content": %s}]}' % nested)
    before = stack.errors_counted("INVALID_ARGUMENT")
    response = await client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].split("[")[0] in (where, "body")
    assert stack.errors_counted("INVALID_ARGUMENT") == before + 1
