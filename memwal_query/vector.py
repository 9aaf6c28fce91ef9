"""Vector search (KNN) over the merged table.

Sources (see :mod:`memwal_query.vector_search`, :mod:`memwal_query.vector_levels` and
:mod:`memwal_query.vector_pool`):

* the base through its index (a flat scan of fragments the index does not cover
  yet, or the catch-up generations' indexes when the Indexed Read Plan is chosen),
  without the base mask: it over-fetches, drops hits whose key has a newer version
  and widens the search while fewer than ``k`` survive;
* without a filter, small unmerged generations and the MemTables together, in memory,
  probing the base index's nearest IVF partitions (every row without ``nprobes``); a
  search that finds them not in memory yet scores those generations' vectors exactly
  and starts reading them in the background (:mod:`memwal_query.vector_levels`);
  large generations through their own index with the base's ``nprobes`` /
  ``refine_factor`` (their rows held in memory when the budget allows: Lance returns
  row addresses, vectors and columns come from memory), those over the memory budget
  through Lance; superseded rows dropped from what Lance returns;
* with a filter, every generation and MemTable through Lance (flat, exact; large
  generations through their index), the filter applied to each source's own rows.

Every ``_distance`` is recomputed from the row's stored vector (Lance's definitions),
so the merged top-k compares exact distances whatever index found a row. With an
IVF index the search is as approximate as the base's (same ``nprobes``); the
newer levels searched in memory are exact inside the partitions they probe.
"""

from __future__ import annotations

import dataclasses
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query import vector_background as background
from memwal_query.errors import InvalidArgumentError, positive_k
from memwal_query.forked import ThreadPool
from memwal_query.format.beside import start_beside
from memwal_query.planner.catchup import CatchupPlan
from memwal_query.planner.filter_refusal import blamed_on_filter, check_search_filter
from memwal_query.scan.fragment import search_columns
from memwal_query.vector_background import wait_warm
from memwal_query.vector_base_rows import held_base, hold_base_later
from memwal_query.vector_levels import (
    Job,
    generation_jobs,
    index_metric,
    knn_memory,
    pool_ready,
    search_memtables,
    search_pool,
    warm_later,
)
from memwal_query.vector_pool import PoolPlan
from memwal_query.vector_search import Candidates, SearchSpec, lance_search
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = ["NearestStats", "NearestResult", "IndexCoverage", "nearest", "index_coverage", "knn_memory", "wait_warm"]

METRICS = {"l2": "l2", "cosine": "cosine", "dot": "dot"}
#: Beyond this k a search's k is capped at the snapshot's rows (the same answer: every live row).
_LARGE_K = 4096
#: Lance searches of one vector search run side by side (they release the GIL).
_WORKERS = 4
_EXECUTOR = ThreadPool(_WORKERS, "memwal-knn")
#: Newer keys per base row from which the base's hits are told live by address (the base mask).
_BY_ADDRESS_SHARE = 0.5


@dataclass(frozen=True)
class IndexCoverage:
    """How far a base-table index has caught up with the data merged into the base."""

    index_name: str
    column: str
    index_type: str
    indexed_fragments: tuple[int, ...]
    unindexed_fragments: tuple[int, ...]
    unindexed_rows: int
    caught_up_generations: tuple[tuple[str, int], ...] | None
    source: str
    plan: CatchupPlan | None = None
    plan_used: bool = False
    #: Why a usable plan is not used ('' when it is, or when the plan is not usable: its reason says why).
    flat_reason: str = ""

    def describe(self) -> str:
        """One line for ``explain``."""
        if not self.unindexed_fragments:
            frag = "all base fragments indexed"
        elif self.plan is not None and self.plan_used:
            frag = (
                f"fragments {list(self.unindexed_fragments)} ({self.unindexed_rows:,} rows) not indexed yet: served by "
                f"catch-up generations [{self.plan.generations_text()}] and their indexes ({self.plan.reason})"
            )
        else:
            why = ""
            if self.flat_reason:
                why = f" ({self.flat_reason})"
            elif self.plan is not None:
                why = f" ({self.plan.reason})"
            frag = (
                f"fragments {list(self.unindexed_fragments)} ({self.unindexed_rows:,} rows) not indexed yet: "
                f"searched flat{why}"
            )
        return f"index {self.index_name} ({self.index_type} on {self.column}): {frag}; coverage from {self.source}"


@dataclass
class NearestStats:
    """What a vector search touched."""

    sources: list[str] = field(default_factory=list)
    coverage: IndexCoverage | None = None
    #: Which newer levels were searched in memory and which through Lance (no filter).
    memory: PoolPlan | None = None
    pruned_regions: list[str] = field(default_factory=list)
    seconds: float = 0.0


def index_coverage(table: HasView, column: str) -> IndexCoverage | None:
    """Which base fragments the index on ``column`` covers (None: no index)."""
    view = view_of(table)
    found = next((i for i in view.base_indexes() if column in i.columns), None)
    if found is None:
        return None
    plan = view.catchup_plan(found.name)  # it also finds the unindexed fragments
    catchup = None
    source = "the index's fragment bitmap"
    for c in view.snapshot.index.index_catchup:
        if c.index_name == found.name:
            catchup = tuple((m.region_id, m.generation) for m in c.caught_up)
            source = "the MemWAL index catch-up progress"
    return IndexCoverage(
        index_name=found.name,
        column=column,
        index_type=found.index_type,
        indexed_fragments=tuple(sorted(found.fragment_ids)),
        unindexed_fragments=plan.uncovered_fragments,
        unindexed_rows=plan.uncovered_rows,
        caught_up_generations=catchup,
        source=source,
        plan=plan if plan.uncovered_fragments else None,
        plan_used=view.uses_catchup(plan),
        flat_reason=view.flat_because(plan) if plan.usable else "",
    )


def _query_vector(view: TableView, column: str, query: Any, metric: str) -> np.ndarray:
    """``query`` as one float32 vector for ``column``, or a one-line error saying what is wrong."""
    schema = view.snapshot.schema
    if column not in schema.names:
        msg = f"unknown vector column {column!r} in {view.uri} (columns: {schema.names})"
        raise InvalidArgumentError(msg)
    if "_distance" in schema.names:  # Lance refuses to search such a table ("Duplicate column name")
        msg = f"{view.uri} has its own column '_distance', the column a vector search adds for each row's distance"
        raise InvalidArgumentError(msg)
    typ = schema.field(column).type
    if not pa.types.is_fixed_size_list(typ) or not (
        pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type)
    ):
        msg = f"column {column!r} of {view.uri} is {typ}, not a fixed-size list of numbers (a vector)"
        raise InvalidArgumentError(msg)
    if not pa.types.is_floating(typ.value_type):  # Lance: int8 never, uint8 by hamming distance only
        msg = f"column {column!r} of {view.uri} holds {typ.value_type} vectors: Lance searches float vectors only"
        raise InvalidArgumentError(msg)
    raw = query.as_py() if isinstance(query, pa.Scalar) else query
    try:
        q64 = np.asarray(raw)
        if raw is None or q64.dtype.kind not in "biuf":
            raise TypeError("got None" if raw is None else f"got {type(raw).__name__} of {q64.dtype}")
        q64 = q64.astype(np.float64)
    except (TypeError, ValueError) as err:
        msg = f"query for {column!r} is not a numeric vector: {err}"
        raise InvalidArgumentError(msg) from err
    if q64.size != typ.list_size:
        msg = f"query vector has dimension {q64.size}, column {column!r} of {view.uri} has dimension {typ.list_size}"
        raise InvalidArgumentError(msg)
    if sum(n > 1 for n in q64.shape) > 1:  # (d,), (1, d), (d, 1) are one vector; (2, d / 2) is not
        msg = f"query for {column!r} must be one vector, got an array of shape {q64.shape}"
        raise InvalidArgumentError(msg)
    if not np.isfinite(q64).all():
        msg = f"query vector for {column!r} holds NaN or infinite values: no distance to it is defined"
        raise InvalidArgumentError(msg)
    if np.abs(q64).max(initial=0) > np.finfo(np.float32).max:
        msg = f"query vector for {column!r} holds values beyond float32's range (vectors are searched as float32)"
        raise InvalidArgumentError(msg)
    q = q64.astype(np.float32).reshape(-1)
    if metric == "cosine" and not q.any():
        msg = f"query vector for {column!r} is all zeros: its cosine distance to any row is undefined"
        raise InvalidArgumentError(msg)
    return q


class NearestResult(NamedTuple):
    """A vector search's rows (with ``_distance``) and what it searched."""

    rows: pa.Table
    stats: NearestStats


def _base_label(coverage: IndexCoverage | None, catchup: bool) -> str:
    if coverage is None:
        return "base (no index: flat)"
    if catchup:
        return f"base (index {coverage.index_name}, indexed fragments only)"
    return f"base ({coverage.describe()})"


def _base_jobs(
    view: TableView,
    spec: SearchSpec,
    cov: IndexCoverage | None,
    catchup: CatchupPlan | None,
    cands: Candidates,
    pruned: set[str],
) -> list[Job]:
    """The base search (over-fetch) and, with the Indexed Read Plan, its catch-up generations."""
    exact = cov is None or spec.refine_factor is not None or cov.index_type.upper() == "IVF_FLAT"
    base = view.snapshot.base
    what = f"base of {view.uri}"
    newer, rows = view.merge.newer, _base_rows(view)
    refined = spec.refine_factor is not None and cov is not None and cov.index_type.upper() != "IVF_FLAT"
    # most base rows superseded (newer keys >= half the base): the base's live hits are found by
    # address once the mask is decided (in the background: it reads the base keys, at most
    # twice the newer keys)
    shadowed = (lambda: view.merge.base_drop) if _by_address(view) and view.merge.base_mask.all_known else None
    held = held_base(view, spec.column) if shadowed is not None and spec.filter is None else None
    run = partial(
        cands.base,
        base,
        what,
        newer,
        rows,
        indexed=view.indexed_only(catchup.index.fragment_ids) if catchup is not None else None,
        exact=exact,
        refined=refined,
        shadowed=shadowed,
        held=held,
    )
    label = _base_label(cov, catchup is not None) + ("; its live rows in memory" if held is not None else "")
    jobs: list[Job] = [(label, run)]
    for src in catchup.sources if catchup is not None else ():
        g = src.generation  # the rows stand in for base rows: the base's search parameters
        if g.region_id not in pruned:
            label = f"{g.region_id} catch-up generation {g.generation} (unindexed base rows)"
            jobs.append((label, partial(lance_search, g.dataset, g.uri, spec, spec.args(spec.k), src.drop)))
    return jobs


def _read_later(view: TableView, spec: SearchSpec, index_name: str | None, pooled: bool) -> None:
    """After a search without a filter: what later searches use, read in the background (the
    newer levels', and the base mask when the base's hits are told live by address)."""
    warm_later(view, spec, index_name, pooled=pooled)
    by_address = _by_address(view)
    if by_address and not view.merge.base_mask.all_known:
        background.later(view.merge.base_mask.all)  # reads the base keys: at most twice the newer keys
    hold_base_later(view, spec.column, wanted=by_address)  # the base's live rows, when the budget has room


def _rows_bound(view: TableView) -> int:
    """At least as many rows as the snapshot has in all levels (from metadata, at least 1)."""
    snap = view.snapshot
    rows = sum(
        int(f.metadata.physical_rows) if f.metadata.physical_rows is not None else f.count_rows()
        for f in snap.base.get_fragments()
    )
    for r in snap.regions:
        rows += sum(g.num_rows for g in r.generations)
        rows += r.memtable.table.num_rows if r.memtable is not None else 0
    return max(1, rows)


def _catchup(view: TableView, spec: SearchSpec, stats: NearestStats) -> tuple[CatchupPlan | None, bool]:
    """The base index's catch-up plan and whether this search uses it (``stats.coverage`` says so)."""
    coverage = stats.coverage
    plan = coverage.plan if coverage is not None else None
    if coverage is None or plan is None or not view.uses_catchup(plan):
        return plan, False
    built_for = index_metric(view.snapshot.base, coverage.index_name, view.cache)
    if built_for != spec.metric:
        # Lance searches the base flat for a distance its index was not built for (and finds
        # nothing with fast_search): the unindexed rows are read there, not from catch-up generations
        why = (
            f"the index is built for {built_for or 'another'} distance, this search asks {spec.metric}: "
            "Lance searches every base row"
        )
        stats.coverage = dataclasses.replace(coverage, plan_used=False, flat_reason=why)
        return plan, False
    plan = view.recheck_catchup(plan)  # a merger may have deleted a generation
    stats.coverage = dataclasses.replace(coverage, plan=plan, plan_used=plan.usable)
    return plan, plan.usable


def _by_address(view: TableView) -> bool:
    """Whether the base's hits are told live by address: newer keys >= half the base rows."""
    newer = len(view.merge.newer)
    return newer > 0 and newer >= _base_rows(view) * _BY_ADDRESS_SHARE


def _base_rows(view: TableView) -> int:
    return view.derived(("base-rows",), lambda: int(view.snapshot.base.count_rows()))


def nearest(
    view: TableView,
    column: str,
    query: Any,
    *,
    k: int = 10,
    filter: str | pc.Expression | None = None,
    nprobes: int | None = None,
    refine_factor: int | None = None,
    distance: str = "l2",
    columns: Sequence[str] | None = None,
    in_query: bool = False,
) -> NearestResult:
    """Top-k merged rows nearest to ``query``; see the module docs.

    A filter also prunes regions (their generations and MemTables are not searched).
    ``in_query``: called from inside a running DataFusion query (the SQL table
    function), where a SQL-string filter cannot be planned: only pyarrow-expression
    filters prune there.
    """
    t0 = time.perf_counter()
    k = positive_k(k)
    if METRICS.get(str(distance).lower()) is None:
        msg = f"distance must be one of {sorted(METRICS)}, got {distance!r}"
        raise InvalidArgumentError(msg)
    for name, value in (("nprobes", nprobes), ("refine_factor", refine_factor)):
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1):
            msg = f"{name} must be a positive integer, got {value!r}"
            raise InvalidArgumentError(msg)
    if k > _LARGE_K:  # Lance sizes its top-k buffers by k (k=10**9 aborted the process)
        k = min(k, view.derived(("rows-bound",), lambda: _rows_bound(view)))
    schema = view.snapshot.schema
    check_search_filter(filter, view.uri, schema, "vector search ")
    q = _query_vector(view, column, query, METRICS[str(distance).lower()])
    out_cols, shown = search_columns(columns, schema.names, view.uri, view.snapshot.primary_key)
    spec = SearchSpec(
        column,
        q,
        k,
        METRICS[str(distance).lower()],
        None if nprobes is None else int(nprobes),
        None if refine_factor is None else int(refine_factor),
        filter,
        tuple(out_cols),
        tuple(view.snapshot.primary_key),
    )
    with blamed_on_filter(filter, schema, view.uri, "vector search "):
        stats = NearestStats(coverage=index_coverage(view, column))
        pruned = view.search_pruned(filter, in_query)
        stats.pruned_regions = sorted(pruned)
        plan, catchup = _catchup(view, spec, stats)
        cands = Candidates(spec, schema)
        index_name = stats.coverage.index_name if stats.coverage is not None else None
        pooled = filter is None and pool_ready(view, spec, index_name)
        base_jobs = _base_jobs(view, spec, stats.coverage, plan if catchup else None, cands, pruned)
        jobs = base_jobs + generation_jobs(view, spec, pruned, cands, pooled=pooled)
        futures = start_beside(_EXECUTOR.get(), _WORKERS, [fn for _, fn in jobs])  # Lance searches beside the pool's
        in_memory = None
        if filter is None:  # the pool; while it is not in memory yet, the MemTables alone
            in_memory = search_pool(view, spec, index_name) if pooled else search_memtables(view, spec)
        for (label, _), fut in zip(base_jobs, futures, strict=False):
            cands.add(fut.result(), label)
        if filter is None:
            stats.memory = knn_memory(view, column)
        if in_memory is not None:
            cands.add(in_memory[1], in_memory[0])
        for (label, _), fut in zip(jobs[len(base_jobs) :], futures[len(base_jobs) :], strict=True):
            cands.add(fut.result(), label)
        stats.sources = cands.labels
        out = cands.top()
        if shown is not None:  # no column asked for: the distances alone
            out = out.drop_columns([c for c in out_cols if c not in shown])
        if filter is None:
            _read_later(view, spec, index_name, pooled)
    stats.seconds = time.perf_counter() - t0
    return NearestResult(out, stats)
