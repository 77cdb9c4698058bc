"""`specd up --drafter-addr in-process`: each verifier drafts in its own engine process, no drafter service."""
import json
import subprocess
import sys
import urllib.request

import psutil
import pytest

from support.ports import STACK_PORTS, free_offset, port_is_free
from bench.local_stack import REPO_ROOT

pytestmark = pytest.mark.timeout(300)

PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog."


def complete(http_port: int, k: int) -> dict:
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 32, "temperature": 0, "num_speculative_tokens": k}
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_an_in_process_drafter_drafts_without_a_drafter_service_and_keeps_the_output():
    offset = free_offset()
    gateway_http, drafter_grpc = STACK_PORTS[1] + offset, STACK_PORTS[4] + offset
    argv = [sys.executable, "-m", "specd_cli", "up", "--port-offset", str(offset), "--host", "127.0.0.1",
            "--device", "cpu", "--dtype", "float32", "--drafter-addr", "in-process"]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout.readline() == "specd: ready\n"
        names = [" ".join(child.cmdline()) for child in psutil.Process(process.pid).children()]
        assert len(names) == 2 and not any(" drafter " in name for name in names)  # verifier and gateway only
        assert port_is_free(drafter_grpc)
        plain, drafted = complete(gateway_http, 0), complete(gateway_http, 4)
        assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]
        speculative = drafted["usage"]["speculative"]
        assert speculative["accepted_tokens"] > 0  # the engine's own drafter proposed, and was right
        assert speculative["steps"] < plain["usage"]["speculative"]["steps"]
    finally:
        process.terminate()
        process.wait(timeout=60)
