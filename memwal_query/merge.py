"""Dedup once per snapshot: which row of which level is the live version of a key.

Only key columns move here, never data columns. Per region, the keys of every
newer level (unmerged flushed generations and the MemTable) are sorted by key,
then ``_gen`` descending, then position descending; the first row of each key wins.
A winning tombstone deletes the key. The result is:

* per flushed generation, a sorted array of row addresses to *drop* (superseded
  or tombstone rows);
* per region, the MemTable rows that survive (data columns included; the
  MemTable is in memory anyway);
* for the base table, a sorted array of row addresses to drop: every base row
  whose key appears in any newer level ("masked base").

Every source can then take every user filter safely: the masks depend on keys
only, never on the values a filter looks at.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.format.wal import TOMBSTONE
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import GenerationSource, MemTableSource, Snapshot

__all__ = [
    "NewerKeys",
    "ascending_hits",
    "RegionMergeStats",
    "MergeState",
    "RankedLevels",
    "compute_merge",
    "first_of_group",
    "rank_levels",
]

log = logging.getLogger("memwal_query")

_EMPTY = np.empty(0, dtype=np.uint64)


@dataclass(frozen=True)
class RegionMergeStats:
    """What the dedup of one region found."""

    newer_rows: int
    live_keys: int
    deleted_keys: int
    superseded_rows: int


class NewerKeys:
    """Every key with a version in a newer level (unmerged generations, MemTables).

    A base row is live exactly when its key is not here (a newer version or a
    tombstone shadows it), so a base row read for any reason (a scan, an index
    search, a lookup) can be checked without the base mask. Per region, ``newest``
    holds the newest version of each key: the key columns, ``_deleted``, ``_gen``,
    ``_seq`` (row address in its generation or MemTable sequence) and ``_lvl``
    (index into the region's generations, -1: the MemTable), sorted by key.
    """

    def __init__(self, newest: dict[str, pa.Table], pk: Sequence[str]) -> None:
        self.newest = newest
        self.pk = list(pk)
        self._sorted: np.ndarray | None = None
        self._unique: pa.Table | None = None

    def __len__(self) -> int:
        return sum(t.num_rows for t in self.newest.values())

    def _numeric(self) -> np.ndarray | None:
        """All newer keys as one sorted numpy array (single integer key), else None."""
        if len(self.pk) != 1 or not self.newest:
            return None
        first = next(iter(self.newest.values())).schema.field(self.pk[0]).type
        if not pa.types.is_integer(first):
            return None
        if self._sorted is None:
            parts = [t.column(self.pk[0]).to_numpy() for t in self.newest.values()]
            self._sorted = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        return self._sorted

    def contains(self, keys: pa.Table) -> np.ndarray:
        """Boolean mask: which rows of ``keys`` (the key columns) have a newer version.

        Example:
            >>> import pyarrow as pa
            >>> newer = NewerKeys({"r": pa.table({"id": [2, 5]})}, ["id"])
            >>> newer.contains(pa.table({"id": [1, 2, 5, 7]})).tolist()
            [False, True, True, False]
        """
        n = keys.num_rows
        if n == 0 or not self.newest:
            return np.zeros(n, dtype=bool)
        arr = self._numeric()
        if arr is not None:
            col = keys.column(self.pk[0])
            valid = np.asarray(pc.is_valid(col)) if col.null_count else None  # a null key shadows nothing
            k = np.asarray((pc.fill_null(col, 0) if col.null_count else col).to_numpy(), dtype=arr.dtype)
            if valid is None and k.size > 1 and bool(np.all(k[1:] >= k[:-1])):
                return ascending_hits(k, arr)  # a bulk-loaded base batch: only newer keys in its range
            pos = np.minimum(np.searchsorted(arr, k), arr.size - 1)
            hit = arr[pos] == k if arr.size else np.zeros(n, dtype=bool)
            return hit & valid if valid is not None else hit
        if self._unique is None:
            self._unique = pa.concat_tables([t.select(self.pk) for t in self.newest.values()])
        probe = keys.select(self.pk).append_column("_row", pa.array(np.arange(n, dtype=np.int64)))
        rows = probe.join(self._unique, keys=self.pk, join_type="left semi").column("_row")
        hit = np.zeros(n, dtype=bool)
        hit[np.asarray(rows.to_numpy())] = True
        return hit


def ascending_hits(keys: np.ndarray, newer: np.ndarray) -> np.ndarray:
    """Which of the ascending ``keys`` are in the sorted, unique ``newer``.

    Only the newer keys inside ``keys``' range are looked up (few per batch), not every
    key: a full pass over a bulk-loaded base costs a few searches per batch.

    Example:
        >>> import numpy as np
        >>> ascending_hits(np.array([1, 2, 2, 3, 9]), np.array([2, 9, 20])).tolist()
        [False, True, True, False, True]
    """
    hit = np.zeros(keys.size, dtype=bool)
    if not keys.size or not newer.size:
        return hit
    w = newer[np.searchsorted(newer, keys[0]) : np.searchsorted(newer, keys[-1], "right")]
    if w.size:
        edges = np.zeros(keys.size + 1, dtype=np.int64)  # each run of equal keys [lo, hi): +1 ... -1
        np.add.at(edges, np.searchsorted(keys, w, "left"), 1)
        np.add.at(edges, np.searchsorted(keys, w, "right"), -1)
        hit = np.cumsum(edges[:-1]) > 0
    return hit


@dataclass(frozen=True)
class MergeState:
    """The dedup decision of a snapshot, consumed by the DataFusion sources."""

    base_drop: np.ndarray = field(repr=False)
    generation_drop: dict[str, np.ndarray] = field(repr=False)
    memtables: dict[str, pa.Table] = field(repr=False)
    region_stats: dict[str, RegionMergeStats]
    base_shadowed_rows: int
    seconds: float
    cross_region_keys: int = 0
    newer: NewerKeys = field(default_factory=lambda: NewerKeys({}, []), repr=False)


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


def _generation_keys(ds: object, pk: Sequence[str], cache: SnapshotCache, uri: str) -> pa.Table:
    with cache.lock:
        hit = cache.generation_keys.get(uri)
    if hit is not None:
        return hit
    t = ds.to_table(columns=[*pk, TOMBSTONE], with_row_address=True)  # type: ignore[attr-defined]
    with cache.lock:
        cache.generation_keys[uri] = t
    return t


def _base_keys(snapshot: Snapshot, cache: SnapshotCache) -> pa.Table:
    with cache.lock:
        hit = cache.base_keys.get(snapshot.base_version)
    if hit is not None:
        return hit
    t = snapshot.base.to_table(columns=list(snapshot.primary_key), with_row_address=True)
    with cache.lock:
        cache.base_keys.clear()  # keep one base version: the newest one asked for
        cache.base_keys[snapshot.base_version] = t
    return t


def _numeric_key(snapshot: Snapshot, pk: list[str]) -> bool:
    if len(pk) != 1:
        return False
    t = snapshot.schema.field(pk[0]).type
    return bool(pa.types.is_integer(t))


def _fragment_identity(frag: lance.fragment.LanceFragment) -> tuple[object, ...]:
    """What makes a fragment's live rows: its id, data files and deletion file."""
    m = frag.metadata
    d = m.deletion_file
    deletion = (d.id, d.read_version, d.num_deleted_rows) if d is not None else None
    return (frag.fragment_id, tuple(f.path for f in m.files), deletion)


def _fragment_index(snapshot: Snapshot, cache: SnapshotCache, key: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per base fragment, its keys sorted (with their row addresses).

    Runs are cached per fragment identity (id, data files, deletion file), so a new
    base version reads only the fragments a merge added or changed: refresh cost
    grows with the new data, not with the table. Fragments written by bulk loads and
    merges are usually sorted by key already (one comparison pass); only unsorted
    ones are sorted.
    """
    frags = snapshot.base.get_fragments()
    idents = [_fragment_identity(f) for f in frags]
    with cache.lock:
        known = {i: cache.base_runs[i] for i in idents if i in cache.base_runs}
    missing = [f for f, i in zip(frags, idents, strict=True) if i not in known]

    def read(frag: lance.fragment.LanceFragment) -> tuple[np.ndarray, np.ndarray]:
        t = frag.to_table(columns=[key], with_row_address=True)
        k = t.column(key).combine_chunks().to_numpy(zero_copy_only=False)
        a = t.column("_rowaddr").combine_chunks().to_numpy(zero_copy_only=False)
        if k.size > 1 and not bool(np.all(k[1:] >= k[:-1])):
            order = np.argsort(k, kind="stable")
            k, a = k[order], a[order]
        return k, a

    if missing:
        with ThreadPoolExecutor(min(4, len(missing))) as pool:
            for f, run in zip(missing, pool.map(read, missing), strict=True):
                known[_fragment_identity(f)] = run
    with cache.lock:
        cache.base_runs = dict(known)  # keep the runs of the newest base version only
    return [known[i] for i in idents]


def _base_mask(snapshot: Snapshot, cache: SnapshotCache, keys: pa.Table, pk: list[str]) -> np.ndarray:
    """Sorted row addresses of base rows whose key appears in ``keys`` (the newer levels).

    Integer keys: a per-base-version index of sorted key runs (one per fragment,
    built once and reused by refreshes) is searched for the newer keys, so the cost
    grows with the newer keys, not with the base. Other keys: a hash semi-join.
    """
    if _numeric_key(snapshot, pk):
        index = _fragment_index(snapshot, cache, pk[0])
        want = np.unique(keys.column(pk[0]).combine_chunks().to_numpy(zero_copy_only=False))
        hits = []
        for sk, sa in index:
            if sk.size == 0:
                continue
            w = want[np.searchsorted(want, sk[0]) : np.searchsorted(want, sk[-1], "right")]
            if w.size == 0:
                continue
            lo = np.searchsorted(sk, w, "left")
            hi = np.searchsorted(sk, w, "right")
            counts = hi - lo
            total = int(counts.sum())
            if total:
                starts = np.repeat(lo, counts)
                offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
                hits.append(sa[starts + offsets])
        return _sorted_u64(np.concatenate(hits)) if hits else _EMPTY
    base = _base_keys(snapshot, cache)
    unique = keys.group_by(pk, use_threads=False).aggregate([])
    rows = base.join(unique, keys=pk, join_type="left semi").column("_rowaddr")
    return _sorted_u64(rows)


def _sorted_u64(arr: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    if isinstance(arr, (pa.Array, pa.ChunkedArray)):
        arr = np.asarray(arr.to_numpy() if isinstance(arr, pa.Array) else arr.to_numpy(), dtype=np.uint64)
    out = np.unique(np.asarray(arr, dtype=np.uint64))
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
        kt = _generation_keys(g.dataset, pk, cache, g.uri)
        n = kt.num_rows
        parts.append(
            pa.table(
                {
                    **{k: kt.column(k).cast(key_schema.field(k).type) for k in pk},
                    TOMBSTONE: kt.column(TOMBSTONE),
                    "_gen": pa.array(np.full(n, g.generation, dtype=np.int64)),
                    "_seq": kt.column("_rowaddr"),
                    "_lvl": pa.array(np.full(n, lvl, dtype=np.int32)),
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
                    "_gen": m.column("_gen"),
                    "_seq": m.column("_seq"),
                    "_lvl": pa.array(np.full(m.num_rows, -1, dtype=np.int32)),
                }
            )
        )
    if not parts:
        return None
    allk = pa.concat_tables(parts).combine_chunks()
    allk = allk.append_column("_idx", pa.array(np.arange(allk.num_rows, dtype=np.int64)))
    order = pc.sort_indices(
        allk,
        sort_keys=[(k, "ascending") for k in pk] + [("_gen", "descending"), ("_seq", "descending")],
    )
    s = allk.take(order)
    return RankedLevels(
        sorted=s,
        first=first_of_group([s.column(k) for k in pk]),
        tombstone=pc.fill_null(s.column(TOMBSTONE), False).to_numpy(zero_copy_only=False),
        level=s.column("_lvl").to_numpy(),
        seq=s.column("_seq").to_numpy(),
        memtable_offset=offset,
    )


def compute_merge(snapshot: Snapshot, cache: SnapshotCache) -> MergeState:
    """Decide, once per snapshot, which rows of which level are live.

    Args:
        snapshot: The snapshot to merge.
        cache: Holds per-generation key columns and the base key column.

    Returns:
        The :class:`MergeState`.
    """
    t0 = time.perf_counter()
    pk = list(snapshot.primary_key)
    gen_drop: dict[str, np.ndarray] = {}
    memtables: dict[str, pa.Table] = {}
    stats: dict[str, RegionMergeStats] = {}
    newer_keys: list[pa.Table] = []
    newest: dict[str, pa.Table] = {}
    key_schema = pa.schema([snapshot.schema.field(k) for k in pk])
    for region in snapshot.regions:
        ranked = rank_levels(region.generations, region.memtable, pk, key_schema, cache)
        if ranked is None:
            continue
        s, first, tomb, lvl, seq = ranked.sorted, ranked.first, ranked.tombstone, ranked.level, ranked.seq
        keep = first & ~tomb
        mem = region.memtable
        for i, g in enumerate(region.generations):
            in_lvl = lvl == i
            drop = seq[in_lvl & ~keep]
            if drop.size:
                gen_drop[g.uri] = np.sort(drop.astype(np.uint64))
        if mem is not None and mem.table.num_rows:
            mem_rows = s.column("_idx").to_numpy()[(lvl == -1) & keep]
            offset = ranked.memtable_offset
            idx = np.sort(mem_rows - offset)
            memtables[region.region_id] = mem.table.take(pa.array(idx))
        newest[region.region_id] = s.filter(pa.array(first)).select([*pk, TOMBSTONE, "_gen", "_seq", "_lvl"])
        newer_keys.append(newest[region.region_id].select(pk))
        stats[region.region_id] = RegionMergeStats(
            newer_rows=s.num_rows,
            live_keys=int(keep.sum()),
            deleted_keys=int((first & tomb).sum()),
            superseded_rows=int((~first).sum()),
        )
    base_drop = _EMPTY
    cross = 0
    if newer_keys:
        keys = pa.concat_tables(newer_keys)
        if len(newer_keys) > 1:
            cross = _cross_region_keys(keys, pk, snapshot.uri)
        base_drop = _base_mask(snapshot, cache, keys, pk)
    return MergeState(
        base_drop=base_drop,
        generation_drop=gen_drop,
        memtables=memtables,
        region_stats=stats,
        base_shadowed_rows=int(base_drop.size),
        seconds=time.perf_counter() - t0,
        cross_region_keys=cross,
        newer=NewerKeys(newest, pk),
    )


def _cross_region_keys(keys: pa.Table, pk: list[str], uri: str) -> int:
    """Keys present in more than one region (each region's keys are unique already).

    The spec routes a key to exactly one region; a key in two regions is not
    deduplicated across them (there is no order between regions), so say so.
    """
    counts = keys.group_by(pk).aggregate([([], "count_all")])
    n = int(pc.sum(pc.greater(counts.column("count_all"), 1)).as_py() or 0)
    if n:
        log.warning(
            "%s: %d primary key(s) have rows in more than one region; regions must not share keys "
            "(each region's newest version is returned)",
            uri,
            n,
        )
    return n
