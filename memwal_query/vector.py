"""Vector search (KNN) over the merged table, one Lance search per source.

Every source runs Lance's own ``nearest`` search with the snapshot's dedup mask
passed as ``row_addr_blocklist``, which Lance applies *before* ranking: the masked
base (its index where one exists, a flat scan of fragments the index does not
cover yet), each unmerged generation, and the surviving MemTable rows (held in a
``memory://`` Lance dataset so filters mean the same everywhere). Each source
therefore returns its true top-k among live, filter-passing rows, and the merged
top-k is the best k of their union: no over-fetch is needed. A filter is applied
to the live version of each row only (superseded versions are masked out first).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import serialize_row_addrs

from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.format.lance_open import lance_message
from memwal_query.merge import MergeState
from memwal_query.planner.catchup import CatchupPlan
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = ["NearestStats", "NearestResult", "IndexCoverage", "nearest", "index_coverage"]

METRICS = {"l2": "l2", "cosine": "cosine", "dot": "dot"}


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

    def describe(self) -> str:
        """One line for ``explain``."""
        if not self.unindexed_fragments:
            frag = "all base fragments indexed"
        elif self.plan is not None and self.plan_used:
            frag = (
                f"fragments {list(self.unindexed_fragments)} ({self.unindexed_rows} rows) not indexed yet: served by "
                f"catch-up generations [{self.plan.generations_text()}] and their indexes ({self.plan.reason})"
            )
        else:
            why = ""
            if self.plan is not None:
                why = (
                    " (catch-up generations usable, but cheaper to search these rows flat: index_catchup='auto')"
                    if self.plan.usable
                    else f" ({self.plan.reason})"
                )
            frag = (
                f"fragments {list(self.unindexed_fragments)} ({self.unindexed_rows} rows) not indexed yet: "
                f"searched flat{why}"
            )
        return f"index {self.index_name} ({self.index_type} on {self.column}): {frag}; coverage from {self.source}"


@dataclass
class NearestStats:
    """What a vector search touched."""

    sources: list[str] = field(default_factory=list)
    coverage: IndexCoverage | None = None
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
    )


def _query_vector(view: TableView, column: str, query: Any) -> np.ndarray:
    schema = view.snapshot.schema
    if column not in schema.names:
        msg = f"unknown vector column {column!r} in {view.uri} (columns: {schema.names})"
        raise InvalidArgumentError(msg)
    typ = schema.field(column).type
    if not pa.types.is_fixed_size_list(typ) or not (
        pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type)
    ):
        msg = f"column {column!r} of {view.uri} is {typ}, not a fixed-size list of numbers (a vector)"
        raise InvalidArgumentError(msg)
    try:
        q = np.asarray(query.as_py() if isinstance(query, pa.Scalar) else query, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError) as err:
        msg = f"query for {column!r} is not a numeric vector: {err}"
        raise InvalidArgumentError(msg) from err
    if q.size != typ.list_size:
        msg = f"query vector has dimension {q.size}, column {column!r} of {view.uri} has dimension {typ.list_size}"
        raise InvalidArgumentError(msg)
    return q


def _search(
    ds: lance.LanceDataset,
    what: str,
    cols: list[str],
    nearest_args: dict[str, Any],
    filt: str | pc.Expression | None,
    block: np.ndarray | None,
    *,
    indexed_only: bool = False,
) -> pa.Table:
    kwargs: dict[str, Any] = {
        "columns": [*cols, "_distance"],
        "nearest": nearest_args,
        "prefilter": True,
        "disable_scoring_autoprojection": True,
    }
    if filt is not None:
        kwargs["filter"] = filt
    if indexed_only:
        kwargs["fast_search"] = True  # rows outside the index are served by catch-up generations
    if block is not None and block.size:
        kwargs["row_addr_blocklist"] = serialize_row_addrs(block.tolist())
    try:
        return ds.scanner(**kwargs).to_table()
    except (ValueError, OSError, RuntimeError) as err:
        text = lance_message(err)
        if filt is not None and "Invalid user input" in text:  # e.g. the filter names no column of the table
            msg = f"vector search filter {str(filt)!r} does not apply to {what}: {text}"
            raise InvalidArgumentError(msg) from err
        msg = f"vector search in {what} failed: {text}"
        raise MemWalError(msg) from err


class NearestResult(NamedTuple):
    """A vector search's rows (with ``_distance``) and what it searched."""

    rows: pa.Table
    stats: NearestStats


def _search_args(
    column: str, q: np.ndarray, k: int, distance: str, nprobes: int | None, refine: int | None
) -> dict[str, Any]:
    """Lance ``nearest`` arguments (``k`` and ``distance`` already checked)."""
    metric = METRICS[str(distance).lower()]
    args: dict[str, Any] = {"column": column, "q": q, "k": k, "metric": metric}
    if nprobes is not None:
        args["nprobes"] = int(nprobes)
    if refine is not None:
        args["refine_factor"] = int(refine)
    return args


def _pruned(view: TableView, filter: str | pc.Expression | None, in_query: bool) -> set[str]:
    """Regions the filter prunes (a SQL string cannot be planned inside a running query)."""
    if isinstance(filter, pc.Expression):
        return set(view.plan_expression(filter).pruned_regions)
    if isinstance(filter, str) and not in_query:
        return set(view.plan_sql(filter).pruned_regions)
    return set()


class _Sources:
    """The per-source searches of one vector search, and their labels."""

    def __init__(self, view: TableView, out_cols: list[str], filt: str | pc.Expression | None) -> None:
        self.view = view
        self.out_cols = out_cols
        self.filt = filt
        self.parts: list[pa.Table] = []
        self.labels: list[str] = []

    def search(
        self,
        ds: lance.LanceDataset,
        what: str,
        args: dict[str, Any],
        block: np.ndarray | None,
        label: str,
        *,
        indexed_only: bool = False,
    ) -> None:
        self.parts.append(_search(ds, what, self.out_cols, args, self.filt, block, indexed_only=indexed_only))
        self.labels.append(label)

    def base(self, args: dict[str, Any], merge: MergeState, coverage: IndexCoverage | None, catchup: bool) -> None:
        if coverage is None:
            label = "base (no index: flat)"
        elif catchup:
            label = f"base (index {coverage.index_name}, indexed fragments only)"
        else:
            label = f"base ({coverage.describe()})"
        view = self.view
        self.search(view.snapshot.base, f"base of {view.uri}", args, merge.base_drop, label, indexed_only=catchup)

    def catchup(self, args: dict[str, Any], plan: CatchupPlan, pruned: set[str]) -> None:
        for src in plan.sources:
            g = src.generation
            if g.region_id not in pruned:
                # the rows stand in for base rows: searched with the base's search parameters
                label = f"{g.region_id} catch-up generation {g.generation} (unindexed base rows)"
                self.search(g.dataset, g.uri, args, src.drop, label)

    def regions(self, flat: dict[str, Any], merge: MergeState, pruned: set[str]) -> None:
        for region in self.view.snapshot.regions:
            if region.region_id in pruned:
                continue
            for g in region.generations:
                label = f"{region.region_id} generation {g.generation}"
                self.search(g.dataset, g.uri, flat, merge.generation_drop.get(g.uri), label)
            mem = merge.memtables.get(region.region_id)
            if mem is not None and mem.num_rows:
                ds = self.view.memtable_dataset(region.region_id, mem)
                self.search(ds, f"memtable of region {region.region_id}", flat, None, f"{region.region_id} memtable")

    def top(self, k: int, schema: pa.Schema) -> pa.Table:
        parts = [p for p in self.parts if p.num_rows]
        if not parts:
            return pa.schema(
                [schema.field(c) for c in self.out_cols] + [pa.field("_distance", pa.float32())]
            ).empty_table()
        target = pa.schema([schema.field(c) for c in self.out_cols] + [parts[0].schema.field("_distance")])
        allrows = pa.concat_tables([p.select(target.names).cast(target) for p in parts])
        order = pc.sort_indices(allrows, sort_keys=[("_distance", "ascending")])
        return allrows.take(order[:k])


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
    if not isinstance(k, int) or k <= 0:
        msg = f"k must be a positive integer, got {k!r}"
        raise InvalidArgumentError(msg)
    if METRICS.get(str(distance).lower()) is None:
        msg = f"distance must be one of {sorted(METRICS)}, got {distance!r}"
        raise InvalidArgumentError(msg)
    q = _query_vector(view, column, query)
    schema = view.snapshot.schema
    out_cols = list(columns) if columns is not None else list(schema.names)
    missing = [c for c in out_cols if c not in schema.names]
    if missing:
        msg = f"unknown column(s) {missing} in {view.uri}"
        raise InvalidArgumentError(msg)
    args = _search_args(column, q, k, distance, nprobes, refine_factor)
    stats = NearestStats(coverage=index_coverage(view, column))
    pruned = _pruned(view, filter, in_query)
    stats.pruned_regions = sorted(pruned)
    plan = stats.coverage.plan if stats.coverage is not None else None
    catchup = plan is not None and view.uses_catchup(plan)
    if catchup:
        assert plan is not None and stats.coverage is not None
        plan = view.recheck_catchup(plan)  # a merger may have deleted a generation
        catchup = plan.usable
        stats.coverage = dataclasses.replace(stats.coverage, plan=plan, plan_used=catchup)
    merge = view.merge
    sources = _Sources(view, out_cols, filter)
    sources.base(args, merge, stats.coverage, catchup)
    if catchup:
        assert plan is not None
        sources.catchup(args, plan, pruned)
    sources.regions({k_: v for k_, v in args.items() if k_ not in ("nprobes", "refine_factor")}, merge, pruned)
    stats.sources = sources.labels
    out = sources.top(k, schema)
    stats.seconds = time.perf_counter() - t0
    return NearestResult(out, stats)
