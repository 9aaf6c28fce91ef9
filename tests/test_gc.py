"""Garbage collection (``memwal_write.collect_garbage``) on tables written by pylance's writer:
it removes merged generations' directories and the WAL entries only they held, and nothing an
acknowledged write or a later read needs. Checked against the dict model after every step,
with writers open across the collection and a lost unmerged generation rebuilt after it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query import lookup_rows
from memwal_query.format import machine_cache
from memwal_query.format.names import parse_bitrev64_name
from memwal_query.format.wal import read_wal_entry
from memwal_query.snapshot import latest_region_manifest
from memwal_query.verify import verify_table
from memwal_write import collect_garbage

from lsm_model import PK, ModelTable, sort_table

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])


def _rows(ids: np.ndarray, v: int) -> list[dict[str, int]]:
    return [{"id": int(i), "v": v} for i in ids]


def _check(t: ModelTable) -> None:
    got = sort_table(mq.open_table(t.uri).to_arrow().cast(SCHEMA), ["id"])
    assert got.equals(sort_table(t.expected(), ["id"]))


def _wal_positions(t: ModelTable, region: str) -> set[int]:
    names = [n for n, d in t.storage().list_dir(f"_mem_wal/{region}/wal") if not d]
    return {p for p in (parse_bitrev64_name(n) for n in names) if p is not None}


def _table(tmp_path: Path) -> ModelTable:
    return ModelTable(
        str(tmp_path / "t"), SCHEMA, pa.Table.from_pylist(_rows(np.arange(400), 0), schema=SCHEMA), bucket=("id", 3)
    )


def test_collects_merged_generations_and_loses_no_write(tmp_path: Path) -> None:
    t = _table(tmp_path)
    rng = np.random.default_rng(7)
    merged: dict[str, int] = {}
    for step in range(1, 9):
        t.put(_rows(rng.choice(600, 40, replace=False), step))
        t.delete([(int(k),) for k in rng.choice(600, 8, replace=False)])
        if step % 2 == 0:
            t.flush()
        if step % 3 == 0:
            t.merge_all(merged)
        # a writer may be open (its MemTable in the WAL tail) while the collector runs
        before = {r: _wal_positions(t, r) for r in t.regions()}
        removed = collect_garbage(t.uri, older_than=0)
        for r in t.regions():
            m = latest_region_manifest(t.storage(), r)
            assert m is not None
            left = {g for g, _ in t.flushed(r) if (Path(t.uri, "_mem_wal", r) / dict(t.flushed(r))[g]).exists()}
            assert all(g > merged.get(r, 0) for g in left)  # every merged one went
            unmerged = {g for g, _ in t.flushed(r) if g > merged.get(r, 0)}
            assert unmerged <= left  # no unmerged one did
            tail = {p for p in before[r] if p > m.replay_after_wal_position}
            assert tail <= _wal_positions(t, r)  # WAL entries after the replay position stay
        for row in removed.to_pylist():
            assert not Path(t.uri, row["path"]).exists() and row["generation"] <= merged[row["region_id"]]
        _check(t)
        assert verify_table(t.uri).ok
    t.put(_rows(np.arange(590, 610), 99))  # writers go on after the collection
    t.flush()
    _check(t)
    assert t.merge_all(merged) > 0
    collect_garbage(t.uri, older_than=0)
    _check(t)
    for r in t.regions():  # all merged: nothing of the merged generations is left but the newest WAL file
        assert not [n for n, d in t.storage().list_dir(f"_mem_wal/{r}") if d and "_gen_" in n]
        assert len(_wal_positions(t, r)) == 1
    # pylance's writer puts a new writer's fence after the last WAL file: in the tail, where
    # readers see the epoch it claims (in an emptied WAL it went to position 1)
    kept = {r: _wal_positions(t, r) for r in t.regions()}
    t.put(_rows(np.arange(700, 760), 100))
    for r in t.regions():
        m = latest_region_manifest(t.storage(), r)
        assert m is not None
        new = _wal_positions(t, r) - kept[r]
        fences = [p for p in new if read_wal_entry(t.storage(), r, p).fence]  # type: ignore[union-attr]
        assert fences and min(fences) > m.replay_after_wal_position, (fences, m.replay_after_wal_position)
    _check(t)


def test_keeps_what_a_lost_unmerged_generation_is_rebuilt_from(tmp_path: Path) -> None:
    t = _table(tmp_path)
    t.put(_rows(np.arange(0, 30), 1))
    t.flush()
    t.put(_rows(np.arange(20, 60), 2))
    t.delete([(5,), (25,)])
    t.flush()
    region = t.regions()[0]
    gens = dict(t.flushed(region))
    t.merge(region, min(gens))  # the first merged, the second not
    removed = collect_garbage(t.uri, older_than=0)
    mine = {r["generation"] for r in removed.to_pylist() if r["region_id"] == region}
    assert mine - {0} == {min(gens)}  # generation 0: writers' fence entries
    shutil.rmtree(Path(t.uri, "_mem_wal", region, gens[max(gens)]))  # lose the unmerged one
    _check(t)  # rebuilt from the WAL entries the collector kept


def test_grace_period_and_dry_run(tmp_path: Path) -> None:
    t = _table(tmp_path)
    t.put(_rows(np.arange(0, 50), 1))
    t.flush()
    t.merge_all({})
    assert collect_garbage(t.uri).num_rows == 0  # merged less than an hour ago
    dry = collect_garbage(t.uri, older_than=0, dry_run=True)
    assert dry.num_rows > 0 and all(Path(t.uri, p).exists() for p in dry.column("path").to_pylist())
    done = collect_garbage(t.uri, older_than=0)
    assert done.equals(dry) and not any(Path(t.uri, p).exists() for p in done.column("path").to_pylist())
    assert collect_garbage(t.uri, older_than=0).num_rows == 0
    _check(t)
    with pytest.raises(mq.InvalidArgumentError, match="older_than must be a number of seconds >= 0"):
        collect_garbage(t.uri, older_than=-1)


def test_a_base_restored_to_before_a_merge_keeps_its_generations(tmp_path: Path) -> None:
    """The version old enough says merged, the newest (a restore() to before the merge) does
    not: the generation is the only copy of its rows again and must stay."""
    import time

    import lance

    t = _table(tmp_path)
    t.put(_rows(np.arange(500, 520), 1))
    t.flush()
    before = lance.dataset(t.uri).version
    t.merge_all({})
    time.sleep(1.2)
    lance.dataset(t.uri, version=before).restore()
    assert collect_garbage(t.uri, older_than=1).num_rows == 0
    _check(t)
    assert verify_table(t.uri).ok


def _racing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: int, collect: Callable[[ModelTable], None]
) -> tuple[ModelTable, list[int]]:
    """A table whose WAL tail holds ``entries`` puts, and a hook that, when an open first
    replays a tail, flushes, merges and runs ``collect`` (the open read the older manifest)."""
    import memwal_query.snapshot.load as load
    from memwal_write import merge_generations

    t = ModelTable(
        str(tmp_path / "t"), SCHEMA, pa.Table.from_pylist(_rows(np.arange(3), 0), schema=SCHEMA), unsharded=True
    )
    for k in range(10, 10 + entries):  # acknowledged, in the WAL tail: one entry each
        t.put(_rows(np.array([k]), 1))
    real = load.replay_wal_tail
    calls: list[int] = []

    def racing(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not calls:
            t.flush()
            merge_generations(t.uri)
            collect(t)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(load, "replay_wal_tail", racing)
    return t, calls


@pytest.mark.parametrize("cut", [True, False])
def test_a_strong_open_racing_a_flush_merge_and_collection_misses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: bool
) -> None:
    """A strong open read a region's manifest, then a writer flushed, a merger merged and the
    collector removed the WAL entries the open was about to replay: the tail ended early and
    the snapshot missed acknowledged rows, without an error. A newer manifest after the tail
    is read now makes the open read the region again."""
    import memwal_query.snapshot.load as load

    def collect(t: ModelTable) -> None:  # the newest entry is kept
        assert collect_garbage(t.uri, older_than=0).num_rows > 0

    t, _ = _racing_open(tmp_path, monkeypatch, 4, collect)
    if cut:  # the cross-region re-reads must catch it without the region's own re-read
        monkeypatch.setattr(load, "_settled_region", lambda read, storage, consistency: read())
    else:  # the region's own read must hold without the cross-region re-reads
        monkeypatch.setattr(load, "_consistent_cut", lambda storage, by_id, *rest: (by_id, False))
    got = mq.open_table(t.uri).to_arrow().cast(SCHEMA)
    assert sort_table(got, ["id"]).equals(sort_table(t.expected(), ["id"]))


def test_a_strong_open_racing_a_collection_half_done_is_no_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector removes covered WAL entries in path order (bit-reversed names): half done, it
    leaves holes in the tail an open with an older manifest replays. Such a hole was taken for a
    damaged WAL (a false MemWalCorruptionError in a soak); a newer manifest explains it: the
    region is read again with it."""
    from memwal_query.format.wal import wal_entry_path

    def half_done(t: ModelTable) -> None:
        Path(t.uri, wal_entry_path(t.regions()[0], 2)).unlink()

    t, calls = _racing_open(tmp_path, monkeypatch, 6, half_done)
    got = mq.open_table(t.uri).to_arrow().cast(SCHEMA)
    assert sort_table(got, ["id"]).equals(sort_table(t.expected(), ["id"]))
    assert len(calls) >= 2  # read again


def test_version_age_in_the_hour_a_clock_falls_back() -> None:
    """pylance gives a version's time as a naive local datetime: in the repeated hour it names
    two instants; the later one is taken (a version never looks older than it is)."""
    import datetime as dt
    import os
    import time

    from memwal_write.gc import _committed_at  # noqa: PLC2701 - the conversion under test

    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        ambiguous = dt.datetime(2026, 11, 1, 1, 30)  # 01:30 happens twice that night
        assert _committed_at(ambiguous) == ambiguous.replace(fold=1).timestamp()
        assert _committed_at(ambiguous) - ambiguous.replace(fold=0).timestamp() == 3600
    finally:
        if old is None:
            os.environ.pop("TZ")
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_an_older_snapshot_after_its_generations_were_collected_says_refresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot whose unmerged generations were merged and collected since it opened, after a
    newer snapshot of it let go of their keys: ``lookup`` and ``plan`` failed with pyarrow's raw
    ``ArrowInvalid`` "Not found" (region routing read the keys again), SQL with DataFusion's
    wrapping of it. Each read says the generation is no longer readable and to refresh (a
    lookup named the base's files when routing no longer read the generation's keys: their
    ranking answers it); ``plan`` reads no row of it."""
    import lance

    from memwal_write import RoutedWriter, merge_generations

    uri = str(tmp_path / "t")
    lance.write_dataset(pa.table({"id": [0, 1], "v": [0, 0]}, schema=SCHEMA), uri).initialize_mem_wal(
        bucket_column="id", num_buckets=2
    )
    first = mq.open_table(uri)
    with RoutedWriter.open(uri) as w:  # generation 1 of each region, unmerged
        w.put(pa.table({"id": list(range(5, 40)), "v": [1] * 35}, schema=SCHEMA))
    older = first.refresh()
    machine_cache.settle()  # its generations' ranking held (made off the open's path)
    merge_generations(uri)
    collect_garbage(uri, older_than=0)
    newer = older.refresh()
    gone = r"^generation 1 of region .* is no longer readable: it was merged and garbage-collected .*refresh\(\)"
    assert len(older.plan("id = 5").pruned) == 1  # of two regions

    def lookup_taking_rows() -> object:  # no generation held in memory: one take of its rows
        with monkeypatch.context() as m:
            m.setattr(lookup_rows, "LOOKUP_ROWS_BUDGET", 0)
            return older.lookup([7, 8])

    for read in (
        lookup_taking_rows,
        lambda: older.lookup([5, 6]),
        lambda: older.sql("SELECT * FROM t WHERE id = 5").collect(),
        lambda: older.to_reader(filter="id = 5").read_all(),  # was "invalid filter 'id = 5' ..."
    ):
        with pytest.raises(mq.MemWalError, match=gone):
            read()
    assert newer.lookup([5, 6]).to_pylist() == [{"id": 5, "v": 1}, {"id": 6, "v": 1}]
