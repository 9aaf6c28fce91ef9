"""Spark reads: the merged table as a Spark DataFrame, one region per Spark task.

The snapshot is opened and merged once on the driver; each task receives its part of
the plan (source fragments with their drop lists, through the public fragment API of
:class:`memwal_query.scan.SourceFragment`) and only scans.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.format.lance_open import REFRESH_AND_RETRY
from memwal_query.scan.fragment import SourceFragment
from memwal_query.spark_types import spark_batch, spark_schema
from memwal_query.table import open_table

log = logging.getLogger("memwal_query")

__all__ = ["read_spark", "read_units", "spark_scan"]


def read_units(frags: Sequence[SourceFragment], pruned: set[str]) -> list[list[SourceFragment]]:
    """One unit per region (its generations and MemTable) plus a row-balanced share of the base."""
    regions = sorted({f.region for f in frags if f.region is not None and f.region not in pruned})
    units: list[list[SourceFragment]] = [[f for f in frags if f.region == r] for r in regions]
    units = units or [[]]
    loads = [sum(f.rows_hint() for f in u) for u in units]
    base = [f for f in frags if f.region is None]
    for f in sorted(base, key=lambda f: f.rows_hint(), reverse=True):
        i = loads.index(min(loads))
        units[i].append(f)
        loads[i] += f.rows_hint()
    return [u for u in units if u]


def spark_scan(
    frags: Iterable[SourceFragment], columns: Sequence[str] | None, filt: pc.Expression | None, out_schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """A Spark task's batches of ``frags``. A file a merger removed since the DataFrame was
    planned fails as the scan does, but telling a Spark user, who has no Table to refresh,
    to load the DataFrame again."""
    try:
        for frag in frags:
            for out in frag.scanner(columns=columns, filter=filt).to_batches():
                if out.num_rows:
                    yield spark_batch(out, out_schema)
    except GeneratorExit:  # closed unfinished, maybe at exit when module globals are gone
        raise
    except MemWalError as err:
        text = str(err).replace(REFRESH_AND_RETRY, "load the DataFrame again (spark.read...load()) and retry")
        raise type(err)(text) from err  # every MemWalError takes its message alone


def _read_task(
    columns: Sequence[str] | None, filt: pc.Expression | None, out_schema: pa.Schema
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for blob in b.column("plan").to_pylist():
                yield from spark_scan(pickle.loads(blob), columns, filt, out_schema)

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

    table = open_table(uri, storage_options=storage_options)
    ds = table.dataset()
    final = ds.projected(columns)
    if isinstance(predicate, str):
        columns = None  # the filter runs in Spark and may read any column
    out_schema = spark_schema(ds.projected(columns))  # vectors as Spark arrays
    filt = predicate if isinstance(predicate, pc.Expression) else None
    pruned: set[str] = set()
    if isinstance(predicate, str):
        try:  # pruning reads Spark's SQL as DataFusion's; Spark runs the filter
            pruned = set(table.plan(predicate).pruned_regions)
        except InvalidArgumentError as err:  # Spark's own functions (size(l), double('NaN') ...)
            log.debug("%s: no region pruning for %r: %s", table.uri, predicate, err)
    units = read_units(ds.source_fragments(filter=filt), pruned)
    struct = from_arrow_schema(out_schema)
    if not units:
        return spark.createDataFrame([], struct)
    # Each task gets its own part of the driver's plan: fragments with their drop lists
    # (pickled with their Lance manifests), so no task opens the table or merges.
    plans = [(i, bytearray(pickle.dumps(u, protocol=pickle.HIGHEST_PROTOCOL))) for i, u in enumerate(units)]
    rdd = spark.sparkContext.parallelize(plans, len(plans))
    unit_df = spark.createDataFrame(rdd, "unit int, plan binary")
    result = unit_df.mapInArrow(_read_task(columns, filt, out_schema), struct)
    if isinstance(predicate, str):
        try:
            result = result.filter(predicate).select(*final.names)
        except Exception as err:
            msg = f"cannot apply predicate {predicate!r} to {table.uri}: {err}"
            raise InvalidArgumentError(msg) from err
    return result
