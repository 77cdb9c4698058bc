"""The committed generated code in specd/v1 matches protos/ (run `make protos` when this fails)."""
from pathlib import Path

from specd import protos_codegen


def test_generated_code_is_current(tmp_path: Path) -> None:
    committed = Path(protos_codegen.__file__).parent / "v1"
    for fresh in protos_codegen.generate(tmp_path):
        assert (committed / fresh.name).read_bytes() == fresh.read_bytes(), (
            f"specd/v1/{fresh.name} is stale: run `make protos`")


def test_every_proto_field_is_documented() -> None:
    for proto in (protos_codegen.PROTO_DIR / "specd" / "v1").glob("*.proto"):
        lines = proto.read_text().splitlines()
        for index, line in enumerate(lines):
            stripped = line.strip()
            is_field = stripped.endswith(";") and "=" in stripped and not stripped.startswith(("syntax", "option"))
            if is_field:
                assert lines[index - 1].strip().startswith("//"), f"{proto.name}:{index + 1} has no comment"
