"""Damaged tables: every decoder of on-storage bytes, fuzzed with hypothesis.

Inputs are random bytes, truncations, bit flips, splices and field-level mutations of
real files written by pylance (a region manifest, a Lance manifest with its MemWAL
index, a version hint, a WAL entry, a bloom filter, inline region snapshots). Each
file is read through the function a reader uses, from a real table folder; only
:class:`MemWalError` subclasses may escape, with a one-line message naming the file,
and each example must finish within :data:`DEADLINE`.

The quick suite runs :data:`QUICK` examples per decoder; the slow suite runs
``MEMWAL_FUZZ_EXAMPLES`` (default 300) per decoder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lance.file import LanceFileReader

import memwal_query as mq
from memwal_proto import mem_wal_pb2
from memwal_query.errors import MemWalCorruptionError, MemWalError
from memwal_query.format.bloom import read_bloom_filter
from memwal_query.format.decode import bitrev64_name, lance_manifest_file_name
from memwal_query.format.deletions import deleted_offsets
from memwal_query.format.inline_snapshots import decode_inline_snapshots
from memwal_query.format.memwal_index import read_memwal_index
from memwal_query.format.storage import Storage
from memwal_query.format.wal import read_wal_entry, wal_entry_path
from memwal_query.fts.posting_codec import UnsupportedPostings, decode_all, decode_doc_ids
from memwal_query.snapshot import load as _load
from memwal_query.snapshot import manifests as _manifests
from memwal_query.snapshot import memtables as _memtables

from hostile import SCHEMA, Hostile, build_hostile, edit_mem_wal_details, edit_region_manifest, inline_snapshot_bytes

DEADLINE = timedelta(seconds=10)  # a guard against hangs on hostile input (a shared CI machine took 4 s)
QUICK = 30
DEEP = int(os.environ.get("MEMWAL_FUZZ_EXAMPLES", "300"))
REGION = "00000000-0000-4000-8000-000000000001"
DATA_SCHEMA = pa.schema([*SCHEMA, pa.field("_tombstone", pa.bool_())])

# the snapshot loader's pieces these decoders feed (the module was split into a package)
snap = SimpleNamespace(
    _read_region_manifest_version=_manifests._read_region_manifest_version,
    _version_hint=_manifests._version_hint,
    latest_region_manifest=_manifests.latest_region_manifest,
    _read_index=read_memwal_index,
    _inline_regions=_load._inline_regions,
    _conform=_memtables._conform,
)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return build_hostile(tmp_path_factory.mktemp("fuzz-src"))


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Storage:
    """An empty table folder each example writes its one damaged file into."""
    return Storage.open(str(tmp_path_factory.mktemp("fuzz-table")))


def _run(strategy: st.SearchStrategy[bytes], check: Callable[[bytes], None], examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=DEADLINE,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def run(data: bytes) -> None:
        check(data)

    run()


def _only_memwal_errors(fn: Callable[[], object], names: str) -> None:
    try:
        fn()
    except MemWalError as err:
        msg = str(err)
        assert names in msg, msg
        assert "\n" not in msg, msg


# --------------------------------------------------------------------------- #
# Byte-level mutations of a real file
# --------------------------------------------------------------------------- #


def _flip(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for i, bit in flips:
        out[i % len(out)] ^= 1 << bit
    return bytes(out)


def mutated(original: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes, truncations, bit flips and splices of ``original``."""
    n = len(original)
    return st.one_of(
        st.binary(max_size=2 * n + 64),
        st.integers(0, n).map(lambda k: original[:k]),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 7)), min_size=1, max_size=8).map(
            lambda fl: _flip(original, fl)
        ),
        st.tuples(st.integers(0, n), st.integers(0, n), st.binary(max_size=16)).map(
            lambda t: original[: t[0]] + t[2] + original[t[1] :]
        ),
    )


U64 = st.integers(0, (1 << 64) - 1)
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["../../x", "/etc", "s3://b/k", "%2e%2e", "a\x00b", "1e308"]))


# --------------------------------------------------------------------------- #
# Region manifests
# --------------------------------------------------------------------------- #


def _manifest_field_edit(original: bytes) -> st.SearchStrategy[bytes]:
    def apply(edit: tuple[str, Any]) -> bytes:
        field, value = edit
        pb = mem_wal_pb2.ShardManifest()
        pb.ParseFromString(original)
        if field == "path":
            pb.sstables[0].path = value
        elif field == "sst_generation":
            pb.sstables[0].generation = value
        elif field == "shard_id":
            pb.shard_id.uuid = value
        elif field == "status":
            pb.status = value  # type: ignore[assignment]
        else:
            setattr(pb, field, value)
        return pb.SerializeToString()

    ints = st.sampled_from(
        ["version", "writer_epoch", "replay_after_wal_entry_position", "current_generation", "sst_generation"]
    )
    return st.one_of(
        st.tuples(ints, U64),
        st.tuples(st.just("path"), TEXT),
        st.tuples(st.just("shard_id"), st.binary(max_size=20)),
        st.tuples(st.just("status"), st.integers(-(1 << 31), (1 << 31) - 1)),
    ).map(apply)


def _check_region_manifest(storage: Storage) -> Callable[[bytes], None]:
    rel = f"_mem_wal/{REGION}/manifest/{bitrev64_name(1)}.binpb"

    def check(data: bytes) -> None:
        _write(storage, rel, data)
        _only_memwal_errors(lambda: snap._read_region_manifest_version(storage, REGION, 1), storage.child_uri(rel))
        _only_memwal_errors(lambda: snap.latest_region_manifest(storage, REGION), storage.child_uri(rel))

    return check


def _write(storage: Storage, rel: str, data: bytes) -> None:
    path = Path(storage.uri) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _manifest_v1(real: Hostile) -> bytes:
    """The latest region manifest pylance wrote, renumbered as version 1 (it is read as such)."""
    pb = mem_wal_pb2.ShardManifest()
    pb.ParseFromString(real.latest_manifest().read_bytes())
    pb.version = 1
    return pb.SerializeToString()


def _region_manifest_strategy(real: Hostile) -> st.SearchStrategy[bytes]:
    original = _manifest_v1(real)
    return st.one_of(mutated(original), _manifest_field_edit(original))


# --------------------------------------------------------------------------- #
# Version hints
# --------------------------------------------------------------------------- #

JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=10,
)


def _hint_strategy(real: Hostile) -> st.SearchStrategy[bytes]:
    original = (real.region_dir / "manifest" / "version_hint.json").read_bytes()
    return st.one_of(
        mutated(original),
        JSON.map(lambda v: json.dumps({"version": v}).encode()),
        st.sampled_from([b'{"version": 1e308}', b'{"version": -1}', b"[" * 5000, b'{"version": 18446744073709551615}']),
    )


def _check_hint(storage: Storage, caplog: pytest.LogCaptureFixture, real: Hostile) -> Callable[[bytes], None]:
    rel = f"_mem_wal/{REGION}/manifest/version_hint.json"
    _write(storage, f"_mem_wal/{REGION}/manifest/{bitrev64_name(1)}.binpb", _manifest_v1(real))

    def check(data: bytes) -> None:
        _write(storage, rel, data)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="memwal_query"):
            start = snap._version_hint(storage, REGION)
        assert isinstance(start, int) and start >= 1
        assert all(storage.child_uri(rel) in r.getMessage() for r in caplog.records)
        assert snap.latest_region_manifest(storage, REGION) is not None

    return check


# --------------------------------------------------------------------------- #
# Lance manifests with the MemWAL index, inline region snapshots
# --------------------------------------------------------------------------- #


def _details_edit(real: Hostile, inline: bytes) -> st.SearchStrategy[bytes]:
    path = real.base_manifest()

    def apply(edit: tuple[str, Any]) -> bytes:
        field, value = edit
        scratch = path.parent.parent.parent / "scratch.manifest"
        shutil.copy(path, scratch)

        def change(d: mem_wal_pb2.MemWalIndexDetails) -> None:
            if field == "inline_snapshots":
                d.inline_snapshots = value
            elif field == "merged":
                d.compacted_sstables.add(shard_id=mem_wal_pb2.UUID(uuid=value[0]), generation=value[1])
            elif field == "num_shards":
                d.num_shards = value
            else:
                d.sharding_specs[0].fields[0].parameters["num_buckets"] = value

        edit_mem_wal_details(scratch, change)
        return scratch.read_bytes()

    return st.one_of(
        st.tuples(st.just("inline_snapshots"), mutated(inline)),
        st.tuples(st.just("merged"), st.tuples(st.binary(max_size=20), U64)),
        st.tuples(st.just("num_shards"), st.integers(0, (1 << 32) - 1)),
        st.tuples(st.just("num_buckets"), TEXT),
    ).map(apply)


def _check_lance_manifest(storage: Storage) -> Callable[[bytes], None]:
    rel = f"_versions/{lance_manifest_file_name(1)}"

    def read() -> None:
        index = snap._read_index(storage, 1)
        snap._inline_regions(index, storage, 1)

    def check(data: bytes) -> None:
        _write(storage, rel, data)
        _only_memwal_errors(read, storage.uri)

    return check


def _check_inline(data: bytes) -> None:
    _only_memwal_errors(lambda: decode_inline_snapshots(data, where="the-index-file"), "the-index-file")


def _inline_edit(tmp: Path) -> st.SearchStrategy[bytes]:
    ids = st.lists(st.one_of(st.uuids().map(str), TEXT), min_size=0, max_size=4)
    return ids.map(lambda rows: inline_snapshot_bytes(tmp, rows))


# --------------------------------------------------------------------------- #
# WAL entries
# --------------------------------------------------------------------------- #


def _wal_edit(original: bytes) -> st.SearchStrategy[bytes]:
    table = pa.ipc.open_stream(original).read_all()

    def apply(edit: tuple[dict[str, str], bool]) -> bytes:
        meta, drop = edit
        t = table.drop_columns(["v"]) if drop else table
        t = t.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        return bytes(sink.getvalue().to_pybytes())

    keys = st.sampled_from(["generation", "writer_epoch", "fence_sentinel"])
    return st.tuples(st.dictionaries(keys, TEXT | U64.map(str), max_size=3), st.booleans()).map(apply)


def _check_wal(storage: Storage) -> Callable[[bytes], None]:
    rel = wal_entry_path(REGION, 1)

    def read() -> None:
        got = read_wal_entry(storage, REGION, 1)
        if isinstance(got, MemWalError):
            raise got
        if got is not None:
            snap._conform(got.table, DATA_SCHEMA, f"WAL entry {storage.child_uri(rel)}")

    def check(data: bytes) -> None:
        _write(storage, rel, data)
        _only_memwal_errors(read, storage.child_uri(rel))

    return check


# --------------------------------------------------------------------------- #
# Bloom filters
# --------------------------------------------------------------------------- #


def _check_bloom(storage: Storage) -> Callable[[bytes], None]:
    rel = f"_mem_wal/{REGION}/g_gen_1/bloom_filter.bin"

    def read() -> None:
        bloom = read_bloom_filter(storage, rel)
        if bloom is not None:
            bloom.might_contain_keys([(1,), (2**63 - 1,)], ["int64"])

    def check(data: bytes) -> None:
        _write(storage, rel, data)
        _only_memwal_errors(read, storage.child_uri(rel))

    return check


def _bloom_strategy(real: Hostile) -> st.SearchStrategy[bytes]:
    original = real.bloom_files()[0].read_bytes()
    return st.one_of(mutated(original), st.integers(0, 1 << 17).map(bytes))


# --------------------------------------------------------------------------- #
# The tests: quick and deep
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# Deletion files (base fragments' deleted rows, read for the base mask)
# --------------------------------------------------------------------------- #


def _deletion_files(tmp: Path) -> list[tuple[str, bytes]]:
    """Real deletion files pylance wrote: an Arrow array of offsets and a roaring bitmap."""
    ds = lance.write_dataset(pa.table({"id": pa.array(range(20_000), pa.int64())}), str(tmp / "deletions"))
    ds.delete("id % 997 = 0")
    ds = lance.dataset(ds.uri)
    small = ds.get_fragments()[0].metadata.deletion_file
    files = [(small.file_type, Path(ds.uri, small.path(0)).read_bytes())]
    ds.delete("id % 3 = 0")
    big = lance.dataset(ds.uri).get_fragments()[0].metadata.deletion_file
    files.append((big.file_type, Path(ds.uri, big.path(0)).read_bytes()))
    assert {k for k, _ in files} == {"array", "bitmap"}
    return files


def _deletion_case(tmp: Path) -> tuple[st.SearchStrategy[bytes], Callable[[bytes], None]]:
    files = _deletion_files(tmp)
    what = "_deletions/0-9-123.bin"

    def check(data: bytes) -> None:
        for kind, _ in files:
            try:
                got = deleted_offsets(data, kind, what)
            except MemWalError as err:
                assert what in str(err) and "\n" not in str(err), str(err)
            else:  # whatever decodes is a set of row offsets
                assert got.dtype == np.uint64 and bool(np.all(got[1:] > got[:-1]))

    return st.one_of(*(mutated(data) for _, data in files)), check


def _posting_case(tmp: Path) -> tuple[st.SearchStrategy[bytes], Callable[[bytes], None]]:
    """A real posting list (full blocks and a tail) as one blob: block boundaries are kept,
    so mutations hit headers, packed words and varints alike."""
    words = [f"w{i % 7}" if i % 3 else "common" for i in range(1000)]
    ds = lance.write_dataset(pa.table({"id": range(1000), "text": words}), str(tmp / "postings"))
    ds.create_scalar_index("text", "INVERTED")
    index = next(d for d in lance.dataset(ds.uri).describe_indices() if d.name == "text_idx")
    folder = Path(ds.uri, "_indices", str(index.segments[0].uuid))
    postings = LanceFileReader(str(folder / "part_0_invert.lance"), columns=["_posting", "_length"]).read_all()
    table = postings.to_table()
    lengths = table.column("_length").to_pylist()
    tid = int(np.argmax(lengths))
    blocks = table.column("_posting")[tid].values.to_pylist()
    assert len(blocks) > 2 and lengths[tid] % 128  # full blocks and a tail
    cuts = np.cumsum([len(b) for b in blocks])[:-1].tolist()
    whole = decode_doc_ids(table.column("_posting")[tid].values, lengths[tid], 1000)
    assert whole.tolist() == [i for i, w in enumerate(words) if w == "common"]  # the undamaged list decodes
    every = decode_all(table.column("_posting").combine_chunks(), np.array(lengths), 1000)
    assert every[1][every[0] == tid].tolist() == whole.tolist()

    def check(data: bytes) -> None:
        bounds = [0, *(min(c, len(data)) for c in cuts), len(data)]
        arr = pa.array([data[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)], pa.large_binary())
        try:
            got = decode_doc_ids(arr, lengths[tid], 1000)
        except UnsupportedPostings:
            pass
        else:
            assert got.size == lengths[tid] and bool(np.all(got[1:] > got[:-1])) and 0 <= got[0] and got[-1] < 1000
        lists = pa.ListArray.from_arrays(pa.array([0, len(arr)], pa.int32()), arr)
        try:
            tok, doc, freq = decode_all(lists, np.array([lengths[tid]]), 1000)
        except UnsupportedPostings:
            return
        assert tok.size == doc.size == freq.size == lengths[tid] and bool(np.all(doc[1:] > doc[:-1]))

    return mutated(b"".join(blocks)), check


DECODERS = [
    "region_manifest",
    "version_hint",
    "lance_manifest",
    "inline_snapshots",
    "wal_entry",
    "bloom_filter",
    "deletion_file",
    "posting_list",
]


def _case(
    name: str, real: Hostile, storage: Storage, caplog: pytest.LogCaptureFixture, tmp: Path
) -> tuple[st.SearchStrategy[bytes], Callable[[bytes], None]]:
    inline = inline_snapshot_bytes(tmp, [REGION])
    wal = real.wal_files()[0].read_bytes()
    return {
        "region_manifest": lambda: (_region_manifest_strategy(real), _check_region_manifest(storage)),
        "version_hint": lambda: (_hint_strategy(real), _check_hint(storage, caplog, real)),
        "lance_manifest": lambda: (
            st.one_of(mutated(real.base_manifest().read_bytes()), _details_edit(real, inline)),
            _check_lance_manifest(storage),
        ),
        "inline_snapshots": lambda: (st.one_of(mutated(inline), _inline_edit(tmp)), _check_inline),
        "wal_entry": lambda: (st.one_of(mutated(wal), _wal_edit(wal)), _check_wal(storage)),
        "bloom_filter": lambda: (_bloom_strategy(real), _check_bloom(storage)),
        "deletion_file": lambda: _deletion_case(tmp),
        "posting_list": lambda: _posting_case(tmp),
    }[name]()


@pytest.mark.parametrize("decoder", DECODERS)
def test_decoder_fuzz_quick(
    decoder: str, real: Hostile, storage: Storage, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    _run(*_case(decoder, real, storage, caplog, tmp_path), QUICK)


@pytest.mark.slow
@pytest.mark.parametrize("decoder", DECODERS)
def test_decoder_fuzz_deep(
    decoder: str, real: Hostile, storage: Storage, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    _run(*_case(decoder, real, storage, caplog, tmp_path), DEEP)


# --------------------------------------------------------------------------- #
# Whole tables: readers and `memwal verify`
# --------------------------------------------------------------------------- #


@pytest.fixture
def copy(real: Hostile, tmp_path: Path) -> Hostile:
    shutil.copytree(real.root, tmp_path / "c")
    return Hostile(tmp_path / "c", real.region)


def test_huge_version_hint_is_a_warning_for_readers(copy: Hostile, caplog: pytest.LogCaptureFixture) -> None:
    hint = copy.region_dir / "manifest" / "version_hint.json"
    hint.write_text('{"version": 1e308}')
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        assert mq.open_table(str(copy.table)).count_rows() == 25
    assert any(str(hint) in r.getMessage() and "probing from 1" in r.getMessage() for r in caplog.records)


def test_out_of_range_region_manifest_fields_are_manifest_errors(copy: Hostile) -> None:
    for field in ("replay_after_wal_entry_position", "current_generation"):
        original = copy.latest_manifest().read_bytes()

        def edit(pb: mem_wal_pb2.ShardManifest, field: str = field) -> None:
            setattr(pb, field, (1 << 64) - 1)

        edit_region_manifest(copy.latest_manifest(), edit)
        with pytest.raises(mq.ManifestError, match=f"{copy.latest_manifest()}.*outside"):
            mq.open_table(str(copy.table))
        copy.latest_manifest().write_bytes(original)


def test_verify_reports_one_line_per_damaged_file(copy: Hostile, capsys: pytest.CaptureFixture[str]) -> None:
    from memwal_query.cli import main
    from memwal_query.format.decode import decode_region_manifest

    after = decode_region_manifest(copy.latest_manifest().read_bytes()).replay_after_wal_position
    shutil.copy(copy.wal_files()[0], copy.table / wal_entry_path(copy.region, after + 2))  # valid, after a damaged one
    damaged = {
        copy.region_dir / "manifest" / "version_hint.json": b'{"version": 1e308}',
        copy.bloom_files()[-1]: b"\x00" * 33,
        copy.table / wal_entry_path(copy.region, after + 1): b"not arrow",
    }
    for path, data in damaged.items():
        path.write_bytes(data)
    assert main(["verify", str(copy.table)]) == 2
    out = capsys.readouterr().out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == len(damaged), out
    for path in damaged:
        assert sum(str(path) in line for line in problems) == 1, (path, out)


def test_inline_snapshots_that_make_lance_abort_are_corruption_errors(tmp_path: Path) -> None:
    """Lance aborts the process on these (found by the fuzzing above): read in a helper
    process, they are one-line errors naming the file, and the next read works."""
    good = inline_snapshot_bytes(tmp_path, [REGION])
    assert good.count(b"shard_spec_id") == 1
    footer = len(good) - 40  # ..., u32 global buffers, u32 columns, u16 major, u16 minor, "LANC"
    damaged = {
        "a NUL in a field name": good.replace(b"shard_spec_id", b"shard_\x00pec_id"),
        "2^31 global buffers": good[: footer + 24] + (0x7F000001).to_bytes(4, "little") + good[footer + 28 :],
    }
    for what, data in damaged.items():
        with pytest.raises(MemWalError, match="X: inline region snapshots are not a readable Lance file") as err:
            decode_inline_snapshots(data, where="X")
        assert "\n" not in str(err.value), what
        assert [r.region_id for r in decode_inline_snapshots(good)] == [REGION]


def test_a_base_manifest_that_panics_lance_is_a_manifest_error(tmp_path: Path) -> None:
    """Lance's manifest decoder panics on some damaged manifests (pyo3's PanicException, a
    BaseException that ``except Exception`` misses): opening and merging raised it raw."""
    from memwal_query.errors import ManifestError
    from memwal_write import merge_generations, write_arrow

    from lsm_model import PK

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])
    uri = str(tmp_path / "t")
    lance.write_dataset(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=schema), uri).initialize_mem_wal(
        unsharded=True
    )
    write_arrow(uri, pa.table({"id": [3], "v": ["c"]}, schema=schema))
    latest = min((tmp_path / "t" / "_versions").glob("*.manifest"))  # V2 names: the smallest is the newest
    with latest.open("r+b") as f:
        f.write(b"x" * 20)
    for call in (lambda: mq.open_table(uri), lambda: merge_generations(uri)):
        with pytest.raises(ManifestError, match=f"cannot open Lance table at {uri}"):
            call()


_NON_UTF8_NAMES = {
    # not one column of row offsets: its name went into memwal's error message
    "not offsets": (
        b"\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x08\x00\x00\x00\x00\x00\x14\x00\x00\x00"
        b"\x00\x00\x0c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x08\x00"
        b"\x00\x00\x00\x00\x04\x00\x08\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x14\x00\x00\x00\x0c\x00"
        b"\x00\x00\x10\x00\x00\x00\x0f\x00\x04\x00\x00\x00\x00\x00\x10\x00\x00\x00\x18\x00\x00\x00\x00\x00"
        b"\x00\x00\x00\x00\x00\x01\x18\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
        b"\x00\x00\x00\x00\x00\x00\x0e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80"
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
        b"\x00\x00\x00\x00\x00\x00\xa8\x00\x00\x00ARROW1"
    ),
    # one uint32 column: taking the column decoded its name (found in CI)
    "uint32 offsets": (
        b"\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x08\x00\x00\x00\x00\x00\x14\x00\x00\x00"
        b"\x00\x00\x0c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x08\x00"
        b"\x00\x00\x00\x00\x04\x00\x08\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x14\x00\x00\x00\x0c\x00"
        b"\x00\x00\x10\x00\x00\x00\x0f\x00\x04\x00\x00\x00\x00\x00\x10\x00\x00\x00\x18\x00\x00\x00\x00\x00"
        b"\x00\x00\x00\x00\x00\x02\x10\x00\x00\x00\x00\x00\x06\x00\x00\x00\x04\x00\x06\x00\x00\x00 \x00"
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
        b"\x00\x00\x00\x00\x00\x00\xa8\x00\x00\x00ARROW1"
    ),
}


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("not offsets", "not a readable Arrow file|not UTF-8"),
        ("uint32 offsets", "one column of row offsets .*not UTF-8"),
    ],
)
def test_a_deletion_file_whose_column_name_is_not_utf8_is_a_corruption_error(case: str, match: str) -> None:
    """Found by the deep decoder fuzz: an Arrow deletion file whose field name is not UTF-8
    raised pyarrow's UnicodeDecodeError (while memwal wrote its error message; when it took an
    integer column) instead of a MemWalCorruptionError naming the file."""
    with pytest.raises(MemWalCorruptionError, match=match):
        deleted_offsets(_NON_UTF8_NAMES[case], "array", "t/_deletions/1.arrow")
