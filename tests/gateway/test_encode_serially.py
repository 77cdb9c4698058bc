"""A gateway process encodes a chat prompt's segments on the calling thread: the Rust tokenizer's thread pool, whose
wake-ups cost more CPU than a five-text batch saves, never starts (an operator's TOKENIZERS_PARALLELISM wins)."""
import os
import subprocess
import sys

from bench.local_stack import REPO_ROOT

CODE = """
import os
from gateway.tokenizer import Tokenizer, encode_serially
from specd.default_model import resolve_model_path
encode_serially()
tokenizer = Tokenizer(resolve_model_path("default"))
before = len(os.listdir("/proc/self/task"))
for _ in range(3):
    tokenizer.encode_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to three."}])
print(before, len(os.listdir("/proc/self/task")))
"""


def threads_before_and_after_encoding(env: dict) -> tuple[int, int]:
    environment = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"} | env
    output = subprocess.run([sys.executable, "-c", CODE], cwd=REPO_ROOT, env=environment, capture_output=True,
                            text=True, check=True).stdout.split()
    return int(output[0]), int(output[1])


def test_a_gateway_encodes_a_chat_without_starting_threads():
    before, after = threads_before_and_after_encoding({})
    assert after == before


def test_an_operators_tokenizer_parallelism_wins():
    before, after = threads_before_and_after_encoding({"TOKENIZERS_PARALLELISM": "true"})
    assert after > before  # the pool started: what the first test would see without encode_serially
