"""The container images: docker/Dockerfile passes hadolint and every service target runs as non-root.

No Docker engine runs on CI machines, so the images are linted and inspected here, not built.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.helm import REPO_ROOT

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
SERVICE_TARGETS = {"gateway": "gateway", "drafter": "drafter", "verifier": "verifier"}


def stages() -> dict[str, list[str]]:
    """Instructions of each build stage, by stage name (line continuations joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    result, current = {}, None
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            current = words[-1]
            result[current] = [line]
        elif current:
            result[current].append(line)
    return result


def effective(stage: str, instruction: str) -> list[str]:
    """The given instruction lines of a stage, including those of the stages it is built FROM."""
    all_stages = stages()
    lines = all_stages[stage]
    parent = lines[0].split()[1]
    inherited = effective(parent, instruction) if parent in all_stages else []
    return inherited + [line for line in lines[1:] if line.split()[0] == instruction]


def test_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("target, command", SERVICE_TARGETS.items())
def test_each_service_image_runs_its_command_as_non_root(target, command):
    users = effective(target, "USER")
    assert users and users[-1].split()[1] == "10001:10001"
    assert effective(target, "ENTRYPOINT")[-1] == 'ENTRYPOINT ["specd"]'
    assert effective(target, "CMD")[-1] == f'CMD ["{command}"]'


def test_verifier_image_carries_cuda_torch_and_flash_attn():
    verifier_base = stages()["verifier"][0]
    assert "nvidia/cuda:" in verifier_base and "runtime" in verifier_base
    build = " ".join(stages()["cuda-build"])
    assert "download.pytorch.org/whl/${TORCH_CUDA}" in build and "flash-attn==" in build
