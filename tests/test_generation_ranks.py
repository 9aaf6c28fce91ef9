"""A region's merge in two steps (``memwal_query.generation_ranks``): its generations ranked
alone, held in memory or kept on this machine (``memwal_query.snapshot.kept_ranks``), then its
MemTable ranked against them, gives the merge that ranks every level at once.

Random levels are compared with the merge of all levels at once (ties, tombstones, keys
repeated within a level, MemTable rows of older generations); tables written by pylance's
MemWAL writer with the dict model (``lsm_model.ModelTable``) and with a process that keeps
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.format import machine_cache
from memwal_query.format.wal import GEN_COLUMN, SEQ_COLUMN, TOMBSTONE
from memwal_query.generation_ranks import ranks_of, with_memtable
from memwal_query.region_merge import RegionMerge, merge_region, rank_levels, ranked_at_once
from memwal_query.snapshot import kept_ranks
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.kept_ranks import KeptRanksName, RankedGenerations, decode, encode
from memwal_query.snapshot.model import GenerationSource, MemTableSource, RegionSnapshot

from builders import events_schema, refuses_every_cut_and_flip, rows
from lsm_model import ModelTable, sort_table

KEYS = pa.schema([pa.field("id", pa.int64())])


def _levels(rng: np.random.Generator) -> tuple[RegionSnapshot, SnapshotCache]:
    """A region of 0-4 generations (keys repeated, tombstones, some rows in a second fragment)
    and a MemTable of 0-24 rows (generations at, below or above the flushed ones; sequences
    that tie; NULL tombstone flags), keys from a small range so that levels share them."""
    cache = SnapshotCache()
    numbers = sorted(int(n) for n in rng.choice(np.arange(1, 12), int(rng.integers(0, 5)), replace=False))
    gens = []
    for i, number in enumerate(numbers):
        n = int(rng.integers(0, 30))
        split = int(rng.integers(0, n + 1)) if rng.random() < 0.3 else n
        addrs = np.concatenate([np.arange(split), (1 << 32) + np.arange(n - split)]).astype(np.uint64)
        uri = f"memory://g{i}"
        cache.generation_keys[uri] = pa.table(
            {"id": rng.integers(0, 40, n), TOMBSTONE: rng.random(n) < 0.2, "_rowaddr": pa.array(addrs, pa.uint64())}
        )
        gens.append(GenerationSource("r", number, uri, None, n))  # type: ignore[arg-type]
    m = int(rng.integers(0, 25))
    choices = [max(numbers, default=0) + 1] * 4 + numbers + [0]
    flags = [None if rng.random() < 0.1 else bool(rng.random() < 0.2) for _ in range(m)]
    table = pa.table(
        {
            "id": pa.array(rng.integers(0, 40, m), pa.int64()),
            "v": pa.array(np.arange(m)),
            TOMBSTONE: pa.array(flags, pa.bool_()),
            GEN_COLUMN: pa.array(rng.choice(choices, m), pa.int64()),
            SEQ_COLUMN: pa.array(rng.integers(0, 8, m), pa.uint64()),
        }
    )
    mem = MemTableSource("r", table, "WAL tail", (1, 2), ()) if m or rng.random() < 0.5 else None
    return RegionSnapshot("r", None, 0, tuple(gens), (), mem), cache


def _same(got: RegionMerge | None, want: RegionMerge | None) -> None:
    assert (got is None) == (want is None)
    if got is None or want is None:
        return
    assert got.stats == want.stats
    assert {u: d.tolist() for u, d in got.generation_drop.items()} == {
        u: d.tolist() for u, d in want.generation_drop.items()
    }
    assert all(d.dtype == np.uint64 for d in got.generation_drop.values())
    assert (got.memtable is None) == (want.memtable is None)
    if got.memtable is not None and want.memtable is not None:
        assert got.memtable.to_pylist() == want.memtable.to_pylist()
    assert got.newest.schema.names == want.newest.schema.names
    assert got.newest.schema.types == want.newest.schema.types
    assert got.newest.to_pylist() == want.newest.to_pylist()


def _kept(ranks: RankedGenerations, region: RegionSnapshot, cache: SnapshotCache) -> RankedGenerations:
    """``ranks`` through a kept file (encoded, then decoded against the region's generations)."""
    shapes = []
    for g in region.generations:
        fragments = cache.generation_keys[g.uri].column("_rowaddr").to_numpy() >> np.uint64(32)
        shapes.append({int(f): int((fragments == f).sum()) for f in np.unique(fragments)})
    name = KeptRanksName(b"k" * 32, tuple(shapes), np.dtype(np.int64), tuple(g.uri for g in region.generations))
    got = decode(encode(name, ranks), name)
    assert got is not None
    return got


@pytest.mark.parametrize("seed", range(300))
def test_two_steps_rank_as_all_levels_at_once(seed: int) -> None:
    rng = np.random.default_rng(seed)
    region, cache = _levels(rng)
    want = ranked_at_once(region, ["id"], KEYS, cache)
    _same(merge_region(region, ["id"], KEYS, SnapshotCache(generation_keys=dict(cache.generation_keys)), b""), want)
    if region.generations:
        ranked = rank_levels(region.generations, None, ["id"], KEYS, cache)
        ranks = ranks_of(ranked, len(region.generations), "id", np.dtype(np.int64))
        _same(with_memtable(_kept(ranks, region, cache), region, "id", KEYS), want)


def _name() -> KeptRanksName:
    return KeptRanksName(bytes(range(32)), ({0: 2}, {0: 1, 1: 2}), np.dtype(np.int64), ("a", "b"))


def _ranks() -> RankedGenerations:
    """Generation a: key 3, then a tombstone of key 8; generation b: key 3 again, key 5 twice
    (its second fragment)."""
    u = np.uint64
    return RankedGenerations(
        np.array([3, 5, 8]),
        np.array([False, False, True]),
        np.array([1, 1, 0], dtype=np.int32),
        np.array([0, (1 << 32) | 1, 1], dtype=u),
        (np.array([0, 1], dtype=u), np.array([1 << 32], dtype=u)),
        5,
    )


def test_damaged_or_foreign_ranking_files_are_ignored() -> None:
    """A file cut short, with any byte changed, of another name or other generations, or whose
    keys are unsorted, whose levels or addresses fall outside its generations, whose drop lists
    are unsorted, or whose rows do not add up, decodes to nothing; a whole one to what was kept."""
    name, ranks = _name(), _ranks()
    data = encode(name, ranks)
    got = decode(data, name)
    assert got is not None and got.keys.tolist() == [3, 5, 8] and got.rows == 5
    assert got.seq.tolist() == ranks.seq.tolist() and got.level.tolist() == [1, 1, 0]
    assert [d.tolist() for d in got.drops] == [[0, 1], [1 << 32]] and got.tombstone.tolist() == [False, False, True]
    refuses_every_cut_and_flip(data, lambda d: decode(d, name))
    assert decode(data, KeptRanksName(bytes(32), name.fragments, name.dtype)) is None
    assert decode(data, KeptRanksName(name.name, ({0: 2},), name.dtype)) is None
    assert decode(data, KeptRanksName(name.name, ({0: 1}, {0: 1, 1: 2}), name.dtype)) is None  # row 1 of a
    assert decode(data, KeptRanksName(name.name, ({0: 2}, {0: 1, 1: 1}), name.dtype)) is None  # row 1 of b's 2nd
    assert decode(data, KeptRanksName(name.name, ({0: 2}, {0: 1}), name.dtype)) is None  # no such fragment
    u = np.uint64
    bad = [
        RankedGenerations(ranks.keys[[1, 0, 2]], ranks.tombstone, ranks.level, ranks.seq, ranks.drops, 5),
        RankedGenerations(ranks.keys, ranks.tombstone, np.array([2, 1, 0], np.int32), ranks.seq, ranks.drops, 5),
        RankedGenerations(
            ranks.keys, ranks.tombstone, ranks.level, ranks.seq, (np.array([1, 0], u), ranks.drops[1]), 5
        ),
        RankedGenerations(ranks.keys, ranks.tombstone, ranks.level, ranks.seq, ranks.drops, 6),
    ]
    for b in bad:
        assert decode(encode(name, b), name) is None


def _table(path: Path, rng: np.random.Generator) -> ModelTable:
    """Two regions of two generations each (keys overwritten and deleted) and a WAL tail."""
    schema = events_schema()
    base = pa.Table.from_pylist(rows(range(400), 0, rng), schema=schema)
    t = ModelTable(str(path / "t"), schema, base, bucket=("id", 2), max_memtable_rows=10_000)
    for v in (1, 2):
        t.put(rows(rng.choice(600, 150, replace=False), v, rng))
        t.delete([(int(k),) for k in rng.choice(600, 20, replace=False)])
        t.flush()
    t.put(rows(rng.choice(600, 60, replace=False), 3, rng))
    return t


def _answers(table: mq.Table) -> dict[str, Any]:
    keys = list(range(0, 600, 7))
    return {
        "rows": sort_table(table.to_arrow(), ["id"]).to_pylist(),
        "count": table.sql("SELECT count(*) AS n FROM t").to_pylist()[0]["n"],
        "lookup": sorted(r["id"] for r in table.lookup(keys).to_pylist()),
    }


def _keeping_nothing(uri: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setenv("MEMWAL_CACHE_DIR", "off")
        return _answers(mq.open_table(uri))


def test_a_new_snapshot_takes_the_kept_ranking_and_reads_no_generation_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first snapshot ranks each region's generations and keeps the ranking; a snapshot with
    a cache of its own (a new process) then reads none of their keys, after a write too (only
    the MemTable is ranked again); a flush or a merge changes the generations and their
    ranking is read again. Every answer is the model's and a process keeping nothing's."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(11)
    t = _table(tmp_path, rng)

    def step(reads_keys: bool) -> None:
        first = mq.open_table(t.uri)  # ranks in the background and keeps (if not kept already)
        machine_cache.settle()
        again = mq.open_table(t.uri)  # as a new process: a cache of its own
        assert bool(again.view.cache.generation_keys) == reads_keys
        got = _answers(again)
        assert got == _answers(first) == _keeping_nothing(t.uri, monkeypatch)
        assert got["rows"] == sort_table(t.expected(), ["id"]).to_pylist()

    kept = tmp_path / "cache" / kept_ranks.KIND
    step(reads_keys=False)
    assert len([p for p in kept.rglob("*") if p.is_file()]) == 2  # one per region
    t.put(rows(rng.choice(600, 40, replace=False), 4, rng))  # keys of the generations overwritten
    t.delete([(int(k),) for k in rng.choice(600, 15, replace=False)])
    step(reads_keys=False)
    t.flush()
    step(reads_keys=False)  # the first snapshot of the new generations kept their ranking
    (region, *_) = t.regions()
    t.merge(region, t.flushed(region)[0][0])
    step(reads_keys=False)
