"""Streaming the merged table out (issue 23): ``to_reader`` / ``to_stream`` against the dict model.

Tables are written by pylance's writer (newer generations, a merged one, deletes, a live WAL
tail); the oracle is the model's rows (and plain numpy for the key check).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq
from memwal_query.errors import InvalidArgumentError
from memwal_query.merge import ascending_hits

from lsm_model import PK, ModelTable, sort_table


def _model(events: Any, columns: list[str] | None = None, where: pc.Expression | None = None) -> pa.Table:
    t = events.expected()
    if where is not None:
        t = t.filter(where)
    return sort_table(t.select(columns) if columns else t, ["id"] if not columns or "id" in columns else columns)


def _sorted(t: pa.Table) -> pa.Table:
    return sort_table(t, ["id"] if "id" in t.column_names else t.column_names)


def test_reader_streams_the_model_rows(events: Any) -> None:
    table = mq.open_table(events.uri)
    assert any(r.memtable is not None for r in table.snapshot.regions)
    assert any(r.generations for r in table.snapshot.regions)
    reader = table.to_reader()
    assert reader.schema == table.schema
    assert _sorted(reader.read_all()).equals(_model(events))


@pytest.mark.parametrize(
    ("columns", "where"),
    [
        (["amount", "cat"], None),  # the key column not asked for: still masked by key
        (["id", "qty"], pc.field("qty") > 25),
        (["qty", "id"], (pc.field("id") < 900) & (pc.field("cat") == "b")),
        (None, pc.field("amount") >= 1000),  # rows of newer levels only
        (["cat"], pc.field("id") == 7),
    ],
)
def test_reader_projection_and_pyarrow_filter(events: Any, columns: list[str] | None, where: Any) -> None:
    table = mq.open_table(events.uri)
    got = table.to_reader(columns=columns, filter=where).read_all()
    assert got.schema.names == (columns or table.schema.names)
    want = events.expected() if where is None else events.expected().filter(where)
    want = want.select(columns) if columns else want
    assert _sorted(got).equals(_sorted(want))


def test_reader_sql_filter_equals_model_and_sql(events: Any) -> None:
    table = mq.open_table(events.uri)
    got = table.to_reader(columns=["id", "amount"], filter="qty BETWEEN 3 AND 30 AND cat <> 'a'").read_all()
    want = events.expected().filter((pc.field("qty") >= 3) & (pc.field("qty") <= 30) & (pc.field("cat") != "a"))
    assert _sorted(got).equals(_sorted(want.select(["id", "amount"])))
    sql = table.sql("SELECT id, amount FROM t WHERE qty BETWEEN 3 AND 30 AND cat <> 'a'").to_arrow_table()
    assert _sorted(got).to_pylist() == _sorted(sql).to_pylist()


@pytest.mark.parametrize("filt", [pc.field("id") == 7, "id = 7"])
def test_reader_filter_prunes_regions(events: Any, filt: Any) -> None:
    table = mq.open_table(events.uri)
    got = table.to_reader(filter=filt).read_all()
    assert got.to_pylist() == [r for r in events.expected().to_pylist() if r["id"] == 7]
    scan = table.dataset(cache=False).last_scan
    assert scan is not None and len(scan.pruned_regions) == len(table.snapshot.regions) - 1


def test_reader_bad_arguments_raise_memwal_errors(events: Any) -> None:
    table = mq.open_table(events.uri)
    with pytest.raises(InvalidArgumentError, match="nope"):
        table.to_reader(columns=["id", "nope"])
    for read in (table.to_reader, table.to_stream):  # was Lance's ValueError with a Rust source path
        with pytest.raises(InvalidArgumentError, match=r"\['id'\] asked for more than once"):
            read(columns=["id", "qty", "id"], filter="qty > 3")
    with pytest.raises(InvalidArgumentError, match="invalid filter"):
        table.to_reader(filter="no_such_column > 3")
    with pytest.raises(InvalidArgumentError, match="filter must be"):
        table.to_reader(filter=3)  # type: ignore[arg-type]
    # a SQL filter is one expression: nothing after it becomes part of the query
    for tail in ("ORDER BY id LIMIT 1", "UNION ALL SELECT id FROM t", "GROUP BY id HAVING id > 7", "; SELECT 1"):
        with pytest.raises(InvalidArgumentError, match="invalid filter"):
            table.to_reader(columns=["id"], filter=f"qty >= 0 {tail}")


def test_reader_is_one_shot_and_stream_rereads(events: Any) -> None:
    table = mq.open_table(events.uri)
    reader = table.to_reader(columns=["id"])
    first = reader.read_all()
    assert first.num_rows == events.expected().num_rows
    assert reader.read_all().num_rows == 0  # pyarrow's reader: consumed (documented); to_reader() again
    assert table.to_reader(columns=["id"]).read_all().equals(first)
    stream = table.to_stream(columns=["id", "qty"], filter="qty > 25")
    want = sorted(k[0] for k, row in events.model.items() if row["qty"] > 25)
    for _ in range(2):  # DuckDB asks for a new pass per query
        got = duckdb.sql("SELECT id FROM stream ORDER BY id").fetchall()
        assert [r[0] for r in got] == want
    assert sorted(pa.table(stream).column("id").to_pylist()) == want
    assert sum(b.num_rows for b in stream) == len(want)


def test_full_pass_decodes_no_whole_fragment(events: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    table = mq.open_table(events.uri)
    whole: list[object] = []
    real = lance.fragment.LanceFragment.to_table

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        whole.append(kwargs.get("columns"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lance.fragment.LanceFragment, "to_table", counting)
    cache = table.view.cache
    assert _sorted(table.to_reader().read_all()).equals(_model(events))
    assert whole == [] and cache.fragment_columns == {}  # a one-shot pass keeps nothing
    # SQL streams too (no whole-fragment decode) and keeps what it decoded, up to the budget
    some = ["id", "cat", "amount"]
    assert _sorted(table.sql("SELECT id, cat, amount FROM t").to_arrow_table()).equals(_model(events, some))
    kept = sum(a.nbytes for cols in cache.fragment_columns.values() for a in cols.values())
    assert whole == [] and cache.fragment_columns and cache.resident_bytes == kept
    assert _sorted(table.sql("SELECT * FROM t").to_arrow_table()).equals(_model(events))
    assert whole == [] and cache.resident_bytes > kept  # the other columns kept as they streamed
    # later queries of those columns read memory, with the same rows
    assert _sorted(table.sql("SELECT id, cat, amount FROM t").to_arrow_table()).equals(_model(events, some))
    want = _sorted(events.expected().filter(pc.field("amount") > 3).select(some))
    assert _sorted(table.sql("SELECT id, cat, amount FROM t WHERE amount > 3").to_arrow_table()).equals(want)
    assert _sorted(table.to_reader().read_all()).equals(_model(events))
    assert whole == []


def test_sql_full_pass_keeps_within_the_budget(events: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from memwal_query.scan import column_cache

    monkeypatch.setattr(column_cache, "RESIDENT_MAX_BYTES", 30_000)  # a few generations, not the base
    table = mq.open_table(events.uri)
    for _ in range(2):
        got = table.sql("SELECT id, cat, qty FROM t").to_arrow_table()
        assert _sorted(got).equals(_model(events, ["id", "cat", "qty"]))
    cache = table.view.cache
    assert 0 < cache.resident_bytes <= 30_000 and cache.over_budget


def _table(tmp_path: Path, *, shuffled: bool, fragment_rows: int) -> ModelTable:
    """A base of several fragments (keys ascending or shuffled), newer levels, a WAL tail."""
    rng = np.random.default_rng(5)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])
    ids = rng.permutation(3000) if shuffled else np.arange(3000)
    base = pa.table({"id": ids, "v": [f"b{i}" for i in ids]}, schema=schema)

    def split(ds: lance.LanceDataset) -> None:
        lance.write_dataset(base, ds.uri, mode="overwrite", max_rows_per_file=fragment_rows)

    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("id", 3), prepare=split, max_memtable_rows=200)
    for g in range(3):
        keys = rng.choice(3300, 400, replace=False)
        t.put([{"id": int(k), "v": f"g{g}-{k}"} for k in keys])
        t.delete([(int(k),) for k in rng.choice(3300, 30, replace=False)])
        t.flush()
    t.put([{"id": int(k), "v": f"tail-{k}"} for k in rng.choice(3300, 100, replace=False)])
    t.delete([(int(k),) for k in rng.choice(3000, 10, replace=False)])
    return t


@pytest.mark.parametrize("shuffled", [False, True])
def test_reader_masks_every_base_fragment_by_key(tmp_path: Path, shuffled: bool) -> None:
    t = _table(tmp_path, shuffled=shuffled, fragment_rows=700)
    table = mq.open_table(t.uri)
    assert len(table.snapshot.base.get_fragments()) >= 4
    want = sort_table(t.expected(), ["id"])
    assert sort_table(table.to_reader().read_all(), ["id"]).equals(want)
    assert sort_table(table.to_reader(columns=["v"]).read_all(), ["v"]).equals(sort_table(want.select(["v"]), ["v"]))
    sel = pc.field("v") >= "g1"
    assert sort_table(table.to_reader(filter=sel).read_all(), ["id"]).equals(want.filter(sel))
    assert sum(b.num_rows for b in table.to_reader(columns=[])) == want.num_rows
    t.flush()


def test_string_keys_streamed(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k", pa.string(), nullable=False, metadata=PK), pa.field("n", pa.int64())])
    base = pa.table({"k": [f"key{i:04d}" for i in range(500)], "n": list(range(500))}, schema=schema)
    t = ModelTable(str(tmp_path / "s"), schema, base, bucket=("k", 2))
    t.put([{"k": f"key{i:04d}", "n": -i} for i in range(450, 560)])
    t.delete([("key0003",), ("key0451",)])
    t.flush()
    t.put([{"k": "key0010", "n": 10_000}])
    got = sort_table(mq.open_table(t.uri).to_reader().read_all(), ["k"])
    assert got.equals(sort_table(t.expected(), ["k"]))
    t.flush()


def test_ascending_hits_matches_isin() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        keys = np.sort(rng.integers(0, 300, rng.integers(0, 120)))  # duplicates included
        newer = np.unique(rng.integers(-20, 320, rng.integers(0, 60)))
        assert np.array_equal(ascending_hits(keys, newer), np.isin(keys, newer))


def test_wide_rows_stream_in_batches_of_bounded_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches were 65,536 rows whatever their width (a generation of wide rows came out in one
    batch of hundreds of MB): a Lance scan's batch holds about ``SCAN_BATCH_BYTES`` of its
    data files (here 1 MiB: rows of 2 KiB random bytes, 512 a batch)."""
    import os

    import memwal_query.scan.fragment as fragment

    monkeypatch.setattr(fragment, "SCAN_BATCH_BYTES", 1 << 20)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("b", pa.binary())])

    def rows(ids: range) -> list[dict[str, Any]]:
        return [{"id": i, "b": os.urandom(2048)} for i in ids]

    base = pa.Table.from_pylist(rows(range(3000)), schema=schema)
    t = ModelTable(str(tmp_path / "w"), schema, base, unsharded=True, max_memtable_rows=10_000)
    t.put(rows(range(2500, 6000)))  # one generation of 3,500 rows
    t.flush()
    table = mq.open_table(t.uri)
    batches = list(table.to_reader())
    assert max(b.num_rows for b in batches) <= 600
    got = sort_table(pa.Table.from_batches(batches), ["id"])
    assert got.equals(sort_table(t.expected(), ["id"]))
    assert max(b.num_rows for b in table.to_reader(columns=["id"], filter="id > 10")) <= 600
