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

The pieces: :mod:`memwal_write.spark_routing` (the spec in Spark),
:mod:`memwal_write.dedupe` (newest row per key, Arrow), :mod:`memwal_write.spark_tasks`
and :mod:`memwal_write.spark_driver` (the two write paths). Reads are on the read side:
:func:`memwal_query.spark_read.read_spark` (also ``memwal_write.read_spark``).

Example:
    >>> from memwal_write.spark import bucket_partition_seeds
    >>> len(bucket_partition_seeds(8))
    8
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.format.nested import map_column_leaves
from memwal_write.arrow_writer import RoutedWriter
from memwal_write.spark_driver import write_on_driver
from memwal_write.spark_routing import PKEY, SEED0_LITERAL, bucket_column, bucket_partition_seeds, spark_routing
from memwal_write.spark_tasks import WRITE_STATS_SCHEMA, WriteJob, task_fn

__all__ = [
    "write",
    "delete",
    "to_datafusion",
    "bucket_column",
    "bucket_partition_seeds",
    "WRITE_STATS_SCHEMA",
    "SEED0_LITERAL",
]

log = logging.getLogger("memwal_write")

#: ``via="auto"`` collects to the driver only up to this Spark size estimate (the
#: optimizer's ``sizeInBytes``; file scans report their compressed size, so the rows
#: may be a few times more).
AUTO_DRIVER_MAX_BYTES = 256 << 20


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


def _in_session_zone(table: pa.Table, df: Any) -> pa.Table:
    """``toArrow``'s timestamps (UTC) in the session time zone, as Spark's tasks hand them over:
    written into a column without a time zone, a TIMESTAMP keeps its session-local time."""
    tz = str(df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC")

    def other_zone(t: pa.DataType, _: pa.DataType) -> bool:
        return bool(pa.types.is_timestamp(t) and t.tz and t.tz != tz)

    def in_zone(values: pa.Array, _: pa.DataType) -> pa.Array:
        return values.cast(pa.timestamp(values.type.unit, tz)) if other_zone(values.type, _) else values

    for i, f in enumerate(table.schema):
        before = table.column(i)
        col = map_column_leaves(before, f.type, other_zone, in_zone)  # in structs and lists too
        if col is not before:
            table = table.set_column(i, f.with_type(col.type), col)
    return table


def _collect(df: Any, uri: str, mode: str, *, auto: bool) -> pa.Table | None:
    """The rows on the driver (``toArrow``); ``None`` when ``auto`` and they are too
    large for ``spark.driver.maxResultSize`` (nothing is written before this)."""
    try:
        return _in_session_zone(df.toArrow(), df)
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


def _columns(df: Any, probe: RoutedWriter, mode: str, order_by: str | None) -> tuple[Any, tuple[str, ...]]:
    """The DataFrame (keys only for deletes) and the table columns it writes; refuses bad columns."""
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
    return df, columns


def _run_tasks(prepared: Any, job: WriteJob, probe: RoutedWriter, out_schema: Any) -> pa.Table:
    """Run the write tasks; their statistics. Task errors come back as ours."""
    spark = prepared.sparkSession
    mode = job.mode
    # Larger Arrow batches into the write tasks (the put size): fewer JVM -> Python round
    # trips, measured ~20% faster at 2M rows. Set for this job only, then restored.
    conf_key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(conf_key, None)
    try:
        if int(before or 10_000) < probe.max_rows_per_put:
            spark.conf.set(conf_key, str(probe.max_rows_per_put))
        return prepared.mapInArrow(task_fn(job), out_schema).toArrow()
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
    pk = probe.primary_key
    df, columns = _columns(df, probe, mode, order_by)
    out_schema = from_arrow_schema(WRITE_STATS_SCHEMA)
    auto = via == "auto"
    if auto:
        via = _auto_via(df, num_partitions=num_partitions, fail_after_puts=fail_after_puts)
    table = _collect(df, probe.uri, mode, auto=auto) if via == "driver" else None
    if table is not None:
        stats = write_on_driver(
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
    routed, routing = spark_routing(df, spec, probe.field_names, probe.dataset.schema, num_partitions)
    sort = [PKEY, *pk, *([order_by] if order_by and mode == "put" else [])]
    # the partition key only places rows; the tasks do not need it (one column less to ship)
    prepared = routed.repartition(routing.num_partitions, PKEY).sortWithinPartitions(*sort).drop(PKEY)
    job = WriteJob(
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
    stats = _run_tasks(prepared, job, probe, out_schema)
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
