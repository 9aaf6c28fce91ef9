"""Whether the columns a Spark query was planned with still are the table's.

Spark fixes a DataFrame's or a stream's schema when it plans it, and memwal reads the table
as it is when a batch runs. After a column was renamed, dropped or changed type in between
(also a struct child or a list item's child), casting the rows to the planned schema would
match columns by name and fill the ones it cannot find with NULL: values silently lost, for
good in a stream whose checkpoint moves on. Such a read fails instead, naming the column;
planning it again (loading the table, restarting the stream) reads the table as it is.

Example:
    >>> import pyarrow as pa
    >>> from pyspark.sql.types import LongType, StructField, StructType
    >>> planned = StructType([StructField("id", LongType()), StructField("x", LongType())])
    >>> drift(planned, pa.schema([("id", pa.int64()), ("y", pa.int64())]), whole=False)
    "column 'x' is no longer in the table"
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from memwal_query.spark_types import spark_schema

__all__ = ["drift"]


def drift(planned: StructType, current: pa.Schema, *, whole: bool) -> str | None:
    """How ``current`` (a table's Arrow schema) differs from the ``planned`` Spark schema, or None.

    Names and types are compared as Spark sees them (nullability aside), nested types whole.
    ``whole``: the columns must be the same ones in the same order (a stream's batches); else
    each planned column must be there with its type (a DataFrame may select some).
    """
    now = from_arrow_schema(spark_schema(current))
    have = {f.name: f for f in now.fields}
    for f in planned.fields:
        got = have.get(f.name)
        if got is None:
            return f"column {f.name!r} is no longer in the table"
        if got.dataType.simpleString() != f.dataType.simpleString():
            return f"column {f.name!r} is {got.dataType.simpleString()} now, planned as {f.dataType.simpleString()}"
    if whole and now.fieldNames() != planned.fieldNames():
        added = [n for n in now.fieldNames() if n not in planned.fieldNames()]
        return (
            f"column {added[0]!r} was added"
            if added
            else "the column order changed (a column dropped and added again?)"
        )
    return None
