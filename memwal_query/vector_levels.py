"""The newer levels of a vector search without a filter: in memory, or read for now until they are.

Small unmerged generations and the MemTables are searched together in memory (the
*pool*, :mod:`memwal_query.vector_pool`), probing the base index's nearest IVF
partitions. Reading every small generation and assigning its rows to partitions costs
~10 ms a generation (a lagging merger's 104 small generations: ~1 s), so a search that
finds the pool not in memory yet does not wait for it. It reads just those generations'
vectors and row addresses and scores them exactly (:meth:`Candidates.small_generation
<memwal_query.vector_search.Candidates.small_generation>`: a Lance flat search costs twice
that read), scores the MemTables flat in memory, and the pool is read on the background
thread (:mod:`memwal_query.vector_background`) for the searches after it. The pool is laid out on
the calling thread when its generations are in memory already (a refreshed snapshot that
adds none), and always with ``MEMWAL_KNN_BACKGROUND=0``.

Large generations are searched through their own index, their rows held in memory once
read in the background (:func:`memwal_query.vector_pool.plan_pool`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import lance
import numpy as np
import pyarrow as pa

from memwal_query import vector_background as background
from memwal_query.format.sets import member
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import GenerationSource
from memwal_query.vector_distance import exact_distances
from memwal_query.vector_pool import (
    Partitioning,
    PoolPart,
    PoolPlan,
    VectorPool,
    build_pool,
    claim_part,
    generation_part,
    part_of,
    plan_pool,
    ready_part,
    warm_part,
)
from memwal_query.vector_search import (
    Candidates,
    Scored,
    SearchSpec,
    by_source,
    lance_search,
)
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = [
    "Job",
    "UNPARTITIONED",
    "index_centroids",
    "index_metric",
    "knn_memory",
    "partitioning",
    "pool_ready",
    "search_pool",
    "search_memtables",
    "generation_jobs",
    "warm_later",
]

Job = tuple[str, Callable[[], pa.Table | Scored]]
Found = tuple[str, Scored]
"""A source's label and its best rows (exact distances, how to read their output columns)."""

UNPARTITIONED = Partitioning(None, False, "flat")
_READERS = 4  # generations read at once when the pool is read on the calling thread
_ENV_LOCK = threading.Lock()
_CENTROIDS_ENV = "LANCE_INCLUDE_VECTOR_CENTROIDS"  # read by Lance (Rust) when it builds index stats
# Added once, at import: a search then only changes its value, which the C library replaces
# in place; adding or removing a variable may move the environment array while one of Lance's
# threads is reading it (they read variables without Python's lock).
os.environ.setdefault(_CENTROIDS_ENV, "false")


def index_centroids(ds: lance.LanceDataset, index_name: str, cache: SnapshotCache) -> np.ndarray | None:
    """The IVF centroids of a base vector index (None: not an IVF index), read once per index."""
    return _index_facts(ds, index_name, cache, centroids=True)[0]


def index_metric(ds: lance.LanceDataset, index_name: str, cache: SnapshotCache) -> str | None:
    """The distance a base vector index was built for (``"l2"``, ``"cosine"``, ``"dot"``; None: unknown).

    A search with another distance is not served by the index: Lance searches every row flat
    instead, and with ``fast_search`` (indexed fragments only) it finds nothing at all. Read
    without the centroids (~1 ms against ~35 ms for 256 x 128 centroids) unless they are in."""
    with cache.lock:
        full = cache.vector_parts.get(("centroids", ds.uri, index_name, ds.version))
    if isinstance(full, tuple):
        return str(full[1]) if full[1] is not None else None
    return _index_facts(ds, index_name, cache, centroids=False)[1]


def _index_facts(
    ds: lance.LanceDataset, index_name: str, cache: SnapshotCache, *, centroids: bool
) -> tuple[np.ndarray | None, str | None]:
    """(IVF centroids, metric) of a base vector index, read once per index version (without
    ``centroids``: the metric only, a much smaller read)."""
    key = ("centroids" if centroids else "metric", ds.uri, index_name, ds.version)
    with cache.lock:
        if key in cache.vector_parts:
            hit = cache.vector_parts[key]
            return hit if isinstance(hit, tuple) else (None, None)
    found: tuple[np.ndarray | None, str | None] = (None, None)
    with _ENV_LOCK:  # a background read and a search may ask at once: one restores what it set
        old = os.environ.get(_CENTROIDS_ENV, "false")
        # set either way: pylance 14 prints a warning when it is not
        os.environ[_CENTROIDS_ENV] = "true" if centroids else "false"
        try:
            stats = ds.stats.index_stats(index_name)
            segments = stats.get("indices") or []
            metrics = {str(s.get("metric_type", "")).lower() for s in segments}
            metric = metrics.pop() if len(metrics) == 1 else None
            cents = [np.asarray(s["centroids"], dtype=np.float32) for s in segments if s.get("centroids") is not None]
            one = len(cents) == 1 and cents[0].ndim == 2 and cents[0].shape[0] > 1
            found = (cents[0] if one else None, metric or None)
        except (ValueError, OSError, RuntimeError, KeyError, TypeError):
            found = (None, None)  # an index without IVF centroids: the pool is searched flat
        finally:
            os.environ[_CENTROIDS_ENV] = old  # never removed (see _CENTROIDS_ENV)
    with cache.lock:
        # One base version's at a time: each merge makes a new version (a long-lived reader
        # kept a copy of the centroids per version it ever searched).
        for old_key in [k for k in cache.vector_parts if k[:3] == key[:3] and k != key]:
            del cache.vector_parts[old_key]
        cache.vector_parts[key] = found
    return found


def knn_memory(table: HasView, column: str) -> PoolPlan:
    """Which newer levels a vector search on ``column`` keeps in memory, and the budget."""
    view = view_of(table)
    return view.derived(("knn-plan", column), lambda: plan_pool(view.snapshot, column))


def _partition_key(view: TableView, spec: SearchSpec, index_name: str | None) -> str:
    """Names the pool's layout: the base index's IVF partitions for l2 and cosine (dot: read whole)."""
    if index_name is None or spec.metric == "dot":
        return UNPARTITIONED.key
    base = view.snapshot.base
    if index_metric(base, index_name, view.cache) != spec.metric:
        return UNPARTITIONED.key  # Lance searches the base flat for this distance: so is the pool
    return f"{base.uri}@{base.version}/{index_name}/{spec.metric}"


def partitioning(view: TableView, spec: SearchSpec, index_name: str | None) -> Partitioning:
    """The base index's IVF centroids the pool is laid out by (none: read whole)."""
    key = _partition_key(view, spec, index_name)
    if index_name is None or key == UNPARTITIONED.key:
        return UNPARTITIONED
    cents = index_centroids(view.snapshot.base, index_name, view.cache)
    return Partitioning(cents, spec.metric == "cosine", key)


def _pool_key(view: TableView, spec: SearchSpec, index_name: str | None) -> tuple[str, str, str]:
    return ("knn-pool", spec.column, _partition_key(view, spec, index_name))


def _pool(
    view: TableView,
    spec: SearchSpec,
    gens: Sequence[GenerationSource],
    parts: Partitioning,
    stop: Callable[[], bool] | None = None,
) -> VectorPool | None:
    """The live rows of ``gens`` and the MemTables, laid out by ``parts``.

    Without ``stop`` the generations are read side by side (Lance releases the GIL); with
    it (the background thread) one after another, and ``None`` once ``stop()`` turns true.
    """
    snapshot, merge = view.snapshot, view.merge
    read = partial(generation_part, column=spec.column, snapshot=snapshot, cache=view.cache, parts=parts)
    gen_parts: list[PoolPart | None]
    if stop is None:
        with ThreadPoolExecutor(_READERS, thread_name_prefix="memwal-knn-read") as pool:
            gen_parts = list(pool.map(read, gens))
    else:
        gen_parts = []
        for g in gens:
            gen_parts.append(read(g, stop=stop))
            if stop():
                return None
    sources: list[tuple[str, str, PoolPart, np.ndarray]] = []
    for g, part in zip(gens, gen_parts, strict=True):
        assert part is not None  # read to the end: not stopped
        live = part.valid.copy()
        drop = merge.generation_drop.get(g.uri)
        if drop is not None and drop.size and part.row_addrs is not None:
            live &= ~member(part.row_addrs, drop)  # drop lists are sorted and distinct
        sources.append((f"{g.region_id} generation {g.generation}", g.region_id, part, live))
    for region_id, rows in merge.memtables.items():
        if rows.num_rows:
            part = part_of(rows, spec.column, snapshot, parts)
            sources.append((f"{region_id} memtable", region_id, part, part.valid))
    return build_pool(sources, parts.centroids, parts.cosine)


def _pool_label(pool: VectorPool) -> str:
    labels = [s.label for s in pool.sources]
    if len(labels) > 8:
        mem = sum(1 for s in labels if s.endswith("memtable"))
        gens = len(labels) - mem
        labels = ([f"{gens} generations"] if gens else []) + ([f"{mem} memtables"] if mem else [])
    return f"in memory, exact ({pool.num_rows:,} live rows): {', '.join(labels)}"


def _search_in(pool: VectorPool, spec: SearchSpec) -> Found | None:
    """The pool's best rows for ``spec``: exact distances and how to read their output columns."""
    if not pool.num_rows:
        return None
    idx, _ = pool.candidates(spec.q, spec.metric, spec.nprobes, spec.k)
    dist = exact_distances(pool.vectors[idx], spec.q, spec.metric)  # as for every other source's rows
    cols = list(spec.out_cols)

    def rows(at: np.ndarray) -> pa.Table:
        picked = idx[at]
        row = pool.row_of[picked]
        return by_source(
            pool.source_of[picked], lambda s, mine: pool.sources[s].part.table.select(cols).take(pa.array(row[mine]))
        )

    return _pool_label(pool), Scored(dist, rows)


def pool_ready(view: TableView, spec: SearchSpec, index_name: str | None) -> bool:
    """Whether this search reads the pool in memory: laid out already, its generations all in
    memory (laid out now), or background reads off (read now). Otherwise the small
    generations' vectors are read and scored for this search (:func:`generation_jobs` with
    ``pooled=False``)."""
    if view.derived_ready(_pool_key(view, spec, index_name)) is not None or not background.enabled():
        return True
    key = _partition_key(view, spec, index_name)
    parts = UNPARTITIONED if key == UNPARTITIONED.key else Partitioning(None, False, key)  # ready_part reads .key
    return all(ready_part(g, spec.column, view.cache, parts) is not None for g in knn_memory(view, spec.column).pooled)


def search_pool(view: TableView, spec: SearchSpec, index_name: str | None) -> Found | None:
    """Search the pooled newer levels (small generations, MemTables) in memory (read first if need be)."""
    gens = knn_memory(view, spec.column).pooled

    def build() -> VectorPool:
        pool = _pool(view, spec, gens, partitioning(view, spec, index_name))
        assert pool is not None  # not stopped: read on the calling thread
        return pool

    return _search_in(view.derived(_pool_key(view, spec, index_name), build), spec)


def search_memtables(view: TableView, spec: SearchSpec) -> Found | None:
    """Search the MemTables alone, flat and exact, in memory (while the pool is being read)."""

    def build() -> VectorPool:
        pool = _pool(view, spec, (), UNPARTITIONED)
        assert pool is not None
        return pool

    return _search_in(view.derived(("knn-memtables", spec.column), build), spec)


def generation_jobs(
    view: TableView, spec: SearchSpec, pruned: set[str], cands: Candidates, *, pooled: bool
) -> list[Job]:
    """The newer levels searched on worker threads: without a filter the large and over-budget
    generations through Lance, and while the pool is not in memory (``pooled=False``) the small
    ones from their vectors read now; with a filter every generation (large ones by their
    index, others flat) and MemTable through Lance."""
    plan = knn_memory(view, spec.column)
    merge = view.merge
    if spec.filter is None and pooled:
        gens = [*plan.indexed, *plan.over_budget]
    else:
        gens = [g for r in view.snapshot.regions if r.region_id not in pruned for g in r.generations]
        gens.sort(key=lambda g: g not in plan.indexed)  # the longest searches first (a first one loads the index)
    jobs: list[Job] = []
    for g in gens:
        indexed = g in plan.indexed
        drop = merge.generation_drop.get(g.uri)
        part = ready_part(g, spec.column, view.cache, UNPARTITIONED) if spec.filter is None and g in plan.held else None
        if part is not None:
            label = f"{g.region_id} generation {g.generation} (its index; rows held in memory)"
            jobs.append((label, partial(cands.held, g.dataset, g.uri, drop, part, g.num_rows)))
            continue
        if spec.filter is None and g in plan.pooled:  # the pool is not in memory yet
            label = f"{g.region_id} generation {g.generation} (flat for now)"
            jobs.append((label, partial(cands.small_generation, g.dataset, g.uri, drop)))
            continue
        label = f"{g.region_id} generation {g.generation} ({'its index' if indexed else 'flat'})"
        jobs.append((label, partial(cands.generation, g.dataset, g.uri, drop, g.num_rows, index=indexed)))
    if spec.filter is not None:
        for region_id, mem in merge.memtables.items():
            if region_id not in pruned and mem.num_rows:
                ds = view.memtable_dataset(region_id, mem)
                what = f"memtable of region {region_id}"
                args = spec.args(spec.k, index=False)
                jobs.append((f"{region_id} memtable", partial(lance_search, ds, what, spec, args, None, vectors=False)))
    return jobs


def warm_later(view: TableView, spec: SearchSpec, index_name: str | None, *, pooled: bool) -> None:
    """After a search without a filter, read in the background what later searches use: the
    pool (unless ``pooled``) and the held large generations' rows."""
    if not pooled:
        key = _pool_key(view, spec, index_name)
        if view.claim(key):
            background.later(partial(_read_pool, view, spec, index_name, key))
    for g in knn_memory(view, spec.column).held:
        if claim_part(g, spec.column, view.cache, UNPARTITIONED):
            stop = background.EXITING.is_set
            background.later(partial(warm_part, g, spec.column, view.snapshot, view.cache, UNPARTITIONED, stop))


def _read_pool(view: TableView, spec: SearchSpec, index_name: str | None, key: tuple[str, str, str]) -> None:
    """Read and lay out the pool on the background thread (dropped if the interpreter exits meanwhile)."""
    try:
        gens = knn_memory(view, spec.column).pooled
        pool = _pool(view, spec, gens, partitioning(view, spec, index_name), background.EXITING.is_set)
        if pool is not None:
            view.derived(key, lambda: pool)
    finally:
        view.release(key)
