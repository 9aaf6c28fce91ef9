"""Tests of the pure decoders against tables written by pylance's own writer."""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from lance.mem_wal import CompactedSsTable

from memwal_proto import mem_wal_pb2
from memwal_query.format.decode import (
    MEM_WAL_INDEX_NAME,
    bitrev64_name,
    decode_index_entries,
    decode_lance_manifest,
    decode_mem_wal_index,
    decode_mem_wal_index_details,
    decode_region_manifest,
    lance_manifest_file_name,
    parse_bitrev64_name,
    parse_lance_manifest_file_name,
    parse_lance_manifest_footer,
)

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)


@dataclass(frozen=True)
class Written:
    path: Path
    region: str

    @property
    def region_dir(self) -> Path:
        return self.path / "_mem_wal" / self.region

    def manifest_bytes(self, version: int) -> bytes:
        return (self.path / "_versions" / lance_manifest_file_name(version)).read_bytes()

    def region_manifests(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in (self.region_dir / "manifest").glob("*.binpb")}


def _rows(start: int, n: int, cat: str, amount: float) -> pa.Table:
    return pa.table(
        {"id": list(range(start, start + n)), "cat": [cat] * n, "amount": [amount] * n},
        schema=SCHEMA,
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """Base v1, initialize_mem_wal v2, 3 flushed generations, merge of gen 1 -> v3."""
    path = tmp_path_factory.mktemp("tbl") / "t"
    ds = lance.write_dataset(_rows(0, 1000, "a", 1.0), str(path))
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4, max_memtable_rows=100)
    ds = lance.dataset(str(path))
    region = str(uuid.uuid4())
    w = ds.mem_wal_writer(region, max_memtable_rows=100)
    for s in range(0, 250, 50):
        w.put(_rows(s, 50, "new", 2.0))
    w.delete(pa.table({"id": [3, 4]}))
    w.close()
    return Written(path, region)


@pytest.fixture(scope="module")
def merged(written: Written) -> Written:
    """Merge generation 1 into the base with mark_sstables_as_compacted (v3)."""
    latest = max(
        (decode_region_manifest(b) for b in written.region_manifests().values()),
        key=lambda m: m.version,
    )
    gen1 = next(g for g in latest.flushed_generations if g.generation == 1)
    table = lance.dataset(str(written.region_dir / gen1.path)).to_table()
    ds = lance.dataset(str(written.path))
    (
        ds.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted([CompactedSsTable(written.region, 1)])
        .execute(table.select(SCHEMA.names))
    )
    return written


# --------------------------------------------------------------------------- #
# Region manifests
# --------------------------------------------------------------------------- #


def test_region_manifest_names_are_bitrev64_of_version(written: Written) -> None:
    files = written.region_manifests()
    versions = {}
    for name, data in files.items():
        m = decode_region_manifest(data)
        assert parse_bitrev64_name(name) == m.version
        assert name == bitrev64_name(m.version) + ".binpb"
        versions[m.version] = m
    assert sorted(versions) == list(range(1, len(versions) + 1))
    hint = json.loads((written.region_dir / "manifest" / "version_hint.json").read_text())
    assert hint["version"] == max(versions)


def test_latest_region_manifest(written: Written) -> None:
    ms = sorted(
        (decode_region_manifest(b) for b in written.region_manifests().values()),
        key=lambda m: m.version,
    )
    first, latest = ms[0], ms[-1]
    assert first.version == 1 and first.current_generation == 1
    assert first.flushed_generations == ()
    assert latest.region_id == written.region
    assert latest.spec_id == 1  # pylance's bucket spec id
    assert latest.field_values == ()
    assert latest.sealed is False
    assert latest.writer_epoch >= 1
    gens = latest.flushed_generations
    assert [g.generation for g in gens] == [1, 2, 3]
    assert latest.current_generation == 4
    assert [g.physical_rows for g in gens] == [100, 100, 52]  # 250 puts + 2 tombstones
    for g in gens:
        assert g.path.endswith(f"_gen_{g.generation}")
        assert (written.region_dir / g.path).is_dir()
        assert g.in_memory_bytes > 0 and g.primary_key_bytes > 0
    assert latest.replay_after_wal_position <= latest.wal_position_last_seen


def test_wal_positions_start_at_one(written: Written) -> None:
    positions = sorted(
        p for p in (parse_bitrev64_name(f.name) for f in (written.region_dir / "wal").iterdir()) if p is not None
    )
    assert positions == list(range(1, len(positions) + 1))


def test_flushed_generation_schema_keeps_tombstones(written: Written) -> None:
    latest = max(
        (decode_region_manifest(b) for b in written.region_manifests().values()),
        key=lambda m: m.version,
    )
    gen3 = lance.dataset(str(written.region_dir / latest.flushed_generations[-1].path))
    assert gen3.schema.names == ["id", "cat", "amount", "_tombstone"]
    assert gen3.schema.field("_tombstone").type == pa.bool_()
    assert not gen3.schema.field("_tombstone").nullable
    tomb = gen3.to_table(filter="_tombstone").to_pylist()
    assert tomb == [
        {"id": 3, "cat": None, "amount": None, "_tombstone": True},
        {"id": 4, "cat": None, "amount": None, "_tombstone": True},
    ]


# --------------------------------------------------------------------------- #
# Lance manifests and the MemWAL index
# --------------------------------------------------------------------------- #


def test_lance_manifest_names_and_versions(merged: Written) -> None:
    files = sorted((merged.path / "_versions").glob("*.manifest"))
    assert len(files) == 3
    for f in files:
        data = f.read_bytes()
        info = decode_lance_manifest(data)
        assert parse_lance_manifest_file_name(f.name) == info.version
        assert lance_manifest_file_name(info.version) == f.name
        assert (info.format_major, info.format_minor) == (0, 2)
        assert info.writer_library == "lance"
        assert [(x.name, x.id, x.primary_key) for x in info.fields] == [
            ("id", 0, True),
            ("cat", 1, False),
            ("amount", 2, False),
        ]
        assert parse_lance_manifest_footer(data[-16:])[0] < len(data)


def test_mem_wal_index_absent_before_initialize(written: Written) -> None:
    data = written.manifest_bytes(1)
    assert decode_lance_manifest(data).index_section_offset is None
    assert decode_index_entries(data) == ()
    assert decode_mem_wal_index(data) is None


def test_mem_wal_index_spec(written: Written) -> None:
    data = written.manifest_bytes(2)
    # pylance writes the index section at the start of the file: offset 0 is valid.
    assert decode_lance_manifest(data).index_section_offset == 0
    idx = decode_mem_wal_index(data)
    assert idx is not None
    assert idx.num_regions == 4
    assert idx.inline_snapshots is None
    assert idx.snapshot_ts_millis == 0
    assert len(idx.specs) == 1
    spec = idx.specs[0]
    assert spec.spec_id == 1 and idx.spec(1) is spec and idx.spec(7) is None
    (f,) = spec.fields
    assert (f.transform, f.expression, f.result_type) == ("bucket", None, "int32")
    assert f.source_ids == (0,)  # Lance field id of "id"
    assert dict(f.parameters) == {"num_buckets": "4"}
    assert idx.merged_generations == ()
    assert idx.merged_generation(written.region) == 0
    assert idx.maintained_indexes == ()
    assert idx.maintain_all_indexes is True
    assert idx.writer_config_defaults["max_memtable_rows"] == "100"
    # Same spec as pylance's own reader reports.
    ref = lance.dataset(str(written.path), version=2).mem_wal_index_details()
    assert ref is not None
    (ref_spec,) = ref["sharding_specs"]
    assert ref_spec["spec_id"] == spec.spec_id
    assert ref_spec["fields"][0]["parameters"] == dict(f.parameters)
    assert ref["num_shards"] == idx.num_regions
    assert ref["writer_config_defaults"] == dict(idx.writer_config_defaults)


def test_mark_sstables_as_compacted_is_decoded(merged: Written) -> None:
    data = merged.manifest_bytes(3)
    idx = decode_mem_wal_index(data)
    assert idx is not None
    assert [(m.region_id, m.generation) for m in idx.merged_generations] == [(merged.region, 1)]
    assert idx.merged_generation(merged.region) == 1
    assert idx.merged_generation(merged.region.upper()) == 1
    assert idx.merged_generation(str(uuid.uuid4())) == 0
    assert idx.index_catchup == ()
    (entry,) = decode_index_entries(data)
    assert entry.name == MEM_WAL_INDEX_NAME
    assert entry.fields == ()
    assert entry.type_url == "/lance.table.MemWalIndexDetails"
    assert decode_mem_wal_index_details(entry.details) == idx
    # The older version still has no merge progress.
    old = decode_mem_wal_index(merged.manifest_bytes(2))
    assert old is not None and old.merged_generation(merged.region) == 0


def test_other_index_entries_and_identity_spec(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    lance.write_dataset(_rows(0, 100, "x", 1.0), path)
    ds = lance.write_dataset(_rows(100, 100, "y", 1.0), path, mode="append")
    ds.create_scalar_index("cat", "BTREE", name="cat_idx")
    lance.dataset(path).initialize_mem_wal(identity_column="cat", maintained_indexes=["cat_idx"])
    ds = lance.dataset(path)
    data = (Path(path) / "_versions" / lance_manifest_file_name(ds.version)).read_bytes()
    entries = {e.name: e for e in decode_index_entries(data)}
    assert set(entries) == {"cat_idx", MEM_WAL_INDEX_NAME}
    btree = entries["cat_idx"]
    assert btree.fields == (1,)
    assert btree.type_url == "/lance.table.BTreeIndexDetails"
    # Same uuid / version / fragments as pylance's own index listing.
    ref = {d.name: d for d in ds.describe_indices()}["cat_idx"]
    (seg,) = ref.segments
    assert btree.fields == tuple(ref.fields)
    assert btree.type_url == ref.type_url
    assert btree.uuid == str(seg.uuid)
    assert btree.dataset_version == seg.dataset_version_at_last_update
    assert sorted(seg.fragment_ids) == [0, 1]
    # Portable 32-bit Roaring bitmap (cookie 12346 = b":0") holding fragments {0, 1}.
    assert btree.fragment_bitmap[:2] == b":0"
    assert len(btree.fragment_bitmap) > 8
    idx = decode_mem_wal_index(data)
    assert idx is not None
    assert idx.maintained_indexes == ("cat_idx",)
    assert idx.maintain_all_indexes is False
    assert idx.num_regions == 0
    (f,) = idx.specs[0].fields
    assert (f.transform, f.result_type, f.source_ids) == ("identity", "utf8", (1,))
    assert dict(f.parameters) == {}


# --------------------------------------------------------------------------- #
# Malformed input
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda b: b[:-1], id="truncated-footer"),
        pytest.param(lambda b: b[:10], id="shorter-than-footer"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b[:-4] + b"LANX", id="bad-magic"),
        pytest.param(lambda b: b[-16:], id="only-footer"),
        pytest.param(
            lambda b: b[:-16] + struct.pack("<qHH", len(b) + 5, 0, 2) + b"LANC",
            id="position-past-end",
        ),
        pytest.param(
            lambda b: b[:-16] + struct.pack("<qHH", -1, 0, 2) + b"LANC",
            id="negative-position",
        ),
        pytest.param(lambda b: bytes(len(b) - 16) + b[-16:], id="zeroed-body"),
        pytest.param(lambda b: b"\xff" * (len(b) - 16) + b[-16:], id="garbage-body"),
    ],
)
def test_malformed_lance_manifest_raises(written: Written, mangle: object) -> None:
    data = mangle(written.manifest_bytes(2))  # type: ignore[operator]
    for fn in (decode_lance_manifest, decode_mem_wal_index, decode_index_entries):
        with pytest.raises(ValueError):
            fn(data)


def test_index_section_length_past_end_raises(written: Written) -> None:
    data = written.manifest_bytes(2)
    assert decode_lance_manifest(data).index_section_offset == 0
    # The index section sits at offset 0: make its length prefix overrun the file.
    bogus = struct.pack("<I", len(data) * 2) + data[4:]
    with pytest.raises(ValueError, match="past the end"):
        decode_mem_wal_index(bogus)
    with pytest.raises(ValueError, match="past the end"):
        decode_index_entries(bogus)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xff\xff", id="garbage"),
        pytest.param(b"\x5a\x05\x0a\x03abc", id="bad-uuid-length"),
    ],
)
def test_malformed_region_manifest_raises(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_region_manifest(data)


def test_truncated_region_manifest_raises(written: Written) -> None:
    data = max(written.region_manifests().values(), key=len)
    with pytest.raises(ValueError, match="region manifest"):
        decode_region_manifest(data[:-3])


def test_region_manifest_listing_a_generation_twice_raises(written: Written) -> None:
    """Newest wins by generation number: two flushed generations of one number cannot be ordered."""
    data = max(written.region_manifests().values(), key=lambda b: len(decode_region_manifest(b).flushed_generations))
    pb = mem_wal_pb2.ShardManifest()
    pb.ParseFromString(data)
    assert len(pb.sstables) >= 2
    decode_region_manifest(pb.SerializeToString())  # as written: distinct numbers
    pb.sstables[1].generation = pb.sstables[0].generation
    with pytest.raises(ValueError, match=f"flushed generation {pb.sstables[0].generation} twice"):
        decode_region_manifest(pb.SerializeToString())


def test_garbage_mem_wal_details_raises() -> None:
    with pytest.raises(ValueError, match="MemWAL index details"):
        decode_mem_wal_index_details(b"\xff\xff\xff")


# --------------------------------------------------------------------------- #
# Names
# --------------------------------------------------------------------------- #


def test_bitrev64_names() -> None:
    assert bitrev64_name(0) == "0" * 64
    assert bitrev64_name(1) == "1" + "0" * 63
    assert bitrev64_name(2) == "01" + "0" * 62
    assert bitrev64_name(6) == "011" + "0" * 61
    assert bitrev64_name(2**64 - 1) == "1" * 64
    for n in (0, 1, 2, 3, 12345, 2**63, 2**64 - 1):
        assert parse_bitrev64_name(bitrev64_name(n)) == n
        assert parse_bitrev64_name(bitrev64_name(n) + ".arrow") == n
    for bad in ("", "version_hint.json", "1" * 63, "2" + "0" * 63, "1" * 65 + ".binpb"):
        assert parse_bitrev64_name(bad) is None
    for out in (-1, 2**64):
        with pytest.raises(ValueError):
            bitrev64_name(out)


def test_lance_manifest_file_names() -> None:
    assert lance_manifest_file_name(1) == "18446744073709551614.manifest"
    assert lance_manifest_file_name(0) == "18446744073709551615.manifest"
    assert lance_manifest_file_name(2**64 - 1) == "00000000000000000000.manifest"
    for v in (0, 1, 2, 99, 10**12, 2**64 - 1):
        assert parse_lance_manifest_file_name(lance_manifest_file_name(v)) == v
    assert parse_lance_manifest_file_name("7.manifest") == 7  # V1 scheme
    for bad in ("latest_version_hint.json", "x.manifest", "99999999999999999999.manifest", ".manifest"):
        assert parse_lance_manifest_file_name(bad) is None
    with pytest.raises(ValueError):
        lance_manifest_file_name(-1)
