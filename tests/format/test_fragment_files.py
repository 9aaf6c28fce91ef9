"""Fragment columns read straight from Lance data files and deletion files, against Lance's
own scanner on datasets pylance writes (deletions of every shape it stores)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import lance
import numpy as np
import pyarrow as pa
import pytest

from memwal_query.errors import MemWalCorruptionError
from memwal_query.format.deletions import deleted_offsets
from memwal_query.format.fragment_files import read_columns, read_live_columns
from memwal_query.format.storage import Storage
from memwal_query.regionspec.spec import lance_field_ids

N = 100_000


def _dataset(path: Path) -> lance.LanceDataset:
    """Nested columns before the key (field ids do not follow positions), two fragments."""
    ids = np.arange(N, dtype=np.int64)
    t = pa.table(
        {
            "s": pa.StructArray.from_arrays([pa.array(ids % 5), pa.array((ids % 3).astype(str))], ["a", "b"]),
            "tags": pa.array([[str(i % 4)] for i in range(N)]),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 2).astype(np.float32)), 2),
            "id": ids,
            "name": pa.array([f"n{i}" for i in range(N)]),
        }
    )
    return lance.write_dataset(t, str(path), max_rows_per_file=70_000)


def _ids(ds: lance.LanceDataset) -> dict[str, int]:
    return {name: i for i, name in lance_field_ids(ds).items()}


def _lance_live(frag: lance.fragment.LanceFragment, columns: list[str]) -> pa.Table:
    return frag.to_table(columns=columns, with_row_address=True)


def _check_all(ds: lance.LanceDataset, columns: list[str]) -> set[str]:
    """Every fragment read directly equals Lance's read; returns the deletion file kinds seen."""
    storage, kinds = Storage.open(ds.uri), set()
    for frag in ds.get_fragments():
        meta = frag.metadata
        got = read_live_columns(storage, meta, _ids(ds), columns, ds.schema)
        assert got is not None, f"fragment {frag.fragment_id} fell back"
        assert got.equals(_lance_live(frag, columns))
        d = meta.deletion_file
        if d is not None:
            kinds.add(d.file_type)
            data = Path(ds.uri, d.path(frag.fragment_id)).read_bytes()
            live = _lance_live(frag, []).column("_rowaddr").to_numpy() & 0xFFFFFFFF
            want = np.setdiff1d(np.arange(meta.physical_rows), live)
            assert deleted_offsets(data, d.file_type, d.path(frag.fragment_id)).tolist() == want.tolist()
    return kinds


def test_deletions_of_every_shape_read_as_lance_reads_them(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d")
    assert _check_all(ds, ["id", "name"]) == set()  # no deletion file yet
    steps = [
        "id % 997 = 0",  # a few: an Arrow array of offsets
        "id % 7 = 0",  # thousands, scattered: roaring array containers
        "id < 20000 AND id % 3 != 0",  # dense in one 65,536-row span: a bitmap container
        "id >= 75000 AND id < 95000",  # one long run
    ]
    kinds: set[str] = set()
    for pred in steps:
        ds.delete(pred)
        ds = lance.dataset(ds.uri)
        kinds |= _check_all(ds, ["id"])
        kinds |= _check_all(ds, ["name", "id"])
    assert kinds == {"array", "bitmap"}


def test_a_column_added_later_is_read_from_its_own_data_file(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d")
    ds.add_columns({"twice": "id * 2"})
    ds.delete("id % 11 = 0")
    ds = lance.dataset(ds.uri)
    assert all(len(f.metadata.files) == 2 for f in ds.get_fragments())
    _check_all(ds, ["twice"])
    _check_all(ds, ["id"])
    storage = Storage.open(ds.uri)
    frag = ds.get_fragments()[0]
    # two columns from two data files: not one read, Lance reads them
    assert read_live_columns(storage, frag.metadata, _ids(ds), ["id", "twice"]) is None


def test_renamed_columns_are_found_by_field_id(tmp_path: Path) -> None:
    """The file keeps a column's old name: found by field id, a rename (here two names
    swapped) is read as Lance reads it, never as the column that had the name before."""
    ds = _dataset(tmp_path / "d")
    ds.delete("id % 5 = 0")
    ds.alter_columns({"path": "id", "name": "key"}, {"path": "name", "name": "id"})
    ds = lance.dataset(ds.uri)
    assert ds.schema.field("id").type == pa.string()
    _check_all(ds, ["id"])
    _check_all(ds, ["key"])
    _check_all(ds, ["id", "key"])


def test_a_damaged_or_disagreeing_deletion_file_falls_back(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d")
    ds.delete("id % 3 = 0")
    ds = lance.dataset(ds.uri)
    storage = Storage.open(ds.uri)
    first, second = ds.get_fragments()
    path = Path(ds.uri, first.metadata.deletion_file.path(first.fragment_id))
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    assert read_live_columns(storage, first.metadata, _ids(ds), ["id"]) is None
    # a well-formed bitmap deleting other rows than the manifest counts
    other = Path(ds.uri, second.metadata.deletion_file.path(second.fragment_id)).read_bytes()
    path.write_bytes(other)
    assert first.metadata.deletion_file.num_deleted_rows != len(deleted_offsets(other, "bitmap", "x"))
    assert read_live_columns(storage, first.metadata, _ids(ds), ["id"]) is None
    path.unlink()
    assert read_live_columns(storage, first.metadata, _ids(ds), ["id"]) is None
    path.write_bytes(good)
    assert read_live_columns(storage, first.metadata, _ids(ds), ["id"]) is not None


def test_a_damaged_data_file_falls_back(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d")
    storage, frag = Storage.open(ds.uri), ds.get_fragments()[0]
    data = Path(ds.uri, "data", frag.metadata.files[0].path)
    shutil.copy(data, tmp_path / "keep")
    raw = bytearray(data.read_bytes())
    raw[-40:] = bytes(40)  # the footer
    data.write_bytes(bytes(raw))
    assert read_live_columns(storage, frag.metadata, _ids(ds), ["id"]) is None
    data.write_bytes(bytes(raw[: len(raw) // 3]))
    assert read_live_columns(storage, frag.metadata, _ids(ds), ["id"]) is None


def _roaring(containers: list[tuple[int, str, np.ndarray]], runs: bool) -> bytes:
    """A portable roaring bitmap of ``(key, kind, low values)`` containers (kind: array, bitmap, run)."""
    n = len(containers)
    if runs:
        flags = np.packbits(np.array([k == "run" for _, k, _ in containers]), bitorder="little")
        out = struct.pack("<I", 12347 | ((n - 1) << 16)) + flags.tobytes()
    else:
        out = struct.pack("<II", 12346, n)
    out += b"".join(struct.pack("<HH", key, len(low) - 1) for key, _, low in containers)
    if not runs or n >= 4:
        out += bytes(4 * n)  # offsets (not used by the reader)
    for _, kind, low in containers:
        if kind == "run":
            edges = np.flatnonzero(np.diff(low) != 1)
            starts = np.concatenate([[low[0]], low[edges + 1]])
            ends = np.concatenate([low[edges], [low[-1]]])
            out += struct.pack("<H", len(starts))
            out += b"".join(struct.pack("<HH", s, e - s) for s, e in zip(starts, ends, strict=True))
        elif kind == "bitmap":
            bits = np.zeros(65536, np.uint8)
            bits[low] = 1
            out += np.packbits(bits, bitorder="little").tobytes()
        else:
            out += low.astype("<u2").tobytes()
    return out


@pytest.mark.parametrize("layout", [1, 3, 5])
def test_roaring_containers_of_every_kind(layout: int) -> None:
    """Run containers (which Lance may write after optimizing), with and without the offset
    header (it is present from 4 containers), bitmaps and arrays: values are key << 16 | low."""
    rng = np.random.default_rng(layout)
    kinds = ["run", "bitmap", "array", "run", "array"][:layout]
    containers = []
    for i, kind in enumerate(kinds):
        if kind == "run":
            low = np.concatenate([np.arange(10, 500), np.arange(9000, 9003), [65535]])
        elif kind == "bitmap":
            low = np.sort(rng.choice(65536, 5000, replace=False))
        else:
            low = np.sort(rng.choice(65536, 300, replace=False))
        containers.append((3 * i + 1, kind, low.astype(np.int64)))
    want = np.concatenate([(key << 16) + low for key, _, low in containers])
    for runs in [True] if "run" in kinds else [True, False]:
        got = deleted_offsets(_roaring(containers, runs), "bitmap", "_deletions/x.bin")
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    "damage",
    [
        "cookie",
        "truncated",
        "bitmap-cardinality",
        "run-cardinality",
        "unsorted-keys",
        "unsorted-values",
        "arrow",
        "arrow-columns",
    ],
)
def test_malformed_deletion_files_raise_naming_the_file(damage: str) -> None:
    low = np.arange(100, 200)
    containers = [(0, "array", low), (2, "array", low)]
    data = _roaring(containers, runs=False)
    kind = "bitmap"
    if damage == "cookie":
        data = struct.pack("<I", 999) + data[4:]
    elif damage == "truncated":
        data = data[:-3]
    elif damage == "bitmap-cardinality":
        data = _roaring([(0, "bitmap", np.arange(5000))], runs=False)
        data = data[:8] + struct.pack("<HH", 0, 5100) + data[12:]
    elif damage == "run-cardinality":
        data = _roaring([(0, "run", np.arange(50))], runs=True)
        data = data[:5] + struct.pack("<HH", 0, 60) + data[9:]
    elif damage == "unsorted-keys":
        data = _roaring([(2, "array", low), (1, "array", low)], runs=False)
    elif damage == "unsorted-values":
        data = _roaring([(0, "array", low[::-1].copy())], runs=False)
    elif damage == "arrow-columns":  # a readable Arrow file of two columns
        sink = pa.BufferOutputStream()
        t = pa.table({"a": pa.array([1], pa.uint32()), "b": ["x"]})
        with pa.ipc.new_file(sink, t.schema) as w:
            w.write_table(t)
        data, kind = sink.getvalue().to_pybytes(), "array"
    else:
        kind = "array"
    with pytest.raises(MemWalCorruptionError, match="_deletions/7-1-2") as err:
        deleted_offsets(data, kind, "_deletions/7-1-2")
    assert "\n" not in str(err.value)


def test_a_data_file_listing_fields_out_of_column_order_falls_back(tmp_path: Path) -> None:
    """Field ids are matched to file columns by position: a file whose ``column_indices`` are
    not 0, 1, 2, ... is left to Lance (the same file with them in order is read directly)."""
    ds = _dataset(tmp_path / "d")
    storage, meta = Storage.open(ds.uri), ds.get_fragments()[0].metadata
    f = meta.files[0]

    def fragment(order: list[int]) -> SimpleNamespace:
        file = SimpleNamespace(path=f.path, fields=f.fields, column_indices=order, base_id=None)
        return SimpleNamespace(files=[file], physical_rows=meta.physical_rows, deletion_file=None, id=meta.id)

    in_order = list(f.column_indices)
    assert in_order == list(range(len(f.fields)))
    assert read_columns(storage, fragment(in_order), _ids(ds), ["id"], ds.schema) is not None
    assert read_columns(storage, fragment(in_order[::-1]), _ids(ds), ["id"], ds.schema) is None


@pytest.mark.parametrize("version", ["legacy", "2.0", "2.1", "stable"])
def test_every_file_format_version_reads_as_lance_or_falls_back(tmp_path: Path, version: str) -> None:
    """Tables written in older Lance file formats: the direct read equals Lance's or leaves it
    to Lance, never a different answer. Legacy files are not readable by the file reader, and
    2.0 files list a struct's own field id beside its children's (not matched: left to Lance);
    2.1 and later are read directly."""
    ids = np.arange(5000, dtype=np.int64)
    t = pa.table(
        {
            "s": pa.StructArray.from_arrays([pa.array(ids % 5), pa.array((ids % 3).astype(str))], ["a", "b"]),
            "id": ids,
            "name": pa.array([f"n{i}" for i in range(5000)]),
        }
    )
    ds = lance.write_dataset(t, str(tmp_path / "d"), data_storage_version=version)
    ds.delete("id % 7 = 0")
    ds = lance.dataset(ds.uri)
    storage, frag = Storage.open(ds.uri), ds.get_fragments()[0]
    for columns in (["id"], ["name", "id"]):
        got = read_live_columns(storage, frag.metadata, _ids(ds), columns, ds.schema)
        if got is not None:
            assert got.equals(_lance_live(frag, columns)), (version, columns)
        elif version not in ("legacy", "2.0"):
            pytest.fail(f"a {version} file fell back")


@pytest.mark.parametrize(
    ("offsets", "want"),
    [([1, 2, 7], [1, 2, 7]), ([9, 3, 3, 5], [3, 5, 9]), ([4, 4], [4]), ([], [])],
)
def test_arrow_deletion_offsets_come_out_sorted_and_unique(offsets: list[int], want: list[int]) -> None:
    """An Arrow deletion file's offsets are sorted and unique as Lance writes them; others
    (a hand-made file) are sorted and their repeats dropped."""
    sink = pa.BufferOutputStream()
    table = pa.table({"row_id": pa.array(offsets, pa.uint32())})
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    got = deleted_offsets(sink.getvalue().to_pybytes(), "array", "_deletions/1-2-3.arrow")
    assert got.dtype == np.uint64 and got.tolist() == want
