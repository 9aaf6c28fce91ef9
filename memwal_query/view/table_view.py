"""The frozen merged view of one snapshot: what every access path reads.

A :class:`TableView` is the snapshot, its merge decision, its storage and the caches
it shares with refreshed snapshots, plus values derived from them once and remembered
(region spec values, base indexes, Indexed Read Plans, MemTable datasets, the
DataFusion datasets). Access paths (:mod:`memwal_query.lookup`,
:mod:`memwal_query.vector`, the scan through :meth:`TableView.dataset`, the
descriptions in :mod:`memwal_query.describe`) take a view and return values; none of
them writes to it. The one setting a user may change on an open table,
``index_catchup``, lives in :class:`ReadSettings`, shared by the view and its datasets.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, Protocol, TypeVar

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.index_restriction import IndexedOnly
from memwal_query.format.model import ShardingFieldSpec
from memwal_query.format.nested import as_schema
from memwal_query.format.storage import Storage
from memwal_query.merge import MergeState
from memwal_query.planner.catchup import (
    CATCHUP_MIN_ROWS_PER_SOURCE,
    BaseIndex,
    CatchupPlan,
    base_indexes,
    catchup_size,
    plan_catchup,
    still_readable,
)
from memwal_query.planner.datafusion_expr import predicate_for_table
from memwal_query.planner.plan import Plan, plan_regions, region_values_of
from memwal_query.planner.predicates import Predicate, Unknown, columns_of, needed_columns
from memwal_query.planner.pruning import RegionValues
from memwal_query.planner.routing import checked_values
from memwal_query.regionspec.spec import decode_field_value, evaluate_field, lance_field_ids, parse_result_type
from memwal_query.scan.dataset import MergedDataset, ScanPlan
from memwal_query.scan.filters import decoded
from memwal_query.scan.lance_eval import memory_dataset
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import LiveMemTable, Snapshot

__all__ = ["IndexCatchupMode", "ReadSettings", "OpenTimings", "TableView", "HasView", "view_of"]

T = TypeVar("T")
IndexCatchupMode = Literal["auto", "always", "never"]
_MODES = ("auto", "always", "never")


class ReadSettings:
    """The one mutable setting of an open table (``Table.index_catchup``), validated.

    Example:
        >>> s = ReadSettings("always")
        >>> s.index_catchup
        'always'
    """

    __slots__ = ("_index_catchup",)

    def __init__(self, index_catchup: str = "auto") -> None:
        self._index_catchup: str = "auto"
        self.index_catchup = index_catchup

    @property
    def index_catchup(self) -> str:
        """``"auto"``, ``"always"`` or ``"never"`` (see ``Table.index_catchup``)."""
        return self._index_catchup

    @index_catchup.setter
    def index_catchup(self, mode: str) -> None:
        if mode not in _MODES:
            msg = f"index_catchup must be 'auto', 'always' or 'never', got {mode!r}"
            raise InvalidArgumentError(msg)
        self._index_catchup = mode


@dataclass(frozen=True)
class OpenTimings:
    """Seconds spent opening a snapshot."""

    snapshot: float
    merge: float


@dataclass
class _Memo:
    """Values derived from a frozen view, computed once (shared by copies of the view)."""

    region_values: dict[str, RegionValues | None] | None = None
    field_names: dict[int, str] | None = None
    indexes: list[BaseIndex] | None = None
    catchup: dict[str, CatchupPlan] = field(default_factory=dict)
    memtable_datasets: dict[str, lance.LanceDataset] = field(default_factory=dict)
    derived: dict[tuple[object, ...], object] = field(default_factory=dict)
    claims: set[tuple[object, ...]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Datasets:
    """A view's DataFusion datasets, by options: apart from :class:`_Memo`, which their planner
    reads. Each holds a copy of the view without them, so no reference cycle holds a view: its
    Lance datasets are freed when the last reference to it goes, on that thread, not by the
    garbage collector on whichever thread it runs (a DataFusion worker's, where freeing them
    crashed the process now and then)."""

    by_options: dict[tuple[bool, bool, bool], MergedDataset] = field(default_factory=dict)


def _transform(f: ShardingFieldSpec, arr: pa.Array) -> pa.Array:
    return evaluate_field(f, [arr], len(arr))


@dataclass(frozen=True)
class TableView:
    """One snapshot, merged, with the storage and caches that read it (see the module docs)."""

    snapshot: Snapshot
    merge: MergeState
    storage: Storage = field(repr=False)
    cache: SnapshotCache = field(repr=False)
    live: tuple[LiveMemTable, ...] = ()
    timings: OpenTimings = OpenTimings(0.0, 0.0)
    settings: ReadSettings = field(default_factory=ReadSettings, repr=False, compare=False)
    _memo: _Memo = field(default_factory=_Memo, repr=False, compare=False)
    _datasets: _Datasets = field(default_factory=_Datasets, repr=False, compare=False)

    @property
    def view(self) -> TableView:
        """The view itself (a view is accepted wherever a table is, see :class:`HasView`)."""
        return self

    @property
    def uri(self) -> str:
        """The table URI."""
        return self.snapshot.uri

    def with_snapshot(self, snapshot: Snapshot) -> TableView:
        """The same view over another snapshot (nothing derived is kept)."""
        return dataclasses.replace(self, snapshot=snapshot, _memo=_Memo(), _datasets=_Datasets())

    def with_index_catchup(self, mode: str) -> TableView:
        """The same view (and derived values) with its own ``index_catchup`` setting (and its own
        DataFusion datasets: theirs plan scans with the setting of the view that built them)."""
        return dataclasses.replace(self, settings=ReadSettings(mode), _datasets=_Datasets())

    # -- region pruning ---------------------------------------------------------
    def region_values(self) -> dict[str, RegionValues | None]:
        """Each region's spec values (``None`` = unknown; ``outside`` rows: the region is never pruned)."""
        memo = self._memo
        if memo.region_values is None:
            values = region_values_of(self.snapshot, lambda raw, rt: decode_field_value(raw, parse_result_type(rt)))
            memo.region_values = checked_values(self.snapshot, values, self.field_names(), self.cache)
        return memo.region_values

    def field_names(self) -> dict[int, str]:
        """Lance field id -> column name, for the columns region specs refer to."""
        memo = self._memo
        if memo.field_names is None:
            memo.field_names = lance_field_ids(self.snapshot.base)
        return memo.field_names

    def plan(self, predicate: Predicate, *, in_query: bool = False) -> Plan:
        """Which regions ``predicate`` can touch (``in_query``: no DataFusion call allowed)."""
        return plan_regions(
            self.snapshot,
            predicate,
            self.region_values(),
            self.field_names(),
            _transform,
            allow_expressions=not in_query,
        )

    def plan_sql(self, predicate_sql: str | None, *, lance: bool = False) -> Plan:
        """:meth:`plan` of a SQL predicate (``None`` = all rows); see ``Table.plan``.

        ``lance``: the predicate is a filter Lance runs (``nearest``, ``search_text``), read
        with Lance's rules for names (:func:`predicate_for_table`).
        """
        if predicate_sql is None:
            return self.plan(Unknown("no predicate"))
        try:
            pred = predicate_for_table(self.snapshot.schema, predicate_sql, lance=lance)
        except Exception as err:
            msg = f"cannot plan predicate {predicate_sql!r} over {self.uri}: {err}"
            raise InvalidArgumentError(msg) from err
        return self.plan(pred)

    def search_pruned(self, filt: str | pc.Expression | None, in_query: bool) -> set[str]:
        """Regions the filter of a search (``nearest``, ``search_text``) prunes: a string is
        Lance SQL, which Lance runs over every source; a SQL string cannot be planned inside
        a running query (nothing pruned then)."""
        if isinstance(filt, pc.Expression):
            return set(self.plan_expression(filt).pruned_regions)
        if isinstance(filt, str) and not in_query:
            return set(self.plan_sql(filt, lance=True).pruned_regions)
        return set()

    def plan_expression(self, expr: pc.Expression) -> Plan:
        """:meth:`plan` of a pyarrow filter (callable while DataFusion runs a query)."""
        return self.plan(decoded(expr, self.snapshot.schema.names), in_query=True)

    def plan_scan(self, expr: pc.Expression, *, prune: bool = True, catchup: bool = True) -> ScanPlan:
        """The frozen plan of a filter DataFusion pushed down: one decode, then pruning and catch-up."""
        pred = decoded(expr, self.snapshot.schema.names)
        regions = self.plan(pred, in_query=True) if prune else None
        used = self.catchup_for(columns_of(pred)) if catchup else None
        return ScanPlan(pred, needed_columns(pred), regions, used)

    # -- indexes and the Indexed Read Plan -------------------------------------------
    def base_indexes(self) -> list[BaseIndex]:
        """The user indexes of the snapshot's base version (read once per snapshot)."""
        memo = self._memo
        if memo.indexes is None:
            memo.indexes = base_indexes(self.snapshot)
        return list(memo.indexes)

    def scalar_indexes(self) -> list[BaseIndex]:
        """The base indexes on one non-vector column (those SQL filters can use)."""
        schema = self.snapshot.schema
        return [
            i
            for i in self.base_indexes()
            if len(i.columns) == 1 and not pa.types.is_fixed_size_list(schema.field(i.columns[0]).type)
        ]

    def indexed_only(self, fragments: Collection[int]) -> IndexedOnly:
        """A base index search restricted to ``fragments`` (those its index covers), knowing
        whether every scalar index a filter may use covers them too."""
        return IndexedOnly.of(fragments, (i.fragment_ids for i in self.scalar_indexes()))

    def catchup_plan(self, index_name: str) -> CatchupPlan:
        """The Indexed Read Plan of a base index (computed once); see ``Table.catchup_plan``."""
        plan = self._memo.catchup.get(index_name)
        if plan is None:
            found = next((i for i in self.base_indexes() if i.name == index_name), None)
            if found is None:
                names = [i.name for i in self.base_indexes()]
                msg = f"{self.uri} (version {self.snapshot.base_version}) has no index {index_name!r}; indexes: {names}"
                raise InvalidArgumentError(msg)
            plan = plan_catchup(self.snapshot, self.storage, self.cache, found)
            self._memo.catchup[index_name] = plan
        return plan

    def uses_catchup(self, plan: CatchupPlan) -> bool:
        """Whether indexed reads serve ``plan``'s rows from its generations (``index_catchup``)."""
        mode = self.settings.index_catchup
        if not plan.usable or mode == "never":
            return False
        return mode == "always" or plan.uncovered_rows >= CATCHUP_MIN_ROWS_PER_SOURCE * len(plan.sources)

    def flat_because(self, plan: CatchupPlan) -> str:
        """Why indexed reads serve ``plan``'s rows flat, not from its generations ('' when they use them)."""
        if not plan.usable:
            return plan.reason
        if self.settings.index_catchup == "never":
            return "catch-up generations usable, but index_catchup='never'"
        if self.uses_catchup(plan):
            return ""
        return (
            f"catch-up generations usable, but cheaper to read these rows flat: index_catchup='auto' uses them "
            f"from {CATCHUP_MIN_ROWS_PER_SOURCE:,} unindexed rows per generation"
        )

    def recheck_catchup(self, plan: CatchupPlan) -> CatchupPlan:
        """``plan`` if its generations are all still there; else the unusable plan (remembered)."""
        checked = still_readable(self.storage, plan)
        if checked is not plan:
            self._memo.catchup[plan.index.name] = checked
        return checked

    def catchup_for(self, columns: set[str] | frozenset[str]) -> CatchupPlan | None:
        """The usable, chosen Indexed Read Plan of a scalar index on one of ``columns``, if any."""
        for idx in self.scalar_indexes():
            if idx.columns[0] in columns:
                if self.settings.index_catchup == "auto" and idx.name not in self._memo.catchup:
                    rows, gens = catchup_size(self.snapshot, self.storage, idx)
                    if not gens or rows < CATCHUP_MIN_ROWS_PER_SOURCE * gens:
                        continue  # "auto" would not use it: opening its generations is not worth it
                plan = self.catchup_plan(idx.name)
                if self.uses_catchup(plan):
                    plan = self.recheck_catchup(plan)
                    if plan.usable:
                        return plan
        return None

    def derived(self, key: tuple[object, ...], build: Callable[[], T]) -> T:
        """A value an access path derives from this view, built once (e.g. vector search's pool)."""
        memo = self._memo.derived
        if key not in memo:
            memo[key] = build()
        return memo[key]  # type: ignore[return-value]

    def derived_ready(self, key: tuple[object, ...]) -> object | None:
        """A value :meth:`derived` built already under ``key`` (None: not built yet)."""
        return self._memo.derived.get(key)

    def claim(self, key: tuple[object, ...]) -> bool:
        """True for one caller of ``key`` until it calls :meth:`release` (e.g. who reads a
        derived value in the background)."""
        with self._memo.lock:
            if key in self._memo.claims:
                return False
            self._memo.claims.add(key)
            return True

    def release(self, key: tuple[object, ...]) -> None:
        """Let ``key`` be claimed again."""
        with self._memo.lock:
            self._memo.claims.discard(key)

    # -- datasets ------------------------------------------------------------------
    def dataset(self, *, hidden_columns: bool = False, prune: bool = True, cache: bool = True) -> MergedDataset:
        """The merged table as DataFusion scans it (one per option set); see ``Table.dataset``."""
        key = (hidden_columns, prune, cache)
        ds = self._datasets.by_options.get(key)
        if ds is None:
            planning = dataclasses.replace(self, _datasets=_Datasets())  # no reference back (see _Datasets)
            ds = MergedDataset(
                self.snapshot,
                self.merge,
                with_hidden=hidden_columns,
                planner=partial(planning.plan_scan, prune=prune, catchup=not hidden_columns),
                resident=self.cache if cache else None,
                indexed=frozenset(i.columns[0] for i in self.scalar_indexes()),
            )
            self._datasets.by_options[key] = ds
        return ds

    def memtable_dataset(self, region_id: str, rows: pa.Table) -> lance.LanceDataset:
        """A region's surviving MemTable rows as an in-memory Lance dataset (built once)."""
        ds = self._memo.memtable_datasets.get(region_id)
        if ds is None:
            schema = self.snapshot.schema
            ds = memory_dataset(as_schema(rows.select(schema.names), schema))
            self._memo.memtable_datasets[region_id] = ds
        return ds


class HasView(Protocol):
    """Anything that reads through a :class:`TableView` (a ``Table``, or a view itself)."""

    @property
    def view(self) -> TableView: ...


def view_of(source: HasView) -> TableView:
    """The view of a table or view."""
    got = getattr(source, "view", None)
    if not isinstance(got, TableView):
        msg = f"expected a memwal Table or TableView, got {type(source).__name__}"
        raise InvalidArgumentError(msg)
    return got
