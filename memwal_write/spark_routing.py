"""Routing in Spark: the table's region spec as Spark column expressions.

``bucket`` via Spark's ``hash`` (Murmur3 over Lance's byte encoding; seeding it with a
literal whose seed-42 hash is 0 gives Lance's seed-0 hash), and partition seeds so that
every task holds whole regions (for a bucket spec with as many partitions as buckets,
exactly one bucket per task). Other specs fall back to the shared Arrow evaluation.

Example:
    >>> len(bucket_partition_seeds(8))
    8
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import MemWalError
from memwal_query.format.model import RegionSpec
from memwal_query.regionspec.murmur3 import hash_int32_words
from memwal_query.regionspec.spec import evaluate_spec, region_groups
from memwal_write.arrow_writer import RoutedWriter
from memwal_write.routing import region_id_for

__all__ = [
    "SEED0_LITERAL",
    "SPARK_HASH_SEED",
    "PKEY",
    "BUCKET",
    "hashable",
    "bucket_column",
    "bucket_partition_seeds",
    "Routing",
    "spark_routing",
    "check_routing",
]

#: An int32 whose Spark ``hash`` (Murmur3, seed 42) is 0: ``hash(lit(SEED0_LITERAL), c)`` is
#: the seed-0 Murmur3 hash of ``c`` that Lance's ``bucket`` transform uses.
SEED0_LITERAL = -1693959553


SPARK_HASH_SEED = 42

PKEY = "__memwal_pkey"
BUCKET = "__memwal_bucket"


# -- routing in Spark -----------------------------------------------------------------------
def hashable(col: Any, spark_type: Any, target: pa.DataType) -> Any:
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
class Routing:
    """How the write job partitions rows (all picklable)."""

    num_partitions: int
    native: bool
    bucket_checked: bool


def spark_routing(
    df: Any, spec: RegionSpec | None, field_names: Mapping[int, str], schema: pa.Schema, num_partitions: int | None
) -> tuple[Any, Routing]:
    """Add the partition key column (and the bucket column, when native) to ``df``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    spark_types = {f.name: f.dataType for f in df.schema.fields}
    if spec is None:
        return df.withColumn(PKEY, F.lit(0)), Routing(1, True, False)
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
        value = hashable(F.col(name), spark_types[name], schema.field(name).type)
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
            return out, Routing(parts, True, spec.fields[0].transform == "bucket")
        key = cols[0] if len(cols) == 1 else F.struct(*cols)
        parts = num_partitions or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
        return df.withColumn(PKEY, key), Routing(parts, True, False)
    # fallback: evaluate the spec with the shared Arrow code in a Python pass
    parts = num_partitions or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
    # a new StructType: ``add`` changes the one it is called on, and ``df.schema`` is the
    # DataFrame's own (cached): ``df`` then named a column its plan lacks
    out_schema = StructType([*df.schema.fields, StructField(PKEY, StringType(), nullable=False)])

    def add_region(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            values = evaluate_spec(spec, b, field_names)
            types = [values.schema.field(i).type for i in range(values.num_columns)]
            ids = np.empty(b.num_rows, dtype=object)
            for k, rows in region_groups(values).items():
                ids[rows.to_numpy()] = region_id_for(spec, k, types)
            yield b.append_column(PKEY, pa.array(ids.tolist(), pa.string()))

    return df.mapInArrow(add_region, out_schema), Routing(parts, False, False)


def check_routing(writer: RoutedWriter, batch: pa.Table) -> None:
    """Refuse a batch whose Spark bucket differs from the shared spec evaluation."""
    if writer.spec is None or BUCKET not in batch.column_names:
        return
    # the spec reads the values as the table stores them (an int column into a long key is
    # routed as a long, as Spark routed it): cast its source columns first
    schema = writer.dataset.schema
    for sid in {i for f in writer.spec.fields for i in f.source_ids}:
        name = writer.field_names.get(sid)
        if (
            name in batch.column_names
            and name in schema.names
            and batch.schema.field(name).type != schema.field(name).type
        ):
            try:
                cast = batch.column(name).cast(schema.field(name).type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return  # a value the column cannot hold: the write refuses it, naming the column
            batch = batch.set_column(batch.column_names.index(name), name, cast)
    values = evaluate_spec(writer.spec, batch, writer.field_names).column(0)
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
