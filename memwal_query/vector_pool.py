"""The newer levels' vectors kept in memory for vector search: one matrix per snapshot.

Small unmerged generations and the MemTables are searched together, exactly, with
numpy, instead of one Lance search each. Per generation, its rows (every column) and
their assignment to the base index's IVF partitions are read once and kept in the
:class:`~memwal_query.snapshot.cache.SnapshotCache` by generation URI, so a refresh
reads only new generations. Per snapshot, the live rows (the dedup mask applied) of
every pooled source are laid out as one matrix sorted by partition
(:class:`VectorPool`). A search with ``nprobes`` reads the ``nprobes`` partitions whose
centroids are nearest (the base index's own centroids: the same probing as the base
search, but exact inside the partitions); without ``nprobes`` (or without a base IVF
index) it reads every row: an exact search.

A generation is *large* when it holds at least :data:`LARGE_GENERATION_ROWS` rows and
carries its own index on the column: it is searched through that index, like the base.
Its rows are *held* in memory too when they fit the budget after the pooled ones: the
index then returns row addresses only, and the hits' vectors (for exact distances) and
columns come from memory instead of a Lance read per search (about half of such a
search's cost). They are read in the background after a search (:func:`claim_part`,
:func:`warm_part`): a first search does not wait for them. Generations that do not fit the
memory budget (:func:`budget_bytes`, largest first) are searched through Lance too.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from memwal_query.errors import MemWalError
from memwal_query.format.lance_open import lance_message
from memwal_query.format.nested import as_schema
from memwal_query.format.topk import smallest
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import GenerationSource, Snapshot
from memwal_query.vector_distance import distances_from_dot, dot_slack, exact_distances, vector_matrix

__all__ = [
    "LARGE_GENERATION_ROWS",
    "Partitioning",
    "PoolPart",
    "PoolSource",
    "VectorPool",
    "PoolPlan",
    "budget_bytes",
    "plan_pool",
    "build_pool",
    "generation_part",
    "ready_part",
    "claim_part",
    "claim_key",
    "keep_claimed",
    "warm_part",
    "part_of",
]

#: A generation with at least this many rows and its own vector index is searched through it.
LARGE_GENERATION_ROWS = 100_000
_DEFAULT_BUDGET_MB = 1024


def budget_bytes() -> int:
    """Memory for pooled vectors: ``MEMWAL_KNN_MEMORY_MB`` (default 1024 MB)."""
    raw = os.environ.get("MEMWAL_KNN_MEMORY_MB", "")
    try:
        mb = float(raw) if raw else _DEFAULT_BUDGET_MB
    except ValueError:
        mb = _DEFAULT_BUDGET_MB
    return int(max(mb, 0) * 2**20)


def _assign(mat: np.ndarray, centroids: np.ndarray | None, cosine: bool) -> np.ndarray | None:
    """Nearest centroid of each row (l2; rows normalised first for cosine), in blocks."""
    if centroids is None:
        return None
    x = _normalised(mat) if cosine else mat
    cn = (centroids * centroids).sum(axis=1)
    out = np.empty(len(x), dtype=np.int32)
    for lo in range(0, len(x), 65536):
        blk = x[lo : lo + 65536]
        out[lo : lo + len(blk)] = np.argmin(cn[None, :] - 2 * (blk @ centroids.T), axis=1)
    return out


def _normalised(mat: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / infinite components
        n = np.linalg.norm(mat, axis=1, keepdims=True)
        return mat / np.where(n == 0, 1, n)


@dataclass(frozen=True)
class PoolPart:
    """One source's rows in memory: every column, the vectors, their norms and partitions."""

    table: pa.Table = field(repr=False)
    vectors: np.ndarray = field(repr=False)
    valid: np.ndarray = field(repr=False)
    row_addrs: np.ndarray | None = field(repr=False)
    assign: np.ndarray | None = field(repr=False)
    #: The order sorting ``row_addrs`` (None: in address order already, as Lance reads a generation).
    addr_order: np.ndarray | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        """Memory held: the table, and the vectors where they are a copy (not a view of its buffer)."""
        return int(self.table.nbytes + (self.vectors.nbytes if self.vectors.flags.owndata else 0))

    def positions(self, addrs: np.ndarray, what: str) -> np.ndarray:
        """Row positions of row addresses ``addrs`` (each must be one of this part's rows)."""
        own, order = self.row_addrs, self.addr_order
        if own is None or own.size == 0:
            msg = f"{what}: no rows held to find its index's hits in"
            raise MemWalError(msg)
        at = np.minimum(np.searchsorted(own if order is None else own[order], addrs), own.size - 1)
        if order is not None:
            at = order[at]
        if not bool(np.all(own[at] == addrs)):
            msg = f"{what}: its index returned rows it does not hold (was the generation rewritten?)"
            raise MemWalError(msg)
        return at


def _read_generation(g: GenerationSource, names: list[str], stop: Callable[[], bool] = bool) -> pa.Table | None:
    """Every row of ``g`` (``names``, ``_rowaddr``); ``None`` if ``stop()`` (default ``bool()``: never) turned true."""
    try:
        # closed here, not whenever the garbage collector gets to it: a stream dropped half
        # read must not be torn down while the interpreter is finalizing
        with g.dataset.scanner(columns=names, with_row_address=True).to_reader() as reader:
            batches = []
            for batch in reader:
                if stop():
                    return None
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=reader.schema)
    except (ValueError, OSError, RuntimeError) as err:
        what = f"generation {g.generation} of region {g.region_id} ({g.uri})"
        msg = f"cannot read {what} for vector search: {lance_message(err)}"
        raise MemWalError(msg) from err


@dataclass(frozen=True)
class Partitioning:
    """IVF centroids the pool is laid out by (``key`` names them in the cache)."""

    centroids: np.ndarray | None
    cosine: bool
    key: str


def part_of(table: pa.Table, column: str, snapshot: Snapshot, parts: Partitioning) -> PoolPart:
    """Rows in memory (the snapshot's columns), with their vectors and partitions."""
    names = list(snapshot.schema.names)
    t = as_schema(table.select(names), snapshot.schema).combine_chunks()
    mat, valid = vector_matrix(t.column(column), snapshot.schema.field(column).type.list_size)
    addrs = order = None
    if "_rowaddr" in table.schema.names:
        addrs = np.asarray(table.column("_rowaddr").to_numpy(), dtype=np.uint64)
        if addrs.size > 1 and not bool(np.all(addrs[1:] > addrs[:-1])):
            order = np.argsort(addrs, kind="stable")
    return PoolPart(t, mat, valid, addrs, _assign(mat, parts.centroids, parts.cosine), order)


def _part_key(g: GenerationSource, column: str, parts: Partitioning) -> tuple[str, str, str, str]:
    """A generation part's key in ``SnapshotCache.vector_parts`` (``keep_generations`` reads ``[1]``)."""
    return ("part", g.uri, column, parts.key)


def generation_part(
    g: GenerationSource,
    column: str,
    snapshot: Snapshot,
    cache: SnapshotCache,
    parts: Partitioning,
    stop: Callable[[], bool] = bool,
) -> PoolPart | None:
    """A generation's rows in memory (read once per generation URI, column and partitioning).

    ``None`` if ``stop()`` turned true while reading (default: never).
    """
    key = _part_key(g, column, parts)
    with cache.lock:
        hit = cache.vector_parts.get(key)
    if isinstance(hit, PoolPart):
        return hit
    rows = _read_generation(g, list(snapshot.schema.names), stop)
    if rows is None:
        return None
    part = part_of(rows, column, snapshot, parts)
    with cache.lock:
        cache.vector_parts[key] = part
    return part


_WARMING = object()  # a generation part being read in the background


def ready_part(g: GenerationSource, column: str, cache: SnapshotCache, parts: Partitioning) -> PoolPart | None:
    """A generation's rows if in memory already (``None``: not read, or being read)."""
    with cache.lock:
        hit = cache.vector_parts.get(_part_key(g, column, parts))
    return hit if isinstance(hit, PoolPart) else None


def claim_part(g: GenerationSource, column: str, cache: SnapshotCache, parts: Partitioning) -> bool:
    """Whether the caller is to read this part (nobody holds or reads it yet); marks it as being read."""
    return claim_key(cache, _part_key(g, column, parts))


def claim_key(cache: SnapshotCache, key: tuple[object, ...]) -> bool:
    """Whether the caller is to read what ``key`` names in ``cache.vector_parts``; marks it as being read."""
    with cache.lock:
        if key in cache.vector_parts:
            return False
        cache.vector_parts[key] = _WARMING
        return True


def keep_claimed(cache: SnapshotCache, key: tuple[object, ...], value: object | None) -> None:
    """Store what a :func:`claim_key` caller read (``None``: nothing; the key can be claimed again),
    unless the claim was forgotten meanwhile (its generation or base left the snapshot)."""
    with cache.lock:
        if cache.vector_parts.get(key) is _WARMING:
            if value is None:
                del cache.vector_parts[key]
            else:
                cache.vector_parts[key] = value


def warm_part(
    g: GenerationSource,
    column: str,
    snapshot: Snapshot,
    cache: SnapshotCache,
    parts: Partitioning,
    stop: Callable[[], bool],
) -> None:
    """Read a part :func:`claim_part` claimed; kept unless its generation was forgotten meanwhile.

    Reading stops between batches once ``stop()`` is true (the interpreter exiting). A failed
    read is dropped silently: the generation stays searched through Lance, which reports any
    error, and the next search claims the part again.
    """
    try:
        rows = _read_generation(g, list(snapshot.schema.names), stop)
        part: PoolPart | None = None if rows is None else part_of(rows, column, snapshot, parts)
    except (MemWalError, ValueError, OSError, RuntimeError, pa.ArrowException):
        part = None
    keep_claimed(cache, _part_key(g, column, parts), part)


@dataclass(frozen=True)
class PoolSource:
    """One pooled source: its label, its in-memory rows and which of them are live."""

    label: str
    region_id: str
    part: PoolPart
    live: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class PoolPlan:
    """Which newer levels a vector search keeps in memory and which it searches through Lance."""

    column: str
    pooled: tuple[GenerationSource, ...]
    indexed: tuple[GenerationSource, ...]
    over_budget: tuple[GenerationSource, ...]
    pooled_bytes: int
    budget: int
    #: Large generations (of ``indexed``) whose rows are held in memory: their index
    #: returns row addresses, exact distances and columns come from memory.
    held: tuple[GenerationSource, ...] = ()
    held_bytes: int = 0

    def describe(self) -> str:
        """One line for ``explain``."""
        rows = sum(g.num_rows for g in self.pooled)
        text = (
            f"KNN on {self.column}: {len(self.pooled)} generations ({rows:,} rows) and the MemTables in memory, "
            f"~{self.pooled_bytes / 2**20:,.1f} MB of a {self.budget / 2**20:,.0f} MB budget (MEMWAL_KNN_MEMORY_MB)"
        )
        if self.indexed:
            text += f"; {len(self.indexed)} large generations searched through their own index"
            if self.held:
                text += (
                    f" ({len(self.held)} of them held in memory for exact distances, "
                    f"~{self.held_bytes / 2**20:,.1f} MB of the budget)"
                )
        if self.over_budget:
            text += f"; {len(self.over_budget)} over the budget searched through Lance"
        return text


def _has_vector_index(g: GenerationSource, column: str) -> bool:
    try:
        with warnings.catch_warnings():  # describe_indices() (the successor) names no fields yet
            warnings.simplefilter("ignore", DeprecationWarning)
            return any(column in (i.get("fields") or []) for i in g.dataset.list_indices())
    except (ValueError, OSError, RuntimeError):
        return False


def plan_pool(snapshot: Snapshot, column: str) -> PoolPlan:
    """Decide per unmerged generation: in memory, its own index, or Lance (over the budget).

    Large indexed generations are held in memory (smallest first) with what the budget
    leaves once the pooled generations are in.
    """
    typ = snapshot.schema.field(column).type
    dim = typ.list_size
    row_bytes = dim * 4 * 2 + 64  # the vector twice (Arrow and the pool's matrix) and the other columns, roughly
    # a held generation's matrix is its Arrow buffer when the vectors are float32 (no copy)
    held_row_bytes = dim * 4 + 64 if pa.types.is_float32(typ.value_type) else row_bytes
    budget = budget_bytes()
    pooled: list[GenerationSource] = []
    indexed: list[GenerationSource] = []
    over: list[GenerationSource] = []
    used = 0
    gens = [g for r in snapshot.regions for g in r.generations]
    for g in sorted(gens, key=lambda g: g.num_rows):
        if g.num_rows >= LARGE_GENERATION_ROWS and _has_vector_index(g, column):
            indexed.append(g)
        elif used + g.num_rows * row_bytes <= budget:
            pooled.append(g)
            used += g.num_rows * row_bytes
        else:
            over.append(g)
    held: list[GenerationSource] = []
    held_bytes = 0
    for g in indexed:
        if used + held_bytes + g.num_rows * held_row_bytes <= budget:
            held.append(g)
            held_bytes += g.num_rows * held_row_bytes
    return PoolPlan(column, tuple(pooled), tuple(indexed), tuple(over), used, budget, tuple(held), held_bytes)


@dataclass(frozen=True)
class VectorPool:
    """The live pooled rows of one snapshot as one matrix sorted by IVF partition."""

    sources: tuple[PoolSource, ...]
    vectors: np.ndarray = field(repr=False)
    norms: np.ndarray = field(repr=False)
    source_of: np.ndarray = field(repr=False)
    row_of: np.ndarray = field(repr=False)
    offsets: np.ndarray | None = field(repr=False)
    centroids: np.ndarray | None = field(repr=False)
    cosine: bool = False
    _centroid_norms: np.ndarray | None = field(default=None, repr=False, compare=False)
    _max_norm: float | None = field(default=None, repr=False, compare=False)
    _infinite: bool | None = field(default=None, repr=False, compare=False)

    @property
    def num_rows(self) -> int:
        """Live rows in the pool."""
        return len(self.row_of)

    def candidates(self, q: np.ndarray, metric: str, nprobes: int | None, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Pool rows (indexes into the pool) of the ``k`` nearest, and their distances.

        The ranking is exact (Lance's metric up to float rounding): rows are scored from
        dot products, then every row within the error bound of those scores
        (:func:`~memwal_query.vector_distance.dot_slack`) of the k-th is rescored from its
        vector; recompute a winner's distance from its vector where it is reported.
        """
        ranges = self._probed(q, nprobes)
        if ranges is None:
            d = distances_from_dot(np.einsum("ij,j->i", self.vectors, q), self.norms, q, metric)
            idx = np.arange(self.num_rows)
        else:
            n = sum(hi - lo for lo, hi in ranges)
            dot = np.empty(n, dtype=np.float32)
            norms = np.empty(n, dtype=np.float32)
            idx = np.empty(n, dtype=np.int64)
            at = 0
            for lo, hi in ranges:  # einsum, not BLAS: its spinning threads would slow the Lance searches beside
                np.einsum("ij,j->i", self.vectors[lo:hi], q, out=dot[at : at + hi - lo])
                norms[at : at + hi - lo] = self.norms[lo:hi]
                idx[at : at + hi - lo] = np.arange(lo, hi)
                at += hi - lo
            d = distances_from_dot(dot, norms, q, metric)
        if self.infinite:  # the formula's inf - inf is NaN where a vector is infinite: score those exactly
            odd = np.flatnonzero(np.isinf(self.norms[idx]))
            d[odd] = exact_distances(self.vectors[idx[odd]], q, metric)
        if d.size <= k:
            return idx, d
        top = smallest(d, k)
        kth = d[top].max()
        if not np.isfinite(kth):  # fewer than k rows have a distance, or the k-th is infinite: ``top`` it is
            return idx[top], d[top]
        doubt = np.flatnonzero(d <= kth + 2 * dot_slack(self.max_norm, q, metric, self.vectors.shape[1]))
        if doubt.size == top.size:
            return idx[top], d[top]
        exact = exact_distances(self.vectors[idx[doubt]], q, metric)
        best = smallest(exact, k)
        return idx[doubt[best]], exact[best]

    def _probed(self, q: np.ndarray, nprobes: int | None) -> list[tuple[int, int]] | None:
        """Row ranges of the ``nprobes`` partitions whose centroids are nearest (None: every row)."""
        if nprobes is None or self.offsets is None or self.centroids is None or nprobes >= len(self.centroids):
            return None
        if nprobes <= 0:
            return []
        x = _normalised(q[None, :])[0] if self.cosine else q
        cd = self.centroid_norms - 2 * np.einsum("ij,j->i", self.centroids, x)
        probe = np.sort(np.argpartition(cd, nprobes - 1)[:nprobes])
        lo, hi = self.offsets[probe].tolist(), self.offsets[probe + 1].tolist()
        return [(a, b) for a, b in zip(lo, hi, strict=True) if b > a]

    @property
    def max_norm(self) -> float:
        """The largest l2 norm of a pooled vector (computed once)."""
        cached = self._max_norm
        if cached is None:
            finite = self.norms[np.isfinite(self.norms)]  # a NaN element makes a NaN norm
            cached = float(np.sqrt(finite.max(initial=0.0)))
            object.__setattr__(self, "_max_norm", cached)
        return cached

    @property
    def infinite(self) -> bool:
        """Whether a pooled vector has an infinite norm (an infinite component; computed once)."""
        cached = self._infinite
        if cached is None:
            cached = bool(np.isinf(self.norms).any())
            object.__setattr__(self, "_infinite", cached)
        return cached

    @property
    def centroid_norms(self) -> np.ndarray:
        """Squared norms of the centroids (computed once)."""
        assert self.centroids is not None
        cached = self._centroid_norms
        if cached is None:
            cached = np.einsum("ij,ij->i", self.centroids, self.centroids)
            object.__setattr__(self, "_centroid_norms", cached)
        return cached


def build_pool(
    sources: list[tuple[str, str, PoolPart, np.ndarray]], centroids: np.ndarray | None, cosine: bool
) -> VectorPool:
    """Lay out the live rows of ``sources`` (label, region, part, live mask) by partition.

    Each source's live vectors are copied once, straight to their place in the pool.
    """
    kept = [PoolSource(label, region, part, live) for label, region, part, live in sources]
    live_rows = [np.flatnonzero(s.live) for s in kept]
    sizes = [r.size for r in live_rows]
    n = int(sum(sizes))
    dim = kept[0].part.vectors.shape[1] if kept else 0
    source_of = np.repeat(np.arange(len(kept), dtype=np.int32), sizes)
    row_of = np.concatenate(live_rows) if live_rows else np.empty(0, dtype=np.int64)
    offsets = None
    dest: np.ndarray | None = None  # where each row (in source order) goes in the pool
    if centroids is not None and kept and all(s.part.assign is not None for s in kept):
        a = np.concatenate([s.part.assign[r] for s, r in zip(kept, live_rows, strict=True)])  # type: ignore[index]
        order = np.argsort(a, kind="stable")
        dest = np.empty(n, dtype=np.int64)
        dest[order] = np.arange(n)
        source_of, row_of = source_of[order], row_of[order]
        offsets = np.searchsorted(a[order], np.arange(len(centroids) + 1))
    mat = np.empty((n, dim), dtype=np.float32)
    at = 0
    for s, rows in zip(kept, live_rows, strict=True):
        vec = s.part.vectors if rows.size == len(s.part.vectors) else s.part.vectors[rows]
        if dest is None:
            mat[at : at + rows.size] = vec
        else:
            mat[dest[at : at + rows.size]] = vec
        at += rows.size
    norms = np.einsum("ij,ij->i", mat, mat)
    return VectorPool(tuple(kept), mat, norms, source_of, row_of, offsets, centroids, cosine)
