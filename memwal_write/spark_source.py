"""The ``memwal`` Spark data source (PySpark's Python Data Source API, Spark >= 4).

:func:`register_data_source` registers it; then

* ``spark.read.format("memwal").load(uri)``: the merged table, one region per Spark
  partition (its generations and MemTable plus a row-balanced share of the base, planned
  once on the driver as :func:`memwal_query.spark_read.read_spark` does). Arrow batches.
  With ``.option("pushFilters", "true")``, simple filters Spark pushes (``=``, ``<``,
  ``<=``, ``>``, ``>=``, ``IN``, ``IS [NOT] NULL``, ``NOT`` of those, on int / float /
  string / bool values) prune regions and run as Lance filters in every fragment scan;
  the others stay in Spark. Off by default: Spark 4.3 keeps the read planned for one
  query of a DataFrame and reuses it for the next query of that DataFrame that pushes no
  filter (``df.where("id = 5").count()`` then ``df.count()`` counted 1 row), so a pushing
  read must be loaded afresh for every query.
* ``df.write.format("memwal").mode("append").save(uri)``: upserts (or, with
  ``.option("operation", "delete")``, deletes) with :func:`memwal_write.write`'s rules
  (:mod:`memwal_write.spark_sink`).
* ``writeStream`` / ``readStream``: :mod:`memwal_write.spark_stream`.

Options: ``consistency`` (``strong`` / ``eventual``, reads), ``pushFilters`` (reads), ``storage.<key>`` (object
store options), ``order_by``, ``operation``, ``region_id``, ``sink_id`` (writes),
``readChangeFeed`` / ``startingToken`` (stream reads).

Example:
    >>> # memwal_write.register_data_source(spark)
    >>> # spark.read.format("memwal").option("consistency", "eventual").load(uri).where("id < 10")
"""

from __future__ import annotations

import pickle
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from memwal_query.changes import change_schema
from memwal_query.errors import InvalidArgumentError, SchemaChangedError
from memwal_query.spark_read import read_units, spark_scan
from memwal_query.spark_types import spark_schema
from memwal_query.table import Table, open_table
from memwal_write.spark_drift import drift
from memwal_write.spark_sink import SinkOptions, apply_rows, from_ipc, storage_options_of, to_ipc
from memwal_write.spark_stream import MemwalStreamReader, MemwalStreamWriter, StagedRows

__all__ = ["MemwalDataSource", "register_data_source", "filter_expression"]

_OPS = {EqualTo: "eq", GreaterThan: "gt", GreaterThanOrEqual: "ge", LessThan: "lt", LessThanOrEqual: "le"}
_PLAIN = (int, float, str, bool)


def open_from_options(options: Any) -> Table:
    """Open the table an option map names (``path``, ``consistency``, ``storage.*``)."""
    uri = options.get("path")
    if not uri:
        raise InvalidArgumentError("the memwal data source needs a table URI: .load(uri) or .option('path', uri)")
    consistency = str(options.get("consistency", "strong")).lower()
    if consistency not in ("strong", "eventual"):
        msg = f"read of {uri}: option consistency must be 'strong' or 'eventual', got {consistency!r}"
        raise InvalidArgumentError(msg)
    return open_table(str(uri), storage_options=storage_options_of(options), consistency=consistency)  # type: ignore[arg-type]


def filter_expression(f: Filter, columns: Sequence[str], floats: Collection[str] = ()) -> pc.Expression | None:
    """A Spark filter as an exact Arrow expression, or ``None`` when it cannot be pushed.

    A comparison with a float column (``floats``) is not pushed: Spark takes every NaN for the
    same value, above every number, where memwal (DataFusion, Lance) puts a NaN with its sign
    bit set (what ``0/0`` gives) below every number (``f > 5`` left it out when pushed).

    Example:
        >>> str(filter_expression(EqualTo(("id",), 3), ["id"]))
        '(id == 3)'
        >>> filter_expression(EqualTo(("f",), 3.0), ["f"], floats=["f"]) is None
        True
    """
    if isinstance(f, Not):
        inner = filter_expression(f.child, columns, floats)
        return None if inner is None else ~inner
    attr: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    if len(attr) != 1 or attr[0] not in columns:
        return None
    col = pc.field(attr[0])
    if isinstance(f, IsNull):
        return col.is_null()
    if isinstance(f, IsNotNull):
        return col.is_valid()
    if attr[0] in floats:
        return None
    if isinstance(f, In):
        values = list(f.value)
        if not values or not all(isinstance(v, _PLAIN) for v in values):
            return None
        # one is_in, not a chain of ORs: Lance serialises the filter for every fragment scan,
        # and a left-deep chain of 20 equalities took 5 s and 200 MB (4x per value); memwal
        # answers is_in as SQL's IN (a NULL value: NULL, also under NOT)
        return col.isin(values)
    op = _OPS.get(type(f))
    value = getattr(f, "value", None)
    if op is None or not isinstance(value, _PLAIN):
        return None
    return {"eq": col == value, "gt": col > value, "ge": col >= value, "lt": col < value, "le": col <= value}[op]


def _all_of(exprs: Sequence[pc.Expression]) -> pc.Expression:
    """The conjunction of ``exprs`` as a balanced tree (Lance serialises a deep chain in time
    that grows 4x per level)."""
    if len(exprs) == 1:
        return exprs[0]
    half = len(exprs) // 2
    return _all_of(exprs[:half]) & _all_of(exprs[half:])


class MemwalReader(DataSourceReader):
    """Batch reads: one partition per region (see the module docs)."""

    def __init__(self, options: Any, schema: StructType, planned: StructType | None = None) -> None:
        self.options = options  # Spark's CaseInsensitiveDict (dict() would lowercase the keys)
        self.planned = planned  # the table's columns when the read was planned (None: a user's schema)
        self.columns = [f.name for f in schema.fields]
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")  # what Spark takes back (as its own reader)
        self.pushed: list[pc.Expression] = []
        self.floats = frozenset(f.name for f in self.arrow_schema if pa.types.is_floating(f.type))

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark's name
        if str(self.options.get("pushFilters", "false")).lower() != "true":
            yield from filters  # Spark filters (see the module docs: why pushing is opt-in)
            return
        for f in filters:
            expr = filter_expression(f, self.columns, self.floats)
            if expr is None:
                yield f
            else:
                self.pushed.append(expr)

    def _filter(self) -> pc.Expression | None:
        return _all_of(self.pushed) if self.pushed else None

    def partitions(self) -> Sequence[InputPartition]:
        table = open_from_options(self.options)
        changed = None if self.planned is None else drift(self.planned, table.dataset().schema, whole=False)
        if changed is not None:  # a cast by name would read the renamed or retyped columns as NULL
            msg = (
                f"read of {table.uri}: the table's columns changed since the DataFrame was loaded ({changed}); "
                "load it again "
                "(spark.read.format('memwal').load(...)) to read the table's columns as they are now"
            )
            raise SchemaChangedError(msg)
        units = read_units(table.dataset().source_fragments(filter=self._filter()), set())
        return [InputPartition(pickle.dumps(u, protocol=pickle.HIGHEST_PROTOCOL)) for u in units] or [
            InputPartition(pickle.dumps([]))
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from spark_scan(pickle.loads(partition.value), self.columns, self._filter(), self.arrow_schema)


class MemwalWriter(DataSourceArrowWriter):
    """Batch writes: tasks hand their rows to the driver, which writes every region once."""

    def __init__(self, options: Any) -> None:
        self.opts = SinkOptions.from_options(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return StagedRows(to_ipc(iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = from_ipc(m.rows for m in messages if isinstance(m, StagedRows))
        if rows is not None:
            apply_rows(rows, self.opts)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing was written before :meth:`commit`: nothing to undo."""


class MemwalDataSource(DataSource):
    """The ``memwal`` format (see the module docs)."""

    @classmethod
    def name(cls) -> str:
        return "memwal"

    #: The schema :meth:`schema` gave (Spark pickles the source after asking it): the table's
    #: columns when the read was planned, checked again when it runs. None with a schema the
    #: user gave (``.schema(...)``): those columns are cast to the user's types, unchecked.
    planned: StructType | None = None

    def schema(self) -> StructType:
        table = open_from_options(self.options)
        arrow = table.dataset().schema
        if str(self.options.get("readChangeFeed", "false")).lower() == "true":
            arrow = change_schema(arrow, table.primary_key)
        self.planned = from_arrow_schema(spark_schema(arrow))
        return self.planned

    def reader(self, schema: StructType) -> DataSourceReader:
        if "_change" in schema.fieldNames():
            msg = "readChangeFeed is for readStream.format('memwal'); a batch read has no _change column"
            raise InvalidArgumentError(msg)
        return MemwalReader(self.options, schema, self.planned)

    def writer(self, schema: StructType, overwrite: bool) -> MemwalWriter:
        if overwrite:
            where = self.options.get("path")
            msg = f"write to {where}: memwal supports mode('append') (upserts and deletes), not overwrite"
            raise InvalidArgumentError(msg)
        return MemwalWriter(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> MemwalStreamWriter:  # noqa: N802 - Spark's name
        return MemwalStreamWriter(self.options)

    def streamReader(self, schema: StructType) -> MemwalStreamReader:  # noqa: N802 - Spark's name
        if "_change" not in schema.fieldNames():
            msg = "readStream.format('memwal') reads the change feed: add .option('readChangeFeed', 'true')"
            raise InvalidArgumentError(msg)
        return MemwalStreamReader(self.options, schema, self.planned)


def register_data_source(spark: Any) -> None:
    """Register the ``memwal`` format with a Spark session (Spark >= 4).

    Also turns on ``spark.sql.python.filterPushdown.enabled`` (off by default in Spark
    4), without which Spark refuses a Python reader that takes pushed filters.

    Args:
        spark: A ``pyspark.sql.SparkSession``.

    Example:
        >>> # register_data_source(spark); spark.read.format("memwal").load("s3://b/events").count()
    """
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(MemwalDataSource)
