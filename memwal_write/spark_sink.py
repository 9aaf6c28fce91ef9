"""What the ``memwal`` Spark data source writes: upserts and deletes of one Spark job or
micro-batch, applied from the driver with one pylance writer per region.

The rows of every task reach the driver as Arrow IPC (the tasks' commit messages); the
driver dedupes them (newest per key by ``order_by``, as :func:`memwal_write.write`),
splits upserts from deletes (``operation``, or a ``_change`` column as the change feed
gives it) and writes every region through one :class:`~memwal_write.RoutedWriter`: so
no two writers ever claim one region, and a concurrent writer fences this one (an error).

Streaming sinks record each applied micro-batch id in the table directory
(``_memwal_spark/<sink id>/<batch id>.json``, written once), so a restarted query that
replays a batch it had already applied skips it; a batch that failed half-way is
replayed whole (its upserts and deletes are idempotent).

Example:
    >>> SinkOptions.from_options({"path": "/tmp/t", "order_by": "ts"}).order_by
    'ts'
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.format.storage import Storage
from memwal_write.arrow_writer import RoutedWriter
from memwal_write.backoff import backoff
from memwal_write.dedupe import Dedup
from memwal_write.spark_tasks import fenced, fencing_explained

__all__ = ["SinkOptions", "apply_rows", "to_ipc", "from_ipc", "COMMIT_DIR", "committed_batches", "record_batch"]
__all__ += ["batch_record", "check_same_query", "sink_id_for", "FENCED_ATTEMPTS"]

#: Where streaming sinks record the micro-batches they applied (under the table root).
COMMIT_DIR = "_memwal_spark"
_CHANGE = "_change"
_STORAGE_PREFIX = "storage."

log = logging.getLogger("memwal_write")

#: Attempts of :func:`apply_rows` when a concurrent writer fences it (waits 0.25 s, 0.5 s, ... 8 s, randomized).
FENCED_ATTEMPTS = 8
_FIRST_WAIT = 0.25
_MAX_WAIT = 8.0


@dataclass(frozen=True)
class SinkOptions:
    """The data source's write options (picklable)."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)
    order_by: str | None = None
    operation: str = "upsert"  # "upsert" | "delete"
    region_id: str | None = None
    sink_id: str = "default"
    #: The streaming query's ``checkpointLocation`` option (None: not given as an option).
    checkpoint: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkOptions:
        """Parse Spark options (``path``, ``order_by``, ``operation``, ``region_id``,
        ``sink_id``, ``storage.<key>``)."""
        uri = options.get("path")
        if not uri:
            raise InvalidArgumentError("the memwal data source needs a table URI: .save(uri) or .option('path', uri)")
        op = str(options.get("operation", "upsert")).lower()
        if op not in ("upsert", "delete"):
            msg = f"write to {uri}: option operation must be 'upsert' or 'delete', got {op!r}"
            raise InvalidArgumentError(msg)
        return cls(
            uri=str(uri),
            storage_options=storage_options_of(options),
            order_by=options.get("order_by") or None,
            operation=op,
            region_id=options.get("region_id") or None,
            sink_id=str(options.get("sink_id") or _default_sink_id(options)),
            checkpoint=str(options["checkpointLocation"]) if options.get("checkpointLocation") else None,
        )


def _default_sink_id(options: Mapping[str, str]) -> str:
    """A sink's id when none is given: one per checkpoint location (a query and its restarts
    share it; another query, or the same one on a new checkpoint, starts its own record)."""
    where = options.get("checkpointLocation")
    return sink_id_for(str(where)) if where else "default"


def sink_id_for(checkpoint_location: str) -> str:
    """The ``sink_id`` of a streaming sink given none, by its ``checkpointLocation`` option.

    Example:
        >>> sink_id_for("s3://b/ckpt/events")
        'ckpt-79036030cfbbba22'
    """
    return "ckpt-" + hashlib.sha1(checkpoint_location.encode(), usedforsecurity=False).hexdigest()[:16]


def storage_options_of(options: Mapping[str, str]) -> dict[str, str]:
    """The ``storage.<key>`` options as pylance storage options."""
    return {k[len(_STORAGE_PREFIX) :]: str(v) for k, v in options.items() if k.lower().startswith(_STORAGE_PREFIX)}


def to_ipc(batches: Iterable[pa.RecordBatch]) -> bytes | None:
    """Arrow batches as IPC stream bytes (``None`` when there are no rows)."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(blobs: Iterable[bytes | None]) -> pa.Table | None:
    """The rows of IPC stream blobs as one table (``None`` when none)."""
    tables = [pa.ipc.open_stream(b).read_all() for b in blobs if b]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _split(rows: pa.Table, opts: SinkOptions, pk: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    """The newest row per key, as (upserts, deletes)."""
    missing = [k for k in pk if k not in rows.column_names]
    if missing:
        msg = f"write to {opts.uri}: the DataFrame lacks primary key column(s) {missing}"
        raise InvalidArgumentError(msg)
    if opts.order_by is not None and opts.order_by not in rows.column_names:
        msg = f"write to {opts.uri}: order_by column {opts.order_by!r} is not a column of {rows.column_names}"
        raise InvalidArgumentError(msg)
    is_delete = opts.operation == "delete"
    dedup = Dedup(pk, opts.order_by, not is_delete, opts.uri)
    rows = rows.take(dedup.newest_order(rows.select(list(pk)) if is_delete else rows))
    if is_delete:
        return rows.slice(0, 0), rows.select(list(pk))
    if _CHANGE in rows.column_names:
        dels = pc.fill_null(pc.equal(_change_kinds(rows.column(_CHANGE), opts.uri), "delete"), False)
        return rows.filter(pc.invert(dels)), rows.filter(dels).select(list(pk))
    return rows, rows.slice(0, 0).select(list(pk))


def _change_kinds(column: pa.ChunkedArray, uri: str) -> pa.ChunkedArray:
    """A ``_change`` column in lower case; a value other than ``upsert`` / ``delete`` (or NULL:
    an upsert) is refused (``DELETE`` was taken for an upsert of a row of NULLs)."""
    try:
        kinds = pc.utf8_lower(column.cast(pa.string()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise InvalidArgumentError(f"write to {uri}: _change must be 'upsert' or 'delete', not {column.type}") from err
    odd = pc.filter(kinds, pc.invert(pc.is_in(kinds, value_set=pa.array(["upsert", "delete"])))).drop_null()
    if len(odd):
        values = sorted({str(v) for v in column.filter(pc.is_in(kinds, value_set=odd.unique())).to_pylist()})[:5]
        raise InvalidArgumentError(f"write to {uri}: _change must be 'upsert' or 'delete', got {values}")
    return kinds


def apply_rows(rows: pa.Table, opts: SinkOptions, *, fail_after_half: bool = False) -> pa.Table:
    """Upsert / delete ``rows`` in the table from this process; the writer's statistics.

    A writer fenced by a concurrent job writing the same regions (another stream's sink)
    writes every row again, after a random, growing wait: rows are upserted and deleted by
    key, so a second pass leaves what one pass leaves.

    Args:
        rows: The rows of the job (table columns, maybe ``order_by`` and ``_change``).
        opts: The sink's options.
        fail_after_half: Testing hook: write the first half of the upserts, then raise.

    Raises:
        InvalidArgumentError: Missing key columns, an unknown column, ambiguous duplicates.
        MemWalError: A writer was fenced (another writer claimed a region) in every one of
            :data:`FENCED_ATTEMPTS` attempts, or failed.
    """
    for attempt in range(FENCED_ATTEMPTS):
        try:
            return _apply_once(rows, opts, fail_after_half=fail_after_half)
        except MemWalError as err:
            if not fenced(err) or attempt + 1 == FENCED_ATTEMPTS:
                raise
            wait = backoff(attempt, first=_FIRST_WAIT, cap=_MAX_WAIT)
            log.info("write to %s fenced (attempt %d), writing again in %.1f s: %s", opts.uri, attempt + 1, wait, err)
            time.sleep(wait)
    raise AssertionError("unreachable")


def _apply_once(rows: pa.Table, opts: SinkOptions, *, fail_after_half: bool) -> pa.Table:
    w = RoutedWriter.open(opts.uri, storage_options=opts.storage_options, region_id=opts.region_id, max_workers=None)
    schema = w.dataset.schema
    puts, dels = _split(rows, opts, w.primary_key)
    extra = [c for c in puts.column_names if c not in schema.names and c not in (opts.order_by, _CHANGE)]
    if extra and puts.num_rows:
        msg = f"write to {opts.uri}: column(s) {extra} are not in the table schema {schema.names}"
        raise InvalidArgumentError(msg)
    puts = puts.select([c for c in schema.names if c in puts.column_names])
    with fencing_explained(opts.uri), w:
        if fail_after_half:
            w.put(puts.slice(0, puts.num_rows // 2))
            w.close()
            raise RuntimeError(f"injected failure writing {opts.uri} after {puts.num_rows // 2} rows")
        if puts.num_rows:
            w.put(puts)
        if dels.num_rows:
            w.delete(dels)
    return w.stats()


def _batch_rel(sink_id: str, batch_id: int) -> str:
    return f"{COMMIT_DIR}/{sink_id}/{batch_id:020d}.json"


def committed_batches(
    uri: str, sink_id: str = "default", storage_options: Mapping[str, str] | None = None
) -> list[int]:
    """The micro-batch ids a ``writeStream.format("memwal")`` sink has applied to a table.

    Args:
        uri: Table URI.
        sink_id: The sink's ``sink_id`` option; a sink given none has
            :func:`sink_id_for` its ``checkpointLocation`` option (``"default"``: the
            record of sinks that had neither option, which are refused now).
        storage_options: Object store options.

    Returns:
        The batch ids, ascending.

    Example:
        >>> # committed_batches("s3://b/events", "orders-stream")[-1]  # the last applied batch
    """
    storage = Storage.open(uri, storage_options)
    names = [n for n, is_dir in storage.list_dir(f"{COMMIT_DIR}/{sink_id}") if not is_dir and n.endswith(".json")]
    return sorted(int(n.rsplit("/", 1)[-1][: -len(".json")]) for n in names)


def batch_record(storage: Storage, sink_id: str, batch_id: int) -> dict[str, Any] | None:
    """The record of a micro-batch the sink already applied (None: not applied)."""
    raw = storage.read_bytes(_batch_rel(sink_id, batch_id))
    if raw is None:
        return None
    try:
        got = json.loads(raw)
    except ValueError:
        got = None
    return got if isinstance(got, dict) else {}


def record_batch(storage: Storage, opts: SinkOptions, batch_id: int, rows: int) -> None:
    """Record an applied micro-batch (written once; a second record is a no-op)."""
    body = {"batch_id": batch_id, "rows": rows, "committed_at": time.time(), "checkpoint": opts.checkpoint}
    storage.write_bytes_if_absent(_batch_rel(opts.sink_id, batch_id), json.dumps(body).encode())


def check_same_query(record: dict[str, Any], opts: SinkOptions, batch_id: int) -> None:
    """Refuse to skip a batch another query recorded (its checkpoint differs): two queries on
    one ``sink_id``, or a query restarted on a new checkpoint, would skip each other's batches.

    Raises:
        InvalidArgumentError: The record names another checkpoint than this query's.
    """
    theirs = record.get("checkpoint")
    if theirs is None or opts.checkpoint is None or theirs == opts.checkpoint:
        return
    msg = (
        f"write to {opts.uri}: sink {opts.sink_id!r} applied batch {batch_id} for the query checkpointed at "
        f"{theirs!r}, not this one ({opts.checkpoint!r}); its rows would be skipped: give each query its own "
        "sink_id (without one, each checkpoint location has its own)"
    )
    raise InvalidArgumentError(msg)
