"""One region's levels ranked: each key's rows sorted newest first (:func:`rank_levels`), and
what a region's merge yields (:class:`RegionMerge`).

Used by the merge of each region (:mod:`memwal_query.region_merge`), the ranking of its
generations alone (:mod:`memwal_query.generation_ranks`) and the catch-up planner.
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
from memwal_query.snapshot.model import GenerationSource, MemTableSource

__all__ = ["RegionMerge", "RegionMergeStats", "RankedLevels", "first_of_group", "idx_column", "rank_levels"]


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
    allk = allk.append_column(idx_column(pk), pa.array(np.arange(allk.num_rows, dtype=np.int64)))
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


def idx_column(pk: Sequence[str]) -> str:
    """The name of the ranked key rows' number beside the key columns."""
    return scratch("_idx", pk)
