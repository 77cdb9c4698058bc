"""Arctic Inference's SuffixDecodingCache (arXiv 2411.04975) as a reference drafter for the replay bench.

Built, once, from the `arctic-inference==0.3.0` sdist on PyPI: only its `csrc/suffix_decoding` (C++,
bound with nanobind) and the Python wrapper around it, compiled with CMake and nanobind from PyPI, all
inside the git-ignored `.tools/arctic-inference-0.3.0/`. A benchmark-only reference: specd never imports
it. Needs g++ and, to read the sdist's metadata, torch (in specd's venv).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

from verifier_service.engine.proposer import DraftRequest

VERSION = "0.3.0"
TOOLS = Path(__file__).resolve().parents[1] / ".tools" / f"arctic-inference-{VERSION}"
PACKAGE_FILES = ("arctic_inference/__init__.py", "arctic_inference/suffix_decoding/__init__.py",
                 "arctic_inference/suffix_decoding/cache.py")


def build() -> Path:
    """The folder to put on sys.path for `arctic_inference.suffix_decoding` (built on first use)."""
    package = TOOLS / "python"
    if list((package / "arctic_inference" / "suffix_decoding").glob("_C*.so")):
        return package
    TOOLS.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    # --no-build-isolation: reading the sdist's metadata imports torch, which specd's venv has.
    subprocess.run([*pip, "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                    f"arctic-inference=={VERSION}", "-d", str(TOOLS)], check=True)
    deps = TOOLS / "build-deps"
    subprocess.run([*pip, "install", "--target", str(deps), "cmake", "nanobind"], check=True)
    source = TOOLS / "source"
    with tarfile.open(TOOLS / f"arctic_inference-{VERSION}.tar.gz") as sdist:
        sdist.extractall(source, filter="data")
    root = source / f"arctic_inference-{VERSION}"
    cmake = _cmake_binary(deps)
    env = {"PYTHONPATH": str(deps), "PATH": "/usr/bin:/bin"}
    build_dir = TOOLS / "build"
    subprocess.run([cmake, "-S", root / "csrc" / "suffix_decoding", "-B", build_dir,
                    f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release"], check=True, env=env)
    subprocess.run([cmake, "--build", build_dir, "-j", "2"], check=True, env=env)
    for name in PACKAGE_FILES:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / name, package / name)
    for module in build_dir.glob("_C*.so"):
        shutil.copy(module, package / "arctic_inference" / "suffix_decoding" / module.name)
    return package


def _cmake_binary(deps: Path) -> str:
    code = "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))"
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                          env={"PYTHONPATH": str(deps)}).stdout.strip()


class SuffixDecodingProposer:
    """The engine's Proposer protocol over a SuffixDecodingCache, with its defaults unless told otherwise.

    A request's first sight carries its prompt and the prefill step's token (as the engine asks); the
    prompt goes to the request's own tree, every later token to its response (shared through the
    global tree once `max_cached_requests` != 0).
    """

    def __init__(self, max_tree_depth: int = 64, max_cached_requests: int = -1, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1) -> None:
        sys.path.insert(0, str(build()))
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self._cache = SuffixDecodingCache(max_tree_depth, max_cached_requests)
        self._depth = max_tree_depth
        self._spec = {"max_spec_factor": max_spec_factor, "min_token_prob": min_token_prob}
        self._held: dict[str, int] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, list[int]]:
        drafts = {}
        for request in requests:
            tokens = request.token_ids
            held = self._held.get(request.request_id)
            if held is None:
                self._cache.start_request(request.request_id, list(tokens[:-1]))
                held = len(tokens) - 1
            if len(tokens) > held:
                self._cache.add_active_response(request.request_id, list(tokens[held:]))
                self._held[request.request_id] = len(tokens)
            if request.num_draft_tokens > 0:
                draft = self._cache.speculate(request.request_id, list(tokens[-self._depth:]),
                                              max_spec_tokens=request.num_draft_tokens, **self._spec)
                drafts[request.request_id] = list(draft.token_ids)
        return drafts

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            if self._held.pop(request_id, None) is not None:
                self._cache.stop_request(request_id)
