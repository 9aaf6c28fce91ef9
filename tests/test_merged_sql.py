"""Merged SQL over pylance-written tables equals SQL over the dict model's rows."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import datafusion
import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq
import memwal_query.base_reads as base_reads_module
import memwal_query.scan.column_cache as sources_mod
from memwal_query.scan.arrays import fragment_cache_key

from lsm_model import PK, ModelTable, sort_table


def _both(events, hidden: bool = False):  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    ctx = datafusion.SessionContext()
    table.register(ctx, "events", hidden_columns=hidden)
    ctx.register_record_batches("oracle", [events.expected().to_batches()])
    return table, ctx


def test_full_scan_equals_model(events) -> None:  # type: ignore[no-untyped-def]
    table, ctx = _both(events)
    got = ctx.sql("SELECT * FROM events").to_arrow_table()
    exp = events.expected()
    assert got.num_rows == exp.num_rows
    assert sort_table(got, ["id"]).equals(sort_table(exp, ["id"]))
    assert table.count_rows() == exp.num_rows


def test_pickled_fragments_scan_the_same_rows_without_the_table(events) -> None:  # type: ignore[no-untyped-def]
    # Spark ships fragments to tasks: a pickled fragment must scan alone (no snapshot, no merge)
    frags = mq.open_table(events.uri).dataset().source_fragments()
    assert {f.region is None for f in frags} == {True, False}
    assert any(type(f).__name__ == "MemoryFragment" for f in frags)  # the WAL tail ships too
    shipped = pickle.loads(pickle.dumps(frags))
    for flt in (None, pc.field("amount") >= 1000):
        got = pa.Table.from_batches(
            [b for f in shipped for b in f.scanner(columns=["id", "amount"], filter=flt).to_batches()]
        )
        exp = events.expected().select(["id", "amount"])
        if flt is not None:
            exp = exp.filter(flt)
        assert sort_table(got, ["id"]).equals(sort_table(exp, ["id"]))


def test_wal_tail_is_visible_in_strong_mode_only(events) -> None:  # type: ignore[no-untyped-def]
    strong = mq.open_table(events.uri)
    eventual = mq.open_table(events.uri, consistency="eventual")
    assert any(r.memtable is not None for r in strong.snapshot.regions)
    assert all(r.memtable is None for r in eventual.snapshot.regions)
    assert "eventual" in eventual.explain() and "not read" in eventual.explain()
    # eventual == pylance's own LsmScanner over the flushed generations
    lsm = events.lsm_scanner().to_table()
    got = eventual.to_arrow()
    assert sort_table(got, ["id"]).equals(sort_table(lsm.select(got.column_names).cast(got.schema), ["id"]))
    # the open writer's WAL tail changes the answer: strong sees it, eventual does not
    assert strong.count_rows() == events.expected().num_rows
    assert sort_table(strong.to_arrow(), ["id"]) != sort_table(got, ["id"])


QUERIES = [
    "SELECT count(*) AS n FROM {t}",
    "SELECT cat, count(*) AS n, sum(amount) AS s, max(qty) AS q FROM {t} GROUP BY cat ORDER BY cat",
    "SELECT id, amount FROM {t} WHERE amount >= 1000 ORDER BY id",
    "SELECT id FROM {t} WHERE amount < 97 ORDER BY id",  # base values: must not match superseded rows
    "SELECT id, cat FROM {t} WHERE id IN (5, 6, 7, 11, 2100) ORDER BY id",
    "SELECT * FROM {t} WHERE id = 7",
    "SELECT id, qty, row_number() OVER (PARTITION BY cat ORDER BY id) AS rn FROM {t} ORDER BY id LIMIT 50",
    "SELECT a.cat, count(*) AS n FROM {t} a JOIN {t} b ON a.id = b.id + 1 "
    "WHERE b.qty > 10 GROUP BY a.cat ORDER BY a.cat",
    "SELECT id FROM {t} ORDER BY amount DESC, id LIMIT 7",
    "SELECT count(*) AS n FROM {t} WHERE cat LIKE 'a%' AND qty BETWEEN 3 AND 30",
    "SELECT cat, avg(amount) AS a FROM {t} WHERE id % 3 = 0 GROUP BY cat HAVING count(*) > 1 ORDER BY cat",
]


@pytest.mark.parametrize("query", QUERIES)
def test_sql_equals_sql_over_model(events, query: str) -> None:  # type: ignore[no-untyped-def]
    _, ctx = _both(events)
    got = ctx.sql(query.format(t="events")).to_arrow_table()
    exp = ctx.sql(query.format(t="oracle")).to_arrow_table()
    assert got.to_pylist() == exp.to_pylist()


def test_filter_never_matches_superseded_version(events) -> None:  # type: ignore[no-untyped-def]
    table, ctx = _both(events)
    # rows whose newest version changed category: filtering on the old value must not see them
    exp = events.expected()
    for cat in ["a", "b", "c", "d"]:
        got = ctx.sql(f"SELECT id FROM events WHERE cat = '{cat}' ORDER BY id").to_arrow_table()
        want = sorted(r["id"] for r in exp.to_pylist() if r["cat"] == cat)
        assert got.column("id").to_pylist() == want


def test_deleted_and_reinserted_keys(events) -> None:  # type: ignore[no-untyped-def]
    _, ctx = _both(events)
    got = {
        r["id"]: r for r in ctx.sql("SELECT * FROM events WHERE id IN (5, 6, 7, 11, 2100)").to_arrow_table().to_pylist()
    }
    for k in (5, 6, 7, 11, 2100):
        assert got.get(k) == events.model.get((k,))
    # what build_events wrote to these keys (amount = round * 1000 + id % 97), not the model's bookkeeping
    assert 6 not in got  # deleted in round 2, never written again
    assert got[5]["amount"] == 3005.0 and got[2100]["amount"] == 3063.0  # re-inserted after a delete (round 3)
    assert got[7]["amount"] == 2007.0 and got[11]["amount"] == 2011.0  # duplicates in one batch (round 2)


def test_hidden_columns(events) -> None:  # type: ignore[no-untyped-def]
    table, ctx = _both(events, hidden=True)
    got = ctx.sql("SELECT _gen, count(*) AS n FROM events GROUP BY _gen ORDER BY _gen").to_arrow_table()
    assert sum(got.column("n").to_pylist()) == events.expected().num_rows
    gens = got.column("_gen").to_pylist()
    assert gens[0] == 0 and len(gens) > 2
    # a filter on a hidden column works and agrees with the group by
    n0 = ctx.sql("SELECT count(*) AS n FROM events WHERE _gen = 0").to_arrow_table().column("n")[0].as_py()
    assert n0 == got.column("n")[0].as_py()
    regions = ctx.sql("SELECT DISTINCT _region FROM events WHERE _gen > 0").to_arrow_table().column(0).to_pylist()
    assert set(regions) <= set(table.region_ids)
    # no key appears twice
    dup = ctx.sql("SELECT id FROM events GROUP BY id HAVING count(*) > 1").to_arrow_table()
    assert dup.num_rows == 0


def test_count_star_reads_no_data_column(events, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """count(*) reads base key columns only (the lazy base mask: from the data files, or
    through Lance's scanner), never a data column."""
    import lance.fragment

    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path))  # no key runs kept: the keys are read

    import memwal_query.format.fragment_files as fragment_files

    table = mq.open_table(events.uri)
    ctx = datafusion.SessionContext()
    table.register(ctx, "events")
    original = lance.fragment.LanceFragment.scanner
    read: list[list[str]] = []

    def keys_only(self, *a, **k):  # type: ignore[no-untyped-def]
        cols = list(k.get("columns") or [])
        if set(cols) - {"id"}:
            raise AssertionError(f"count(*) read data columns {cols} of a Lance fragment")
        read.append(cols)
        return original(self, *a, **k)

    class FileReader(fragment_files.LanceFileReader):  # type: ignore[misc]
        def read_all(self, *a, **k):  # type: ignore[no-untyped-def]
            read.append(list(self.columns))
            return super().read_all(*a, **k)

        def __init__(self, path: str, *a, columns: list[str] | None = None, **k) -> None:  # type: ignore[no-untyped-def]
            super().__init__(path, *a, columns=columns, **k)
            self.columns = list(columns or ["every column"])

    monkeypatch.setattr(lance.fragment.LanceFragment, "scanner", keys_only)
    monkeypatch.setattr(fragment_files, "LanceFileReader", FileReader)
    n = ctx.sql("SELECT count(*) AS n FROM events").to_arrow_table().column("n")[0].as_py()
    assert n == events.expected().num_rows
    assert read and all(c == ["id"] for c in read), read
    # decided once: a second count(*) reads nothing
    read.clear()
    assert ctx.sql("SELECT count(*) AS n FROM events").to_arrow_table().column("n")[0].as_py() == n
    assert read == []


def test_merged_generations_are_skipped(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    for r in table.snapshot.regions:
        assert r.merged_generation >= 1
        assert all(g.generation > r.merged_generation for g in r.generations)
        assert any("merged into base" in s.reason for s in r.skipped)
    assert "generation 1: skipped: merged into base" in table.explain()


def test_merged_generations_are_one_line_per_region(tmp_path: Path) -> None:
    """A region manifest lists every generation ever flushed: each merged one was a line of
    ``explain()`` and ``memwal inspect`` (a long-lived table's explanation ran to thousands)."""
    from memwal_query.cli import main

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [0], "v": [0]}, schema=schema), unsharded=True)
    for g in range(3):
        t.put([{"id": i, "v": g} for i in range(5)])
        t.flush()
    t.merge_all({})
    t.put([{"id": 9, "v": 9}])
    t.flush()
    text = mq.open_table(t.uri).explain()
    assert text.count("skipped: merged into base") == 1
    assert "generations 1-3: skipped: merged into base (merged generation 3)" in text
    assert main(["inspect", t.uri]) == 0


def test_reader_never_writes(events) -> None:  # type: ignore[no-untyped-def]
    import os

    def listing() -> dict[str, tuple[int, float]]:
        out = {}
        for root, _, files in os.walk(events.uri):
            for f in files:
                p = os.path.join(root, f)
                st = os.stat(p)
                out[p] = (st.st_size, st.st_mtime)
        return out

    before = listing()
    table = mq.open_table(events.uri)
    table.to_arrow()
    table.explain()
    table.refresh().count_rows()
    mq.open_table(events.uri, consistency="eventual").count_rows()
    assert listing() == before


def test_to_reader_streams_same_rows(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    reader = table.to_reader(columns=["id", "cat"])
    assert isinstance(reader, pa.RecordBatchReader)
    got = reader.read_all()
    assert sort_table(got, ["id"]).equals(sort_table(events.expected().select(["id", "cat"]), ["id"]))


def test_drop_mask_on_ordered_and_unordered_batches() -> None:
    import numpy as np

    from memwal_query.scan.arrays import drop_mask as _drop_mask

    rng = np.random.default_rng(3)
    addrs = np.unique(rng.integers(0, 10_000, 3000).astype(np.uint64))
    drop = np.unique(rng.choice(addrs, 500)).astype(np.uint64)
    want = ~np.isin(addrs, drop)
    assert np.array_equal(_drop_mask(pa.array(addrs), drop).to_numpy(zero_copy_only=False), want)
    shuffled = rng.permutation(addrs)
    assert np.array_equal(_drop_mask(pa.array(shuffled), drop).to_numpy(zero_copy_only=False), ~np.isin(shuffled, drop))


def _count_decodes(
    monkeypatch: pytest.MonkeyPatch, methods: tuple[str, ...] = ("to_table",)
) -> list[tuple[str, tuple[str, ...]]]:
    """Calls of ``methods`` of Lance fragments (whole-fragment decodes; ``scanner``: streams),
    and base fragments read straight from their data files."""
    reads: list[tuple[str, tuple[str, ...]]] = []

    def counter(real: Any) -> Any:
        def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            reads.append((str(self._ds.uri), tuple(kwargs.get("columns") or ())))
            return real(self, *args, **kwargs)

        return counting

    for name in methods:
        monkeypatch.setattr(lance.fragment.LanceFragment, name, counter(getattr(lance.fragment.LanceFragment, name)))
    real_direct = base_reads_module.read_columns

    def direct(storage, meta, field_ids, columns, *a, **k):  # type: ignore[no-untyped-def]
        got = real_direct(storage, meta, field_ids, columns, *a, **k)
        if got is not None:  # a base fragment read straight from its data file, not through Lance
            reads.append((storage.uri, tuple(columns)))
        return got

    monkeypatch.setattr(base_reads_module, "read_columns", direct)
    return reads


def _fragment_count(table: mq.Table) -> int:
    snap = table.snapshot
    return len(snap.base.get_fragments()) + sum(
        len(g.dataset.get_fragments()) for r in snap.regions for g in r.generations
    )


def test_fragment_columns_are_decoded_once_and_forgotten_when_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": range(100), "v": range(100)}), bucket=("id", 2))
    t.put([{"id": i, "v": i * 10} for i in range(50, 180)])
    t.flush()
    table = mq.open_table(t.uri)
    reads = _count_decodes(monkeypatch, ("to_table", "scanner"))  # every Lance read of a fragment
    want = sort_table(t.expected(), ["id"])
    for query in ("SELECT * FROM t", "SELECT * FROM t WHERE v >= 600", "SELECT id FROM t", "SELECT * FROM t"):
        got = sort_table(table.sql(query).to_arrow_table(), ["id"])
        expect = want.filter(pc.field("v") >= 600) if "WHERE" in query else want
        assert got.equals(expect if "id FROM" not in query else expect.select(["id"]))
    gens = {g.uri for r in table.snapshot.regions for g in r.generations}
    assert gens and len(reads) == _fragment_count(table)  # once each, then memory
    assert {k[0] for k in table._cache.fragment_columns} == gens | {table.snapshot.cache_source}
    again = table.refresh()  # nothing changed: a new snapshot reuses the decoded columns
    assert sort_table(again.to_arrow(), ["id"]).equals(want) and len(reads) == _fragment_count(table)
    for r in t.regions():
        t.merge(r, 1)
    table = table.refresh()
    assert not table.snapshot.regions[0].generations
    # merged generations and rewritten base fragments are forgotten
    current = {fragment_cache_key(table.snapshot.cache_source, f) for f in table.snapshot.base.get_fragments()}
    assert set(table._cache.fragment_columns) <= current
    assert table._cache.resident_bytes == sum(
        a.nbytes for cols in table._cache.fragment_columns.values() for a in cols.values()
    )
    assert sort_table(table.to_arrow(), ["id"]).equals(want)


def test_fragment_columns_decoded_as_queries_need_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query decodes only its columns (filter columns included); a later query adds the
    missing ones; beyond the budget scans read Lance (same answers)."""
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64()), pa.field("w", pa.string())]
    )
    base = pa.table({"id": range(200), "v": range(200), "w": [str(i) for i in range(200)]}, schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("id", 2))
    t.put([{"id": i, "v": -i, "w": "new"} for i in range(150, 250)])
    t.delete([(3,), (160,)])
    t.flush()
    table = mq.open_table(t.uri)
    reads = _count_decodes(monkeypatch)
    want = sort_table(t.expected(), ["id"])
    got = table.sql("SELECT id FROM t WHERE v < 100").to_arrow_table()
    assert sorted(got.column("id").to_pylist()) == sorted(r["id"] for r in want.to_pylist() if r["v"] < 100)
    n = _fragment_count(table)
    # the first scan of a base fragment reads through Lance (the lazy base mask is not decided
    # yet); the second decodes it into the cache, its key column with it
    assert len(reads) == n - len(table.snapshot.base.get_fragments())
    again = table.sql("SELECT id FROM t WHERE v < 100").to_arrow_table()
    assert sorted(again.column("id").to_pylist()) == sorted(got.column("id").to_pylist())
    assert len(reads) == n and all(set(cols) == {"id", "v"} for _, cols in reads)
    assert sort_table(table.sql("SELECT * FROM t").to_arrow_table(), ["id"]).equals(want)
    # an unfiltered scan streams from Lance batch by batch (no whole-fragment decode) and
    # keeps what it decoded (up to the budget): later scans read memory
    assert len(reads) == n
    assert sort_table(table.sql("SELECT id, w FROM t").to_arrow_table(), ["id"]).equals(want.select(["id", "w"]))
    assert len(reads) == n and len(table._cache.fragment_columns) == n
    assert all(set(c) == {"id", "v", "w", "_rowaddr"} for c in table._cache.fragment_columns.values())
    assert sort_table(table.sql("SELECT * FROM t WHERE w <> 'x'").to_arrow_table(), ["id"]).equals(want)
    assert len(reads) == n  # from memory
    monkeypatch.setattr(sources_mod, "RESIDENT_MAX_BYTES", 0)
    small = mq.open_table(t.uri)
    for _ in range(2):
        assert sort_table(small.sql("SELECT * FROM t WHERE w <> 'x'").to_arrow_table(), ["id"]).equals(want)
    assert small._cache.fragment_columns == {} and len(small._cache.over_budget) == n
    # what would not fit is never decoded (those scans read Lance); the lazy mask reads keys
    assert all(cols == ("id",) for _, cols in reads[n:])


def test_small_sources_combined_once_per_snapshot_and_column_set(tmp_path: Path) -> None:
    """Generations and MemTable rows packed into one partition are combined (surviving rows
    only) once per column set; filters, constant filters and updates across them stay right."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": range(300), "v": range(300)}), bucket=("id", 2))
    for g in range(3):  # three generations per region, each updating keys the next one updates again
        t.put([{"id": i, "v": 1000 * (g + 1) + i} for i in range(g * 40, g * 40 + 120)])
        t.delete([(i,) for i in range(g * 50 + 5, g * 50 + 9)])
        t.flush()
    t.put([{"id": i, "v": -i} for i in range(100, 130)])  # live MemTable rows (WAL tail)
    table = mq.open_table(t.uri)
    want = sort_table(t.expected(), ["id"])
    ds = table.dataset()
    for sql, expect in [
        ("SELECT * FROM t", want),
        ("SELECT * FROM t WHERE v >= 2000", want.filter(pc.field("v") >= 2000)),
        ("SELECT id FROM t WHERE v < 0", want.filter(pc.field("v") < 0).select(["id"])),
        ("SELECT * FROM t WHERE id = 0 AND id = 1", want.slice(0, 0)),
    ]:
        assert sort_table(table.sql(sql).to_arrow_table(), ["id"]).equals(expect), sql
    assert ds._group_memo, "small sources were not combined"
    assert all(set(k[1]) <= {"id", "v"} for k in ds._group_memo)
    t.flush()
