"""The committed ``memwal_proto`` package matches what ``proto/build.py`` generates."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "memwal_proto"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in {".py", ".pyi"}}


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools is not installed, so proto/build.py cannot run protoc",
)
def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "memwal_proto"
    subprocess.run(
        [sys.executable, str(REPO / "proto" / "build.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    fresh, committed = _files(out), _files(COMMITTED)
    assert sorted(fresh) == sorted(committed), "file list differs: rerun proto/build.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: rerun `python proto/build.py`"


def test_generated_modules_import_as_a_package() -> None:
    from memwal_proto import lance_manifest_pb2, mem_wal_pb2

    assert mem_wal_pb2.ShardManifest.DESCRIPTOR.full_name == "memwal.lance.memwal.ShardManifest"
    assert lance_manifest_pb2.Manifest.DESCRIPTOR.full_name == "memwal.lance.table.Manifest"
