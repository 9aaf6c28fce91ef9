"""A refresh after a small write decides base fragments again from their last drop list
(``mask_delta``) and cuts the newly superseded rows out of the kept columns by slicing
(``column_cache.survivor_entry``): answers stay the model's across puts, deletes, flushes
and merges, on tables written by pylance's MemWAL writer.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq
import memwal_query.mask_delta as mask_delta_module
from memwal_query.mask_delta import key_delta, redecided, sorted_hits

from builders import events_schema, rows
from lsm_model import PK, ModelTable, sort_table


def _addresses(live: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Addresses of the live rows among positions ``pos`` of fragment 7 (``7 << 32 | offset``)."""
    return np.asarray(pos[live[pos]], dtype=np.uint64) + np.uint64(7 << 32)


def _whole(keys: np.ndarray, addresses: Callable[[np.ndarray], np.ndarray], newer: np.ndarray) -> np.ndarray:
    return addresses(np.flatnonzero(np.isin(keys, newer)))


def test_key_delta_and_redecided_equal_deciding_whole() -> None:
    """Random sorted fragments (repeated keys, deleted rows) and newer key sets before and
    after a change: the drop list decided again equals the one decided from scratch."""
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(300):
        span = int(rng.integers(50, 5000))
        keys = np.sort(rng.integers(0, span, int(rng.integers(0, 3000))))
        addresses = partial(_addresses, rng.random(keys.size) > 0.1)  # some rows deleted
        whole = partial(_whole, keys, addresses)

        old = np.unique(rng.integers(-10, span + 10, int(rng.integers(0, 400))))
        changed = rng.integers(-10, span + 10, int(rng.integers(0, 12 if trial % 3 else 60)))
        new = np.setxor1d(old, changed)  # keys join and leave
        added, removed = key_delta(old, new) or (None, None)
        assert added is not None and removed is not None
        assert added.tolist() == np.setdiff1d(new, old).tolist() and removed.tolist() == np.setdiff1d(old, new).tolist()
        got = redecided(keys, addresses, whole(old), added, removed)
        if got is not None:
            checked += 1
            assert got.tolist() == whole(new).tolist(), trial
        assert sorted_hits(keys, new).tolist() == np.flatnonzero(np.isin(keys, new)).tolist()
    assert checked > 150  # most trials change few keys: decided again, not whole


def _sum_count(t: ModelTable, below: float) -> tuple[float, int]:
    e = t.expected()
    kept = e.filter(pc.less(e.column("amount"), below)).column("amount")
    return float(pc.sum(kept).as_py() or 0.0), len(kept)


def test_refreshes_after_small_writes_match_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    base = pa.Table.from_pylist(rows(range(4000), 0, rng), schema=events_schema())
    t = ModelTable(str(tmp_path / "t"), events_schema(), base, bucket=("id", 2), max_memtable_rows=10_000)
    t.put(rows(rng.choice(4400, 300, replace=False), 1, rng))
    t.flush()
    calls = {"again": 0, "whole": 0}
    real = mask_delta_module.redecided

    def spy(*args: Any) -> np.ndarray | None:
        got: np.ndarray | None = real(*args)
        calls["again" if got is not None else "whole"] += 1
        return got

    monkeypatch.setattr(mask_delta_module, "redecided", spy)
    table = mq.open_table(t.uri)
    q = "SELECT sum(amount) AS s, count(*) AS n FROM t WHERE amount < 60"
    sliced = 0
    for step in range(30):
        for _ in range(2):  # the second query is served from the kept columns
            got = table.sql(q).to_pydict()
            want = _sum_count(t, 60.0)
            assert (got["s"][0], got["n"][0]) == (pytest.approx(want[0]), want[1]), step
        cache = table.view.cache
        sliced += sum(c.num_chunks > 1 for _, _, cols, _ in cache.survivors.values() for c in cols.values())
        if step == 12:
            t.flush()
        if step == 20:
            region = t.regions()[0]
            t.merge(region, t.flushed(region)[0][0])  # new base fragments and deletion files
        if step % 5 == 4:
            t.delete([(int(k),) for k in rng.choice(4000, 3, replace=False)])
        else:  # base keys superseded, new keys, and a key written back
            t.put(rows([*rng.choice(4000, 4, replace=False), 4400 + step], step + 2, rng))
        table = table.refresh()
    assert sort_table(table.to_arrow(), ["id"]).to_pylist() == sort_table(t.expected(), ["id"]).to_pylist()
    assert table.count_rows() == len(t.model)
    assert calls["again"] >= 20 and sliced >= 10  # the paths under test were taken


def test_kept_decisions_hold_a_bounded_number_of_key_sets() -> None:
    """Each decision holds its snapshot's newer keys (up to every unmerged key): fragments decided
    by many different snapshots would keep as many key sets alive. At most DECISION_KEY_SETS."""
    from memwal_query.snapshot.cache import DECISION_KEY_SETS, Decision, SnapshotCache

    cache = SnapshotCache()
    sets = [np.arange(i, i + 10) for i in range(DECISION_KEY_SETS + 2)]
    for i, keys in enumerate(sets):
        cache.remember_decision(("fragment", i), Decision(keys, np.empty(0, np.uint64)))
        cache.remember_decision(("again", 0), Decision(sets[0], np.empty(0, np.uint64)))  # used again: kept
    assert [k is sets[0] for k in cache.decision_key_sets].count(True) == 1
    assert len(cache.decision_key_sets) == DECISION_KEY_SETS
    held = {id(d.newer) for d in cache.decisions.values()}
    assert held == {id(k) for k in cache.decision_key_sets} and len(held) == DECISION_KEY_SETS
    assert ("fragment", 0) in cache.decisions and ("fragment", 1) not in cache.decisions
    cache.reset()
    assert cache.decisions == {} and cache.decision_key_sets == []


def test_sorted_live_keys_do_not_vouch_for_stored_rows() -> None:
    """A fragment decided from its live rows (keys 1, 2, 3: sorted) and later from all its stored
    rows (1, 5, 2, 3: the deleted 5 out of order): a binary search of the unsorted run would miss
    key 2's row. Sortedness is checked on the run at hand, not carried over."""
    from memwal_query.mask_delta import PriorDecisions
    from memwal_query.snapshot.cache import SnapshotCache

    cache = SnapshotCache()
    old, new = np.array([7, 9]), np.array([2, 7, 9])
    PriorDecisions(cache, old).remember(("f",), np.empty(0, np.uint64), True)  # live run was sorted
    stored = pa.chunked_array([pa.array([1, 5, 2, 3], pa.int64())])
    drop, key_sorted = PriorDecisions(cache, new).redecide(("f",), stored, lambda p: p.astype(np.uint64))
    assert drop is None and key_sorted is False  # decided whole instead (it finds key 2 at row 2)
    sorted_run = pa.chunked_array([pa.array([1, 2, 3], pa.int64())])
    drop, key_sorted = PriorDecisions(cache, new).redecide(("f",), sorted_run, lambda p: p.astype(np.uint64))
    assert drop is not None and drop.tolist() == [1] and key_sorted is True


def test_refresh_over_a_fragment_whose_deleted_row_is_out_of_order(tmp_path: Path) -> None:
    """Stored keys 0..199, 100000, 200..399 with 100000 deleted: the live keys are sorted, the
    stored ones not. A refresh decided from the live rows (a scan's columns) remembered "sorted",
    the next one decided from the stored rows (the data file) by binary search: key 300's base
    row was kept beside its newer version (401 rows for 400)."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    keys = [*range(200), 100_000, *range(200, 400)]
    base = pa.table({"k": keys, "v": [1] * len(keys)}, schema=schema)
    t = ModelTable(
        str(tmp_path / "t"),
        schema,
        base,
        unsharded=True,
        max_memtable_rows=10_000,
        prepare=lambda ds: ds.delete("k = 100000"),
    )
    t.model.pop((100_000,))

    def total() -> tuple[int, int]:
        return sum(r["v"] for r in t.model.values()), len(t.model)

    t.put([{"k": 5, "v": 10}])
    table = mq.open_table(t.uri)
    assert table.count_rows() == len(t.model)  # decided from the data file's stored rows
    t.put([{"k": 6, "v": 10}])
    table = table.refresh()
    for _ in range(2):  # the second query decodes columns: decided from the live rows
        assert table.sql("SELECT sum(v) AS s FROM t").to_pydict()["s"][0] == total()[0]
    t.put([{"k": 7, "v": 10}])
    table = table.refresh()
    assert table.sql("SELECT sum(v) AS s FROM t").to_pydict()["s"][0] == total()[0]  # remembered "sorted"
    t.put([{"k": 300, "v": 10}, {"k": 350, "v": 10}])
    table = table.refresh()
    assert table.count_rows() == len(t.model)  # the stored rows again
    got = table.sql("SELECT sum(v) AS s, count(*) AS n FROM t").to_pydict()
    assert (got["s"][0], got["n"][0]) == total()
    t.flush()


def test_a_refresh_conforms_only_the_wal_entries_it_has_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every refresh conformed every WAL tail entry again (~0.4 s for 2,000 one-row puts with
    nothing new); entries are conformed once, consecutive ones of one schema together, and
    their rows keep the order of their positions (``_seq`` = position << 32 | row)."""
    import memwal_query.snapshot.memtables as memtables

    schema = events_schema()
    rng = np.random.default_rng(3)
    t = ModelTable(str(tmp_path / "t"), schema, pa.Table.from_pylist(rows(range(50), 0, rng), schema=schema))
    for i in range(12):  # one-row puts, a key written three times: the last put wins
        t.put(rows([7 if i % 4 == 0 else 100 + i], i + 1, rng))
    conformed: list[int] = []
    real = memtables._conform  # noqa: SLF001

    def counting(table: pa.Table, *args: Any, **kw: Any) -> pa.Table:
        conformed.append(table.num_rows)
        return real(table, *args, **kw)

    monkeypatch.setattr(memtables, "_conform", counting)
    table = mq.open_table(t.uri)
    assert sum(conformed) == 12 and len(conformed) == 1  # one schema: conformed at once
    expected = sort_table(t.expected(), ["id"])
    assert sort_table(table.to_arrow(), ["id"]).equals(expected)
    conformed.clear()
    again = table.refresh()
    assert conformed == [] and sort_table(again.to_arrow(), ["id"]).equals(expected)
    t.put(rows([200], 20, rng))
    newer = again.refresh()
    assert conformed == [1] and sort_table(newer.to_arrow(), ["id"]).equals(sort_table(t.expected(), ["id"]))
    t.flush()


def test_a_refresh_ranks_again_only_the_regions_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh ranked the keys of every unmerged generation of every region again (~0.14 ms
    per generation, changed or not: 800 generations, ~110 ms per refresh); a region whose
    generations and replayed WAL entries are the same keeps its merge."""
    import memwal_query.region_merge as region_merge

    rng = np.random.default_rng(5)
    schema = events_schema()
    base = pa.Table.from_pylist(rows(range(500), 0, rng), schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("id", 3))
    t.put(rows(range(0, 800, 3), 1, rng))
    t.flush()
    t.put(rows(range(1, 800, 7), 2, rng))  # WAL tails
    ranked: list[str] = []
    real = region_merge._ranked_region  # noqa: SLF001

    def counting(region: Any, *args: Any) -> Any:
        ranked.append(region.region_id)
        return real(region, *args)

    monkeypatch.setattr(region_merge, "_ranked_region", counting)
    table = mq.open_table(t.uri)
    regions = len(table.view.snapshot.regions)
    assert regions >= 2 and len(ranked) == regions

    def step(change: Callable[[], None], ranked_again: int) -> None:
        nonlocal table
        ranked.clear()
        change()
        table = table.refresh()
        assert len(ranked) == ranked_again
        assert sort_table(table.to_arrow(), ["id"]).to_pylist() == sort_table(t.expected(), ["id"]).to_pylist()

    step(lambda: None, 0)
    step(lambda: t.put(rows([5], 3, rng)), 1)  # one key: one region's WAL tail grew
    step(lambda: t.delete([(9,)]), 1)
    step(t.flush, regions)  # every region's MemTable became a generation
    step(lambda: None, 0)
    region = t.regions()[0]
    buffered = _Live(region, pa.Table.from_pylist(rows([11], 4, rng), schema=schema), 99)
    live = mq.open_table(t.uri, live=[buffered])
    ranked.clear()
    live.refresh()
    assert region in ranked  # rows handed in may change: never reused
    t.flush()


class _Live:
    """A MemTable handed in with ``open_table(live=...)``."""

    def __init__(self, region_id: str, rows: pa.Table, generation: int) -> None:
        self.region_id = region_id
        self.rows = rows
        self.generation = generation

    def to_batches(self) -> list[pa.RecordBatch]:
        return self.rows.to_batches()
