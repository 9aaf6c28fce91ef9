"""Arrow data as Spark's Arrow exchange takes it.

Spark has no fixed-size lists (a vector column is an ``ArrayType``: Arrow ``list`` with an
``element`` child), no unsigned integers and, unless told otherwise, exchanges strings and
binaries with 32-bit offsets. Batches handed to Spark (``read_spark`` tasks, the ``memwal``
data source) are cast to :func:`spark_schema` of the table's schema; the values are the
same. Unsigned integers widen as Spark reads Parquet's: uint8 -> short, uint16 -> int,
uint32 -> long, uint64 -> decimal(20, 0); float16 -> float, date64 -> date. Spark holds
timestamps and durations in microseconds (nanoseconds are truncated) and times in
nanoseconds.

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


def _exact(t: pa.DataType) -> bool:
    """Whether a cast to ``t`` must keep every value (nanoseconds truncate to Spark's microseconds,
    a date64 to its day)."""
    return not (pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date(t))


def spark_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast to ``schema`` (a :func:`spark_schema`), column by column."""
    if batch.schema.equals(schema):
        return batch
    columns = [
        c if c.type == f.type else c.cast(f.type, safe=_exact(f.type))
        for c, f in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
