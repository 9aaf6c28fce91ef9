"""Region spec transforms: one whole-array function per transform.

Each function takes Arrow arrays and returns an Arrow array with one result
per input row; none loops over rows in Python. ``bucket`` and ``unsharded``
reproduce ``lance.mem_wal.evaluate_sharding_spec`` (pylance 14.0.2) exactly;
the others are not evaluated by pylance and follow the MemWAL spec text and
Iceberg's partition transforms (see each function).

Example:
    >>> import pyarrow as pa
    >>> bucket(pa.array([1, 2, None], pa.int32()), 8).to_pylist()
    [2, 7, 0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError
from memwal_query.regionspec.murmur3 import Seed, hash_binary_array, hash_int32_words, hash_int64_words

__all__ = [
    "hash_values",
    "bucket",
    "multi_bucket",
    "identity",
    "unsharded",
    "truncate",
    "year",
    "month",
    "day",
    "hour",
    "expression_values",
]

_NAN32 = np.uint32(0x7FC00000)
_NAN64 = np.uint64(0x7FF8000000000000)
# Arrow type -> numpy dtype of its fixed-width values, hashed as 4 bytes.
_WORD32: dict[pa.DataType, type[np.generic]] = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.date32(): np.int32,
    pa.time32("s"): np.int32,
    pa.time32("ms"): np.int32,
}
_WORD64: dict[pa.DataType, type[np.generic]] = {
    pa.int64(): np.int64,
    pa.uint64(): np.uint64,
    pa.time64("us"): np.int64,
    pa.time64("ns"): np.int64,
}


def _flat(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def _values(arr: pa.Array, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
    """Zero-copy view of a fixed-width array's values (null slots undefined)."""
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr), dtype=dtype)
    return np.frombuffer(buf, dtype=dtype)[arr.offset : arr.offset + len(arr)]


def _valid(arr: pa.Array) -> npt.NDArray[np.bool_]:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def hash_values(arr: pa.Array | pa.ChunkedArray, seed: Seed = 0) -> npt.NDArray[np.int32]:
    """Murmur3 hashes of each value's bucket encoding (see FORMAT.md).

    4 LE bytes for 8/16/32-bit integers, date32, time32, bool (0/1) and float32
    bits; 8 LE bytes for 64-bit integers, timestamps (raw value), time64 and
    float64 bits; ``-0.0`` hashes as ``+0.0`` and every NaN as the canonical
    quiet NaN; strings hash their UTF-8 bytes. Null slots get undefined hashes.

    Args:
        arr: The values.
        seed: One seed, or one per value.

    Returns:
        Signed 32-bit hashes.

    Raises:
        InvalidArgumentError: The type cannot be bucketed (binary, decimal,
            float16, date64, duration, views, dictionaries, nested types).

    Example:
        >>> import pyarrow as pa
        >>> hash_values(pa.array([1], pa.int32())).tolist()
        [-68075478]
    """
    arr = _flat(arr)
    t = arr.type
    if pa.types.is_null(t):  # a missing source column: every slot is NULL
        return np.broadcast_to(np.asarray(seed, dtype=np.int64), (len(arr),)).astype(np.int32)
    if pa.types.is_boolean(t):
        bits = np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=np.uint32)
        return hash_int32_words(bits, seed)
    if t in _WORD32:
        return hash_int32_words(_values(arr, _WORD32[t]).astype(np.uint32), seed)
    if t in _WORD64 or pa.types.is_timestamp(t):
        return hash_int64_words(_values(arr, _WORD64.get(t, np.int64)).astype(np.uint64), seed)
    if pa.types.is_float32(t):
        f32 = _values(arr, np.float32)
        b32 = np.where(f32 == 0, np.uint32(0), f32.view(np.uint32))
        return hash_int32_words(np.where(np.isnan(f32), _NAN32, b32), seed)
    if pa.types.is_float64(t):
        f64 = _values(arr, np.float64)
        b64 = np.where(f64 == 0, np.uint64(0), f64.view(np.uint64))
        return hash_int64_words(np.where(np.isnan(f64), _NAN64, b64), seed)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return hash_binary_array(arr, seed)
    msg = f"cannot bucket values of type {t} (supported: bool, integers, float32/64, date32, time, timestamp, utf8)"
    raise InvalidArgumentError(msg)


def _bucket_of(h: npt.NDArray[np.int32], valid: npt.NDArray[np.bool_], num_buckets: int) -> pa.Int32Array:
    if not 0 < num_buckets <= 0x7FFFFFFF:
        msg = f"num_buckets must be a positive int32, got {num_buckets}"
        raise InvalidArgumentError(msg)
    b = h & np.int32(0x7FFFFFFF)
    b %= np.int32(num_buckets)
    if not valid.all():
        b[~valid] = 0
    return pa.array(b, type=pa.int32())


def bucket(arr: pa.Array | pa.ChunkedArray, num_buckets: int) -> pa.Int32Array:
    """``(murmur3(value) & 0x7fffffff) % num_buckets``; NULL goes to bucket 0.

    Matches ``lance.mem_wal.evaluate_sharding_spec``'s ``bucket`` transform.

    Args:
        arr: The source column.
        num_buckets: Number of buckets (positive).

    Returns:
        Non-null ``int32`` bucket ids in ``[0, num_buckets)``.

    Example:
        >>> import pyarrow as pa
        >>> bucket(pa.array(["a", "b", None]), 8).to_pylist()
        [1, 5, 0]
    """
    arr = _flat(arr)
    return _bucket_of(hash_values(arr), _valid(arr), num_buckets)


def multi_bucket(arrays: Sequence[pa.Array | pa.ChunkedArray], num_buckets: int) -> pa.Int32Array:
    """Bucket over several columns, hashing them in chain.

    The MemWAL spec defines ``abs(murmur3_multi(col0, col1, ...)) % N`` where
    NULL inputs are ignored; pylance does not implement it. Here ``h`` starts at
    0 and each non-null value re-hashes with the previous ``h`` as seed (Spark's
    multi-column ``hash`` rule); the bucket is ``(h & 0x7fffffff) % N``, so one
    column gives exactly :func:`bucket`, and all-NULL rows go to bucket 0.

    Args:
        arrays: The source columns, in ``source_ids`` order.
        num_buckets: Number of buckets (positive).

    Returns:
        Non-null ``int32`` bucket ids.

    Example:
        >>> import pyarrow as pa
        >>> a = pa.array([1, 2], pa.int32())
        >>> multi_bucket([a], 8) == bucket(a, 8)
        True
    """
    if not arrays:
        raise InvalidArgumentError("multi_bucket needs at least one source column")
    h = np.zeros(len(arrays[0]), dtype=np.int32)
    for col in arrays:
        col = _flat(col)
        h = np.where(_valid(col), hash_values(col, h), h)
    return _bucket_of(h, np.ones(len(h), dtype=bool), num_buckets)


def identity(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The value itself (result type = source type).

    Example:
        >>> import pyarrow as pa
        >>> identity(pa.array(["x", None])).to_pylist()
        ['x', None]
    """
    return _flat(arr)


def unsharded(num_rows: int) -> pa.Int32Array:
    """Constant ``0`` (``int32``, non-null), as pylance returns for ``unsharded``.

    Example:
        >>> unsharded(2).to_pylist()
        [0, 0]
    """
    return pa.array(np.zeros(num_rows, dtype=np.int32), type=pa.int32())


def _floor_truncate(v: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.int64]:
    """``v - floor_mod(v, width)``, raising where int64 would overflow."""
    r = v - np.mod(v, np.int64(width))
    if np.any(r > v):
        raise InvalidArgumentError(f"truncate({width}) overflows int64")
    return r


def truncate(arr: pa.Array | pa.ChunkedArray, width: int) -> pa.Array:
    """Iceberg's ``truncate[W]``: result type = source type, NULL stays NULL.

    Strings keep their first ``W`` code points, binary its first ``W`` bytes;
    integers become ``v - (v mod W)`` with a non-negative remainder (so -1 -> -W);
    decimals (precision <= 18) do the same on the unscaled value, ``W`` being
    in units of the last digit (W=50, scale 2: 10.65 -> 10.50).

    Args:
        arr: The source column.
        width: ``W``, positive.

    Returns:
        The truncated values.

    Example:
        >>> import pyarrow as pa
        >>> truncate(pa.array([1, -1, 10]), 10).to_pylist()
        [0, -10, 10]
        >>> truncate(pa.array(["iceberg", "日本語"]), 2).to_pylist()
        ['ic', '日本']
    """
    if width <= 0:
        raise InvalidArgumentError(f"truncate width must be positive, got {width}")
    arr = _flat(arr)
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.utf8_slice_codeunits(arr, 0, width)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pc.binary_slice(arr, 0, width)
    mask = ~_valid(arr)
    if pa.types.is_unsigned_integer(t):
        u = _values(arr, t.to_pandas_dtype()).astype(np.uint64)
        return pa.array(u - u % np.uint64(width), mask=mask).cast(t)
    if pa.types.is_integer(t):
        r = _floor_truncate(_values(arr, t.to_pandas_dtype()).astype(np.int64), width)
        info = np.iinfo(t.to_pandas_dtype())
        if np.any((r < info.min) & ~mask):
            raise InvalidArgumentError(f"truncate({width}) overflows {t}")
        return pa.array(np.where(mask, 0, r), mask=mask).cast(t)
    if isinstance(t, pa.Decimal128Type) and t.precision <= 18:
        words = np.frombuffer(arr.buffers()[1], dtype=np.int64)[2 * arr.offset : 2 * (arr.offset + len(arr))]
        unscaled = np.where(mask, 0, words[0::2])
        r = _floor_truncate(unscaled, width)
        if np.any(np.abs(r) >= 10**t.precision):
            raise InvalidArgumentError(f"truncate({width}) overflows {t}")
        data = np.stack([r, r >> 63], axis=1).ravel()
        validity = None if not mask.any() else pa.array(~mask).buffers()[1]
        return pa.Array.from_buffers(t, len(arr), [validity, pa.py_buffer(data.tobytes())])
    raise InvalidArgumentError(f"cannot truncate values of type {t} (supported: integers, decimal, string, binary)")


_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _since_epoch(arr: pa.Array, per_day: bool, transform: str) -> npt.NDArray[np.int64]:
    """Days (``per_day``) or hours since 1970-01-01T00:00 UTC, floored."""
    t = arr.type
    if pa.types.is_date32(t):
        if not per_day:
            raise InvalidArgumentError(f"{transform} needs a timestamp, got {t}")
        return _values(arr, np.int32).astype(np.int64)
    if pa.types.is_date64(t):
        if not per_day:
            raise InvalidArgumentError(f"{transform} needs a timestamp, got {t}")
        ms = _values(arr, np.int64).astype(np.int64)
        return ms // np.int64(86_400_000)
    if pa.types.is_timestamp(t):
        raw = _values(arr, np.int64).astype(np.int64)
        return raw // np.int64(3600 * _UNIT_PER_SECOND[t.unit] * (24 if per_day else 1))
    raise InvalidArgumentError(f"{transform} needs a date or timestamp, got {t}")


def _int32_result(values: npt.NDArray[np.int64], arr: pa.Array, transform: str) -> pa.Int32Array:
    mask = ~_valid(arr)
    values = np.where(mask, 0, values)
    if np.any((values < -(2**31)) | (values >= 2**31)):
        raise InvalidArgumentError(f"{transform} result does not fit int32 for {arr.type}")
    return pa.array(values.astype(np.int32), type=pa.int32(), mask=mask if mask.any() else None)


def _calendar(arr: pa.Array | pa.ChunkedArray, unit: str, transform: str) -> pa.Int32Array:
    arr = _flat(arr)
    mask = ~_valid(arr)
    days = np.where(mask, 0, _since_epoch(arr, True, transform))
    if np.any(np.abs(days) > 2**31 * 366):
        raise InvalidArgumentError(f"{transform} result does not fit int32 for {arr.type}")
    ordinal = days.astype("datetime64[D]").astype(f"datetime64[{unit}]").astype(np.int64)
    return _int32_result(ordinal, arr, transform)


def year(arr: pa.Array | pa.ChunkedArray) -> pa.Int32Array:
    """Years since 1970 (Iceberg ``year``), floored; UTC for zoned timestamps.

    Example:
        >>> import datetime, pyarrow as pa
        >>> year(pa.array([datetime.date(1969, 12, 31), datetime.date(2024, 5, 1)])).to_pylist()
        [-1, 54]
    """
    return _calendar(arr, "Y", "year")


def month(arr: pa.Array | pa.ChunkedArray) -> pa.Int32Array:
    """Months since 1970-01 (Iceberg ``month``), floored.

    Example:
        >>> import datetime, pyarrow as pa
        >>> month(pa.array([datetime.date(1969, 12, 31), datetime.date(1971, 2, 1)])).to_pylist()
        [-1, 13]
    """
    return _calendar(arr, "M", "month")


def day(arr: pa.Array | pa.ChunkedArray) -> pa.Int32Array:
    """Days since 1970-01-01 (Iceberg ``day``), floored.

    Example:
        >>> import datetime, pyarrow as pa
        >>> day(pa.array([datetime.datetime(1969, 12, 31, 23)], pa.timestamp("s"))).to_pylist()
        [-1]
    """
    arr = _flat(arr)
    return _int32_result(_since_epoch(arr, True, "day"), arr, "day")


def hour(arr: pa.Array | pa.ChunkedArray) -> pa.Int32Array:
    """Hours since 1970-01-01T00 (Iceberg ``hour``), floored; timestamps only.

    Example:
        >>> import datetime, pyarrow as pa
        >>> hour(pa.array([datetime.datetime(1970, 1, 1, 5, 59)], pa.timestamp("us"))).to_pylist()
        [5]
    """
    arr = _flat(arr)
    return _int32_result(_since_epoch(arr, False, "hour"), arr, "hour")


def expression_values(
    columns: Sequence[pa.Array | pa.ChunkedArray],
    expression: str,
    result_type: pa.DataType | None = None,
    num_rows: int | None = None,
) -> pa.Array:
    """Evaluates a DataFusion SQL expression over ``col0, col1, ...``.

    Runs its own single-partition ``SessionContext`` (so row order is kept);
    never call it from inside a DataFusion callback.

    Args:
        columns: The source columns, bound to ``col0``, ``col1``, ... in order.
        expression: A DataFusion SQL scalar expression.
        result_type: Type to cast the result to, or None to keep DataFusion's.
        num_rows: Row count (needed only when ``columns`` is empty).

    Returns:
        One value per row.

    Example:
        >>> import pyarrow as pa
        >>> expression_values([pa.array([1, 2, None])], "col0 * 10", pa.int32()).to_pylist()
        [10, 20, None]
    """
    from datafusion import SessionConfig, SessionContext

    n = num_rows if num_rows is not None else (len(columns[0]) if columns else 0)
    data = {f"col{i}": _flat(c) for i, c in enumerate(columns)}
    data["__memwal_row"] = pa.array(np.arange(n, dtype=np.int64))
    ctx = SessionContext(SessionConfig().with_target_partitions(1))
    ctx.from_arrow(pa.table(data), name="t")
    try:
        out = ctx.sql(f"SELECT ({expression}) AS v FROM t ORDER BY __memwal_row").to_arrow_table()
        col = _flat(out.column("v")) if out.num_rows else pa.array([], out.schema.field("v").type)
        return col.cast(result_type) if result_type is not None else col
    except Exception as err:  # DataFusion raises plain Exceptions
        msg = f"cannot evaluate expression {expression!r}: {err}"
        raise InvalidArgumentError(msg) from err
