"""Arrow data as Spark's Arrow exchange takes it.

Spark has no fixed-size lists (a vector column is an ``ArrayType``: Arrow ``list`` with an
``element`` child), no unsigned integers and, unless told otherwise, exchanges strings and
binaries with 32-bit offsets. Batches handed to Spark (``read_spark`` tasks, the ``memwal``
data source) are cast to :func:`spark_schema` of the table's schema; the values are the
same. Unsigned integers widen as Spark reads Parquet's: uint8 -> short, uint16 -> int,
uint32 -> long, uint64 -> decimal(20, 0); float16 -> float, date64 -> date. Spark holds
timestamps and durations in microseconds (nanoseconds are dropped, towards the past: a
nanosecond before 1970 is the microsecond before it) and times in nanoseconds; a time out of
Spark's range is refused, naming the column.

Example:
    >>> import pyarrow as pa
    >>> spark_schema(pa.schema([("vec", pa.list_(pa.float32(), 4)), ("t", pa.large_string()), ("u", pa.uint64())]))
    vec: list<element: float>
      child 0, element: float
    t: string
    u: decimal128(20, 0)
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.nested import map_leaves

__all__ = ["spark_schema", "spark_batch"]


def _spark_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        item = t.value_field
        return pa.list_(pa.field("element", _spark_type(item.type), item.nullable))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_spark_type(f.type)) for f in t])
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", t.tz)  # Spark holds microseconds
    if pa.types.is_duration(t):
        return pa.duration("us")
    if pa.types.is_time(t):
        return pa.time64("ns")  # Spark's TimeType in Arrow
    return _WIDER.get(t, t)


_WIDER = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
    pa.float16(): pa.float32(),
    pa.date64(): pa.date32(),
}


def spark_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types Spark exchanges (fixed-size lists as lists, unsigned integers
    widened, 32-bit offsets)."""
    return pa.schema([f.with_type(_spark_type(f.type)) for f in schema], metadata=schema.metadata)


def spark_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast to ``schema`` (a :func:`spark_schema`), column by column, at any depth:
    nanoseconds dropped (towards the past: -1 ns is -1 µs, as for every earlier instant),
    a time out of Spark's range refused.

    Raises:
        InvalidArgumentError: A value Spark cannot hold (names the column).
    """
    if batch.schema.equals(schema):
        return batch
    columns = []
    for c, f in zip(batch.columns, schema, strict=True):
        if c.type != f.type:
            try:
                c = map_leaves(c, f.type, _spark_leaf).cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                msg = f"column {f.name!r} ({c.type}) cannot be handed to Spark as {f.type}: {err}"
                raise InvalidArgumentError(msg) from err
        columns.append(c)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


_PER_DAY_MS = 86_400_000


def _spark_leaf(values: pa.Array, target: pa.DataType) -> pa.Array:
    """One value array as Spark's type ``target`` (see :func:`spark_batch`)."""
    t = values.type
    if t == target:
        return values
    temporal = (pa.types.is_timestamp(t) and pa.types.is_timestamp(target)) or (
        pa.types.is_duration(t) and pa.types.is_duration(target)
    )
    if temporal and t.unit == "ns" and target.unit == "us":
        return _floor_divided(values.cast(pa.int64()), 1000).cast(target)
    if pa.types.is_date64(t) and pa.types.is_date32(target):
        return _floor_divided(values.cast(pa.int64()), _PER_DAY_MS).cast(pa.int32()).cast(target)
    return values.cast(target)  # safe: a value out of the target's range is refused


def _floor_divided(values: pa.Array, by: int) -> pa.Array:
    """Integer division of ``values`` by ``by``, rounding towards minus infinity."""
    quotient = pc.divide(values, by)  # towards zero
    behind = pc.less(pc.subtract(values, pc.multiply(quotient, by)), 0)
    return pc.subtract(quotient, behind.cast(pa.int64()))
