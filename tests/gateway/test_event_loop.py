"""A long prompt is tokenized off the event loop: other requests on the gateway are not held up by it."""
import asyncio
import time

import httpx
import pytest

from support.gateway_stack import start_gateway_stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_tokenizing_a_long_prompt_leaves_the_event_loop_free(tokenizer):
    # A context large enough that ~2 MB of text must be tokenized (seconds on a CPU) to be judged.
    stack = await start_gateway_stack(tokenizer, max_model_len=2**22)
    try:
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=120) as client:
            body = {"model": "default", "prompt": "x" * 2_000_000, "max_tokens": 1}
            request = asyncio.create_task(client.post("/v1/completions", json=body))
            worst_lag = 0.0
            while not request.done():  # the gateway runs on this loop: its stalls are this loop's
                started = time.perf_counter()
                await asyncio.sleep(0.01)
                worst_lag = max(worst_lag, time.perf_counter() - started - 0.01)
            assert (await request).status_code == 200
        assert worst_lag < 0.5, f"the event loop stalled for {worst_lag:.2f} s"
    finally:
        await stack.stop()
