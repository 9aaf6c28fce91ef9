"""Routed writes of Arrow data through pylance's own MemWAL writer.

:class:`RoutedWriter` evaluates the table's region spec on every batch (the same
code the reader prunes with), opens one pylance region writer per spec value,
names regions deterministically (:mod:`memwal_write.routing`) and seeds each new
region's first manifest with its spec values, so tables written this way are
always prunable. :func:`write_arrow` is the one-call form.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa
from lance.mem_wal import ShardWriter

from memwal_proto import mem_wal_pb2
from memwal_query.conform import conform
from memwal_query.errors import InvalidArgumentError, MemWalError, is_panic
from memwal_query.format.decode import (
    RegionSpec,
    bitrev64_name,
)
from memwal_query.format.lance_open import lance_message, open_lance
from memwal_query.format.memwal_index import read_memwal_index
from memwal_query.format.storage import Storage
from memwal_query.regionspec.spec import evaluate_spec, lance_field_ids, region_runs
from memwal_query.snapshot.model import primary_key_of
from memwal_write.routing import check_open, check_spec_on_key, field_entries, region_id_for

__all__ = ["RoutedWriter", "RegionWriteStats", "REGION_STATS_SCHEMA", "write_arrow", "conform"]

log = logging.getLogger("memwal_write")

DEFAULT_MAX_ROWS = 100_000

REGION_STATS_SCHEMA = pa.schema(
    [
        ("region_id", pa.string()),
        ("spec_values", pa.string()),
        ("rows_put", pa.int64()),
        ("rows_deleted", pa.int64()),
        ("puts", pa.int64()),
        ("created", pa.bool_()),
    ]
)


@dataclass
class RegionWriteStats:
    """What one region received."""

    region_id: str
    spec_values: tuple[Any, ...]
    rows_put: int = 0
    rows_deleted: int = 0
    puts: int = 0
    created: bool = False


def _to_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    pd = sys.modules.get("pandas")  # a DataFrame exists only if pandas was imported
    if pd is not None and isinstance(data, pd.DataFrame):
        # before the Arrow stream protocol, which pandas 2.3 has: it would add the index
        # (``__index_level_0__`` of a filtered frame) as a column
        return pa.Table.from_pandas(data, preserve_index=False)
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    msg = (
        f"cannot write {type(data).__name__}: pass a pyarrow Table, RecordBatch, RecordBatchReader or pandas DataFrame"
    )
    raise InvalidArgumentError(msg)


def _aligned(table: pa.Table) -> pa.Table:
    """``table`` with decimal columns copied where their values are not 16-byte aligned (Arrow
    IPC streams, e.g. Spark's, may leave them 8-byte aligned): pylance panics on those."""
    for i, f in enumerate(table.schema):
        if not pa.types.is_decimal(f.type):
            continue
        col = table.column(i)
        if any(c.buffers()[1] is not None and c.buffers()[1].address % 16 for c in col.chunks):
            copies = [c.take(pa.array(range(len(c)), pa.int64())) for c in col.chunks]
            table = table.set_column(i, f, pa.chunked_array(copies, f.type))
    return table


def _delete_keys(w: RoutedWriter, keys: Any) -> pa.Table:
    """``keys`` (rows to delete) as the table's key columns, or the error saying why not."""
    return conform(_to_table(keys), w.dataset.schema, what=f"delete from {w.uri}", keys=w.primary_key)


def _region_created(
    storage: Storage, spec: RegionSpec | None, region_id: str, key: tuple[Any, ...], types: list[Any]
) -> RegionWriteStats:
    """A region's first manifest written (with its spec values) unless it has one already."""
    assert spec is not None
    created = False
    rel = f"_mem_wal/{region_id}/manifest"
    if not storage.exists(f"{rel}/version_hint.json") and not storage.exists(f"{rel}/{bitrev64_name(1)}.binpb"):
        m = mem_wal_pb2.ShardManifest(version=1, writer_epoch=0, current_generation=1, shard_spec_id=spec.spec_id)
        m.shard_id.uuid = uuid.UUID(region_id).bytes
        for fid, raw in field_entries(spec, key, types):
            m.shard_field_values.add(field_id=fid, value=raw)
        created = storage.write_bytes_if_absent(f"{rel}/{bitrev64_name(1)}.binpb", m.SerializeToString())
        if created:
            storage.write_bytes_if_absent(f"{rel}/version_hint.json", json.dumps({"version": 1}).encode())
    return RegionWriteStats(region_id, tuple(key), created=created)


@dataclass
class RoutedWriter:
    """Writes Arrow data into a MemWAL table, one pylance region writer per spec value.

    Use as a context manager; :meth:`close` closes every region writer (flushing
    their MemTables as generations). Threads may share one: a region gets one pylance
    writer, and its writes go in one at a time (whole ``put`` / ``delete`` parts, in the
    order the threads reach it); :meth:`close` after every thread's last write.

    Example:
        >>> # with RoutedWriter.open("data/events") as w:
        >>> #     w.put(table); w.delete(pa.table({"id": [1, 2]}))
        >>> # w.stats() -> per-region rows
    """

    uri: str
    dataset: lance.LanceDataset
    storage: Storage
    spec: RegionSpec | None
    primary_key: tuple[str, ...]
    max_rows_per_put: int
    writer_options: Mapping[str, Any]
    region_id: str | None = None
    #: Regions written (and closed) at the same time by one put / close; 1 = one by one.
    max_workers: int = 1
    _writers: dict[str, ShardWriter] = field(default_factory=dict)
    _stats: dict[str, RegionWriteStats] = field(default_factory=dict)
    _field_names: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the dicts above
    _region_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _closed: bool = False

    @classmethod
    def open(
        cls,
        uri: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        region_id: str | None = None,
        max_rows_per_put: int | None = None,
        max_workers: int | None = 1,
        **writer_options: Any,
    ) -> RoutedWriter:
        """Open a table for routed writes.

        Args:
            uri: Table URI.
            storage_options: Object store options, as pylance takes them.
            region_id: Write every row to this region: tables without a region spec, or
                unsharded ones (refused where the spec reads columns: queries pruning
                regions would miss rows written elsewhere than their spec value's region).
            max_rows_per_put: Rows per ``put`` (default: the writers' ``max_memtable_rows``).
            max_workers: Regions one ``put`` / ``close`` writes at the same time (threads;
                ``None``: the number of CPUs, at least 8: a durable ``put`` waits for its
                WAL flush, so more regions in flight than cores keep the cores busy).
                Rows of one region are always put in order by one thread.
            **writer_options: Passed to ``LanceDataset.mem_wal_writer`` (``durable_write``,
                ``max_memtable_rows`` ...).
        """
        storage = Storage.open(uri, storage_options)
        ds = open_lance(storage, str(uri), " for writing")
        index = read_memwal_index(storage, ds.version)
        pk = primary_key_of(ds.schema)
        spec = max(index.specs, key=lambda s: s.spec_id) if index.specs else None
        check_open(storage.uri, spec, region_id, writer_options, max_rows_per_put)
        if spec is not None and region_id is None:
            check_spec_on_key(spec, lance_field_ids(ds), pk, storage.uri)
        limit = int(
            writer_options.get("max_memtable_rows")
            or index.writer_config_defaults.get("max_memtable_rows", 0)
            or DEFAULT_MAX_ROWS
        )
        rows = min(limit, max_rows_per_put) if max_rows_per_put else limit
        if max_workers is not None and max_workers < 1:
            msg = f"max_workers must be >= 1 or None, got {max_workers}"
            raise InvalidArgumentError(msg)
        workers = max_workers if max_workers is not None else max(8, os.cpu_count() or 1)
        w = cls(storage.uri, ds, storage, spec, pk, rows, dict(writer_options), region_id, workers)
        w._field_names = lance_field_ids(ds)
        return w

    @property
    def field_names(self) -> dict[int, str]:
        """Lance field id -> column name of the table (what region specs refer to)."""
        return self._field_names

    # -- routing ---------------------------------------------------------------
    def region_values(self, table: pa.Table) -> pa.Table | None:
        """The region spec's values for every row (``None``: every row goes to one region)."""
        if self.region_id is not None or self.spec is None:
            return None
        return evaluate_spec(self.spec, table, self._field_names)

    def _route(
        self, table: pa.Table, values: pa.Table | None = None, rows: pa.Array | None = None
    ) -> list[tuple[str, Callable[[], pa.Table]]]:
        """Each region's rows, in their original order, as a function that makes them.

        The functions run in the regions' writer threads (:meth:`_each_region`), so the
        copy of each region's rows is made in parallel. ``values``: :meth:`region_values`
        when the caller has them; rows already in region order are sliced, not copied.
        ``rows``: write only these rows of ``table``, in this order (``values`` are then
        those of ``table.take(rows)``).
        """
        one_region = self.region_id is not None or self.spec is None
        if rows is not None and (one_region or values is None):
            table, rows = table.take(rows), None
        if one_region:
            return [(str(self.region_id), lambda: table)]
        assert self.spec is not None
        if values is None:
            values = evaluate_spec(self.spec, table, self._field_names)
        types = [values.schema.field(i).type for i in range(values.num_columns)]
        order, runs = region_runs(values)
        if rows is not None:
            order = rows if order is None else rows.take(order)
        if order is not None:
            # one buffer per column: a take from many chunks (toArrow gives one per
            # Arrow batch) costs several times a take from one
            table = table.combine_chunks()
        spans: dict[str, list[tuple[int, int]]] = {}
        for key, start, stop in runs:
            rid = region_id_for(self.spec, key, types)
            self._ensure_region(rid, key, types)
            # one region in several runs (values equal only as a region, e.g. NaN): in order
            spans.setdefault(rid, []).append((start, stop))

        def rows_of(region_spans: list[tuple[int, int]]) -> pa.Table:
            pieces = [
                table.slice(a, b - a) if order is None else table.take(order.slice(a, b - a)) for a, b in region_spans
            ]
            return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)

        return [(rid, functools.partial(rows_of, ss)) for rid, ss in spans.items()]

    def _ensure_region(self, region_id: str, key: tuple[Any, ...], types: list[Any]) -> None:
        with self._lock:
            if region_id not in self._stats:
                self._stats[region_id] = _region_created(self.storage, self.spec, region_id, key, types)

    def _writer(self, region_id: str) -> ShardWriter:
        with self._lock:  # two writers of one region would fence each other
            if self._closed:  # a new writer would never be closed, nor its rows flushed
                raise InvalidArgumentError(f"this RoutedWriter of {self.uri} is closed: open another to write")
            w = self._writers.get(region_id)
            return w if w is not None else self._new_writer(region_id)

    def _new_writer(self, region_id: str) -> ShardWriter:
        try:
            w = self.dataset.mem_wal_writer(region_id, **self.writer_options)
        except TypeError as err:  # an option mem_wal_writer does not take
            msg = f"bad writer option(s) {sorted(self.writer_options)} for {self.uri}: {err}"
            raise InvalidArgumentError(msg) from err
        except (OSError, ValueError, RuntimeError) as err:
            msg = f"cannot open a writer for region {region_id} of {self.uri}: {lance_message(err)}"
            raise MemWalError(msg) from err
        self._writers[region_id] = w
        self._stats.setdefault(region_id, RegionWriteStats(region_id, ()))
        self._region_locks[region_id] = threading.Lock()
        return w

    # -- writes ----------------------------------------------------------------
    def _each_region(
        self, parts: list[tuple[str, Callable[[], pa.Table]]], fn: Callable[[str, pa.Table], None]
    ) -> None:
        """``fn(region, rows)`` for every part, regions in parallel (writers opened first, here)."""
        for rid, _ in parts:
            self._writer(rid)
        if self.max_workers <= 1 or len(parts) <= 1:
            for rid, make in parts:
                fn(rid, make())
            return
        with ThreadPoolExecutor(min(self.max_workers, len(parts))) as pool:
            for f in [pool.submit(lambda r, m: fn(r, m()), rid, make) for rid, make in parts]:
                f.result()

    def _parts(
        self, table: pa.Table, values: pa.Table | None, rows: pa.Array | None
    ) -> list[tuple[str, Callable[[], pa.Table]]]:
        n = table.num_rows if rows is None else len(rows)
        if values is not None and values.num_rows != n:
            msg = f"region values have {values.num_rows} rows for {n} rows to write to {self.uri}"
            raise InvalidArgumentError(msg)
        return self._route(table, values, rows)

    def put(self, data: Any, *, _region_values: pa.Table | None = None, _rows: pa.Array | None = None) -> None:
        """Upsert rows (later rows of the same key win).

        Args:
            data: The rows (Arrow table / batch / reader, pandas).
            _region_values: Internal (the Spark driver path): :meth:`region_values` of
                the rows written, already computed; rows sorted by them are routed without
                a copy. Not checked again: wrong values would split keys across regions.
            _rows: Internal (the Spark driver path): write only these rows of ``data``,
                in this order (its deduplicated rows, sorted by region value).
        """
        table = _aligned(conform(_to_table(data), self.dataset.schema, what=f"put into {self.uri}"))
        self._each_region(self._parts(table, _region_values, _rows), functools.partial(self._write_region, "put"))

    def delete(self, keys: Any, *, _region_values: pa.Table | None = None, _rows: pa.Array | None = None) -> None:
        """Delete rows by primary key (only the key columns are read).

        Args:
            keys: The primary key columns of the rows to delete.
            _region_values: Internal, as for :meth:`put`.
            _rows: Internal, as for :meth:`put`.
        """
        table = _delete_keys(self, keys)
        full = pa.table(
            {
                f.name: table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
                for f in self.dataset.schema
            }
        )
        self._each_region(self._parts(full, _region_values, _rows), functools.partial(self._write_region, "delete"))

    def _write_region(self, op: str, rid: str, part: pa.Table) -> None:
        """``op`` ("put" / "delete") one region's rows, ``max_rows_per_put`` at a time."""
        w = self._writer(rid)  # closed meanwhile: the error saying so
        with self._lock:
            st, lock = self._stats[rid], self._region_locks[rid]
        with lock:  # one region's writes in order, one thread at a time
            self._put_parts(op, rid, w, st, part)

    def _put_parts(self, op: str, rid: str, w: ShardWriter, st: RegionWriteStats, part: pa.Table) -> None:
        for off in range(0, part.num_rows, self.max_rows_per_put):
            chunk = part.slice(off, self.max_rows_per_put)
            try:
                if op == "put":
                    w.put(chunk)
                else:
                    w.delete(chunk.select(list(self.primary_key)))
            except BaseException as err:  # a Rust panic in pylance is a BaseException
                if not isinstance(err, (OSError, RuntimeError)) and not is_panic(err):
                    raise
                what = f"put of {chunk.num_rows} rows into" if op == "put" else f"delete of {chunk.num_rows} keys in"
                msg = f"{what} region {rid} of {self.uri} failed: {lance_message(err)}"
                raise MemWalError(msg) from err
            if op == "put":
                st.rows_put += chunk.num_rows
                st.puts += 1
            else:
                st.rows_deleted += chunk.num_rows

    def stats(self) -> pa.Table:
        """Per-region write statistics."""
        rows = [
            {
                "region_id": s.region_id,
                "spec_values": json.dumps(
                    [v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for v in s.spec_values]
                ),
                "rows_put": s.rows_put,
                "rows_deleted": s.rows_deleted,
                "puts": s.puts,
                "created": s.created,
            }
            for s in self._stats.values()
        ]
        schema = REGION_STATS_SCHEMA
        return pa.Table.from_pylist(rows, schema=schema)

    def close(self) -> None:
        """Close every region writer (each flushes its MemTable as a generation)."""
        errors: dict[str, list[str]] = {}  # message -> regions (a fenced writer fails alike everywhere)
        with self._lock:
            self._closed = True
            writers = list(self._writers.items())
            self._writers.clear()

        def close_one(item: tuple[str, ShardWriter]) -> None:
            try:
                item[1].close()
            except (OSError, RuntimeError) as err:
                errors.setdefault(lance_message(err).replace(item[0], "<region>"), []).append(item[0])

        if self.max_workers <= 1 or len(writers) <= 1:
            for item in writers:
                close_one(item)
        else:
            with ThreadPoolExecutor(min(self.max_workers, len(writers))) as pool:
                list(pool.map(close_one, writers))
        if errors:
            parts = [f"region{'s' if len(r) > 1 else ''} {', '.join(sorted(r))}: {m}" for m, r in errors.items()]
            msg = f"closing writers of {self.uri} failed: " + "; ".join(sorted(parts))
            raise MemWalError(msg)

    def __enter__(self) -> RoutedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_arrow(
    uri: str,
    data: Any = None,
    *,
    deletes: Any = None,
    storage_options: Mapping[str, str] | None = None,
    region_id: str | None = None,
    max_rows_per_put: int | None = None,
    max_workers: int | None = None,
    **writer_options: Any,
) -> pa.Table:
    """Route Arrow rows (puts, then deletes) to their regions and write them with pylance.

    Args:
        uri: Table URI (a Lance table with ``initialize_mem_wal`` done).
        data: Rows to upsert: pyarrow Table / RecordBatch / RecordBatchReader / pandas.
        deletes: Keys to delete (the primary key columns).
        storage_options: Object store options.
        region_id: Target region for tables without a region spec (or unsharded ones).
        max_rows_per_put: Rows per ``put`` call.
        max_workers: Regions written at the same time (default: CPUs, at least 8).
        **writer_options: Passed to ``LanceDataset.mem_wal_writer``.

    Returns:
        Per-region statistics (``region_id``, ``spec_values``, ``rows_put``, ...).

    Example:
        >>> import lance, tempfile, pyarrow as pa, memwal_query as mq
        >>> pk = {"lance-schema:unenforced-primary-key": "true"}
        >>> schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=pk), pa.field("v", pa.string())])
        >>> uri = tempfile.mkdtemp() + "/t"
        >>> lance.write_dataset(pa.table({"id": [1], "v": ["a"]}, schema=schema), uri).initialize_mem_wal(
        ...     bucket_column="id", num_buckets=4)
        >>> stats = write_arrow(uri, pa.table({"id": [1, 2, 3], "v": ["b", "c", "d"]}), deletes=pa.table({"id": [2]}))
        >>> sum(stats.column("rows_put").to_pylist()), sorted(mq.open_table(uri).to_arrow().column("v").to_pylist())
        (3, ['b', 'd'])
    """
    with RoutedWriter.open(
        uri,
        storage_options=storage_options,
        region_id=region_id,
        max_rows_per_put=max_rows_per_put,
        max_workers=max_workers,
        **writer_options,
    ) as w:
        keys = None if deletes is None else _delete_keys(w, deletes)  # checked before any row is put
        if data is not None:
            w.put(data)
        if keys is not None:
            w.delete(keys)
        return w.stats()
