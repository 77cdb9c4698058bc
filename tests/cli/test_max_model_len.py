"""An explicit --max-model-len that the KV cache cannot hold stops the verifier at start-up with one line and
exit code 2 (issue 16, item 2: SPECD_MAX_MODEL_LEN=8192 used to be served as 5,824 tokens without a word)."""
import subprocess
import sys

from bench.local_stack import REPO_ROOT, free_port


def test_specd_verifier_refuses_a_max_model_len_its_cache_cannot_hold():
    argv = [sys.executable, "-m", "specd_cli", "verifier", "--host", "127.0.0.1", "--device", "cpu",
            "--port", str(free_port()), "--metrics-port", str(free_port()), "--drafter-addr", "none",
            "--max-model-len", "8192"]  # the default 256 MiB CPU cache holds 5,824 tokens of the default model
    result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("specd verifier: --max-model-len 8192 ") and "5824" in line, line
    assert "--kv-cache-bytes" in line
