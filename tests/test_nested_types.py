"""Struct and list-of-struct columns at every level: a NULL struct reads as NULL fields
wherever the row lives, and non-nullable struct children survive lookups, changes and the
merger. Checked against the dict model (expected values computed in Python)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.format.nested import as_schema, with_parent_nulls

from lsm_model import PK, ModelTable

STRUCT = pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("s", STRUCT),
        pa.field("ls", pa.list_(STRUCT)),
    ]
)


def _row(i: int, tag: int) -> dict[str, Any]:
    s = None if (i + tag) % 3 == 0 else {"a": i * 10 + tag, "b": None if i % 4 == 0 else f"b{i}"}
    ls = None if (i + tag) % 5 == 0 else [None if (i + tag) % 2 else {"a": i, "b": "x"}, {"a": tag, "b": None}]
    return {"id": i, "s": s, "ls": ls}


def _field_a(row: dict[str, Any]) -> Any:
    return None if row["s"] is None else row["s"]["a"]


def _first_a(row: dict[str, Any]) -> Any:
    first = row["ls"][0] if row["ls"] else None
    return None if first is None else first["a"]


def test_null_structs_read_as_null_fields_at_every_level(tmp_path: Path) -> None:
    """A WAL entry holds the writer's own batch: pyarrow's from_pylist puts 0 / '' under a
    NULL struct, and DataFusion's s['a'] read it as 0 from a MemTable (NULL once flushed)."""
    t = ModelTable(str(tmp_path / "t"), SCHEMA, pa.Table.from_pylist([_row(i, 0) for i in range(60)], schema=SCHEMA))
    region = "00000000-0000-0000-0000-000000000001"
    t.put([_row(i, 1) for i in range(20, 40)], region=region)
    t.flush()  # a generation
    t.put([_row(i, 2) for i in range(30, 70)], region=region)  # the open writer's MemTable (WAL tail)
    rows = list(t.model.values())
    want_null_a = sorted(r["id"] for r in rows if _field_a(r) is None)
    want_zero_a = sorted(r["id"] for r in rows if _field_a(r) == 0)
    want_first = sorted((r["id"], _first_a(r)) for r in rows if _first_a(r) is not None)
    assert any(r["s"] is None for r in rows if r["id"] >= 60)  # NULL structs in the MemTable
    table = mq.open_table(t.uri)
    for _ in ("cold", "warm"):
        ids = table.sql("SELECT id FROM t WHERE s['a'] IS NULL ORDER BY id").to_pydict()["id"]
        assert ids == want_null_a
        assert table.sql("SELECT id FROM t WHERE s['a'] = 0 ORDER BY id").to_pydict()["id"] == want_zero_a
        got = table.sql("SELECT id, ls[1]['a'] AS a FROM t WHERE ls[1]['a'] IS NOT NULL ORDER BY id").to_pydict()
        assert list(zip(got["id"], got["a"], strict=True)) == want_first
        n = table.sql("SELECT count(s['b']) AS n FROM t").to_pydict()["n"][0]
        assert n == sum(1 for r in rows if r["s"] is not None and r["s"]["b"] is not None)
    reader = table.to_reader(filter="s['a'] = 0").read_all()
    assert sorted(reader.column("id").to_pylist()) == want_zero_a
    t.flush()


def test_non_nullable_struct_child_in_lookups_changes_and_merges(tmp_path: Path) -> None:
    """A NULL struct whose child is declared NOT NULL holds NULL children as Lance reads it;
    pyarrow's cast (to the column's own type) refused it: lookups, changes and the merger failed."""
    st = pa.struct([pa.field("a", pa.int32(), nullable=False)])
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("n", pa.int32(), nullable=False),
            pa.field("s", st),
        ]
    )
    base = pa.Table.from_pylist([{"id": 1, "n": 0, "s": None}, {"id": 2, "n": 0, "s": {"a": 5}}], schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("id", 2))
    token = mq.open_table(t.uri).change_token
    t.put([{"id": 11, "n": 1, "s": None}, {"id": 12, "n": 1, "s": {"a": 6}}])
    t.flush()
    t.put([{"id": 21, "n": 2, "s": None}])
    table = mq.open_table(t.uri)
    want = sorted(t.model.values(), key=lambda r: r["id"])
    assert table.lookup([1, 2, 11, 12, 21]).sort_by("id").to_pylist() == want
    changed = table.changes(token).sort_by("id").to_pylist()
    assert [(r["id"], r["s"]) for r in changed] == [(11, None), (12, {"a": 6}), (21, None)]
    t.flush()
    assert t.merge_all({}) >= 1
    assert mq.open_table(t.uri).to_arrow().sort_by("id").to_pylist() == want


def test_helpers_on_sliced_and_nested_arrays() -> None:
    s = pa.StructArray.from_arrays(
        [pa.array([0, 1, 2, 3], pa.int32()), pa.array(["", "x", "", "y"])],
        fields=list(STRUCT),
        mask=pa.array([True, False, True, False]),
    )
    lists = pa.ListArray.from_arrays(pa.array([0, 1, 3, 4]), s)  # [[NULL], [{1,x}, NULL], [{3,y}]]
    table = pa.table({"s": s.slice(1, 3), "ls": lists})
    out = with_parent_nulls(table)
    assert out.column("s").chunk(0).field(0).to_pylist() == [1, None, 3]
    assert out.column("s").to_pylist() == table.column("s").to_pylist()
    assert out.column("ls").chunk(0).values.field(1).to_pylist() == [None, "x", None, "y"]
    assert out.column("ls").to_pylist() == table.column("ls").to_pylist()
    plain = pa.table({"x": [1, 2]})
    assert with_parent_nulls(plain) is plain
    wanted = pa.schema([pa.field("x", pa.int64(), nullable=False)])
    assert as_schema(plain, wanted).schema == wanted and as_schema(plain, wanted).column(0).type == pa.int64()
    assert as_schema(plain, pa.schema([pa.field("x", pa.int32())])).column(0).type == pa.int32()


def test_a_struct_with_a_field_the_table_lacks_is_refused(tmp_path: Path) -> None:
    """An extra top-level column is refused; an extra struct field was dropped without a word."""
    from memwal_write import write_arrow

    base = pa.Table.from_pylist([_row(i, 0) for i in range(6)], schema=SCHEMA)
    t = ModelTable(str(tmp_path / "t"), SCHEMA, base, bucket=("id", 2))
    extra = pa.struct([("a", pa.int32()), ("b", pa.string()), ("secret", pa.string())])
    rows = pa.table({"id": pa.array([1], pa.int64()), "s": pa.array([{"a": 1, "b": "x", "secret": "y"}], extra)})
    with pytest.raises(mq.InvalidArgumentError, match=r"struct field\(s\) \['s.secret'\] are not in the table schema"):
        write_arrow(t.uri, rows)
    nested = pa.list_(extra)
    rows = pa.table({"id": pa.array([1], pa.int64()), "ls": pa.array([[{"a": 1, "b": "x", "secret": "y"}]], nested)})
    with pytest.raises(mq.InvalidArgumentError, match=r"\['ls\[\].secret'\]"):
        write_arrow(t.uri, rows)
    assert mq.open_table(t.uri).to_arrow().sort_by("id").equals(base.sort_by("id"))


def test_a_struct_inside_a_struct_reads_after_a_refresh_cut_its_cached_rows(tmp_path: Path) -> None:
    """A refreshed snapshot hands DataFusion its cached columns cut by the new drop list:
    a slice of a struct with a struct field made DataFusion 54's arrow-rs panic ("end <=
    self.len()") on every SQL query, with or without the cache."""
    inner = pa.struct([("x", pa.float64()), ("y", pa.string())])
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("ss", pa.struct([("inner", inner), ("z", pa.int64())])),
            pa.field("ls", pa.list_(pa.struct([("inner", inner)]))),
        ]
    )

    def rows(ids: range, tag: int) -> list[dict[str, Any]]:
        value = {"x": float(tag), "y": f"y{tag}"}
        return [{"id": i, "ss": {"inner": value, "z": i}, "ls": [{"inner": value}, None]} for i in ids]

    t = ModelTable(str(tmp_path / "t"), schema, pa.Table.from_pylist(rows(range(300), 0), schema=schema))
    region = "00000000-0000-0000-0000-000000000001"
    t.put(rows(range(0, 40), 1), region=region)
    t.flush()
    t.put(rows(range(30, 35), 2), region=region)
    table = mq.open_table(t.uri)
    query = "SELECT id, ss, ls FROM t WHERE ss['z'] >= 0 ORDER BY id"
    for _ in ("cold", "warm"):
        assert table.sql(query).to_arrow_table().to_pylist() == sorted(t.model.values(), key=lambda r: r["id"])
    t.put(rows(range(100, 103), 3), region=region)  # the refreshed drop list cuts base rows out
    table = table.refresh()
    want = sorted(t.model.values(), key=lambda r: r["id"])
    assert table.sql(query).to_arrow_table().to_pylist() == want
    ctx = datafusion.SessionContext()
    table.register(ctx, "u", cache=False)
    assert ctx.sql(query.replace("FROM t", "FROM u")).to_arrow_table().to_pylist() == want
    looked = table.sql("SELECT id, ss FROM memwal_lookup('t', [101, 5]) ORDER BY id").to_arrow_table().to_pylist()
    assert looked == [{"id": r["id"], "ss": r["ss"]} for r in want if r["id"] in (5, 101)]
    t.flush()


def _slice_sensitive_arrays() -> dict[str, pa.Array]:
    point = pa.struct([("x", pa.int32()), ("y", pa.string())])
    rows = [{"x": i, "y": f"y{i}"} for i in range(40)]
    nested = pa.array([{"p": r, "z": r["x"]} for r in rows])
    pairs = pa.array([[r, r] for r in rows], pa.list_(point, 2))
    over_sliced = pa.ListArray.from_arrays(pa.array(range(0, 21), pa.int32()), nested.slice(3, 20))
    held = pa.StructArray.from_arrays([pa.array(range(40), pa.int32()), pairs], names=["k", "f"])
    return {"struct<struct>": nested, "fsl<struct>": pairs, "list over sliced values": over_sliced, "struct<fsl>": held}


@pytest.mark.parametrize("shape", sorted(_slice_sensitive_arrays()))
def test_slices_datafusion_cannot_read_are_copied(shape: str) -> None:
    """DataFusion's arrow-rs panics ("end <= self.len()") on slices of these shapes (a MemTable
    over 8,192 rows reaches it in batches, a refreshed snapshot with cut cached columns)."""
    from memwal_query.scan.arrays import slice_sensitive, unsliced

    arr = _slice_sensitive_arrays()[shape]
    sliced = arr.slice(3, 15)
    batch = pa.record_batch([pa.array(range(15)), sliced], names=["id", "c"])
    assert slice_sensitive(sliced.type)
    copied = unsliced(batch, [1])
    got = datafusion.SessionContext().from_arrow(pa.Table.from_batches([copied])).to_arrow_table()
    assert got.column("c").to_pylist() == sliced.to_pylist()
    assert unsliced(copied, [1]) is copied  # nothing sliced: not copied again
    assert not slice_sensitive(pa.list_(pa.struct([("x", pa.int32())])))  # a list of structs is fine sliced
