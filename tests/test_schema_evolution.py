"""Columns added, renamed and dropped on a table whose newer levels predate the change.

pylance lets a table with a MemWAL add an all-NULL column, rename a column and drop one
(it refuses computed columns and type changes). Generations flushed and WAL entries
logged before the change keep the columns they were written with; a reader matches them
to the base's columns by Lance field id. The oracle is the dict model, changed the way
the columns were; pylance's own LsmScanner (base + flushed generations) agrees with it.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_write import merge_generations

from lsm_model import NS, PK, ModelTable, sort_table

DIM = 4
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("x", pa.float64()),
        pa.field("cat", pa.string()),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
        pa.field("s", pa.struct([("a", pa.int64()), ("b", pa.string())])),
    ]
)


def _unsharded_writer(uri: str) -> Any:
    return lance.dataset(uri).mem_wal_writer(str(uuid.uuid5(NS, "unsharded")), max_memtable_rows=1000)


def _rows(ids: Any, tag: int, schema: pa.Schema, rng: np.random.Generator) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    cols: dict[str, Any] = {
        "id": ids,
        "x": tag + rng.random(len(ids)),
        "x2": tag + rng.random(len(ids)),
        "cat": np.array(["a", "b", "c"])[rng.integers(0, 3, len(ids))],
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(len(ids) * DIM).astype(np.float32)), DIM),
        "y": np.full(len(ids), tag * 10, dtype=np.int64),
        "s": [{"a": tag * 100 + i, "b": f"b{tag}"} for i in range(len(ids))],
    }
    if "s" in schema.names and schema.field("s").type.num_fields == 1:  # after the change: s.a2 only
        cols["s"] = [{"a2": tag * 100 + i} for i in range(len(ids))]
    return pa.table({f.name: cols[f.name] for f in schema}, schema=schema)


def _evolve(t: ModelTable) -> None:
    """Add an all-NULL column ``y``, rename ``x`` to ``x2``, drop ``cat`` and add a new ``cat``,
    rename struct child ``s.a`` to ``s.a2`` and drop ``s.b``."""
    ds = lance.dataset(t.uri)
    ds.add_columns(pa.field("y", pa.int64()))
    ds.alter_columns({"path": "x", "name": "x2"})
    ds.drop_columns(["cat"])
    lance.dataset(t.uri).alter_columns({"path": "s.a", "name": "a2"})
    lance.dataset(t.uri).drop_columns(["s.b"])
    lance.dataset(t.uri).add_columns(pa.field("cat", pa.string()))
    t.schema = lance.dataset(t.uri).schema
    t.ds = lance.dataset(t.uri)
    for row in t.model.values():  # what the evolved columns hold for rows written before
        row["x2"] = row.pop("x")
        row["y"] = None
        row["cat"] = None  # the dropped column's values are not the new column's
        row["s"] = {"a2": row["s"]["a"]}


def build_evolved(uri: str, *, evolve: bool = True) -> ModelTable:
    """Base, a flushed generation per region, then a WAL tail left open; then the columns change."""
    rng = np.random.default_rng(4)
    t = ModelTable(uri, SCHEMA, _rows(np.arange(200), 0, SCHEMA, rng), bucket=("id", 2), max_memtable_rows=1000)
    t.put(_rows(np.r_[0:30, 200:220], 1, SCHEMA, rng))
    t.delete([(k,) for k in range(30, 40)])
    t.flush()
    t.put(_rows(np.r_[20:25, 100:110, 220:225], 2, SCHEMA, rng))  # the WAL tail of writers left open
    t.delete([(k,) for k in range(110, 113)])
    if evolve:
        _evolve(t)
    return t


def _assert_rows(table: mq.Table, t: ModelTable, what: str) -> None:
    names = t.schema.names
    got = sort_table(table.sql("SELECT * FROM t").to_arrow_table(), ["id"])
    assert got.column_names == names, what
    assert got.to_pylist() == sorted(t.model.values(), key=lambda r: r["id"]), what
    assert table.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": len(t.model)}], what
    want = sorted(r["id"] for r in t.model.values() if r["x2"] >= 1.0)
    got_ids = table.sql("SELECT id FROM t WHERE x2 >= 1.0").to_arrow_table().column("id").to_pylist()
    assert sorted(got_ids) == want, f"{what}: filter on the renamed column"
    assert table.sql("SELECT count(*) AS n FROM t WHERE y IS NULL").to_pylist()[0]["n"] == sum(
        r["y"] is None for r in t.model.values()
    ), f"{what}: filter on the added column"
    for k in [0, 5, 22, 35, 105, 111, 150, 210, 222, 500]:
        got_row = table.lookup(k).to_pylist()
        assert got_row == ([t.model[(k,)]] if (k,) in t.model else []), f"{what}: lookup {k}"
    q = np.ones(DIM, dtype=np.float32)
    rows = list(t.model.values())
    d = ((np.array([r["vec"] for r in rows], dtype=np.float32) - q) ** 2).sum(axis=1)
    want_knn = [rows[i]["id"] for i in np.argsort(d, kind="stable")[:7]]
    assert table.nearest("vec", q, k=7).column("id").to_pylist() == want_knn, f"{what}: nearest"


@pytest.fixture()
def evolved(tmp_path: Path) -> Any:
    t = build_evolved(str(tmp_path / "t"))
    yield t
    t.flush()


def test_levels_written_before_the_columns_changed_read_with_the_new_columns(evolved: ModelTable) -> None:
    table = mq.open_table(evolved.uri)
    _assert_rows(table, evolved, "strong read, WAL tail and generations from before the change")
    assert table.explain().count("written before the base's columns changed") == len(evolved.regions())
    # pylance's own reader of the flushed levels agrees on the generations' rows
    scanned = {r["id"]: r for r in evolved.lsm_scanner().to_table().to_pylist()}
    eventual = mq.open_table(evolved.uri, consistency="eventual").sql("SELECT * FROM t").to_pylist()
    assert {r["id"]: r for r in eventual} == scanned


def test_writes_after_the_change_and_merges_of_older_generations(evolved: ModelTable) -> None:
    rng = np.random.default_rng(9)
    evolved.flush()  # the open writers flush their pre-change MemTables
    evolved.put(_rows(np.r_[0:5, 100:103, 300:305], 3, evolved.schema, rng))
    evolved.flush()
    evolved.put(_rows(np.r_[1:3, 301:303], 4, evolved.schema, rng))  # a new WAL tail, new columns
    _assert_rows(mq.open_table(evolved.uri), evolved, "before merging")
    stats = merge_generations(evolved.uri)
    assert set(stats.column("status").to_pylist()) == {"merged"}
    _assert_rows(mq.open_table(evolved.uri), evolved, "after memwal's merger folded every generation in")
    base = sort_table(lance.dataset(evolved.uri).to_table(), ["id"])
    assert base.column_names == evolved.schema.names
    assert base.column("x2").null_count == 0  # the renamed column's old rows kept their values
    assert pa.compute.struct_field(base.column("s"), "a2").null_count == 0


def test_a_refresh_after_the_change_reads_the_new_columns(tmp_path: Path) -> None:
    """A table opened (and its caches filled) before the change sees it on refresh."""
    t = build_evolved(str(tmp_path / "t"), evolve=False)
    try:
        before = mq.open_table(t.uri)
        assert before.lookup(22).column_names == SCHEMA.names
        assert before.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": len(t.model)}]
        before.nearest("vec", np.zeros(DIM), k=3)
        assert before.sql("SELECT * FROM t").to_arrow_table().num_rows == len(t.model)  # columns kept warm
        _evolve(t)
        _assert_rows(before.refresh(), t, "refreshed after the change")
    finally:
        t.flush()


def test_a_refresh_after_a_column_is_dropped_and_added_again_or_renamed(tmp_path: Path) -> None:
    """Dropping a column and adding it again, or renaming columns, keeps the base's data files:
    a refreshed snapshot served the old values from the columns it had decoded (by name)."""
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("a", pa.int64()), pa.field("b", pa.int64())]
    )
    base = pa.table({"id": [1, 2, 3, 4], "a": [10, 20, 30, 40], "b": [1, 2, 3, 4]}, schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("id", 2))
    query = "SELECT id, a, b FROM t ORDER BY id"

    def warm() -> mq.Table:
        table = mq.open_table(t.uri)
        for _ in range(2):  # the second scan reads the decoded columns
            table.sql(query).to_pylist()
        return table

    def want() -> list[dict[str, Any]]:
        return lance.dataset(t.uri).to_table(columns=["id", "a", "b"]).sort_by("id").to_pylist()

    table = warm()
    lance.dataset(t.uri).drop_columns(["b"])
    lance.dataset(t.uri).add_columns(pa.field("b", pa.int64()))  # all NULL, no data file
    refreshed = table.refresh()
    assert [r["b"] for r in want()] == [None] * 4
    assert refreshed.sql(query).to_pylist() == want() and refreshed.sql(query).to_pylist() == want()
    assert refreshed.to_arrow().sort_by("id").select(["id", "a", "b"]).to_pylist() == want()

    table = warm()
    for old, new in (("a", "tmp"), ("b", "a"), ("tmp", "b")):  # swap a and b
        lance.dataset(t.uri).alter_columns({"path": old, "name": new})
    refreshed = table.refresh()
    assert [r["b"] for r in want()] == [10, 20, 30, 40]
    assert refreshed.sql(query).to_pylist() == want() and refreshed.sql(query).to_pylist() == want()


def test_struct_children_are_matched_by_field_id_or_else_by_name() -> None:
    """conform's field-id matching inside structs: renamed, added and dropped children by id;
    children that carry no ids (data from elsewhere) by name; NULL structs stay NULL."""
    from memwal_query.conform import FIELD_ID, by_field_id

    def f(name: str, typ: pa.DataType, i: int | None) -> pa.Field:
        return pa.field(name, typ, metadata={FIELD_ID: str(i).encode()} if i is not None else None)

    target = pa.schema([f("s", pa.struct([f("a2", pa.int64(), 2), f("c", pa.string(), 9)]), 1)])
    with_ids = pa.struct([f("a", pa.int64(), 2), f("b", pa.string(), 3)])
    old = pa.table({"s": pa.array([{"a": 1, "b": "x"}, None], with_ids)}, schema=pa.schema([f("s", with_ids, 1)]))
    assert by_field_id(old, target).to_pylist() == [{"s": {"a2": 1, "c": None}}, {"s": None}]
    no_ids = pa.struct([f("a2", pa.int64(), None), f("c", pa.string(), None)])
    plain = pa.table({"s": pa.array([{"a2": 5, "c": "y"}], no_ids)}, schema=pa.schema([f("s", no_ids, 1)]))
    assert by_field_id(plain, target).to_pylist() == [{"s": {"a2": 5, "c": "y"}}]


@pytest.mark.parametrize("how", ["restore", "version"])
def test_nulls_written_while_a_column_was_nullable_read_after_a_restore_to_not_null(tmp_path: Path, how: str) -> None:
    """``y`` NOT NULL, made nullable, NULLs flushed (unmerged), then the base restored (or opened)
    at the NOT NULL version: every path reads the NULLs, and the merger refuses them by name."""
    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("y", pa.int64(), False)])
    ds = lance.write_dataset(pa.table({"id": np.arange(100), "y": np.arange(100) % 7}, schema=schema), uri)
    ds.initialize_mem_wal(unsharded=True, max_memtable_rows=1000)
    not_null = lance.dataset(uri).version
    lance.dataset(uri).alter_columns({"path": "y", "nullable": True})
    writer = _unsharded_writer(uri)
    writer.put(pa.table({"id": pa.array([1, 2, 3, 200], pa.int64()), "y": pa.array([None] * 4, pa.int64())}))
    writer.close()
    if how == "restore":
        lance.dataset(uri, version=not_null).restore()
        table = mq.open_table(uri)
    else:
        table = mq.open_table(uri, version=not_null)
    assert table.sql("SELECT count(*) AS n FROM t WHERE y IS NULL").to_pylist() == [{"n": 4}]
    assert table.sql("SELECT count(*) AS n FROM t WHERE y IS NOT NULL").to_pylist() == [{"n": 97}]
    assert table.sql("SELECT count(y) AS n FROM t").to_pylist() == [{"n": 97}]
    got = table.to_arrow()
    assert got.schema.field("y").nullable and got.column("y").null_count == 4
    assert not got.schema.field("id").nullable
    assert table.lookup([1, 200]).to_pylist() == [{"id": 1, "y": None}, {"id": 200, "y": None}]
    if how == "restore":
        with pytest.raises(mq.MemWalError, match=r"into .*: 'y' is NOT NULL in the base, but 4 .* hold NULL"):
            merge_generations(uri)
        lance.dataset(uri).alter_columns({"path": "y", "nullable": True})
        merge_generations(uri)
        assert lance.dataset(uri).to_table(filter="y IS NULL").num_rows == 4


def test_engine_errors_keep_a_cause_of_several_lines(tmp_path: Path) -> None:
    """DataFusion's type_coercion error says why on the lines after "caused by" (and a hint)."""
    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("b", pa.binary())])
    lance.write_dataset(pa.table({"id": [1, 2], "b": [b"ab", b"c"]}, schema=schema), uri).initialize_mem_wal(
        unsharded=True
    )
    with pytest.raises(mq.MemWalError) as err:
        mq.open_table(uri).sql("SELECT id FROM t WHERE octet_length(b) = 2").to_arrow_table()
    msg = str(err.value)
    assert "\n" not in msg and "type_coercion (caused by: " in msg and "requires String, but received Binary" in msg
    assert "CAST(column AS VARCHAR)" in msg


def test_a_struct_child_made_nullable_then_restored_reads_its_nulls(tmp_path: Path) -> None:
    """The same for a struct child (``alter_columns`` path ``s.a``): reading the base's rows into
    the declared schema failed ("Can't cast to non-nullable field 'a'")."""
    uri = str(tmp_path / "t")
    st = pa.struct([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.int64())])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("s", st)])
    rows = pa.table({"id": np.arange(10), "s": [{"a": i, "b": i} for i in range(10)]}, schema=schema)
    lance.write_dataset(rows, uri).initialize_mem_wal(unsharded=True, max_memtable_rows=1000)
    not_null = lance.dataset(uri).version
    lance.dataset(uri).alter_columns({"path": "s.a", "nullable": True})
    ds = lance.dataset(uri)
    writer = _unsharded_writer(uri)
    newer = [{"a": None, "b": 5}, {"a": None, "b": 6}]
    writer.put(pa.table({"id": pa.array([1, 20], pa.int64()), "s": pa.array(newer, ds.schema.field("s").type)}))
    writer.close()
    lance.dataset(uri, version=not_null).restore()
    table = mq.open_table(uri)
    assert table.sql("SELECT id FROM t WHERE s['a'] IS NULL ORDER BY id").to_pylist() == [{"id": 1}, {"id": 20}]
    assert table.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 11}]
    assert table.lookup([1, 2]).column("s").to_pylist() == [{"a": None, "b": 5}, {"a": 2, "b": 2}]


def _by_id(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("change", ["rename", "drop_then_take_its_name", "drop_then_add_again"])
def test_struct_children_inside_lists_are_matched_by_field_id(tmp_path: Path, change: str) -> None:
    """``lst: list<struct<p, q>>``, rows in a flushed generation and in a WAL tail, then a child of
    the list's items renamed (``lst.item.p`` -> ``p2``), or ``q`` dropped and ``p`` renamed ``q``,
    or ``q`` dropped and added again: the rows written before read ``p2`` as NULL, or showed the
    dropped ``q`` under its successor (pyarrow's cast matches children by name inside lists), and
    the merger wrote that into the base."""
    uri = str(tmp_path / "t")
    item = pa.struct([pa.field("p", pa.int64()), pa.field("q", pa.int64())])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("lst", pa.list_(item))])

    def rows(ids: list[int]) -> pa.Table:
        return pa.Table.from_pylist(
            [{"id": i, "lst": [{"p": i, "q": -i}, None, {"p": None, "q": 7}]} for i in ids], schema
        )

    lance.write_dataset(rows([1, 2]), uri).initialize_mem_wal(unsharded=True, max_memtable_rows=1000)
    flushed = _unsharded_writer(uri)
    flushed.put(rows([2, 3]))
    flushed.close()
    tail = _unsharded_writer(uri)
    tail.put(pa.Table.from_pylist([{"id": 4, "lst": [{"p": 4, "q": -4}]}, {"id": 5, "lst": None}], schema))
    if change == "rename":
        lance.dataset(uri).alter_columns({"path": "lst.item.p", "name": "p2"})
        new: Any = lambda i: [{"p2": i, "q": -i}, None, {"p2": None, "q": 7}]  # noqa: E731
    elif change == "drop_then_take_its_name":
        lance.dataset(uri).drop_columns(["lst.item.q"])
        lance.dataset(uri).alter_columns({"path": "lst.item.p", "name": "q"})
        new = lambda i: [{"q": i}, None, {"q": None}]  # noqa: E731
    else:  # a new field id under the same name and type: pyarrow's type == ignores field ids
        lance.dataset(uri).drop_columns(["lst.item.q"])
        lance.dataset(uri).add_columns(pa.schema([pa.field("lst", pa.list_(pa.struct([pa.field("q", pa.int64())])))]))
        new = lambda i: [{"p": i, "q": None}, None, {"p": None, "q": None}]  # noqa: E731
    want = [{"id": i, "lst": new(i)} for i in (1, 2, 3)]
    want += [{"id": 4, "lst": new(4)[:1]}, {"id": 5, "lst": None}]
    table = mq.open_table(uri)
    assert _by_id(table.to_arrow()) == want
    assert table.sql("SELECT * FROM t ORDER BY id").to_pylist() == want
    assert table.lookup([3, 4]).to_pylist() == want[2:4]
    assert _by_id(mq.open_table(uri, consistency="eventual").to_arrow()) == want[:3]
    merge_generations(uri)
    assert _by_id(lance.dataset(uri).to_table()) == want[:3]
    tail.close()


@pytest.mark.parametrize("column", ["list", "struct_and_a_rename"])
def test_nested_not_null_made_nullable_then_restored_reads_and_merges(tmp_path: Path, column: str) -> None:
    """A NOT NULL child of a list's items (``lst.item.p``), or of a struct (``s.p``) with another
    column renamed after the restore (the generation is then read through a conformed copy),
    made nullable, NULLs flushed and logged, the base restored to NOT NULL: the list case failed
    every strong read ("Can't cast to non-nullable field 'p'"), eventual reads with a raw
    pyarrow error; the rename case failed every read with Lance's "contained null values"; the
    merger raised pyarrow's error instead of naming the field."""
    uri = str(tmp_path / "t")
    child = pa.struct([pa.field("p", pa.int64(), nullable=False)])
    typ = pa.list_(child) if column == "list" else child
    path = "s.item.p" if column == "list" else "s.p"
    schema = pa.schema([pa.field("id", pa.int64(), False, metadata=PK), pa.field("s", typ), pa.field("x", pa.int64())])

    def value(v: int | None) -> Any:
        return [{"p": v}] if column == "list" else {"p": v}

    lance.write_dataset(pa.Table.from_pylist([{"id": 0, "s": value(0), "x": 0}], schema), uri).initialize_mem_wal(
        unsharded=True, max_memtable_rows=1000
    )
    not_null = lance.dataset(uri).version
    lance.dataset(uri).alter_columns({"path": path, "nullable": True})
    nullable = lance.dataset(uri).schema
    flushed = _unsharded_writer(uri)
    flushed.put(pa.Table.from_pylist([{"id": 1, "s": value(None), "x": 1}], nullable))
    flushed.close()
    tail = _unsharded_writer(uri)
    tail.put(pa.Table.from_pylist([{"id": 2, "s": value(None), "x": 2}], nullable))
    lance.dataset(uri, version=not_null).restore()
    x = "x"
    if column != "list":
        lance.dataset(uri).alter_columns({"path": "x", "name": "x2"})
        x = "x2"
    want = [{"id": i, "s": value(None if i else 0), x: i} for i in range(3)]
    table = mq.open_table(uri)
    assert _by_id(table.to_arrow()) == want
    assert table.lookup([1, 2]).to_pylist() == want[1:]
    assert _by_id(mq.open_table(uri, consistency="eventual").to_arrow()) == want[:2]
    with pytest.raises(mq.MemWalError, match=rf"into .*: '{path}' is NOT NULL in the base, but 1 of"):
        merge_generations(uri)
    lance.dataset(uri).alter_columns({"path": path, "nullable": True})
    merge_generations(uri)
    assert _by_id(lance.dataset(uri).to_table()) == want[:2]
    tail.close()


def test_a_column_renamed_while_a_generation_merges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The merger read a generation's rows with the base's columns once, then committed against
    the base as it found it at each attempt: a rename in between failed the merge with pyarrow's
    KeyError ('Field "x2" does not exist'). The rows are read for the version each attempt commits against."""
    import memwal_write.merger as merger

    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), False, metadata=PK), pa.field("x", pa.int64())])
    lance.write_dataset(pa.table({"id": [1, 2], "x": [10, 20]}, schema=schema), uri).initialize_mem_wal(
        unsharded=True, max_memtable_rows=1000
    )
    writer = _unsharded_writer(uri)
    writer.put(pa.table({"id": [2, 3], "x": [21, 31]}, schema=schema))
    writer.close()
    read = merger._generation_rows

    def rename_after_reading(*args: Any) -> pa.Table:
        rows = read(*args)
        if "x" in lance.dataset(uri).schema.names:
            lance.dataset(uri).alter_columns({"path": "x", "name": "x2"})  # another process, meanwhile
        return rows

    monkeypatch.setattr(merger, "_generation_rows", rename_after_reading)
    merge_generations(uri)
    want = [{"id": 1, "x2": 10}, {"id": 2, "x2": 21}, {"id": 3, "x2": 31}]
    assert _by_id(lance.dataset(uri).to_table()) == want
    assert _by_id(mq.open_table(uri).to_arrow()) == want


def test_rows_in_memory_after_a_column_is_dropped_and_added_again(tmp_path: Path) -> None:
    """A column dropped and added again has the schema it had (not the field): a refresh
    reused the merge of a region whose WAL tail did not change, and a lost generation's rows
    rebuilt from the WAL, both conformed to the old field, showing the dropped values."""
    import shutil

    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("a", pa.int64()), pa.field("b", pa.int64())]
    )
    for lost in (False, True):
        t = ModelTable(str(tmp_path / f"t{lost}"), schema, pa.table({"id": [1], "a": [1], "b": [2]}, schema=schema))
        t.put([{"id": 2, "a": 10, "b": 20}])
        if lost:  # flushed, then its folder gone: rebuilt from the WAL
            t.flush()
            region = t.regions()[0]
            ((_, path),) = t.flushed(region)
            shutil.rmtree(Path(t.uri, "_mem_wal", region, path))
        table = mq.open_table(t.uri)
        assert table.lookup([2]).column("b").to_pylist() == [20]
        lance.dataset(t.uri).drop_columns(["b"])
        lance.dataset(t.uri).add_columns(pa.field("b", pa.int64()))
        refreshed = table.refresh()
        assert refreshed.to_arrow().sort_by("id").column("b").to_pylist() == [None, None], lost
        assert refreshed.lookup([2]).column("b").to_pylist() == [None], lost
        assert refreshed.sql("SELECT count(*) AS n FROM t WHERE b IS NULL").to_pydict()["n"] == [2], lost
        if not lost:
            t.flush()
