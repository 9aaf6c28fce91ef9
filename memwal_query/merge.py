"""Dedup once per snapshot: which row of which level is the live version of a key.

Only key columns move here, never data columns. Per region, the keys of every
newer level (unmerged flushed generations and the MemTable) are sorted by key,
then ``_gen`` descending, then position descending; the first row of each key wins.
A winning tombstone deletes the key. The result is:

* per flushed generation, a sorted array of row addresses to *drop* (superseded
  or tombstone rows);
* per region, the MemTable rows that survive (data columns included; the
  MemTable is in memory anyway);
* for the base table, a :class:`~memwal_query.base_mask.BaseMask`: every base row
  whose key appears in any newer level ("masked base"), decided lazily per base
  fragment (opening a snapshot reads no base key).

Every source can then take every user filter safely: the masks depend on keys
only, never on the values a filter looks at.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.base_mask import BaseMask
from memwal_query.format.scratch import scratch
from memwal_query.format.storage import Storage
from memwal_query.region_merge import RegionMergeStats, merge_region
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.generations import generation_keys
from memwal_query.snapshot.kept_ranks import held
from memwal_query.snapshot.model import Snapshot

__all__ = [
    "NewerKeys",
    "ascending_hits",
    "RegionMergeStats",
    "MergeState",
    "compute_merge",
]


log = logging.getLogger("memwal_query")
_MAP_PROBE_MAX = 4096  # lookups of up to this many non-integer keys use a per-region dict
_MAP_ENTRY_BYTES = 120  # what one dict entry of a key tuple costs, roughly (for ``nbytes``)


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
        self._region_keys: dict[str, np.ndarray] = {}
        self._region_maps: dict[str, dict[tuple[object, ...], int]] = {}
        self._lock = threading.Lock()
        self.shared_keys = 0  # keys in more than one region (known once sorted_numeric() ran)

    def __len__(self) -> int:
        return sum(t.num_rows for t in self.newest.values())

    def sorted_numeric(self) -> np.ndarray | None:
        """All newer keys as one sorted, unique numpy array (single integer key), else None."""
        return self._numeric()

    def _numeric(self) -> np.ndarray | None:
        """All newer keys as one sorted numpy array (single integer key), else None."""
        if len(self.pk) != 1 or not self.newest:
            return None
        first = next(iter(self.newest.values())).schema.field(self.pk[0]).type
        if not pa.types.is_integer(first):
            return None
        with self._lock:  # scans decide base fragments on several threads
            if self._sorted is None:
                self._sorted, self.shared_keys = _sorted_unique([t.column(self.pk[0]) for t in self.newest.values()])
        return self._sorted

    @property
    def nbytes(self) -> int:
        """Memory held by the in-memory key index (the tables and the arrays derived from them)."""
        derived = [a.nbytes for a in self._region_keys.values()]
        derived += [_MAP_ENTRY_BYTES * len(m) for m in self._region_maps.values()]  # an estimate
        if self._sorted is not None:
            derived.append(self._sorted.nbytes)
        return int(sum(t.nbytes for t in self.newest.values()) + sum(derived))

    def find(self, region_id: str, keys: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Which rows of ``keys`` have a newer version in the region, and where.

        Returns:
            ``(key_rows, newest_rows)``: positions in ``keys`` and the matching positions in
            ``newest[region_id]`` (the newest version of that key). A null key matches nothing.

        Example:
            >>> import pyarrow as pa
            >>> newer = NewerKeys({"r": pa.table({"id": [2, 5]})}, ["id"])
            >>> [a.tolist() for a in newer.find("r", pa.table({"id": [5, 1, 2]}))]
            [[0, 2], [1, 0]]
        """
        table = self.newest.get(region_id)
        empty = np.empty(0, dtype=np.int64)
        if table is None or table.num_rows == 0 or keys.num_rows == 0:
            return empty, empty
        col = keys.column(self.pk[0])
        if len(self.pk) == 1 and pa.types.is_integer(col.type):
            arr = self._region_keys.get(region_id)
            if arr is None:
                arr = self._region_keys[region_id] = np.asarray(table.column(self.pk[0]).to_numpy())
            k = np.asarray(pc.fill_null(col, 0).to_numpy(), dtype=arr.dtype)
            pos = np.minimum(np.searchsorted(arr, k), arr.size - 1)
            hit = arr[pos] == k
            if col.null_count:
                hit &= np.asarray(pc.is_valid(col))
            rows = np.flatnonzero(hit)
            return rows, pos[rows].astype(np.int64)
        if keys.num_rows <= _MAP_PROBE_MAX:  # a few keys: the region's key map (built once)
            return self._mapped(region_id, table, keys)
        # Many keys: a hash join, the lookup keys as the build side.
        krow, nrow = scratch("_krow", self.pk), scratch("_nrow", self.pk)
        probe = keys.select(self.pk).append_column(krow, pa.array(np.arange(keys.num_rows, dtype=np.int64)))
        target = table.select(self.pk).append_column(nrow, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        joined = target.join(probe, keys=self.pk, join_type="inner", use_threads=False)
        return (
            np.asarray(joined.column(krow).to_numpy(), dtype=np.int64),
            np.asarray(joined.column(nrow).to_numpy(), dtype=np.int64),
        )

    def _mapped(self, region_id: str, table: pa.Table, keys: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`find` through a dict of the region's keys (non-integer keys; nulls match nothing)."""
        with self._lock:
            found = self._region_maps.get(region_id)
            if found is None:
                found = self._region_maps[region_id] = _key_map(table, self.pk)
        rows, at = [], []
        for i, key in enumerate(_key_tuples(keys, self.pk)):
            hit = found.get(key)
            if hit is not None and None not in key:
                rows.append(i)
                at.append(hit)
        return np.asarray(rows, dtype=np.int64), np.asarray(at, dtype=np.int64)

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
        row = scratch("_row", self.pk)
        probe = keys.select(self.pk).append_column(row, pa.array(np.arange(n, dtype=np.int64)))
        rows = probe.join(self._unique, keys=self.pk, join_type="left semi").column(row)
        hit = np.zeros(n, dtype=bool)
        hit[np.asarray(rows.to_numpy())] = True
        return hit


def _key_tuples(table: pa.Table, pk: Sequence[str]) -> list[tuple[object, ...]]:
    return list(zip(*(table.column(c).to_pylist() for c in pk), strict=True))


def _key_map(table: pa.Table, pk: Sequence[str]) -> dict[tuple[object, ...], int]:
    """Key tuple -> row of ``table`` (keys are unique per region's newest versions)."""
    return {key: i for i, key in enumerate(_key_tuples(table, pk))}


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


def _sorted_unique(columns: list[pa.ChunkedArray]) -> tuple[np.ndarray, int]:
    """The distinct values of key-sorted integer columns, sorted, and how many of them occur
    in more than one column."""
    parts = [np.asarray(c.to_numpy()) for c in columns if len(c)]
    if not parts:
        return np.empty(0, dtype=np.int64), 0
    allk = np.sort(np.concatenate(parts))  # introsort: 0.74 ms for 161k keys, timsort over the runs 1.1 ms
    keep = np.ones(allk.size, dtype=bool)
    keep[1:] = allk[1:] != allk[:-1]
    repeated = ~keep
    shared = int(np.count_nonzero(repeated[1:] & ~repeated[:-1])) if allk.size > 1 else 0
    return allk[keep], shared


@dataclass(frozen=True)
class MergeState:
    """The dedup decision of a snapshot, consumed by the DataFusion sources.

    ``base_mask`` decides shadowed base rows lazily, per base fragment;
    :attr:`base_drop` and :attr:`base_shadowed_rows` decide all of them (once).
    """

    base_mask: BaseMask = field(repr=False)
    generation_drop: dict[str, np.ndarray] = field(repr=False)
    memtables: dict[str, pa.Table] = field(repr=False)
    region_stats: dict[str, RegionMergeStats]
    seconds: float
    cross_region_keys: int = 0
    newer: NewerKeys = field(default_factory=lambda: NewerKeys({}, []), repr=False)

    @property
    def base_drop(self) -> np.ndarray:
        """Every shadowed base row address, sorted (reads the keys of undecided base fragments)."""
        return self.base_mask.all()

    @property
    def base_shadowed_rows(self) -> int:
        """Base rows shadowed by a newer level (decides every base fragment)."""
        return self.base_mask.count()


def compute_merge(snapshot: Snapshot, cache: SnapshotCache, storage: Storage | None = None) -> MergeState:
    """Decide, once per snapshot, which rows of which level are live.

    Args:
        snapshot: The snapshot to merge.
        cache: Holds per-generation key columns and the base key column.
        storage: The table's storage: base key columns are then read from the data files.

    Returns:
        The :class:`MergeState`.
    """
    t0 = time.perf_counter()
    pk = list(snapshot.primary_key)
    key_schema = pa.schema([snapshot.schema.field(k) for k in pk])
    ranked = {r.region_id for r in snapshot.regions if held(cache, r.region_id, r.generations) is not None}
    with cache.lock:  # a region whose generations' ranking is held reads none of their keys
        unread = [
            g
            for r in snapshot.regions
            if r.region_id not in ranked
            for g in r.generations
            if g.uri not in cache.generation_keys
        ]
    if len(unread) > 1:  # one small Lance read each: overlap them (rank_levels then finds them cached)
        with ThreadPoolExecutor(min(4, len(unread))) as pool:
            list(pool.map(lambda g: generation_keys(g.dataset, pk, cache, g.uri), unread))
    regions = snapshot.regions
    mark = snapshot.columns_mark
    parts = [merge_region(r, pk, key_schema, cache, mark) for r in regions]  # threads measured no faster
    gen_drop: dict[str, np.ndarray] = {}
    memtables: dict[str, pa.Table] = {}
    stats: dict[str, RegionMergeStats] = {}
    newest: dict[str, pa.Table] = {}
    for region, part in zip(regions, parts, strict=True):
        if part is None:
            continue
        gen_drop.update(part.generation_drop)
        if part.memtable is not None:
            memtables[region.region_id] = part.memtable
        newest[region.region_id] = part.newest
        stats[region.region_id] = part.stats
    newer_keys = [t.select(pk) for t in newest.values()]
    newer = NewerKeys(newest, pk)
    cross = 0
    if len(newer_keys) > 1:
        numeric = newer.sorted_numeric()  # also what base fragments are checked against
        if numeric is not None:
            cross = _warn_cross_region(newer.shared_keys, snapshot.uri)
        else:
            cross = _cross_region_keys(pa.concat_tables(newer_keys), pk, snapshot.uri)
    return MergeState(
        base_mask=BaseMask(snapshot.cache_source, snapshot.base, pk, newer, cache, storage),
        generation_drop=gen_drop,
        memtables=memtables,
        region_stats=stats,
        seconds=time.perf_counter() - t0,
        cross_region_keys=cross,
        newer=newer,
    )


def _cross_region_keys(keys: pa.Table, pk: list[str], uri: str) -> int:
    """Keys present in more than one region (each region's keys are unique already).

    The spec routes a key to exactly one region; a key in two regions is not
    deduplicated across them (there is no order between regions), so say so.
    """
    counts = keys.group_by(pk).aggregate([([], "count_all")])
    return _warn_cross_region(int(pc.sum(pc.greater(counts.column("count_all"), 1)).as_py() or 0), uri)


def _warn_cross_region(n: int, uri: str) -> int:
    if n:
        log.warning(
            "%s: %d primary key(s) have rows in more than one region; regions must not share keys "
            "(each region's newest version is returned)",
            uri,
            n,
        )
    return n
