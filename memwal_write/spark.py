"""Spark integration: routed writes, region-parallel merged reads, Spark -> DataFusion.

Writes (:func:`write`, :func:`delete`) go through pylance's own MemWAL writer:

1. The table's region spec is evaluated *in Spark* (``bucket`` via Spark's
   ``hash``, which is Murmur3 over Lance's byte encoding; seeding it with a
   literal whose seed-42 hash is 0 gives Lance's seed-0 hash), and rows are
   repartitioned so that every task holds whole regions (for a bucket spec with
   as many partitions as buckets, exactly one bucket per task).
2. Each task sorts its rows by key, drops duplicate keys (newest by ``order_by``,
   or fails on ambiguous duplicates), combines small Arrow batches, and writes
   them with :class:`memwal_write.RoutedWriter` (one pylance writer per region;
   routing, region ids and region-manifest seeding are the shared code). Each
   task checks that Spark's bucket equals the shared spec evaluation.

A retried task attempt opens new pylance writers, which bumps the writer epoch of
its regions: the failed attempt is fenced and its WAL is replayed by the new
writer before the new attempt re-writes the same (deduplicated) rows, so no row is
lost and no older value wins. Speculative execution is refused (two live attempts
would fence each other).

The driver path (``via="driver"``, and ``via="auto"`` on a local master for rows
the optimizer estimates small) collects the rows with ``toArrow`` instead, applies
the same dedupe rules in Arrow and writes every region from the driver (regions in
parallel threads, one pylance writer each): no shuffle, no Python workers.

Example:
    >>> import pyarrow as pa
    >>> from memwal_write.spark import bucket_partition_seeds
    >>> len(bucket_partition_seeds(8))
    8
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.conform import conform
from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.format.decode import RegionSpec
from memwal_query.regionspec.murmur3 import hash_int32_words
from memwal_query.regionspec.spec import equal_next, evaluate_spec, region_groups
from memwal_write.arrow_writer import REGION_STATS_SCHEMA, RoutedWriter
from memwal_write.routing import region_id_for

__all__ = [
    "write",
    "delete",
    "read_spark",
    "to_datafusion",
    "bucket_column",
    "bucket_partition_seeds",
    "WRITE_STATS_SCHEMA",
    "SEED0_LITERAL",
]

log = logging.getLogger("memwal_write")

#: An int32 whose Spark ``hash`` (Murmur3, seed 42) is 0: ``hash(lit(SEED0_LITERAL), c)`` is
#: the seed-0 Murmur3 hash of ``c`` that Lance's ``bucket`` transform uses.
SEED0_LITERAL = -1693959553
SPARK_HASH_SEED = 42

PKEY = "__memwal_pkey"
#: ``via="auto"`` collects to the driver only up to this Spark size estimate (the
#: optimizer's ``sizeInBytes``; file scans report their compressed size, so the rows
#: may be a few times more).
AUTO_DRIVER_MAX_BYTES = 256 << 20
BUCKET = "__memwal_bucket"
REGION = "__memwal_region"

WRITE_STATS_SCHEMA = pa.schema(
    [
        *REGION_STATS_SCHEMA,
        ("duplicates_dropped", pa.int64()),
        ("task_partition", pa.int32()),
        ("task_attempt", pa.int32()),
    ]
)


# -- routing in Spark -----------------------------------------------------------------------
def _hashable(col: Any, spark_type: Any, target: pa.DataType) -> Any:
    """``col`` as the Spark value whose ``hash`` equals Lance's bucket hash input, or None."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if pa.types.is_int8(target) or pa.types.is_int16(target) or pa.types.is_int32(target):
        return col.cast("int")
    if pa.types.is_int64(target):
        return col.cast("long")
    if pa.types.is_float32(target):
        return col.cast("float")
    if pa.types.is_float64(target):
        return col.cast("double")
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return col.cast("string")
    if pa.types.is_boolean(target):
        return col.cast("boolean")
    if pa.types.is_date32(target):
        return col.cast("date")
    if pa.types.is_timestamp(target) and isinstance(spark_type, (T.TimestampType, T.TimestampNTZType)):
        if target.unit == "us":
            return col  # Spark hashes a timestamp as its int64 microseconds
        if target.unit == "ms" and isinstance(spark_type, T.TimestampType):
            return F.unix_millis(col)
    return None


def bucket_column(col: Any, num_buckets: int) -> Any:
    """Lance's ``bucket`` transform as a Spark column expression.

    ``(murmur3_seed0(value) & 0x7fffffff) % num_buckets``; NULL -> 0. ``col`` must already
    have the Spark type that matches the Lance column (see :func:`write`).

    Args:
        col: A ``pyspark.sql.Column``.
        num_buckets: Number of buckets.

    Returns:
        An int column with the bucket of each row.

    Example:
        >>> # df.select(bucket_column(F.col("id"), 8))
    """
    from pyspark.sql import functions as F

    h = F.hash(F.lit(SEED0_LITERAL).cast("int"), col)
    return F.when(col.isNull(), F.lit(0)).otherwise((h.bitwiseAND(F.lit(0x7FFFFFFF))) % F.lit(num_buckets))


def bucket_partition_seeds(num_partitions: int) -> list[int]:
    """For each partition k, an int32 that Spark's hash partitioner sends to partition k.

    Spark's ``repartition(n, c)`` puts a row in ``pmod(murmur3_42(c), n)``; repartitioning
    by ``seeds[bucket % n]`` therefore gives every bucket its own task when ``n`` equals
    the number of buckets (plain hash partitioning of 8 values into 8 tasks leaves some
    tasks empty and others with two regions).

    Example:
        >>> seeds = bucket_partition_seeds(4)
        >>> h = hash_int32_words(np.array(seeds, dtype=np.uint32), seed=SPARK_HASH_SEED).astype(np.int64)
        >>> [int(x) for x in np.mod(h, 4)]
        [0, 1, 2, 3]
    """
    found: dict[int, int] = {}
    start = 0
    while len(found) < num_partitions:
        cand = np.arange(start, start + 4096, dtype=np.int64)
        h = hash_int32_words(cand.astype(np.uint32), seed=SPARK_HASH_SEED).astype(np.int64)
        for v, p in zip(cand.tolist(), np.mod(h, num_partitions).tolist(), strict=True):
            found.setdefault(int(p), int(v))
        start += 4096
    return [found[k] for k in range(num_partitions)]


@dataclass(frozen=True)
class _Routing:
    """How the write job partitions rows (all picklable)."""

    num_partitions: int
    native: bool
    bucket_checked: bool


def _spark_routing(
    df: Any, spec: RegionSpec | None, field_names: Mapping[int, str], schema: pa.Schema, num_partitions: int | None
) -> tuple[Any, _Routing]:
    """Add the partition key column (and the bucket column, when native) to ``df``."""
    from pyspark.sql import functions as F

    spark_types = {f.name: f.dataType for f in df.schema.fields}
    if spec is None:
        return df.withColumn(PKEY, F.lit(0)), _Routing(1, True, False)
    cols: list[Any] = []
    single_bucket: int | None = None
    for f in spec.fields:
        if f.transform == "unsharded":
            cols.append(F.lit(0))
            single_bucket = 1 if len(spec.fields) == 1 else None
            continue
        if f.transform not in ("bucket", "identity") or not f.source_ids:
            cols = []
            break
        name = field_names.get(int(f.source_ids[0]))
        if name is None or name not in spark_types:
            cols = []
            break
        value = _hashable(F.col(name), spark_types[name], schema.field(name).type)
        if value is None:
            cols = []
            break
        if f.transform == "bucket":
            n = int(f.parameters.get("num_buckets", "0"))
            cols.append(bucket_column(value, n))
            if len(spec.fields) == 1:
                single_bucket = n
        else:
            cols.append(value)
    if cols and len(cols) == len(spec.fields):
        if single_bucket is not None:
            parts = num_partitions or single_bucket
            seeds = F.array(*[F.lit(s) for s in bucket_partition_seeds(parts)])
            out = df.withColumn(BUCKET, cols[0]).withColumn(PKEY, F.element_at(seeds, (F.col(BUCKET) % parts) + 1))
            return out, _Routing(parts, True, spec.fields[0].transform == "bucket")
        key = cols[0] if len(cols) == 1 else F.struct(*cols)
        parts = num_partitions or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
        return df.withColumn(PKEY, key), _Routing(parts, True, False)
    # fallback: evaluate the spec with the shared Arrow code in a Python pass
    parts = num_partitions or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
    out_schema = df.schema.add(PKEY, "string", nullable=False)

    def add_region(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            values = evaluate_spec(spec, b, field_names)
            types = [values.schema.field(i).type for i in range(values.num_columns)]
            ids = np.empty(b.num_rows, dtype=object)
            for k, rows in region_groups(values).items():
                ids[rows.to_numpy()] = region_id_for(spec, k, types)
            yield b.append_column(PKEY, pa.array(ids.tolist(), pa.string()))

    return df.mapInArrow(add_region, out_schema), _Routing(parts, False, False)


# -- in-task dedup ----------------------------------------------------------------------------
@dataclass
class _Dedup:
    """Keeps the newest row of each key from key-sorted batches (streaming)."""

    key: tuple[str, ...]
    order_by: str | None
    strict: bool
    uri: str
    dropped: int = 0
    _pending: list[pa.Table] = field(default_factory=list)

    def push(self, table: pa.Table) -> pa.Table | None:
        """Add rows; return the rows whose key is complete (all but the last key run)."""
        t = pa.concat_tables([*self._pending, table]) if self._pending else table
        self._pending = []
        if t.num_rows == 0:
            return None
        same = self._same_key(t)
        boundaries = np.flatnonzero(~same)
        start = int(boundaries[-1]) + 1 if boundaries.size else 0
        self._pending = [t.slice(start)]
        return self._resolve(t.slice(0, start), same[: max(start - 1, 0)]) if start else None

    def finish(self) -> pa.Table | None:
        """The rows still held back."""
        if not self._pending:
            return None
        t = pa.concat_tables(self._pending)
        self._pending = []
        return self._resolve(t, self._same_key(t)) if t.num_rows else None

    def _same_key(self, t: pa.Table) -> np.ndarray:
        same = np.ones(max(t.num_rows - 1, 0), dtype=bool)
        for k in self.key:
            same &= equal_next(t.column(k))
        return same

    def _duplicates(
        self, t: pa.Table, same: np.ndarray, order_col: str | None, rows: Callable[[np.ndarray], pa.Table]
    ) -> np.ndarray:
        """Positions of key-sorted ``t`` superseded by the next row (the newest row of a
        key is the last); ambiguous duplicates are refused. ``rows(positions)``: the whole
        rows there (tied duplicates must be equal)."""
        dup = np.flatnonzero(same)
        if self.strict and dup.size:
            ties = dup
            if order_col is not None:
                ties = dup[equal_next(t.column(order_col))[dup]]
            if ties.size:
                for a, b in zip(rows(ties).to_pylist(), rows(ties + 1).to_pylist(), strict=True):
                    if a != b:
                        key = {k: a[k] for k in self.key}
                        why = f"with the same {self.order_by!r} value" if self.order_by else "and no order_by= column"
                        msg = (
                            f"write to {self.uri}: key {key} appears more than once with different values {why}; "
                            "deduplicate the input or pass order_by= (the newest row per key wins)"
                        )
                        raise InvalidArgumentError(msg)
        self.dropped += int(dup.size)
        return dup

    def _resolve(self, t: pa.Table, same: np.ndarray) -> pa.Table:
        if not same.any():
            return t
        dup = self._duplicates(t, same, self.order_by, lambda pos: t.take(pa.array(pos)))
        keep = np.ones(t.num_rows, dtype=bool)
        keep[dup] = False
        return t.filter(pa.array(keep))

    def newest_order(self, table: pa.Table) -> pa.Array:
        """Row indices of ``table`` in key order, the newest row of each key only.

        The whole-table form of :meth:`push` / :meth:`finish` (same rules): only the key
        and ``order_by`` columns are sorted and compared; the rows are not copied.
        """
        keys = [(k, "ascending") for k in self.key]
        small = table.select(list(self.key))
        order_col = None
        if self.order_by is not None:
            # NULL order_by values sort first (the oldest), as Spark's ascending sort puts them
            order_col = "__order"
            small = small.append_column("__valid", pc.is_valid(table.column(self.order_by)))
            small = small.append_column(order_col, table.column(self.order_by))
            keys += [("__valid", "ascending"), (order_col, "ascending")]
        order = _numeric_key_order(small) if order_col is None else None
        if order is None:
            order = pc.sort_indices(small, sort_keys=keys)
        if table.num_rows < 2:
            return order
        ordered = small.take(order)
        same = self._same_key(ordered)
        if not same.any():
            return order
        dup = self._duplicates(ordered, same, order_col, lambda pos: table.take(order.take(pa.array(pos))))
        keep = np.ones(table.num_rows, dtype=bool)
        keep[dup] = False
        return order.filter(pa.array(keep))


def _numeric_key_order(keys: pa.Table) -> pa.Array | None:
    """Row order sorting one numeric key column without NULLs (numpy's ``argsort``:
    2-15x faster than Arrow's ``sort_indices`` on 2M int64 keys); ``None`` for other keys.

    The sort need not be stable: rows with equal keys are either equal (any one may
    stay) or refused as ambiguous, whatever their order.
    """
    if keys.num_columns != 1:
        return None
    col = keys.column(0)
    t = col.type
    if col.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)):
        return None
    if pa.types.is_float16(t) or pa.types.is_interval(t):
        return None
    values = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pa.array(np.argsort(values.to_numpy(zero_copy_only=False)), pa.int64())


# -- the write task ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _WriteJob:
    """Everything a write task needs (picklable)."""

    uri: str
    mode: str  # "put" | "delete"
    columns: tuple[str, ...]
    key: tuple[str, ...]
    order_by: str | None
    storage_options: Mapping[str, str] | None
    region_id: str | None
    max_rows_per_put: int | None
    writer_options: Mapping[str, Any]
    check_bucket: bool
    fail_after_puts: int | None = None


@contextmanager
def _fencing_explained(uri: str) -> Iterator[None]:
    """Re-raise a writer's "fenced" error with what it means for a write job."""
    try:
        yield
    except MemWalError as err:
        if "fenced" not in str(err).lower():
            raise
        msg = (
            f"a region writer of {uri} was fenced: another writer claimed the region (a concurrent write job, "
            "or a task attempt still running). Rows this attempt wrote are in the WAL and are replayed by the "
            f"newer writer; run one write job per table at a time. Cause: {err}"
        )
        raise MemWalError(msg) from err


def _with_task_columns(stats: pa.Table, dropped: int, partition: int, attempt: int) -> pa.Table:
    """Per-region writer statistics as :data:`WRITE_STATS_SCHEMA` (duplicates on the first row)."""
    n = stats.num_rows
    stats = stats.append_column("duplicates_dropped", pa.array([dropped if i == 0 else 0 for i in range(n)]))
    stats = stats.append_column("task_partition", pa.array([partition] * n, pa.int32()))
    stats = stats.append_column("task_attempt", pa.array([attempt] * n, pa.int32()))
    return stats.cast(WRITE_STATS_SCHEMA)


def _check_routing(writer: RoutedWriter, batch: pa.Table) -> None:
    if writer.spec is None or BUCKET not in batch.column_names:
        return
    values = evaluate_spec(writer.spec, batch, writer._field_names).column(0)
    spark_b = batch.column(BUCKET).cast(pa.int32())
    bad = pc.invert(pc.fill_null(pc.equal(values, spark_b), False))
    if pc.any(bad).as_py():
        i = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
        row = {k: batch.column(k)[i].as_py() for k in writer.primary_key}
        msg = (
            f"routing mismatch writing {writer.uri}: Spark put key {row} in bucket {spark_b[i].as_py()} but the "
            f"region spec gives {values[i].as_py()}; the column type is not routed exactly by Spark (please report)"
        )
        raise MemWalError(msg)


def _write_partition(
    job: _WriteJob, batches: Iterable[pa.RecordBatch], partition: int, attempt: int
) -> Iterator[pa.RecordBatch]:
    """Write one task's rows (sorted by partition key, key, order_by); yield its stats."""
    writer: RoutedWriter | None = None
    dedup = _Dedup(job.key, job.order_by, job.mode == "put", job.uri)
    buffer: list[pa.Table] = []
    buffered = 0
    puts = 0

    def flush() -> None:
        nonlocal buffered, puts
        if not buffered or writer is None:
            return
        data = pa.concat_tables(buffer).select(list(job.columns))
        buffer.clear()
        buffered = 0
        with _fencing_explained(job.uri):
            if job.mode == "put":
                writer.put(data)
            else:
                writer.delete(data)
        puts += 1
        if job.fail_after_puts is not None and attempt == 0 and puts >= job.fail_after_puts:
            msg = f"injected failure of task {partition} attempt {attempt} after {puts} put(s)"
            raise RuntimeError(msg)

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                writer = RoutedWriter.open(
                    job.uri,
                    storage_options=job.storage_options,
                    region_id=job.region_id,
                    max_rows_per_put=job.max_rows_per_put,
                    **job.writer_options,
                )
            table = pa.Table.from_batches([batch])
            if job.check_bucket:
                _check_routing(writer, table)
            done = dedup.push(table)
            if done is not None and done.num_rows:
                buffer.append(done)
                buffered += done.num_rows
                if buffered >= writer.max_rows_per_put:
                    flush()
        rest = dedup.finish()
        if rest is not None and rest.num_rows:
            buffer.append(rest)
            buffered += rest.num_rows
        flush()
        if writer is None:
            return
        with _fencing_explained(job.uri):
            writer.close()
        stats = writer.stats()
    except BaseException:
        if writer is not None:
            try:
                writer.close()
            except MemWalError:
                pass
        raise
    yield from _with_task_columns(stats, dedup.dropped, partition, attempt).to_batches()


def _task_fn(job: _WriteJob) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        yield from _write_partition(job, batches, partition, attempt)

    return run


def _check_speculation(spark: Any, allow: bool) -> None:
    spec = str(spark.sparkContext.getConf().get("spark.speculation", "false")).strip().lower()
    if spec == "true":
        if not allow:
            msg = (
                "spark.speculation is on: two live attempts of one write task would claim the same regions and "
                "fence each other; turn speculation off for MemWAL writes (or pass allow_speculation=True)"
            )
            raise InvalidArgumentError(msg)
        log.warning("spark.speculation is on: speculative write attempts will fence each other and be retried")


def _collect(df: Any, uri: str, mode: str, *, auto: bool) -> pa.Table | None:
    """The rows on the driver (``toArrow``); ``None`` when ``auto`` and they are too
    large for ``spark.driver.maxResultSize`` (nothing is written before this)."""
    try:
        return df.toArrow()
    except Exception as err:  # Py4J: e.g. spark.driver.maxResultSize exceeded
        lines = [ln.strip(" :") for ln in str(err).splitlines() if ln.strip(" :")]
        # Py4J's first line only names the Java call; the cause is further down
        text = next((ln for ln in lines if "maxResultSize" in ln), lines[0] if lines else repr(err))
        if auto and "maxResultSize" in str(err):
            log.info("%s into %s: rows too large to collect (%s); writing from Spark tasks", mode, uri, text)
            return None
        msg = f"Spark {mode} into {uri} (via='driver') could not collect the rows: {text}; use via='tasks'"
        raise MemWalError(msg) from err


def _auto_via(df: Any, *, num_partitions: int | None, fail_after_puts: int | None) -> str:
    """``"driver"`` when Spark runs on this machine (a ``local`` master) and the
    optimizer estimates the rows at most :data:`AUTO_DRIVER_MAX_BYTES`, else ``"tasks"``
    (also when write tasks were asked for: ``num_partitions`` or the failure hook).

    On one machine the write tasks buy no parallelism the driver's region threads do
    not have, and pay a shuffle (measured in ``benchmarks/bench_spark.py``).
    """
    if num_partitions is not None or fail_after_puts is not None:
        return "tasks"
    try:
        master = str(df.sparkSession.sparkContext.master)
        size = int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
    except Exception:  # Spark Connect (no JVM handle), or no estimate
        return "tasks"
    return "driver" if master.startswith("local") and size <= AUTO_DRIVER_MAX_BYTES else "tasks"


def _write_on_driver(
    table: pa.Table,
    probe: RoutedWriter,
    *,
    mode: str,
    columns: tuple[str, ...],
    order_by: str | None,
    storage_options: Mapping[str, str] | None,
) -> pa.Table:
    """``via="driver"``: dedupe the collected rows in Arrow, write every region from
    this process (regions in parallel threads, one pylance writer each)."""
    w = RoutedWriter.open(
        probe.uri,
        storage_options=storage_options,
        region_id=probe.region_id,
        max_rows_per_put=probe.max_rows_per_put,
        max_workers=None,
        **probe.writer_options,
    )
    pk = probe.primary_key
    # Sort and dedupe the keys only (numpy / Arrow sorts release the GIL) while the
    # region values of all rows are computed in a second thread; the writer then orders
    # the surviving rows by region (a stable sort of small values) and copies each
    # region's rows once, in its own thread.
    dedup = _Dedup(pk, order_by, mode == "put", probe.uri)
    typed_keys = conform(table.select(list(pk)), probe.dataset.schema, what=f"{mode} on {probe.uri}", keys=pk)
    with ThreadPoolExecutor(1) as pool:
        values_future = pool.submit(w.region_values, typed_keys)
        newest = dedup.newest_order(table)
        values = values_future.result()
    routed = None if values is None else values.take(newest)
    rows = table.select(list(columns))
    with _fencing_explained(probe.uri), w:
        if mode == "put":
            w.put(rows, _region_values=routed, _rows=newest)
        else:
            w.delete(rows, _region_values=routed, _rows=newest)
    return _with_task_columns(w.stats(), dedup.dropped, 0, 0)


def _run_write(
    df: Any,
    uri: str,
    *,
    mode: str,
    order_by: str | None,
    storage_options: Mapping[str, str] | None,
    region_id: str | None,
    num_partitions: int | None,
    max_rows_per_put: int | None,
    allow_speculation: bool,
    fail_after_puts: int | None,
    writer_options: Mapping[str, Any],
    via: str = "auto",
) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    if via not in ("auto", "tasks", "driver"):
        msg = f"via must be 'auto', 'tasks' or 'driver', got {via!r}"
        raise InvalidArgumentError(msg)
    spark = df.sparkSession
    probe = RoutedWriter.open(
        uri, storage_options=storage_options, region_id=region_id, max_rows_per_put=max_rows_per_put, **writer_options
    )
    schema = probe.dataset.schema
    pk = probe.primary_key
    names = list(df.columns)
    if order_by is not None and order_by not in names:
        msg = f"write to {probe.uri}: order_by column {order_by!r} is not a column of the DataFrame {names}"
        raise InvalidArgumentError(msg)
    missing = [k for k in pk if k not in names]
    if missing:
        msg = f"{mode} on {probe.uri}: the DataFrame lacks primary key column(s) {missing}"
        raise InvalidArgumentError(msg)
    if mode == "put":
        extra = [c for c in names if c not in schema.names and c != order_by]
        if extra:
            msg = f"write to {probe.uri}: column(s) {extra} are not in the table schema {schema.names}"
            raise InvalidArgumentError(msg)
        columns = tuple(c for c in schema.names if c in names)
    else:
        columns = pk
        df = df.select(*pk)
    out_schema = from_arrow_schema(WRITE_STATS_SCHEMA)
    auto = via == "auto"
    if auto:
        via = _auto_via(df, num_partitions=num_partitions, fail_after_puts=fail_after_puts)
    table = _collect(df, probe.uri, mode, auto=auto) if via == "driver" else None
    if table is not None:
        stats = _write_on_driver(
            table,
            probe,
            mode=mode,
            columns=columns,
            order_by=order_by if mode == "put" else None,
            storage_options=storage_options,
        )
        return spark.createDataFrame(stats, out_schema)
    _check_speculation(spark, allow_speculation)
    spec = None if region_id is not None else probe.spec
    routed, routing = _spark_routing(df, spec, probe._field_names, schema, num_partitions)
    sort = [PKEY, *pk, *([order_by] if order_by and mode == "put" else [])]
    # the partition key only places rows; the tasks do not need it (one column less to ship)
    prepared = routed.repartition(routing.num_partitions, PKEY).sortWithinPartitions(*sort).drop(PKEY)
    job = _WriteJob(
        uri=probe.uri,
        mode=mode,
        columns=columns,
        key=pk,
        order_by=order_by if mode == "put" else None,
        storage_options=storage_options,
        region_id=region_id,
        max_rows_per_put=max_rows_per_put,
        writer_options=dict(writer_options),
        check_bucket=routing.bucket_checked,
        fail_after_puts=fail_after_puts,
    )
    # Larger Arrow batches into the write tasks (the put size): fewer JVM -> Python round
    # trips, measured ~20% faster at 2M rows. Set for this job only, then restored.
    conf_key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(conf_key, None)
    try:
        if int(before or 10_000) < probe.max_rows_per_put:
            spark.conf.set(conf_key, str(probe.max_rows_per_put))
        stats = prepared.mapInArrow(_task_fn(job), out_schema).toArrow()
    except Exception as err:  # Py4J / PythonException: surface the task's own message
        text = str(err)
        for marker in ("InvalidArgumentError: ", "MemWalError: "):
            if marker in text:
                detail = text.split(marker, 1)[1].splitlines()[0]
                cls = InvalidArgumentError if marker.startswith("Invalid") else MemWalError
                raise cls(f"Spark {mode} into {probe.uri} failed: {detail}") from err
        raise MemWalError(f"Spark {mode} into {probe.uri} failed: {text.splitlines()[0] if text else err}") from err
    finally:
        if before is None:
            spark.conf.unset(conf_key)
        else:
            spark.conf.set(conf_key, before)
    return spark.createDataFrame(stats.cast(WRITE_STATS_SCHEMA), out_schema)


def write(
    df: Any,
    uri: str,
    *,
    order_by: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    region_id: str | None = None,
    num_partitions: int | None = None,
    max_rows_per_put: int | None = None,
    allow_speculation: bool = False,
    via: str = "auto",
    _fail_first_attempt_after_puts: int | None = None,
    **writer_options: Any,
) -> Any:
    """Upsert a Spark DataFrame into a MemWAL table through pylance's writer.

    Rows are routed by the table's region spec (a key always lands in the same
    region), each Spark task holds whole regions and writes them with one pylance
    writer per region. Runs eagerly (one Spark job).

    ``via="driver"`` instead collects the rows to the driver (``toArrow``; bounded by
    driver memory and ``spark.driver.maxResultSize``), dedupes them in Arrow and writes
    every region from the driver process, regions in parallel: no shuffle and no
    Python worker round trip, the faster choice on one machine (``local[*]``) for data
    that fits in the driver; the same rows land in the same regions either way.
    ``via="auto"`` (the default) takes the driver path when Spark runs locally and the
    optimizer's size estimate of ``df`` is at most :data:`AUTO_DRIVER_MAX_BYTES` (rows
    that then exceed ``spark.driver.maxResultSize`` are written by tasks instead),
    and the task path otherwise (a cluster, no estimate, or ``num_partitions`` given).

    Args:
        df: A ``pyspark.sql.DataFrame`` with the table's columns (missing nullable
            columns are written as NULL; types are cast to the table schema).
        uri: Table URI, reachable from every executor.
        order_by: Column that orders versions of one key (the largest wins); may be a
            column outside the table schema (it is not written). Without it, a key
            appearing twice with different values is an error.
        storage_options: Object store options, as pylance takes them.
        region_id: Write every row to this region (tables without a region spec).
        num_partitions: Write tasks (default: the number of buckets for a bucket spec,
            else ``spark.sql.shuffle.partitions``).
        max_rows_per_put: Rows per pylance ``put`` (default: the writer's memtable row limit).
        allow_speculation: Only warn (instead of failing) when ``spark.speculation`` is on.
        via: ``"auto"`` (default, see above), ``"tasks"`` (Spark tasks write, scales
            with the cluster) or ``"driver"`` (collect, then write from the driver).
        _fail_first_attempt_after_puts: Testing hook: the first attempt of every task
            raises after this many puts.
        **writer_options: Passed to ``LanceDataset.mem_wal_writer``.

    Returns:
        A Spark DataFrame of per-region statistics (:data:`WRITE_STATS_SCHEMA`), from the
        successful attempt of each task.

    Raises:
        InvalidArgumentError: Unknown columns, a missing key column, ambiguous duplicate
            keys, data that does not fit the schema, speculation on.
        MemWalError: A writer was fenced by a concurrent writer, or a write failed.

    Example:
        >>> # stats = memwal_write.write(spark.createDataFrame(rows), "s3://b/events", order_by="ts")
        >>> # stats.groupBy().sum("rows_put").show()
    """
    return _run_write(
        df,
        uri,
        mode="put",
        order_by=order_by,
        storage_options=storage_options,
        region_id=region_id,
        num_partitions=num_partitions,
        max_rows_per_put=max_rows_per_put,
        allow_speculation=allow_speculation,
        fail_after_puts=_fail_first_attempt_after_puts,
        writer_options=writer_options,
        via=via,
    )


def delete(
    df: Any,
    uri: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    region_id: str | None = None,
    num_partitions: int | None = None,
    max_rows_per_put: int | None = None,
    allow_speculation: bool = False,
    via: str = "auto",
    **writer_options: Any,
) -> Any:
    """Delete the keys of a Spark DataFrame (its primary key columns) from a MemWAL table.

    Same routing, retry and fencing behaviour as :func:`write`; duplicate keys are
    dropped, other columns ignored.

    Args:
        df: A ``pyspark.sql.DataFrame`` holding the primary key column(s).
        uri: Table URI.
        storage_options: Object store options.
        region_id: Target region for tables without a region spec.
        num_partitions: Write tasks.
        max_rows_per_put: Keys per pylance ``delete`` call.
        allow_speculation: Only warn when ``spark.speculation`` is on.
        via: ``"auto"``, ``"tasks"`` or ``"driver"``, as for :func:`write`.
        **writer_options: Passed to ``LanceDataset.mem_wal_writer``.

    Returns:
        Per-region statistics as a Spark DataFrame (``rows_deleted``).

    Example:
        >>> # memwal_write.delete(spark.createDataFrame([(1,), (2,)], "id long"), uri)
    """
    return _run_write(
        df,
        uri,
        mode="delete",
        order_by=None,
        storage_options=storage_options,
        region_id=region_id,
        num_partitions=num_partitions,
        max_rows_per_put=max_rows_per_put,
        allow_speculation=allow_speculation,
        fail_after_puts=None,
        writer_options=writer_options,
        via=via,
    )


# -- Spark -> DataFusion ------------------------------------------------------------------------
def to_datafusion(df: Any, ctx: Any, name: str) -> None:
    """Register a Spark DataFrame's rows as table ``name`` in a DataFusion session.

    Uses ``DataFrame.toArrow()`` (Spark >= 4; ``_collect_as_arrow`` before), so the rows
    arrive as Arrow batches without pandas; they are then joined with merged MemWAL
    tables in SQL.

    Args:
        df: A ``pyspark.sql.DataFrame``.
        ctx: A ``datafusion.SessionContext``.
        name: Table name to use in SQL (replaces a table of that name).

    Raises:
        InvalidArgumentError: ``name`` is empty.

    Example:
        >>> # to_datafusion(spark.range(3).toDF("id"), ctx, "ids")
        >>> # ctx.sql("SELECT * FROM ids JOIN events USING (id)")
    """
    if not isinstance(name, str) or not name:
        msg = f"table name must be a non-empty string, got {name!r}"
        raise InvalidArgumentError(msg)
    if hasattr(df, "toArrow"):
        table = df.toArrow()
    else:  # Spark 3.5
        table = pa.Table.from_batches(df._collect_as_arrow(), schema=None)
    try:
        ctx.deregister_table(name)
    except Exception:  # noqa: BLE001 - not registered
        pass
    batches = table.to_batches()
    if not batches:
        batches = [pa.RecordBatch.from_pylist([], schema=table.schema)]
    ctx.register_record_batches(name, [batches])


# -- region-parallel reads ---------------------------------------------------------------------------
def _fragment_rows(frag: object) -> int:
    rows_hint = getattr(frag, "rows_hint", None)
    return int(rows_hint()) if rows_hint is not None else 0


def _read_units(frags: Sequence[object], pruned: set[str]) -> list[list[object]]:
    """One unit per region (its generations and MemTable) plus a row-balanced share of the base."""
    regions = sorted({r for f in frags if (r := getattr(f, "region", None)) is not None and r not in pruned})
    units: list[list[object]] = [[f for f in frags if getattr(f, "region", None) == r] for r in regions]
    units = units or [[]]
    loads = [sum(_fragment_rows(f) for f in u) for u in units]
    base = [f for f in frags if getattr(f, "region", None) is None]
    for f in sorted(base, key=_fragment_rows, reverse=True):
        i = loads.index(min(loads))
        units[i].append(f)
        loads[i] += _fragment_rows(f)
    return [u for u in units if u]


def _read_task(
    columns: Sequence[str] | None, filt: pc.Expression | None, out_schema: pa.Schema
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for blob in b.column("plan").to_pylist():
                for frag in pickle.loads(blob):
                    for out in frag.scanner(columns=columns, filter=filt).to_batches():
                        if out.num_rows:
                            yield pa.RecordBatch.from_arrays(
                                [c.cast(t.type) for c, t in zip(out.columns, out_schema, strict=True)],
                                schema=out_schema,
                            )

    return run


def read_spark(
    spark: Any,
    uri: str,
    columns: Sequence[str] | None = None,
    predicate: str | pc.Expression | None = None,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> Any:
    """The merged table as a Spark DataFrame, read one region per Spark task.

    Task *i* reads region *i*'s merged rows (unmerged generations and MemTable, minus
    superseded rows) plus its share of the masked base fragments (balanced by row
    count), so the union equals ``memwal_query.open_table(uri).to_arrow()``.

    The snapshot is opened and merged once, here on the driver; each task receives its
    fragments with their drop lists and only scans. The DataFrame therefore always reads
    this snapshot, however late or often it is evaluated (writes made after this call are
    not visible; open a new one to see them). If a generation of the snapshot is merged
    and garbage-collected before the DataFrame runs, the scan fails with a clear error
    instead of returning wrong rows.

    Args:
        spark: A ``pyspark.sql.SparkSession``.
        uri: Table URI.
        columns: Columns to read (default: all).
        predicate: A SQL boolean expression (regions it cannot match are pruned, the
            filter runs in Spark) or a ``pyarrow.compute.Expression`` (pushed into every
            fragment scan, also prunes regions).
        storage_options: Object store options.

    Returns:
        A lazy ``pyspark.sql.DataFrame``.

    Raises:
        InvalidArgumentError: Unknown columns or an invalid predicate.

    Example:
        >>> # read_spark(spark, "s3://b/events", columns=["id", "amount"], predicate="amount > 10").count()
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    import memwal_query as mq

    table = mq.open_table(uri, storage_options=storage_options)
    ds = table.dataset()
    final = ds.projected(columns)
    if isinstance(predicate, str):
        columns = None  # the filter runs in Spark and may read any column
    out_schema = ds.projected(columns)
    filt = predicate if isinstance(predicate, pc.Expression) else None
    pruned: set[str] = set()
    if isinstance(predicate, str):
        pruned = set(table.plan(predicate).pruned_regions)
    units = _read_units(ds.source_fragments(filter=filt), pruned)
    spark_schema = from_arrow_schema(out_schema)
    if not units:
        return spark.createDataFrame([], spark_schema)
    # Each task gets its own part of the driver's plan: fragments with their drop lists
    # (pickled with their Lance manifests), so no task opens the table or merges.
    plans = [(i, bytearray(pickle.dumps(u, protocol=pickle.HIGHEST_PROTOCOL))) for i, u in enumerate(units)]
    rdd = spark.sparkContext.parallelize(plans, len(plans))
    unit_df = spark.createDataFrame(rdd, "unit int, plan binary")
    result = unit_df.mapInArrow(_read_task(columns, filt, out_schema), spark_schema)
    if isinstance(predicate, str):
        try:
            result = result.filter(predicate).select(*final.names)
        except Exception as err:
            msg = f"cannot apply predicate {predicate!r} to {table.uri}: {err}"
            raise InvalidArgumentError(msg) from err
    return result
