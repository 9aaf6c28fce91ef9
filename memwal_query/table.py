"""The user-facing table: open a snapshot, register it in DataFusion, explain it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import ShardSnapshot

from memwal_query.catchup import (
    CATCHUP_MIN_ROWS_PER_SOURCE,
    BaseIndex,
    CatchupPlan,
    base_indexes,
    plan_catchup,
    still_readable,
)
from memwal_query.compat import check_datafusion_supported
from memwal_query.engine_errors import engine_error
from memwal_query.errors import GenerationLostError, InvalidArgumentError, MemWalError
from memwal_query.format.decode import ShardingFieldSpec
from memwal_query.format.storage import Storage
from memwal_query.fts.search import search_text
from memwal_query.hybrid import RRF_K, search_hybrid
from memwal_query.merge import MergeState, compute_merge
from memwal_query.planner.arrow_expr import from_arrow_expression
from memwal_query.planner.datafusion_expr import predicate_for_table
from memwal_query.planner.plan import Plan, plan_regions, region_values_of
from memwal_query.planner.predicates import Predicate, Unknown, columns_of
from memwal_query.planner.pruning import RegionValues
from memwal_query.regionspec.spec import (
    decode_field_value,
    evaluate_field,
    evaluate_spec,
    lance_field_ids,
    parse_result_type,
)
from memwal_query.snapshot import (
    Consistency,
    LiveMemTable,
    MissingGenerationPolicy,
    Snapshot,
    SnapshotCache,
    check_missing_generation_policy,
    load_snapshot,
)
from memwal_query.sources import MergedDataset, fragment_cache_key

__all__ = ["Table", "open_table", "OpenTimings"]


@dataclass(frozen=True)
class OpenTimings:
    """Seconds spent opening a snapshot."""

    snapshot: float
    merge: float


class Table:
    """A snapshot of an LSM-merged MemWAL table.

    Immutable: :meth:`refresh` returns a new :class:`Table`. Create one with
    :func:`open_table`.

    Example:
        >>> import datafusion, memwal_query as mq
        >>> from memwal_query.demo import write_demo_table
        >>> import tempfile
        >>> uri = tempfile.mkdtemp() + "/events"
        >>> _ = write_demo_table(uri, base_rows=1000, update_rows=300, memtable_rows=200, seed=1)
        >>> table = mq.open_table(uri)
        >>> ctx = datafusion.SessionContext()
        >>> table.register(ctx, "events")
        >>> ctx.sql("SELECT count(*) AS n FROM events").to_pydict()["n"][0] == table.count_rows()
        True
    """

    __slots__ = (
        "_snapshot",
        "_merge",
        "_cache",
        "_storage",
        "_live",
        "timings",
        "_datasets",
        "_field_names",
        "_region_values",
        "_last_lookup",
        "_memtable_datasets",
        "_last_nearest",
        "_catchup",
        "_index_catchup",
        "_indexes",
    )

    def __init__(
        self,
        snapshot: Snapshot,
        merge: MergeState,
        cache: SnapshotCache,
        storage: Storage,
        live: Sequence[LiveMemTable],
        timings: OpenTimings,
    ) -> None:
        self._snapshot = snapshot
        self._merge = merge
        self._cache = cache
        self._storage = storage
        self._live = tuple(live)
        self.timings = timings
        self._datasets: dict[tuple[bool, bool, bool], MergedDataset] = {}
        self._field_names: dict[int, str] | None = None
        self._region_values: dict[str, RegionValues | None] | None = None
        self._last_lookup: object = None
        self._memtable_datasets: dict[str, object] = {}
        self._last_nearest: object = None
        self._catchup: dict[str, CatchupPlan] = {}
        self._index_catchup = "auto"
        self._indexes: list[BaseIndex] | None = None

    # -- what it is ---------------------------------------------------------
    @property
    def uri(self) -> str:
        """The table URI."""
        return self._snapshot.uri

    @property
    def snapshot(self) -> Snapshot:
        """The frozen snapshot (base version, regions, sources)."""
        return self._snapshot

    @property
    def merge_state(self) -> MergeState:
        """The dedup decision of this snapshot."""
        return self._merge

    @property
    def version(self) -> int:
        """The base table version this snapshot reads."""
        return self._snapshot.base_version

    @property
    def schema(self) -> pa.Schema:
        """The merged table's schema (without hidden columns)."""
        return self._snapshot.schema

    @property
    def primary_key(self) -> tuple[str, ...]:
        """The primary key column(s)."""
        return self._snapshot.primary_key

    @property
    def consistency(self) -> Consistency:
        """``"strong"`` or ``"eventual"``."""
        return self._snapshot.consistency

    @property
    def region_ids(self) -> list[str]:
        """UUID strings of the regions in this snapshot."""
        return [r.region_id for r in self._snapshot.regions]

    @property
    def storage_options(self) -> dict[str, str]:
        """The storage options the table was opened with (``{}`` on local disk)."""
        return dict(self._storage.storage_options)

    @property
    def io_stats(self) -> object:
        """Storage requests made through memwal's own metadata reads so far."""
        return self._storage.stats

    # -- DataFusion ---------------------------------------------------------
    def dataset(self, *, hidden_columns: bool = False, prune: bool = True, cache: bool = True) -> MergedDataset:
        """The merged table as a ``pyarrow.dataset.Dataset`` DataFusion can scan.

        Args:
            hidden_columns: Add ``_gen``, ``_rowaddr``, ``_region``.
            prune: Skip regions a pushed-down filter cannot match (region pruning).
            cache: Keep the columns a scan decodes in memory (shared by refreshed
                snapshots of this table, up to ``memwal_query.sources.RESIDENT_MAX_BYTES``),
                so later queries filter memory instead of decoding Lance pages again.
        """
        key = (hidden_columns, prune, cache)
        ds = self._datasets.get(key)
        if ds is None:
            ds = MergedDataset(
                self._snapshot,
                self._merge,
                with_hidden=hidden_columns,
                region_filter=self._plan_pushed_filter if prune else None,
                catchup=None if hidden_columns else self._catchup_for_filter,
                resident=self._cache if cache else None,
            )
            self._datasets[key] = ds
        return ds

    def register(
        self,
        ctx: datafusion.SessionContext,
        name: str,
        *,
        hidden_columns: bool = False,
        prune: bool = True,
        cache: bool = True,
    ) -> None:
        """Register the merged table in a DataFusion session.

        Args:
            ctx: The session.
            name: Table name to use in SQL.
            hidden_columns: Add ``_gen`` (0 = base), ``_rowaddr`` and ``_region``
                for debugging.
            prune: Skip regions the query's filters cannot match (default True).
            cache: Keep decoded columns in memory for later queries (see :meth:`dataset`).

        Raises:
            InvalidArgumentError: ``ctx`` is not a ``datafusion.SessionContext``.
        """
        if not isinstance(ctx, datafusion.SessionContext):
            msg = f"register() needs a datafusion.SessionContext, got {type(ctx).__name__}"
            raise InvalidArgumentError(msg)
        if not isinstance(name, str) or not name:
            msg = f"table name must be a non-empty string, got {name!r}"
            raise InvalidArgumentError(msg)
        check_datafusion_supported()
        try:
            ctx.deregister_table(name)
        except Exception:  # noqa: BLE001 - not registered yet
            pass
        ctx.register_dataset(name, self.dataset(hidden_columns=hidden_columns, prune=prune, cache=cache))
        from memwal_query.sql_functions import register_functions

        register_functions(ctx, {name: self})

    def sql(self, query: str, *, name: str = "t", ctx: datafusion.SessionContext | None = None) -> datafusion.DataFrame:
        """Run SQL over this table registered as ``name`` (default ``t``).

        Example:
            >>> # table.sql("SELECT count(*) FROM t").to_arrow_table()
        """
        ctx = ctx or datafusion.SessionContext()
        self.register(ctx, name)
        try:
            return ctx.sql(query)
        except MemWalError:
            raise
        except Exception as err:  # DataFusion's; ours raised inside it come back as they were
            raise engine_error(err) from err

    def to_arrow(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole merged table (or some columns) as an Arrow table."""
        return self.dataset().to_table(columns=columns)

    def to_reader(self, columns: Sequence[str] | None = None) -> pa.RecordBatchReader:
        """The merged table streamed as a ``RecordBatchReader`` (DuckDB, Polars ...)."""
        scan = self.dataset().scanner(columns=columns)
        return pa.RecordBatchReader.from_batches(scan.projected_schema, scan.to_batches())

    def count_rows(self) -> int:
        """Live rows in the merged table, from metadata (no data column is read)."""
        return self.dataset().count_rows()

    # -- planning -----------------------------------------------------------
    def region_values(self) -> dict[str, RegionValues | None]:
        """Each region's spec values (``None`` = unknown: the region is never pruned)."""
        if self._region_values is None:
            self._region_values = region_values_of(
                self._snapshot, lambda raw, rt: decode_field_value(raw, parse_result_type(rt))
            )
        return self._region_values

    def field_names(self) -> dict[int, str]:
        """Lance field id -> column name, for the columns region specs refer to."""
        if self._field_names is None:
            self._field_names = lance_field_ids(self._snapshot.base)
        return self._field_names

    def _plan(self, predicate: Predicate, *, in_query: bool = False) -> Plan:
        return plan_regions(
            self._snapshot,
            predicate,
            self.region_values(),
            self.field_names(),
            _transform,
            allow_expressions=not in_query,
        )

    def _plan_pushed_filter(self, expr: object) -> Plan:
        # Called by DataFusion while it plans a scan: no DataFusion call allowed here.
        return self._plan(from_arrow_expression(expr, self._snapshot.schema.names), in_query=True)

    def plan(self, predicate_sql: str | None = None) -> Plan:
        """Which regions a SQL predicate can touch (region pruning), without running it.

        Args:
            predicate_sql: A SQL boolean expression over the table's columns, e.g.
                ``"id = 42"`` or ``"id IN (1, 2) AND amount > 3"``; ``None`` = all rows.

        Returns:
            A frozen :class:`~memwal_query.planner.plan.Plan`; ``.regions`` and
            ``.pruned_regions`` are region UUID strings.

        Raises:
            InvalidArgumentError: The predicate is not valid SQL over this table.
        """
        if predicate_sql is None:
            return self._plan(Unknown("no predicate"))
        try:
            pred = predicate_for_table(self._snapshot.schema, predicate_sql)
        except Exception as err:
            msg = f"cannot plan predicate {predicate_sql!r} over {self.uri}: {err}"
            raise InvalidArgumentError(msg) from err
        return self._plan(pred)

    # -- point lookups -------------------------------------------------------
    def _route_keys(self, keys: pa.Table) -> dict[str, pa.Table] | None:
        """Keys per region by the region specs; regions with unknown values get every key.

        ``None`` when routing is impossible (a spec reads a non-key column).
        """
        snap = self._snapshot
        values = self.region_values()
        names = self.field_names()
        out: dict[str, pa.Table] = {}
        evaluated: dict[int, pa.Table] = {}
        for r in snap.regions:
            rv = values.get(r.region_id)
            spec = snap.index.spec(r.manifest.spec_id) if r.manifest is not None else None
            if rv is None or spec is None:
                out[r.region_id] = keys
                continue
            if any(names.get(int(i)) not in snap.primary_key for f in spec.fields for i in f.source_ids):
                return None
            if spec.spec_id not in evaluated:
                try:
                    evaluated[spec.spec_id] = evaluate_spec(spec, keys, names)
                except MemWalError:
                    return None
            ev = evaluated[spec.spec_id]
            mask = pa.array(np.ones(keys.num_rows, dtype=bool))
            for f in spec.fields:
                if f.field_id not in rv.values or f.field_id not in ev.column_names:
                    continue
                v = rv.values[f.field_id]
                col = ev.column(f.field_id)
                eq = pc.is_null(col) if v is None else pc.fill_null(pc.equal(col, pa.scalar(v, col.type)), False)
                mask = pc.and_(mask, eq)
            out[r.region_id] = keys.filter(mask)
        return out

    def lookup(self, keys: object, columns: Sequence[str] | None = None) -> pa.Table:
        """The newest live row of each key; deleted and missing keys are absent.

        Newest source first per key (MemTable, generations newest first with bloom
        filters, then the base), only in the region each key routes to.

        Args:
            keys: One key, a list / Arrow array of keys, or for composite keys a
                struct array, ``pyarrow.Table`` or dict of key columns.
            columns: Columns to return (default: all).

        Returns:
            One row per key found (order not guaranteed).

        Raises:
            InvalidArgumentError: Keys that do not fit the key column types, unknown columns.

        Example:
            >>> # table.lookup([1, 2, 3], columns=["id", "amount"])
        """
        from memwal_query.lookup import lookup

        result, stats = lookup(self, keys, columns)
        self._last_lookup = stats
        return result

    @property
    def last_lookup_stats(self) -> object:
        """What the last :meth:`lookup` touched (regions, generations, bloom skips, base keys)."""
        return self._last_lookup

    # -- vector search --------------------------------------------------------
    def _memtable_dataset(self, region_id: str, rows: pa.Table) -> lance.LanceDataset:
        ds = self._memtable_datasets.get(region_id)
        if ds is None:
            from memwal_query.vector import memory_dataset

            ds = memory_dataset(rows.select(self._snapshot.schema.names).cast(self._snapshot.schema))
            self._memtable_datasets[region_id] = ds
        return ds  # type: ignore[return-value]

    def nearest(
        self,
        column: str,
        query: object,
        k: int = 10,
        *,
        filter: str | pc.Expression | None = None,
        nprobes: int | None = None,
        refine_factor: int | None = None,
        distance: str = "l2",
        columns: Sequence[str] | None = None,
        _in_query: bool = False,
    ) -> pa.Table:
        """The ``k`` merged rows nearest to ``query``, with a ``_distance`` column.

        Each source (base, unmerged generations, MemTables) is searched by Lance
        with the snapshot's dedup mask applied before ranking, so superseded and
        deleted rows never take a place in the top-k; the base uses its vector
        index where it covers the data (the rest is searched flat).

        Args:
            column: The vector column (fixed-size list of floats).
            query: The query vector (its length must be the column's dimension).
            k: How many rows.
            filter: A prefilter (SQL string or pyarrow expression) on the live rows.
            nprobes: IVF partitions to probe (index searches).
            refine_factor: Re-rank ``k * refine_factor`` candidates exactly.
            distance: ``"l2"``, ``"cosine"`` or ``"dot"``.
            columns: Columns to return (default: all).

        Raises:
            InvalidArgumentError: Unknown column, not a vector column, wrong dimension, bad k.

        Example:
            >>> # table.nearest("vec", [0.1] * 128, k=5, filter="category = 'books'")
        """
        from memwal_query.vector import nearest

        result, stats = nearest(
            self,
            column,
            query,
            k=k,
            filter=filter,
            nprobes=nprobes,
            refine_factor=refine_factor,
            distance=distance,
            columns=columns,
            in_query=_in_query,
        )
        self._last_nearest = stats
        return result

    @property
    def last_nearest_stats(self) -> object:
        """Sources searched by the last :meth:`nearest` and the index coverage it found."""
        return self._last_nearest

    # -- full-text and hybrid search -------------------------------------------
    def search_text(
        self,
        column: str,
        query: str,
        k: int = 10,
        *,
        filter: str | pc.Expression | None = None,
        columns: Sequence[str] | None = None,
        phrase: bool = False,
        _in_query: bool = False,
    ) -> pa.Table:
        """The ``k`` live rows that best match ``query`` (BM25), with a ``_score`` column, best first.

        Scored as if one INVERTED index (the base index's tokenizer and parameters)
        held exactly the snapshot's live rows: superseded and deleted versions count
        for nothing, wherever they sit (:mod:`memwal_query.fts.search`).

        Args:
            column: A text column with an INVERTED index on the base table.
            query: The query text, tokenized like the indexed text; a row matches
                when it holds any query token (BM25 ranks them).
            k: How many rows.
            filter: A prefilter (SQL string or pyarrow expression) on the live rows;
                a SQL string also prunes regions.
            columns: Columns to return (default: all).
            phrase: Match ``query`` as a phrase (the index must store positions:
                ``with_position=True``).

        Raises:
            InvalidArgumentError: Unknown or non-text column, no INVERTED index on it,
                a phrase query without positions, bad ``k``.

        Example:
            >>> # table.search_text("note", "fast delivery", k=5, filter="category = 'books'")
        """
        return search_text(self, column, query, k=k, filter=filter, columns=columns, phrase=phrase, in_query=_in_query)[
            0
        ]

    def search_hybrid(
        self,
        vector_column: str,
        vector: object,
        text_column: str,
        text: str,
        k: int = 10,
        *,
        filter: str | pc.Expression | None = None,
        columns: Sequence[str] | None = None,
        depth: int | None = None,
        rrf_k: float = RRF_K,
        nprobes: int | None = None,
        refine_factor: int | None = None,
        distance: str = "l2",
        _in_query: bool = False,
    ) -> pa.Table:
        """Hybrid search: merged KNN and merged full-text search fused by reciprocal rank.

        ``relevance = sum of 1 / (rrf_k + rank)`` over the two result lists (ranks from
        1, ``rrf_k = 60``; :mod:`memwal_query.hybrid`), rows matched by primary key.

        Args:
            vector_column: The vector column (see :meth:`nearest`).
            vector: The query vector.
            text_column: The text column with an INVERTED index (see :meth:`search_text`).
            text: The text query.
            k: How many rows.
            filter: A prefilter on the live rows, applied to both searches.
            columns: Columns to return (default: all).
            depth: Rows taken from each search (default ``max(4 * k, 50)``).
            rrf_k: The fusion constant.
            nprobes: See :meth:`nearest`.
            refine_factor: See :meth:`nearest`.
            distance: See :meth:`nearest`.

        Returns:
            The columns plus ``_distance`` and ``_score`` (null where that search did
            not return the row) and ``_relevance_score``, best first.

        Raises:
            InvalidArgumentError: As :meth:`nearest` and :meth:`search_text`; bad ``k``,
                ``depth`` or ``rrf_k``.

        Example:
            >>> # table.search_hybrid("vec", query_vector, "note", "late delivery", k=5)
        """
        return search_hybrid(
            self,
            vector_column,
            vector,
            text_column,
            text,
            k=k,
            filter=filter,
            columns=columns,
            depth=depth,
            rrf_k=rrf_k,
            nprobes=nprobes,
            refine_factor=refine_factor,
            distance=distance,
            in_query=_in_query,
        )

    @property
    def index_catchup(self) -> str:
        """When indexed reads use the Indexed Read Plan (:meth:`catchup_plan`).

        ``"auto"`` (default): when the unindexed base rows are many enough that
        searching them without an index costs more than one indexed search per
        catch-up generation (at least ``CATCHUP_MIN_ROWS_PER_SOURCE`` rows per
        generation, measured in ``benchmarks/bench_lookup_knn.py``); ``"always"``:
        whenever the plan is usable; ``"never"``: unindexed base rows are always
        searched flat. SQL returns the same rows either way; a vector search through the
        generations' (approximate) indexes can rank differently from the flat search.

        Example:
            >>> # table.index_catchup = "always"
        """
        return self._index_catchup

    @index_catchup.setter
    def index_catchup(self, mode: str) -> None:
        if mode not in ("auto", "always", "never"):
            msg = f"index_catchup must be 'auto', 'always' or 'never', got {mode!r}"
            raise InvalidArgumentError(msg)
        self._index_catchup = mode

    def uses_catchup(self, plan: CatchupPlan) -> bool:
        """Whether indexed reads of this table serve ``plan``'s rows from its generations."""
        if not plan.usable or self._index_catchup == "never":
            return False
        return self._index_catchup == "always" or plan.uncovered_rows >= CATCHUP_MIN_ROWS_PER_SOURCE * len(plan.sources)

    def _catchup_for_filter(self, expr: pc.Expression) -> CatchupPlan | None:
        """The usable Indexed Read Plan of a scalar index the pushed filter reads, if any."""
        indexes = self.scalar_indexes()
        if not indexes:
            return None
        cols = columns_of(from_arrow_expression(expr, self._snapshot.schema.names))
        for idx in indexes:
            if idx.columns[0] in cols:
                plan = self.catchup_plan(idx.name)
                if self.uses_catchup(plan):
                    plan = self._recheck_catchup(plan)
                    if plan.usable:
                        return plan
        return None

    def base_indexes(self) -> list[BaseIndex]:
        """The user indexes of the snapshot's base version (read once per snapshot)."""
        if self._indexes is None:
            self._indexes = base_indexes(self)
        return list(self._indexes)

    def scalar_indexes(self) -> list[BaseIndex]:
        """The base indexes on one non-vector column (those SQL filters can use)."""
        schema = self._snapshot.schema
        return [
            i
            for i in self.base_indexes()
            if len(i.columns) == 1 and not pa.types.is_fixed_size_list(schema.field(i.columns[0]).type)
        ]

    def _recheck_catchup(self, plan: CatchupPlan) -> CatchupPlan:
        """``plan`` if its generations are all still there; else the unusable plan (remembered)."""
        checked = still_readable(self, plan)
        if checked is not plan:
            self._catchup[plan.index.name] = checked
        return checked

    def catchup_plan(self, index_name: str) -> CatchupPlan:
        """The Indexed Read Plan of a base index for this snapshot (computed once).

        Base fragments the index does not cover yet are served by the generations
        merged since the index last caught up, with their own indexes, when those are
        still readable and account for exactly those rows (:mod:`memwal_query.catchup`);
        otherwise ``usable`` is False and ``reason`` says why (the rows are then
        searched flat).

        Raises:
            InvalidArgumentError: The base version has no index of that name.

        Example:
            >>> # plan = table.catchup_plan("vec_idx")
            >>> # plan.usable, plan.uncovered_rows, [s.generation.generation for s in plan.sources]
            >>> # print(plan.describe())
        """
        plan = self._catchup.get(index_name)
        if plan is None:
            found = next((i for i in self.base_indexes() if i.name == index_name), None)
            if found is None:
                names = [i.name for i in self.base_indexes()]
                msg = f"{self.uri} (version {self.version}) has no index {index_name!r}; indexes: {names}"
                raise InvalidArgumentError(msg)
            plan = plan_catchup(self, found)
            self._catchup[index_name] = plan
        return plan

    # -- pylance interop -----------------------------------------------------
    def pylance_shard_snapshots(self) -> list[ShardSnapshot]:
        """This snapshot as pylance ``ShardSnapshot``s (regions, unmerged generations).

        For pylance's own readers over the same data (``LsmScanner.from_snapshots``,
        ``LsmPointLookupPlanner``, ``LsmVectorSearchPlanner``), e.g. to compare
        answers; they cannot see other writers' MemTables.

        Raises:
            GenerationLostError: A generation was rebuilt from the WAL (its directory is
                lost): pylance's readers cannot read it.
        """
        shards = []
        for r in self._snapshot.regions:
            for g in r.generations:
                if g.rebuilt_from_wal:
                    msg = (
                        f"{self.uri}: region {r.region_id}: generation {g.generation} ({g.lost_uri}) is lost and "
                        "was rebuilt from the WAL; pylance's readers cannot read it"
                    )
                    raise GenerationLostError(msg)
            s = ShardSnapshot(r.region_id).with_spec_id(r.spec_id)
            if r.manifest is not None:
                paths = {g.generation: g.path for g in r.manifest.flushed_generations}
                s = s.with_current_generation(r.manifest.current_generation)
                for g in r.generations:
                    s = s.with_sstable(g.generation, paths[g.generation])
            shards.append(s)
        return shards

    # -- lifecycle ----------------------------------------------------------
    def refresh(self) -> Table:
        """A newer snapshot of the same table, reusing what did not change.

        Reuses opened generation datasets, decoded WAL entries, known region
        manifest versions (probing starts there) and the base key column when the
        base version did not change.
        """
        new = _open(
            self._storage,
            consistency=self._snapshot.consistency,
            live=self._live,
            cache=self._cache,
            version=None,
            on_missing_generation=self._snapshot.on_missing_generation,
        )
        new.index_catchup = self.index_catchup
        return new

    # -- explain ------------------------------------------------------------
    def explain(self, predicate: str | None = None) -> str:
        """A readable account of the snapshot: sources per region, rows, what was skipped and why.

        Args:
            predicate: Also show which regions this SQL predicate reads and which it
                prunes (and why), as :meth:`plan` decides.
        """
        from memwal_query.display import ExplainText, explain_html
        from memwal_query.explain import explain_table

        text = explain_table(self)
        if predicate is not None:
            text += "\n" + "\n".join("  " + line for line in self.plan(predicate).explain().splitlines())
        return ExplainText(text, explain_html(self, predicate))

    def _repr_html_(self) -> str:
        """Jupyter: sources per region, live rows, freshness."""
        from memwal_query.display import table_html

        return table_html(self)

    def __repr__(self) -> str:
        return (
            f"<memwal Table {self.uri} base v{self.version}, {len(self._snapshot.regions)} regions, "
            f"{self._snapshot.consistency}>"
        )


def _transform(field: ShardingFieldSpec, arr: pa.Array) -> pa.Array:
    return evaluate_field(field, [arr], len(arr))


def _open(
    storage: Storage,
    *,
    consistency: Consistency,
    live: Sequence[LiveMemTable],
    cache: SnapshotCache,
    version: int | None,
    on_missing_generation: MissingGenerationPolicy = "recover",
) -> Table:
    attempts = 3 if version is None else 1
    for attempt in range(attempts):
        t0 = time.perf_counter()
        snap = load_snapshot(
            storage.uri,
            storage_options=storage.storage_options,
            version=version,
            consistency=consistency,
            live=live,
            cache=cache,
            storage=storage,
            on_missing_generation=on_missing_generation,
        )
        t1 = time.perf_counter()
        try:
            merge = compute_merge(snap, cache)
        except (OSError, ValueError, RuntimeError) as err:
            # A generation vanished between listing and reading its keys (a merger
            # merged it, GC removed it): the newest base version holds its rows.
            with cache.lock:
                for r in snap.regions:
                    for g in r.generations:
                        cache.generations.pop(g.uri, None)
                        cache.generation_keys.pop(g.uri, None)
            if attempt == attempts - 1:
                msg = f"cannot read the flushed generations of {storage.uri}: {err}"
                raise MemWalError(msg) from err
            continue
        t2 = time.perf_counter()
        cache.keep_generations({g.uri for r in snap.regions for g in r.generations})
        if cache.fragment_columns or cache.over_budget:  # a fresh open has nothing to forget
            cache.keep_fragments(
                {fragment_cache_key(snap.uri, f) for f in snap.base.get_fragments()}
                | {
                    fragment_cache_key(g.uri, f)
                    for r in snap.regions
                    for g in r.generations
                    for f in g.dataset.get_fragments()
                }
            )
        return Table(snap, merge, cache, storage, live, OpenTimings(t1 - t0, t2 - t1))
    raise AssertionError("unreachable")


def open_table(
    uri: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    consistency: Consistency = "strong",
    version: int | None = None,
    live: Sequence[LiveMemTable] = (),
    on_missing_generation: MissingGenerationPolicy = "recover",
) -> Table:
    """Open a snapshot of a Lance MemWAL table.

    Args:
        uri: Table URI: a local path or ``s3://bucket/path`` (and other object stores).
        storage_options: The same keys pylance accepts (``aws_access_key_id``,
            ``aws_endpoint``, ``allow_http`` ...).
        consistency: ``"strong"`` (default) also reads every region's WAL tail,
            i.e. other writers' live MemTables; ``"eventual"`` reads flushed
            generations only (cheaper, may lag).
        version: Base table version to read (default: latest).
        live: In-process MemTables (:class:`memwal_query.LiveMemTable`) to include.
        on_missing_generation: What to do with a *lost* generation: a flushed
            generation above its region's merged generation (so the base does not hold
            its rows) whose directory is missing, unreadable or partly deleted, still
            after a retry with the newest base version. ``"recover"`` (default): rebuild
            its rows from the region's WAL when the WAL still holds every one of them
            (a warning; :meth:`Table.explain` says so and how to repair), else raise
            :class:`GenerationLostError`. ``"error"``: always raise. ``"skip"``
            (availability over completeness): rebuild when possible, else leave its
            rows out (a warning; ``explain()`` names the generation and the missing
            rows). :meth:`Table.refresh` keeps the setting. Merged generations that were
            garbage-collected are always skipped silently: the base holds their rows.

    Returns:
        A :class:`Table` snapshot.

    Raises:
        TableNotFoundError: No table at ``uri``.
        NotAMemWalTableError: The table has no MemWAL index.
        NoPrimaryKeyError: The schema declares no primary key.
        ManifestError: A manifest cannot be read.
        GenerationLostError: A lost generation cannot be rebuilt (see ``on_missing_generation``).
        InvalidArgumentError: An invalid ``consistency`` or ``on_missing_generation``.

    Example:
        >>> import memwal_query as mq, tempfile
        >>> from memwal_query.demo import write_demo_table
        >>> uri = write_demo_table(tempfile.mkdtemp() + "/t", base_rows=500, update_rows=100, memtable_rows=100, seed=2)
        >>> t = mq.open_table(uri)
        >>> t.primary_key
        ('id',)
    """
    check_missing_generation_policy(on_missing_generation)
    storage = Storage.open(uri, storage_options)
    return _open(
        storage,
        consistency=consistency,
        live=live,
        cache=SnapshotCache(),
        version=version,
        on_missing_generation=on_missing_generation,
    )
