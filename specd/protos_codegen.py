"""Generates specd/v1/*_pb2*.py from protos/specd/v1/*.proto with grpcio-tools.

Run `make protos` after editing a .proto; tests/test_protos.py fails while the committed code is stale.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PROTO_FILES = sorted(p.relative_to(PROTO_DIR).as_posix() for p in (PROTO_DIR / "specd" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Writes the generated modules under out_dir/specd/v1 and returns their paths."""
    from grpc_tools import protoc
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *PROTO_FILES]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / "specd" / "v1").glob("*_pb2*.py*"))


def main() -> None:
    target = ROOT / "specd" / "v1"
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            (target / path.name).write_bytes(path.read_bytes())
            print(f"wrote {target / path.name}")


if __name__ == "__main__":
    sys.exit(main())
