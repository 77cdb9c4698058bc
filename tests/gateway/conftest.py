"""Gateway test fixtures: the default model's real tokenizer, a gateway in front of a scripted verifier, an HTTP client."""
import httpx
import pytest
import pytest_asyncio

from gateway.tokenizer import Tokenizer
from specd.default_model import resolve_model_path
from support.gateway_stack import start_gateway_stack


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer(resolve_model_path("default"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tokenizer):
    stack = await start_gateway_stack(tokenizer)
    yield stack
    await stack.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(stack):
    """An HTTP client of the module's gateway."""
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as client:
        yield client


@pytest.fixture(autouse=True)
def reset_verifier(request):
    """Each test starts from a verifier that streams the whole reply."""
    if "stack" in request.fixturenames:
        verifier = request.getfixturevalue("stack").verifier
        verifier.fail_with = verifier.hold_after_steps = None
        verifier.cancelled.clear()
