"""One region's part of the merge: its levels' keys ranked newest first, what each level
loses, and the reuse of that work by later snapshots of a region that did not change.

A region's merge depends only on its unmerged generations (immutable, named by URI), the
WAL entries its MemTable replays (immutable, by position) and the table's columns: a
refresh reuses the merge of every region whose three are the same (ranking the keys of
every generation again cost ~0.14 ms per generation per refresh, changed or not). Rows
handed in with ``open_table(live=...)`` may change at any time: never reused.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memwal_query.format.wal import GEN_COLUMN, LEVEL_COLUMN, SEQ_COLUMN, TOMBSTONE
from memwal_query.generation_ranks import rank_soon, with_memtable
from memwal_query.region_rank import (
    RankedLevels,
    RegionMerge,
    RegionMergeStats,
    first_of_group,
    idx_column,
    rank_levels,
)
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.kept_ranks import held
from memwal_query.snapshot.model import RegionSnapshot

__all__ = [
    "RegionMerge",
    "RegionMergeStats",
    "RankedLevels",
    "first_of_group",
    "merge_region",
    "rank_levels",
    "ranked_at_once",
]


def _ranked_region(
    region: RegionSnapshot, pk: list[str], key_schema: pa.Schema, cache: SnapshotCache
) -> RegionMerge | None:
    """The region's merge: in two steps for one integer key (its generations' ranking, held or
    kept, then its MemTable: :mod:`memwal_query.generation_ranks`), else all levels at once."""
    mem = region.memtable
    if len(pk) == 1 and pa.types.is_integer(key_schema.field(pk[0]).type):
        if not region.generations and (mem is None or not mem.table.num_rows):
            return None
        if mem is None or not mem.table.column(pk[0]).null_count:
            ranks = held(cache, region.region_id, region.generations)  # found kept, or ranked since
            if ranks is not None:
                return with_memtable(ranks, region, pk[0], key_schema)
            rank_soon(region, pk, key_schema, cache)
    return ranked_at_once(region, pk, key_schema, cache)


def ranked_at_once(
    region: RegionSnapshot, pk: list[str], key_schema: pa.Schema, cache: SnapshotCache
) -> RegionMerge | None:
    """The region's merge from one ranking of every level's keys (:func:`rank_levels`); None
    when it has no rows."""
    ranked = rank_levels(region.generations, region.memtable, pk, key_schema, cache)
    if ranked is None:
        return None
    s, first, tomb, lvl, seq = ranked.sorted, ranked.first, ranked.tombstone, ranked.level, ranked.seq
    keep = first & ~tomb
    mem = region.memtable
    gen_drop: dict[str, np.ndarray] = {}
    for i, g in enumerate(region.generations):
        drop = seq[(lvl == i) & ~keep]
        if drop.size:
            gen_drop[g.uri] = np.sort(drop.astype(np.uint64))
    memtable = None
    if mem is not None and mem.table.num_rows:
        mem_rows = s.column(idx_column(pk)).to_numpy()[(lvl == -1) & keep]
        memtable = mem.table.take(pa.array(np.sort(mem_rows - ranked.memtable_offset)))
    stats = RegionMergeStats(
        newer_rows=s.num_rows,
        live_keys=int(keep.sum()),
        deleted_keys=int((first & tomb).sum()),
        superseded_rows=int((~first).sum()),
    )
    newest = s.filter(pa.array(first)).select([*pk, TOMBSTONE, GEN_COLUMN, SEQ_COLUMN, LEVEL_COLUMN])
    return RegionMerge(gen_drop, memtable, newest, stats)


def merge_region(
    region: RegionSnapshot, pk: list[str], key_schema: pa.Schema, cache: SnapshotCache, columns_mark: bytes
) -> RegionMerge | None:
    """The region's merge, reused from an earlier snapshot of the same levels (``columns_mark``:
    ``Snapshot.columns_mark``, the columns the MemTable rows are conformed to)."""
    mem = region.memtable
    reusable = mem is None or (not mem.live and mem.wal_positions is not None)
    mark = (
        tuple(g.uri for g in region.generations),
        None if mem is None else (mem.origin, mem.wal_positions, mem.table.num_rows),
        columns_mark,
    )
    if reusable:
        with cache.lock:
            hit = cache.region_merges.get(region.region_id)
        if hit is not None and hit[0] == mark:
            return hit[1]  # type: ignore[return-value]
    part = _ranked_region(region, pk, key_schema, cache)
    if reusable:
        with cache.lock:
            cache.region_merges[region.region_id] = (mark, part)
    return part
