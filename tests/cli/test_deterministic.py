"""`specd up --deterministic` in bfloat16 on the CPU: instruction prompts over HTTP give the same greedy text with
speculation on, one at a time, as with speculation off, all at once (without the mode 4 of these 8 differ)."""
import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch

from bench.instruction_prompts import instruction_prompts
from bench.local_stack import REPO_ROOT
from support.ports import STACK_PORTS, free_offset
from verifier_service.model.cpu_linear import onednn_linear_enabled

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not onednn_linear_enabled(torch.device("cpu"), torch.bfloat16, upcast=True),
                                 reason="no oneDNN linears here (the mode refuses to start)")]

PROMPTS = instruction_prompts(8, max_chars=600)


def chat(http_port: int, prompt: str, k: int) -> str:
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": 64,
            "temperature": 0, "num_speculative_tokens": k}
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())["choices"][0]["message"]["content"]


def test_the_same_text_with_and_without_speculation_alone_and_together():
    offset = free_offset()
    http_port = STACK_PORTS[1] + offset
    argv = [sys.executable, "-m", "specd_cli", "up", "--port-offset", str(offset), "--host", "127.0.0.1",
            "--device", "cpu", "--dtype", "bfloat16", "--deterministic"]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout.readline() == "specd: ready\n"
        children = [child.cmdline() for child in psutil.Process(process.pid).children()]
        verifiers = [cmdline for cmdline in children if "verifier" in cmdline]
        assert verifiers and all("--deterministic" in cmdline for cmdline in verifiers)
        alone = [chat(http_port, prompt, 6) for prompt in PROMPTS]  # drafts alone: fewer steps than one at a time
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda prompt: chat(http_port, prompt, 0), PROMPTS))
        assert together == alone
    finally:
        process.terminate()
        process.wait(timeout=60)
