"""The user-facing table: a thin facade over one frozen merged view.

:class:`Table` holds a :class:`~memwal_query.view.TableView` and hands each call to
the access path that answers it: the scan (:meth:`Table.dataset`, SQL), point
lookups (:mod:`memwal_query.lookup`), vector search (:mod:`memwal_query.vector`),
region pruning (:mod:`memwal_query.planner`), descriptions (:mod:`memwal_query.explain`,
:mod:`memwal_query.display`). It records the statistics of its own last lookup and
search (``last_lookup_stats``, ``last_nearest_stats``) as a convenience.

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

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import datafusion
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import ShardSnapshot

from memwal_query.change_token import stored_token
from memwal_query.changes import changes
from memwal_query.count_star import counted
from memwal_query.display import explanation, table_html
from memwal_query.errors import MemWalError, TableNotFoundError
from memwal_query.format.storage import Storage
from memwal_query.frame import sql_frame
from memwal_query.hybrid import RRF_K, search_hybrid
from memwal_query.interop import shard_snapshots
from memwal_query.lookup import LookupStats, lookup
from memwal_query.planner.catchup import BaseIndex, CatchupPlan
from memwal_query.planner.plan import Plan
from memwal_query.planner.pruning import RegionValues
from memwal_query.reader import MergedStream, stream_of, to_reader
from memwal_query.scan.dataset import MergedDataset
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import (
    Consistency,
    LiveMemTable,
    MissingGenerationPolicy,
    Snapshot,
    check_missing_generation_policy,
    check_version,
)
from memwal_query.sql_functions import register_table
from memwal_query.vector import NearestStats, nearest
from memwal_query.view.facts import ViewFacts
from memwal_query.view.open import open_view, refresh_view
from memwal_query.view.table_view import OpenTimings, TableView

__all__ = ["Table", "open_table", "OpenTimings"]


class Table(ViewFacts):
    """A snapshot of an LSM-merged MemWAL table; :meth:`refresh` returns a new one.

    Create one with :func:`open_table`. Everything it answers comes from its frozen
    :attr:`view`; the one setting that may change is :attr:`index_catchup`.
    """

    __slots__ = ("_view", "_last_lookup", "_last_nearest")

    def __init__(self, view: TableView) -> None:
        self._view = view
        self._last_lookup: LookupStats | None = None
        self._last_nearest: NearestStats | None = None

    # -- what it is ---------------------------------------------------------
    @property
    def view(self) -> TableView:
        """The frozen merged view every access path reads."""
        return self._view

    @property
    def _snapshot(self) -> Snapshot:
        return self._view.snapshot

    @_snapshot.setter
    def _snapshot(self, snapshot: Snapshot) -> None:  # tests substitute a hypothetical snapshot
        self._view = self._view.with_snapshot(snapshot)

    @property
    def _cache(self) -> SnapshotCache:
        return self._view.cache

    # -- DataFusion ---------------------------------------------------------
    def dataset(self, *, hidden_columns: bool = False, prune: bool = True, cache: bool = True) -> MergedDataset:
        """The merged table as a ``pyarrow.dataset.Dataset`` DataFusion can scan.

        Args:
            hidden_columns: Add ``_gen``, ``_rowaddr``, ``_region``.
            prune: Skip regions a pushed-down filter cannot match (region pruning).
            cache: Keep the columns a scan decodes in memory (shared by refreshed
                snapshots, up to ``memwal_query.scan.column_cache.RESIDENT_MAX_BYTES``).
        """
        return self._view.dataset(hidden_columns=hidden_columns, prune=prune, cache=cache)

    def register(
        self,
        ctx: datafusion.SessionContext,
        name: str,
        *,
        hidden_columns: bool = False,
        prune: bool = True,
        cache: bool = True,
    ) -> None:
        """Register the merged table as ``name`` (options as :meth:`dataset`) and the SQL functions.

        Raises :class:`InvalidArgumentError` unless ``ctx`` is a ``datafusion.SessionContext``.
        """
        register_table(ctx, name, self.dataset(hidden_columns=hidden_columns, prune=prune, cache=cache), self)

    def sql(self, query: str, *, name: str = "t", ctx: datafusion.SessionContext | None = None) -> datafusion.DataFrame:
        """SQL over this table as ``name``: a DataFrame raising :class:`MemWalError` as it runs (:mod:`.count_star`)."""
        ctx = ctx or datafusion.SessionContext()
        self.register(ctx, name)
        return counted(ctx, sql_frame(ctx, query, self.uri), name, query, self.count_rows)

    def to_arrow(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole merged table (or some columns) as an Arrow table."""
        return self.dataset().to_table(columns=columns)

    def to_reader(
        self, columns: Sequence[str] | None = None, filter: str | pc.Expression | None = None
    ) -> pa.RecordBatchReader:
        """The merged rows streamed as a ``pyarrow.RecordBatchReader`` (DuckDB, Polars, pandas).

        One pass in bounded memory (the column cache is neither filled nor needed). A
        pyarrow reader is one-shot: once read it yields nothing more; call ``to_reader()``
        again, or use :meth:`to_stream` for something DuckDB can query twice.

        Args:
            columns: Columns to return (``None``: all).
            filter: A SQL boolean expression (``"amount > 10"``) or a
                ``pyarrow.compute.Expression``; regions it cannot match are pruned.

        Raises:
            InvalidArgumentError: Unknown columns or an invalid filter.
        """
        return to_reader(self._view, columns, filter)

    def to_stream(
        self, columns: Sequence[str] | None = None, filter: str | pc.Expression | None = None
    ) -> MergedStream:
        """The merged rows as a re-readable Arrow stream (``__arrow_c_stream__``): a new pass per read.

        Arguments as :meth:`to_reader`; see :class:`memwal_query.reader.MergedStream`.
        """
        return stream_of(self._view, columns, filter)

    def count_rows(self) -> int:
        """Live rows in the merged table: fragment metadata and base key columns (once per fragment)."""
        return self.dataset().count_rows()

    # -- planning -----------------------------------------------------------
    def region_values(self) -> dict[str, RegionValues | None]:
        """Each region's spec values (``None`` = unknown: the region is never pruned)."""
        return self._view.region_values()

    def field_names(self) -> dict[int, str]:
        """Lance field id -> column name, for the columns region specs refer to."""
        return self._view.field_names()

    def plan(self, predicate_sql: str | None = None) -> Plan:
        """Which regions a SQL predicate (e.g. ``"id IN (1, 2)"``; ``None`` = all) can touch.

        Returns a frozen :class:`~memwal_query.planner.plan.Plan` (``.regions``,
        ``.pruned_regions``: region UUIDs). Raises :class:`InvalidArgumentError` on bad SQL.
        """
        return self._view.plan_sql(predicate_sql)

    # -- point lookups and vector search ----------------------------------------
    def lookup(self, keys: object, columns: Sequence[str] | None = None) -> pa.Table:
        """The newest live row of each key (one key, a list / Arrow array, or key columns),
        in the order of the keys given (a key given twice comes once).

        Deleted and missing keys are absent; see :func:`memwal_query.lookup.lookup`.
        Raises :class:`InvalidArgumentError` for keys that do not fit or unknown columns.
        """
        result = lookup(self._view, keys, columns)
        self._last_lookup = result.stats
        return result.rows

    @property
    def last_lookup_stats(self) -> LookupStats | None:
        """What this table's last :meth:`lookup` touched (regions, generations, base keys)."""
        return self._last_lookup

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
    ) -> pa.Table:
        """The ``k`` merged rows nearest to ``query``, with a ``_distance`` column.

        ``filter`` (SQL or pyarrow) prefilters live rows and prunes regions; ``distance``
        is ``"l2"``, ``"cosine"`` or ``"dot"``. See :func:`memwal_query.vector.nearest`.
        """
        result = nearest(
            self._view,
            column,
            query,
            k=k,
            filter=filter,
            nprobes=nprobes,
            refine_factor=refine_factor,
            distance=distance,
            columns=columns,
        )
        self._last_nearest = result.stats
        return result.rows

    @property
    def last_nearest_stats(self) -> NearestStats | None:
        """Sources searched by this table's last :meth:`nearest` and the index coverage."""
        return self._last_nearest

    def search_text(
        self,
        column: str,
        query: str,
        k: int = 10,
        *,
        filter: str | pc.Expression | None = None,
        columns: Sequence[str] | None = None,
        phrase: bool = False,
    ) -> pa.Table:
        """The ``k`` live rows best matching ``query`` (BM25), with ``_score``, best first.

        Scored as one INVERTED index over exactly the live rows would (the base index's
        tokenizer and parameters); ``filter`` prefilters live rows and prunes regions;
        ``phrase`` needs an index with positions. See :func:`memwal_query.fts.search.search_text`.
        """
        return _search_text(self._view, column, query, k=k, filter=filter, columns=columns, phrase=phrase).rows

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
    ) -> pa.Table:
        """Merged KNN and full-text search fused by reciprocal rank (``_relevance_score``).

        Each search returns its ``depth`` best rows; ``relevance = sum of 1 / (rrf_k + rank)``.
        See :func:`memwal_query.hybrid.search_hybrid` for the columns and options.
        """
        return search_hybrid(
            self._view,
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
        )

    # -- indexes ------------------------------------------------------------
    @property
    def index_catchup(self) -> str:
        """When indexed reads use the Indexed Read Plan: ``"auto"``, ``"always"``, ``"never"``.

        ``"auto"``: when the unindexed base rows are many enough (``CATCHUP_MIN_ROWS_PER_SOURCE``
        per catch-up generation, :mod:`memwal_query.planner.catchup`). Setting it changes
        this table and its datasets (a documented convenience); :meth:`with_index_catchup`
        returns a new table instead. SQL returns the same rows either way.
        """
        return self._view.settings.index_catchup

    @index_catchup.setter
    def index_catchup(self, mode: str) -> None:
        self._view.settings.index_catchup = mode

    def with_index_catchup(self, mode: str) -> Table:
        """The same snapshot with its own ``index_catchup`` setting."""
        return Table(self._view.with_index_catchup(mode))

    def uses_catchup(self, plan: CatchupPlan) -> bool:
        """Whether indexed reads of this table serve ``plan``'s rows from its generations."""
        return self._view.uses_catchup(plan)

    def base_indexes(self) -> list[BaseIndex]:
        """The user indexes of the snapshot's base version (read once per snapshot)."""
        return self._view.base_indexes()

    def scalar_indexes(self) -> list[BaseIndex]:
        """The base indexes on one non-vector column (those SQL filters can use)."""
        return self._view.scalar_indexes()

    def catchup_plan(self, index_name: str) -> CatchupPlan:
        """The Indexed Read Plan of a base index (:mod:`memwal_query.planner.catchup`).

        ``usable`` says whether its generations serve the unindexed base fragments,
        ``reason`` why (not). Raises :class:`InvalidArgumentError` for an unknown index.
        """
        return self._view.catchup_plan(index_name)

    # -- pylance interop, lifecycle, explain -------------------------------------
    def pylance_shard_snapshots(self) -> list[ShardSnapshot]:
        """This snapshot as pylance ``ShardSnapshot``s (see :func:`memwal_query.interop.shard_snapshots`)."""
        return shard_snapshots(self._view.snapshot)

    @property
    def change_token(self) -> str:
        """A string naming this snapshot's state, to store and give :meth:`changes` later (:mod:`.change_token`)."""
        return stored_token(self._view.snapshot, self._view.storage)

    def changes(self, since: Table | str) -> pa.Table:
        """The net change per key since an older :class:`Table` or change token (:mod:`memwal_query.changes`)."""
        return changes(self, since)

    def refresh(self) -> Table:
        """A newer snapshot of the same table, reusing what did not change (and the settings)."""
        return Table(refresh_view(self._view))

    def explain(self, predicate: str | None = None) -> str:
        """Sources per region, rows, what was skipped and why (and what ``predicate`` prunes)."""
        return explanation(self, predicate)

    def _repr_html_(self) -> str:
        """Jupyter: sources per region, live rows, freshness."""
        return table_html(self)

    def __reduce__(self) -> NoReturn:
        msg = f"a Table ({self.uri}) cannot be pickled or copied: pass its URI and open_table it in the other process"
        raise MemWalError(msg)

    def __repr__(self) -> str:
        snap = self._view.snapshot
        return f"<memwal Table {self.uri} base v{self.version}, {len(snap.regions)} regions, {snap.consistency}>"


def _search_text(view: TableView, column: str, query: str, **options: Any) -> Any:
    """:func:`memwal_query.fts.search.search_text` (the full-text modules load on first use)."""
    from memwal_query.fts.search import search_text

    return search_text(view, column, query, **options)


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
        version: Base table version to read (default: latest). Only the base is
            read at that version: the levels above it (flushed generations not merged
            by that version, WAL tails) are read as they are now, so every key still
            shows its newest value. It is not a view of the table as of that version:
            MemWAL levels do not record the base version they were written at.
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
        InvalidArgumentError: An invalid ``consistency``, ``version`` or ``on_missing_generation``.

    Example:
        >>> import memwal_query as mq, tempfile
        >>> from memwal_query.demo import write_demo_table
        >>> uri = write_demo_table(tempfile.mkdtemp() + "/t", base_rows=500, update_rows=100, memtable_rows=100, seed=2)
        >>> t = mq.open_table(uri)
        >>> t.primary_key
        ('id',)
    """
    check_missing_generation_policy(on_missing_generation)
    version = check_version(uri, version)
    storage = Storage.open(uri, storage_options)
    try:
        view = open_view(
            storage,
            consistency=consistency,
            live=live,
            cache=SnapshotCache(),
            version=version,
            on_missing_generation=on_missing_generation,
        )
    except TableNotFoundError as err:
        given = os.fspath(uri)
        if given.rstrip("/") == storage.uri.rstrip("/"):
            raise
        raise TableNotFoundError(f"{err} (given as {given!r})") from err
    except RuntimeError as err:  # regions load on threads, which a low `ulimit -v` refuses
        if "can't start new thread" not in str(err):
            raise
        msg = f"cannot open {storage.uri}: the process cannot start another thread ({err}); {_LIMIT}"
        raise MemWalError(msg) from err
    return Table(view)


_LIMIT = "is a memory limit (ulimit -v) set below what thread stacks reserve?"
