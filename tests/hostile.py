"""Hostile and damaged tables: a small pylance-written table, a "secret" dataset outside
it, and byte-level edits of the files a reader decodes (shared by the traversal and the
fuzzing tests)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lance
import pyarrow as pa

from memwal_proto import lance_manifest_pb2, mem_wal_pb2
from memwal_query.format.decode import bitrev64_name, lance_manifest_file_name

from lsm_model import PK

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])
SECRET_ROW = {"id": 999, "v": "SECRET"}


@dataclass(frozen=True)
class Hostile:
    """``root/t``: a MemWAL table with one region (two flushed generations and a WAL
    tail); ``root/secret``: a Lance dataset of the same schema that must never be read."""

    root: Path
    region: str

    @property
    def table(self) -> Path:
        return self.root / "t"

    @property
    def secret(self) -> Path:
        return self.root / "secret"

    @property
    def region_dir(self) -> Path:
        return self.table / "_mem_wal" / self.region

    def latest_manifest(self) -> Path:
        files = sorted((self.region_dir / "manifest").glob("*.binpb"), key=lambda p: p.name[::-1])
        return files[-1]

    def manifest_file(self, version: int) -> Path:
        return self.region_dir / "manifest" / f"{bitrev64_name(version)}.binpb"

    def base_manifest(self) -> Path:
        return self.table / "_versions" / lance_manifest_file_name(lance.dataset(str(self.table)).version)

    def wal_files(self) -> list[Path]:
        return sorted((self.region_dir / "wal").glob("*.arrow"), key=lambda p: p.name[::-1])

    def bloom_files(self) -> list[Path]:
        return sorted(self.region_dir.glob("*_gen_*/bloom_filter.bin"))


def build_hostile(root: Path) -> Hostile:
    """Write the table and the secret with pylance (about a second)."""
    root.mkdir(parents=True, exist_ok=True)
    lance.write_dataset(pa.Table.from_pylist([SECRET_ROW], schema=SCHEMA), str(root / "secret"))
    uri = str(root / "t")
    ds = lance.write_dataset(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=SCHEMA), uri)
    ds.initialize_mem_wal(unsharded=True, max_memtable_rows=10)
    region = str(uuid.uuid4())
    w = lance.dataset(uri).mem_wal_writer(region, max_memtable_rows=10)
    for i in range(5):  # two flushes of 10 rows, a tail of 5
        w.put(pa.table({"id": list(range(i * 5, i * 5 + 5)), "v": [f"w{i}"] * 5}, schema=SCHEMA))
    w.close()
    return Hostile(root, region)


def edit_region_manifest(path: Path, edit: Callable[[mem_wal_pb2.ShardManifest], None]) -> None:
    """Decode a region manifest written by pylance, apply ``edit``, write it back."""
    pb = mem_wal_pb2.ShardManifest()
    pb.ParseFromString(path.read_bytes())
    edit(pb)
    path.write_bytes(pb.SerializeToString())


def set_generation_path(path: Path, value: str) -> None:
    """Point the first flushed generation of a region manifest at ``value``."""

    def edit(pb: mem_wal_pb2.ShardManifest) -> None:
        pb.sstables[0].path = value

    edit_region_manifest(path, edit)


def _section(data: bytes, offset: int) -> bytes:
    (n,) = struct.unpack_from("<I", data, offset)
    return data[offset + 4 : offset + 4 + n]


def edit_mem_wal_details(path: Path, edit: Callable[[mem_wal_pb2.MemWalIndexDetails], None]) -> None:
    """Rewrite a Lance manifest file with an edited MemWAL index (new sections appended)."""
    data = path.read_bytes()
    pos, major, minor, magic = struct.unpack("<qHH4s", data[-16:])
    manifest = lance_manifest_pb2.Manifest()
    manifest.ParseFromString(_section(data, pos))
    section = lance_manifest_pb2.IndexSection()
    section.ParseFromString(_section(data, manifest.index_section))
    for idx in section.indices:
        if idx.name == "__lance_mem_wal":
            details = mem_wal_pb2.MemWalIndexDetails()
            details.ParseFromString(idx.index_details.value)
            edit(details)
            idx.index_details.value = details.SerializeToString()
    out = bytearray(data[:-16])
    manifest.index_section = len(out)
    body = section.SerializeToString()
    out += struct.pack("<I", len(body)) + body
    new_pos = len(out)
    body = manifest.SerializeToString()
    out += struct.pack("<I", len(body)) + body
    out += struct.pack("<qHH4s", new_pos, major, minor, magic)
    path.write_bytes(bytes(out))


def inline_snapshot_bytes(tmp: Path, region_ids: list[str]) -> bytes:
    """A Lance file of inline region snapshots naming ``region_ids``."""
    from lance.file import LanceFileWriter

    t = pa.table(
        {
            "shard_id": pa.array(region_ids, pa.string()),
            "shard_spec_id": pa.array([1] * len(region_ids), pa.uint32()),
        }
    )
    p = tmp / f"inline-{uuid.uuid4().hex}.lance"
    with LanceFileWriter(str(p), t.schema) as w:
        w.write_batch(t)
    return p.read_bytes()
