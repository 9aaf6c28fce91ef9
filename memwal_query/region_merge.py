"""One region's part of the merge: its levels' keys ranked newest first, what each level
loses, and the reuse of that work by later snapshots of a region that did not change.

A region's merge depends only on its unmerged generations (immutable, named by URI), the
WAL entries its MemTable replays (immutable, by position) and the table's columns: a
refresh reuses the merge of every region whose three are the same (ranking the keys of
every generation again cost ~0.14 ms per generation per refresh, changed or not). Rows
handed in with ``open_table(live=...)`` may change at any time: never reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.format.scratch import scratch
from memwal_query.format.wal import GEN_COLUMN, LEVEL_COLUMN, SEQ_COLUMN, TOMBSTONE
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.generations import generation_keys
from memwal_query.snapshot.model import GenerationSource, MemTableSource, RegionSnapshot

__all__ = ["RegionMerge", "RegionMergeStats", "RankedLevels", "first_of_group", "merge_region", "rank_levels"]


@dataclass(frozen=True)
class RegionMergeStats:
    """What the dedup of one region found."""

    newer_rows: int
    live_keys: int
    deleted_keys: int
    superseded_rows: int


def first_of_group(sorted_keys: Sequence[pa.ChunkedArray | pa.Array]) -> np.ndarray:
    """Boolean mask of the rows that start a new key in key-sorted columns.

    Example:
        >>> import pyarrow as pa
        >>> first_of_group([pa.array([1, 1, 2, 3, 3])]).tolist()
        [True, False, True, True, False]
    """
    n = len(sorted_keys[0])
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    out[0] = True
    for col in sorted_keys:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        neq = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
        out[1:] |= neq.to_numpy(zero_copy_only=False)
    return out


@dataclass(frozen=True)
class RankedLevels:
    """Key rows of one region's levels sorted by key, then newest first.

    ``first`` marks the newest row of each key; ``level`` is the index of the row's
    generation in the list given (-1: the MemTable); ``seq`` its row address (or
    MemTable sequence).
    """

    sorted: pa.Table
    first: np.ndarray
    tombstone: np.ndarray
    level: np.ndarray
    seq: np.ndarray
    memtable_offset: int


def rank_levels(
    generations: Sequence[GenerationSource],
    memtable: MemTableSource | None,
    pk: Sequence[str],
    key_schema: pa.Schema,
    cache: SnapshotCache,
) -> RankedLevels | None:
    """Rank the key rows of ``generations`` (and ``memtable``) of one region; None if empty."""
    parts: list[pa.Table] = []
    for lvl, g in enumerate(generations):
        kt = generation_keys(g.dataset, pk, cache, g.uri)
        n = kt.num_rows
        parts.append(
            pa.table(
                {
                    **{k: kt.column(k).cast(key_schema.field(k).type) for k in pk},
                    TOMBSTONE: kt.column(TOMBSTONE),
                    GEN_COLUMN: pa.array(np.full(n, g.generation, dtype=np.int64)),
                    SEQ_COLUMN: kt.column("_rowaddr"),
                    LEVEL_COLUMN: pa.array(np.full(n, lvl, dtype=np.int32)),
                }
            )
        )
    offset = sum(p.num_rows for p in parts)
    if memtable is not None and memtable.table.num_rows:
        m = memtable.table
        parts.append(
            pa.table(
                {
                    **{k: m.column(k) for k in pk},
                    TOMBSTONE: pc.fill_null(m.column(TOMBSTONE), False),
                    GEN_COLUMN: m.column(GEN_COLUMN),
                    SEQ_COLUMN: m.column(SEQ_COLUMN),
                    LEVEL_COLUMN: pa.array(np.full(m.num_rows, -1, dtype=np.int32)),
                }
            )
        )
    if not parts:
        return None
    allk = pa.concat_tables(parts).combine_chunks()
    allk = allk.append_column(_idx_column(pk), pa.array(np.arange(allk.num_rows, dtype=np.int64)))
    order = pc.sort_indices(
        allk,
        sort_keys=[(k, "ascending") for k in pk] + [(GEN_COLUMN, "descending"), (SEQ_COLUMN, "descending")],
    )
    s = allk.take(order)
    return RankedLevels(
        sorted=s,
        first=first_of_group([s.column(k) for k in pk]),
        tombstone=pc.fill_null(s.column(TOMBSTONE), False).to_numpy(zero_copy_only=False),
        level=s.column(LEVEL_COLUMN).to_numpy(),
        seq=s.column(SEQ_COLUMN).to_numpy(),
        memtable_offset=offset,
    )


@dataclass(frozen=True)
class RegionMerge:
    """One region's part of the merge (see :func:`compute_merge`)."""

    generation_drop: dict[str, np.ndarray]
    memtable: pa.Table | None
    newest: pa.Table
    stats: RegionMergeStats


def _idx_column(pk: Sequence[str]) -> str:
    """The name of the ranked key rows' number beside the key columns."""
    return scratch("_idx", pk)


def _ranked_region(
    region: RegionSnapshot, pk: list[str], key_schema: pa.Schema, cache: SnapshotCache
) -> RegionMerge | None:
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
        mem_rows = s.column(_idx_column(pk)).to_numpy()[(lvl == -1) & keep]
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
