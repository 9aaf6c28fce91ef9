"""A region's merge in two steps, for a single integer key: its generations ranked alone, then
its MemTable's rows ranked against them.

A region's generations never change but its MemTable does with every write, so ranking them
apart lets a refresh after a write, and a new process (the ranking kept on this machine:
:mod:`memwal_query.snapshot.kept_ranks`), rank only the MemTable's rows: a sort of a few
thousand rows and one binary search each, where ranking every level again read each
generation's keys (~1 ms each in a new process) and sorted all their rows. A snapshot whose
region has no ranking held merges it at once as before (:func:`~memwal_query.region_rank.rank_levels`
over every level) and has its generations ranked alone off the open's path (:func:`rank_soon`).

The result is the one :func:`memwal_query.region_rank.rank_levels` gives over all the levels
at once: a key's newest row has the highest generation, then the highest sequence (row
address), the generations' row first on a tie.

Example:
    >>> import numpy as np
    >>> ranks = RankedGenerations(np.array([1, 2]), np.array([False, False]), np.array([0, 0], dtype=np.int32),
    ...     np.array([0, 1], dtype=np.uint64), (np.array([], dtype=np.uint64),), 2)
    >>> m = Memtable.of(np.array([2, 3]), np.array([9, 9]), np.array([0, 1], dtype=np.uint64), np.array([True, False]))
    >>> match = Matched.of(ranks, np.array([5]), m)  # generation 5 holds keys 1 and 2
    >>> match.lost.tolist(), match.new.tolist()  # key 2's newest row is the MemTable's (9 > 5); key 3 is new
    ([1], [1])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.format.machine_cache import later
from memwal_query.format.wal import GEN_COLUMN, LEVEL_COLUMN, SEQ_COLUMN, TOMBSTONE
from memwal_query.region_rank import RankedLevels, RegionMerge, RegionMergeStats, rank_levels
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.kept_ranks import KeptRanksName, RankedGenerations, held, keep
from memwal_query.snapshot.model import RegionSnapshot

__all__ = [
    "Matched",
    "Memtable",
    "RankedGenerations",
    "generation_ranks",
    "rank_soon",
    "ranks_of",
    "with_memtable",
]

_NO_ROWS = np.empty(0, dtype=np.uint64)


def ranks_of(ranked: RankedLevels | None, levels: int, key: str, dtype: np.dtype) -> RankedGenerations:
    """The ranking of ``levels`` generations alone, from :func:`rank_levels` over them (no MemTable)."""
    if ranked is None:
        return RankedGenerations(np.empty(0, dtype=dtype), np.empty(0, dtype=bool), np.empty(0, dtype=np.int32),
                                 _NO_ROWS, tuple(_NO_ROWS for _ in range(levels)), 0)  # fmt: skip
    first, tomb, level, seq = ranked.first, ranked.tombstone, ranked.level, ranked.seq
    keep_rows = first & ~tomb
    drops = tuple(np.sort(seq[(level == i) & ~keep_rows].astype(np.uint64)) for i in range(levels))
    keys = np.asarray(ranked.sorted.column(key).to_numpy()).astype(dtype, copy=False)[first]
    return RankedGenerations(keys, tomb[first], level[first].astype(np.int32), seq[first].astype(np.uint64), drops,
                             int(first.size))  # fmt: skip


def generation_ranks(
    region: RegionSnapshot, pk: list[str], key_schema: pa.Schema, cache: SnapshotCache
) -> RankedGenerations:
    """The ranking of ``region``'s generations: held by ``cache``, else ranked now, held and kept
    on this machine (under the region's :attr:`~memwal_query.snapshot.model.RegionSnapshot.ranks_name`)."""
    uris = tuple(g.uri for g in region.generations)
    got = held(cache, region.region_id, region.generations)
    if got is not None:
        return got
    dtype = np.dtype(key_schema.field(pk[0]).type.to_pandas_dtype())
    ranked = rank_levels(region.generations, None, pk, key_schema, cache) if uris else None
    ranks = ranks_of(ranked, len(uris), pk[0], dtype)
    with cache.lock:
        cache.generation_ranks[region.region_id] = (uris, ranks)
    name = region.ranks_name
    if isinstance(name, KeptRanksName) and name.uris == uris:
        keep(name, ranks)
    return ranks


def rank_soon(region: RegionSnapshot, pk: list[str], key_schema: pa.Schema, cache: SnapshotCache) -> None:
    """:func:`generation_ranks` on a thread of its own (:func:`~memwal_query.format.machine_cache.later`):
    a snapshot whose region's generations have no ranking held merges the region at once, as fast
    as before, and the next snapshot or process takes the ranking made meanwhile."""
    uris = tuple(g.uri for g in region.generations)
    with cache.lock:  # once per set of generations (None: being ranked)
        hit = cache.generation_ranks.get(region.region_id)
        if not uris or (hit is not None and hit[0] == uris):
            return
        cache.generation_ranks[region.region_id] = (uris, None)
    later(generation_ranks, region, pk, key_schema, cache)


@dataclass(frozen=True)
class Memtable:
    """A MemTable's newest row of each key (``first``: their row numbers in the MemTable)."""

    keys: np.ndarray
    gen: np.ndarray
    seq: np.ndarray
    tombstone: np.ndarray
    first: np.ndarray

    @staticmethod
    def of(keys: np.ndarray, gen: np.ndarray, seq: np.ndarray, tombstone: np.ndarray) -> Memtable:
        """From every row's key, generation, sequence and tombstone flag (the first of equal rows wins)."""
        rows = np.arange(keys.size)
        order = np.lexsort((-rows, seq, gen, keys))  # the newest last in each key's run
        last = np.ones(keys.size, dtype=bool)
        last[:-1] = keys[order][1:] != keys[order][:-1]
        first = order[last]
        return Memtable(keys[first], gen[first], seq[first], tombstone[first], first)


@dataclass(frozen=True)
class Matched:
    """Where a MemTable's newest rows go among a ranking's keys.

    Attributes:
        lost: Positions (in the ranking) of the keys whose newest row is the MemTable's.
        won: The MemTable's rows (positions in :class:`Memtable`) that beat them, in the same order.
        new: The MemTable's rows of keys the generations lack.
        at: Where each of ``new`` goes among the ranking's keys (ascending).
    """

    lost: np.ndarray
    won: np.ndarray
    new: np.ndarray
    at: np.ndarray

    @staticmethod
    def of(ranks: RankedGenerations, generations: np.ndarray, mem: Memtable) -> Matched:
        """``mem`` ranked against ``ranks`` (``generations``: each level's generation number)."""
        at = np.searchsorted(ranks.keys, mem.keys)
        found = at < ranks.keys.size
        found[found] = ranks.keys[at[found]] == mem.keys[found]
        shared, m = at[found], np.flatnonzero(found)
        g_gen = generations[ranks.level[shared]]
        newer = (mem.gen[m] > g_gen) | ((mem.gen[m] == g_gen) & (mem.seq[m] > ranks.seq[shared]))
        new = np.flatnonzero(~found)
        return Matched(shared[newer], m[newer], new, at[new])


def _laid(ours: np.ndarray, theirs: np.ndarray, match: Matched, places: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A ranking's column ``ours`` with the MemTable's ``theirs`` over the keys it lost and
    inserted for its new keys (``places``: where the ranking's keys and the new ones go)."""
    if match.lost.size:
        ours = ours.copy()
        ours[match.lost] = theirs[match.won]
    if not match.new.size:
        return ours
    olds, news = places
    out = np.empty(olds.size + news.size, dtype=np.result_type(ours, theirs))
    out[olds] = ours
    out[news] = theirs[match.new]
    return out


def with_memtable(ranks: RankedGenerations, region: RegionSnapshot, key: str, key_schema: pa.Schema) -> RegionMerge:
    """The region's merge: ``ranks`` (its generations') with its MemTable's rows ranked against them."""
    dtype = ranks.keys.dtype
    generations = np.array([g.generation for g in region.generations], dtype=np.int64)
    table = region.memtable.table if region.memtable is not None else None
    if table is not None and table.num_rows:
        mem = Memtable.of(
            np.asarray(table.column(key).to_numpy()).astype(dtype, copy=False),
            np.asarray(table.column(GEN_COLUMN).to_numpy()).astype(np.int64, copy=False),
            np.asarray(table.column(SEQ_COLUMN).to_numpy()).astype(np.uint64, copy=False),
            np.asarray(pc.fill_null(table.column(TOMBSTONE), False).to_numpy(zero_copy_only=False)),
        )
    else:
        mem = Memtable(ranks.keys[:0], generations[:0], _NO_ROWS, np.empty(0, dtype=bool), np.empty(0, dtype=np.int64))
    match = Matched.of(ranks, generations, mem)
    news = match.at + np.arange(match.new.size)  # each new key after the ranking's keys before it
    olds = np.ones(ranks.keys.size + news.size, dtype=bool)
    olds[news] = False
    into = (np.flatnonzero(olds), news)
    gen_drop = {}
    for i, g in enumerate(region.generations):  # a beaten tombstone is a drop already: the union keeps one
        more = ranks.seq[match.lost[ranks.level[match.lost] == i]]
        drop = np.union1d(ranks.drops[i], more).astype(np.uint64) if more.size else ranks.drops[i]
        if drop.size:
            gen_drop[g.uri] = drop
    tomb = _laid(ranks.tombstone, mem.tombstone, match, into)
    newest = pa.table(
        {
            key: pa.array(_laid(ranks.keys, mem.keys, match, into), type=key_schema.field(key).type),
            TOMBSTONE: pa.array(tomb),
            GEN_COLUMN: pa.array(_laid(generations[ranks.level], mem.gen, match, into), type=pa.int64()),
            SEQ_COLUMN: pa.array(_laid(ranks.seq, mem.seq, match, into), type=pa.uint64()),
            LEVEL_COLUMN: pa.array(_laid(ranks.level, np.full(mem.keys.size, -1, np.int32), match, into), pa.int32()),
        }
    )
    mine = np.concatenate([match.won, match.new])
    live_mem = np.sort(mem.first[mine[~mem.tombstone[mine]]])
    memtable = None
    if table is not None and table.num_rows:  # every row live (the usual WAL tail): no copy
        memtable = table if live_mem.size == table.num_rows else table.take(pa.array(live_mem))
    rows = ranks.rows + (table.num_rows if table is not None else 0)
    stats = RegionMergeStats(
        newer_rows=rows,
        live_keys=int((~tomb).sum()),
        deleted_keys=int(tomb.sum()),
        superseded_rows=rows - newest.num_rows,
    )
    return RegionMerge(gen_drop, memtable, newest, stats)
