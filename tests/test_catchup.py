"""The Indexed Read Plan for scalar-indexed SQL filters, on pylance-written tables."""

from __future__ import annotations

import shutil
from pathlib import Path

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq

from lsm_model import PK, ModelTable, sort_table

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)


def _rows(ids: np.ndarray, tag: float) -> pa.Table:
    return pa.table(
        {"id": ids, "cat": [f"c{(i * 7 + int(tag)) % 11}" for i in ids], "amount": ids.astype(np.float64) + tag},
        schema=SCHEMA,
    )


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> ModelTable:
    rng = np.random.default_rng(4)
    uri = str(tmp_path_factory.mktemp("c") / "t")
    t = ModelTable(uri, SCHEMA, _rows(np.arange(4000), 0.0), bucket=("id", 3), max_memtable_rows=600)
    lance.dataset(uri).create_scalar_index("cat", "BTREE")
    t.put(_rows(rng.choice(4500, 700, replace=False), 1.0))  # updates move rows between categories
    t.delete([(int(k),) for k in rng.choice(4500, 60, replace=False)])
    t.flush()
    for r in t.regions():
        t.merge(r, 1)  # merged, not re-indexed: new base fragments outside the BTree
    t.put(_rows(rng.choice(4500, 300, replace=False), 2.0))  # unmerged generation 2
    t.flush()
    t.put(_rows(rng.choice(4500, 50, replace=False), 3.0))  # WAL tail
    return t


def test_indexed_filter_reads_catchup_generations(indexed: ModelTable) -> None:
    table = mq.open_table(indexed.uri)
    plan = table.catchup_plan("cat_idx")
    assert plan.usable, plan.reason
    assert plan.uncovered_fragments and len(plan.sources) == len(indexed.regions())
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    ds = table.dataset()
    # small table: the cost rule keeps the base fragments; "always" forces the plan
    assert table.index_catchup == "auto" and not table.uses_catchup(plan)
    ds.source_fragments(pa.compute.field("cat") == "c3")
    assert ds.last_catchup is None
    # explain said "served by catch-up generations" whether reads used them or not
    assert "index cat_idx: " in table.explain() and "served by catch-up" not in table.explain()
    assert "searched flat (catch-up generations usable, but cheaper to read these rows flat" in table.explain()
    table.index_catchup = "never"
    assert "searched flat (catch-up generations usable, but index_catchup='never')" in table.explain()
    table.index_catchup = "always"
    exp = indexed.expected()
    for cat in ("c0", "c3", "c10"):
        got = ctx.sql(f"SELECT id, cat, amount FROM t WHERE cat = '{cat}'").to_arrow_table()
        want = exp.filter(pa.compute.equal(exp.column("cat"), cat))
        assert sort_table(got, ["id"]).equals(sort_table(want, ["id"]))
    assert ds.last_catchup is plan
    labels = [getattr(f, "label", "") for f in ds.source_fragments(pa.compute.field("cat") == "c3")]
    assert any("catch-up" in x for x in labels)
    assert not any(x == f"base/{i}" for x in labels for i in plan.uncovered_fragments)
    # a filter on a column without an index reads the base fragments as usual
    assert ds.source_fragments(pa.compute.field("amount") > 5) and ds.last_catchup is None
    assert "served by catch-up generations" in table.explain()
    # everything else is unchanged
    full = sort_table(ctx.sql("SELECT * FROM t").to_arrow_table(), ["id"])
    assert full.equals(sort_table(exp, ["id"]))


def test_auto_skips_a_small_plan_without_opening_its_generations(indexed: ModelTable) -> None:
    table = mq.open_table(indexed.uri)
    view = table.view
    merged = {g.uri for r in view.snapshot.regions for g in r.generations}
    exp = indexed.expected()
    got = table.sql("SELECT id, cat, amount FROM t WHERE cat = 'c3'").to_arrow_table()
    assert sort_table(got, ["id"]).equals(sort_table(exp.filter(pa.compute.equal(exp.column("cat"), "c3")), ["id"]))
    # the cost rule decided from row and generation counts: no catch-up generation was opened
    opened = set(view.cache.generations) - merged
    assert not opened, opened
    assert not any("catch-up" in getattr(f, "label", "") for f in table.dataset().source_fragments(None))
    plan = table.catchup_plan("cat_idx")  # asked for explicitly, it is worked out (and opens them)
    assert plan.usable and not table.uses_catchup(plan)
    assert {s.generation.uri for s in plan.sources} <= set(view.cache.generations)


def test_hidden_columns_keep_base_sources(indexed: ModelTable) -> None:
    table = mq.open_table(indexed.uri)
    table.index_catchup = "always"
    ctx = datafusion.SessionContext()
    table.register(ctx, "t", hidden_columns=True)
    got = ctx.sql("SELECT id, _gen FROM t WHERE cat = 'c4'").to_arrow_table()
    exp = indexed.expected()
    assert sorted(got.column("id").to_pylist()) == sorted(r["id"] for r in exp.to_pylist() if r["cat"] == "c4")
    assert 1 not in set(got.column("_gen").to_pylist())  # generation 1 is merged: its rows are base rows (_gen 0)


def test_generation_collected_after_the_plan_falls_back(indexed: ModelTable, tmp_path: Path) -> None:
    uri = str(tmp_path / "copy")
    shutil.copytree(indexed.uri, uri)
    table = mq.open_table(uri)
    table.index_catchup = "always"
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    query = "SELECT id, cat, amount FROM t WHERE cat = 'c5'"
    exp = indexed.expected()
    want = sort_table(exp.filter(pa.compute.equal(exp.column("cat"), "c5")), ["id"])
    assert sort_table(ctx.sql(query).to_arrow_table(), ["id"]).equals(want)
    assert table.dataset().last_catchup is not None
    # a merger garbage-collects a merged (catch-up) generation after the plan was made
    src = table.catchup_plan("cat_idx").sources[0]
    shutil.rmtree(f"{uri}/{src.path}")
    assert sort_table(ctx.sql(query).to_arrow_table(), ["id"]).equals(want)
    assert table.dataset().last_catchup is None
    plan = table.catchup_plan("cat_idx")
    assert not plan.usable and "garbage-collected after the plan" in plan.reason


def test_a_table_with_its_own_setting_plans_with_it(indexed: ModelTable) -> None:
    """A table from ``with_index_catchup`` plans its scans with its own setting, also once the
    table it came from ran a query (a dataset built for one is not the other's), and both
    answer the model."""
    table = mq.open_table(indexed.uri).with_index_catchup("always")
    query = "SELECT id, amount FROM t WHERE cat = 'c5' ORDER BY id"
    exp = indexed.expected()
    want = sort_table(exp.filter(pa.compute.equal(exp.column("cat"), "c5")).select(["id", "amount"]), ["id"])
    assert table.sql(query).to_arrow_table().equals(want)
    assert table.dataset().last_catchup is not None
    never = table.with_index_catchup("never")
    assert never.sql(query).to_arrow_table().equals(want)
    assert never.dataset().last_catchup is None and table.dataset().last_catchup is not None


def test_reader_filter_reads_catchup_generations(indexed: ModelTable) -> None:
    """to_reader's filter is planned like SQL's: the Indexed Read Plan serves the uncovered base."""
    table = mq.open_table(indexed.uri).with_index_catchup("always")
    exp = indexed.expected()
    for filt, cat in ((pa.compute.field("cat") == "c3", "c3"), ("cat = 'c10'", "c10")):
        got = table.to_reader(columns=["id", "amount"], filter=filt).read_all()
        want = exp.filter(pa.compute.equal(exp.column("cat"), cat)).select(["id", "amount"])
        assert sort_table(got, ["id"]).equals(sort_table(want, ["id"]))
        assert table.dataset(cache=False).last_catchup is not None


def _merged_since_the_index(tmp_path: Path) -> ModelTable:
    """BTREEs on ``cat`` and ``id``, then keys 2000..2299 merged: fragments they do not cover."""
    uri = str(tmp_path / "t")
    t = ModelTable(uri, SCHEMA, _rows(np.arange(2000), 0.0), bucket=("id", 3), max_memtable_rows=600)
    lance.dataset(uri).create_scalar_index("cat", "BTREE")
    lance.dataset(uri).create_scalar_index("id", "BTREE")  # a merge_insert on id then rewrites columns in place
    t.put(_rows(np.arange(2000, 2300), 1.0))
    t.flush()
    for r in t.regions():
        t.merge(r, 1)
    assert mq.open_table(uri).catchup_plan("cat_idx").usable
    return t


def test_rows_written_straight_to_the_base_rule_the_plan_out(tmp_path: Path) -> None:
    """An update() on the base of rows merged since the index was built keeps their keys and
    their count: the plan's row count check passed and indexed queries served the generations'
    older values (so did a delete() of one merged row next to an update() of an indexed one)."""
    t = _merged_since_the_index(tmp_path)
    uri = t.uri
    lance.dataset(uri).update({"cat": "'zz'"}, where="id >= 2000 AND id < 2010")
    table = mq.open_table(uri).with_index_catchup("always")
    plan = table.catchup_plan("cat_idx")
    assert not plan.usable and "wrote rows other than by merging generations (Update)" in plan.reason
    assert table.sql("SELECT count(*) AS n FROM t WHERE cat = 'zz'").to_pylist() == [{"n": 10}]
    lance.dataset(uri).delete("id = 2100")  # deletions alone: the row count check sees them
    plan = mq.open_table(uri).catchup_plan("cat_idx")
    assert not plan.usable and "but the uncovered fragments" in plan.reason
    t.flush()


def test_columns_rewritten_straight_on_the_base_rule_the_plan_out(tmp_path: Path) -> None:
    """A ``merge_insert`` of some columns rewrites them in place (an ``Update`` with no new
    fragment, like a merge's deletes): it passed as deletions only."""
    t = _merged_since_the_index(tmp_path)
    amount = pa.schema([SCHEMA.field("id"), SCHEMA.field("amount")])
    part = pa.table({"id": np.arange(2000, 2050), "amount": [-1.0] * 50}, schema=amount)
    lance.dataset(t.uri).merge_insert("id").when_matched_update_all().execute(part)
    table = mq.open_table(t.uri).with_index_catchup("always")
    plan = table.catchup_plan("cat_idx")
    assert not plan.usable and "wrote rows other than by merging generations (Update)" in plan.reason
    cats = ", ".join(f"'c{i}'" for i in range(11))  # every category: the BTREE serves the filter
    got = table.sql(f"SELECT count(*) AS n FROM t WHERE cat IN ({cats}) AND amount < 0").to_pylist()
    assert got == [{"n": 50}]
    t.flush()


def test_a_refreshed_snapshot_reads_only_the_newer_versions_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history check reads each base version's transaction once per table: a refresh after
    a merge reads the versions since the last snapshot, not all since the index was built."""
    import memwal_query.planner.base_history as base_history

    t = _merged_since_the_index(tmp_path)
    read = base_history.operations
    counts: list[int] = []

    def counted(base: lance.LanceDataset, top: int, count: int) -> dict:
        counts.append(count)
        return read(base, top, count)

    monkeypatch.setattr(base_history, "operations", counted)
    table = mq.open_table(t.uri)
    assert table.catchup_plan("cat_idx").usable
    first = lance.dataset(t.uri).version - 2  # every version since the BTREE on cat (version 2)
    assert counts == [first]
    t.put(_rows(np.arange(2300, 2400), 2.0))
    t.flush()
    for r in t.regions():
        t.merge(r, 2)
    now = lance.dataset(t.uri).version
    plan = table.refresh().catchup_plan("cat_idx")
    assert plan.usable, plan.reason
    assert counts == [first, now - 2 - first]


def test_a_history_read_that_failed_is_read_again_by_the_next_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base version whose transaction could not be read (a transient object-store error)
    rules the plan out for that snapshot only: it was kept as unreadable for the process, so
    every refreshed snapshot went on scanning the unindexed base fragments."""
    import memwal_query.planner.base_history as base_history

    t = _merged_since_the_index(tmp_path)
    read = base_history.operations
    failing = [True]

    def flaky(base: lance.LanceDataset, top: int, count: int) -> dict:
        got = read(base, top, count)
        return {v: op for v, op in got.items() if v != top} if failing[0] else got

    monkeypatch.setattr(base_history, "operations", flaky)
    table = mq.open_table(t.uri)
    plan = table.catchup_plan("cat_idx")
    assert not plan.usable and "cannot be read" in plan.reason
    failing[0] = False
    plan = table.refresh().catchup_plan("cat_idx")
    assert plan.usable, plan.reason


def test_a_compaction_that_remapped_the_index_keeps_the_plan(tmp_path: Path) -> None:
    """pylance 14 cannot read back the transaction of a compaction that rewrote an index
    (``TypeError`` building its ``RewrittenIndex``): such a version counted as a write and
    ruled the plan out until the index was rebuilt. A compaction keeps every row."""
    uri = str(tmp_path / "t")
    rng = np.random.default_rng(1)
    t = ModelTable(
        uri,
        SCHEMA,
        _rows(np.arange(2000), 0.0),
        bucket=("id", 3),
        max_memtable_rows=600,
        write_params={"max_rows_per_file": 200},
    )
    lance.dataset(uri).create_scalar_index("cat", "BTREE")
    t.put(_rows(np.arange(2000, 2300), 1.0))
    t.put(_rows(rng.choice(2000, 200, replace=False), 1.0))  # merged as deletions from indexed fragments
    t.flush()
    for r in t.regions():
        t.merge(r, 1)
    ds = lance.dataset(uri)
    ds.optimize.compact_files(target_rows_per_fragment=100_000, materialize_deletions_threshold=0.0)
    with pytest.raises(
        TypeError, match="RewrittenIndex"
    ):  # what this test is about; if pylance reads it, drop the test
        lance.dataset(uri).get_transactions(1)
    table = mq.open_table(uri).with_index_catchup("always")
    plan = table.catchup_plan("cat_idx")
    assert plan.usable, plan.reason
    flat = mq.open_table(uri).with_index_catchup("never")
    exp = t.expected()
    for cat in ("c0", "c3", "c10"):
        sql = f"SELECT id, amount FROM t WHERE cat = '{cat}' ORDER BY id"
        want = exp.filter(pa.compute.equal(exp.column("cat"), cat)).select(["id", "amount"])
        assert table.sql(sql).to_arrow_table().equals(sort_table(want, ["id"]))
        assert flat.sql(sql).to_arrow_table().equals(sort_table(want, ["id"]))
    t.flush()
