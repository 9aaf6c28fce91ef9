"""Evaluate a whole region spec over a table; group rows by region value.

The reader uses :func:`evaluate_spec` to compute region values of query
literals (pruning); the writer uses it with :func:`region_groups` to route
rows. Field values stored in region manifests go through
:func:`encode_field_value` / :func:`decode_field_value`.

Semantics follow ``lance.mem_wal.evaluate_sharding_spec`` (pylance 14.0.2)
where it evaluates a transform: ``bucket`` and ``identity`` read only the
first source column, a field with both ``transform`` and ``expression`` uses
the transform, and ``result_type`` is ignored for transforms. Unlike pylance,
a source column missing from the data reads as NULL (MemWAL spec: "column
removal resistant").

Example:
    >>> import pyarrow as pa
    >>> from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
    >>> f = ShardingFieldSpec("bucket", (0,), "bucket", None, "int32", {"num_buckets": "8"})
    >>> evaluate_spec(RegionSpec(1, (f,)), pa.table({"id": pa.array([1, 2], pa.int32())}), {0: "id"}).to_pylist()
    [{'bucket': 2}, {'bucket': 7}]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
from memwal_query.regionspec import transforms as tf

__all__ = [
    "evaluate_spec",
    "evaluate_field",
    "parse_result_type",
    "region_groups",
    "encode_field_value",
    "decode_field_value",
    "lance_field_ids",
]

# Arrow (Rust) display names that pyarrow's aliases do not cover.
_TYPE_NAMES = {
    "boolean": pa.bool_(),
    "utf8": pa.string(),
    "largeutf8": pa.large_string(),
    "binary": pa.binary(),
    "largebinary": pa.large_binary(),
}


def parse_result_type(name: str) -> pa.DataType | None:
    """Arrow type named by a spec field's ``result_type``; None if empty/unknown.

    Accepts pyarrow aliases (``int32``, ``utf8``, ``large_utf8``) and Arrow Rust
    display names (``Int32``, ``Utf8``, ``LargeUtf8``).

    Example:
        >>> parse_result_type("Utf8"), parse_result_type("int32"), parse_result_type("")
        (DataType(string), DataType(int32), None)
    """
    key = name.strip()
    if not key:
        return None
    if key.lower() in _TYPE_NAMES:
        return _TYPE_NAMES[key.lower()]
    for candidate in (key, key.lower()):
        try:
            return pa.type_for_alias(candidate)
        except ValueError:
            continue
    return None


def _int_param(field: ShardingFieldSpec, name: str) -> int:
    raw = field.parameters.get(name)
    if raw is None:
        raise InvalidArgumentError(f"region spec field {field.field_id!r} is missing parameter {name!r}")
    try:
        value = int(raw)
    except ValueError as err:
        msg = f"region spec field {field.field_id!r} has invalid {name} {raw!r}"
        raise InvalidArgumentError(msg) from err
    if not 0 < value <= 0x7FFFFFFF:
        raise InvalidArgumentError(f"region spec field {field.field_id!r} needs a positive int32 {name}, got {value}")
    return value


def _first(field: ShardingFieldSpec, columns: list[pa.Array]) -> pa.Array:
    if not columns:
        raise InvalidArgumentError(f"region spec field {field.field_id!r} has no source column")
    return columns[0]


def evaluate_field(field: ShardingFieldSpec, columns: list[pa.Array], num_rows: int) -> pa.Array:
    """Evaluates one spec field over its source columns (``source_ids`` order).

    Args:
        field: The spec field.
        columns: Source columns (NULL arrays for missing ones).
        num_rows: Row count.

    Returns:
        One value per row.

    Raises:
        InvalidArgumentError: Unknown transform, bad parameters, or a source
            type the transform does not support; the message names the field.

    Example:
        >>> import pyarrow as pa
        >>> f = ShardingFieldSpec("u", (), "unsharded", None, "int32")
        >>> evaluate_field(f, [], 2).to_pylist()
        [0, 0]
    """
    name = field.transform
    try:
        if name == "unsharded":
            return tf.unsharded(num_rows)
        if name == "bucket":
            return tf.bucket(_first(field, columns), _int_param(field, "num_buckets"))
        if name == "multi_bucket":
            return tf.multi_bucket(columns, _int_param(field, "num_buckets"))
        if name == "identity":
            return tf.identity(_first(field, columns))
        if name == "truncate":
            return tf.truncate(_first(field, columns), _int_param(field, "width"))
        if name in ("year", "month", "day", "hour"):
            return getattr(tf, name)(_first(field, columns))
        if name is None and field.expression:
            rtype = parse_result_type(field.result_type)
            return tf.expression_values(columns, field.expression, rtype, num_rows)
    except InvalidArgumentError as err:
        msg = f"region spec field {field.field_id!r}: {err}"
        raise InvalidArgumentError(msg) from err
    raise InvalidArgumentError(f"region spec field {field.field_id!r} has unsupported transform {name!r}")


def _source_column(
    table: pa.Table, source_id: int, field_names: Mapping[int, str], null_type: pa.DataType | None
) -> pa.Array:
    name = field_names.get(source_id)
    if name is None or name not in table.column_names:
        return pa.nulls(table.num_rows, type=null_type or pa.null())
    col = table.column(name)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def evaluate_spec(spec: RegionSpec, table: pa.Table | pa.RecordBatch, field_names: Mapping[int, str]) -> pa.Table:
    """Evaluates every field of a region spec: one column per field, by field_id.

    Args:
        spec: The region spec.
        table: The rows (column names as in ``field_names``).
        field_names: Lance field id -> top-level column name (see
            :func:`lance_field_ids`). A source missing from the data reads as NULL.

    Returns:
        A table with ``table.num_rows`` rows and one column per spec field.

    Raises:
        InvalidArgumentError: A field cannot be evaluated; names spec and field.

    Example:
        >>> import pyarrow as pa
        >>> f = ShardingFieldSpec("cat", (1,), "identity", None, "utf8")
        >>> evaluate_spec(RegionSpec(2, (f,)), pa.table({"c": ["x"]}), {1: "c"}).to_pylist()
        [{'cat': 'x'}]
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    names: list[str] = []
    arrays: list[pa.Array] = []
    for field in spec.fields:
        null_type = parse_result_type(field.result_type) if field.transform == "identity" else None
        cols = [_source_column(table, sid, field_names, null_type) for sid in field.source_ids]
        try:
            arrays.append(evaluate_field(field, cols, table.num_rows))
        except InvalidArgumentError as err:
            raise InvalidArgumentError(f"region spec {spec.spec_id}: {err}") from err
        names.append(field.field_id)
    return pa.Table.from_arrays(arrays, names=names)


def region_groups(values: pa.Table) -> dict[tuple[Any, ...], pa.Int64Array]:
    """Groups rows by their region value tuple (as from :func:`evaluate_spec`).

    Vectorised with ``pa.Table.group_by``; groups keep first-appearance order
    and row indices ascend within a group.

    Args:
        values: Evaluated region values, one column per spec field.

    Returns:
        Region value tuple (Python scalars, in column order) -> row indices.

    Example:
        >>> import pyarrow as pa
        >>> g = region_groups(pa.table({"bucket": pa.array([1, 0, 1], pa.int32())}))
        >>> {k: v.to_pylist() for k, v in g.items()}
        {(1,): [0, 2], (0,): [1]}
    """
    keys = values.column_names
    if not keys:
        return {(): pa.array(np.arange(values.num_rows, dtype=np.int64))} if values.num_rows else {}
    renamed = values.rename_columns([f"k{i}" for i in range(len(keys))])
    indexed = renamed.append_column("__row", pa.array(np.arange(values.num_rows, dtype=np.int64)))
    key_names = renamed.column_names
    grouped = indexed.group_by(key_names, use_threads=False).aggregate([("__row", "list")])
    key_lists = [grouped.column(k).to_pylist() for k in key_names]
    rows = grouped.column("__row_list")
    return {tuple(k[i] for k in key_lists): rows[i].values for i in range(grouped.num_rows)}


def equal_next(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``out[i]``: row ``i`` equals row ``i + 1`` (NULL equals NULL, NaN equals NaN, as
    Spark and SQL's GROUP BY see them); length ``n - 1``.

    Example:
        >>> equal_next(pa.array([1, 1, None, None, 2])).tolist()
        [True, False, True, False]
        >>> equal_next(pa.array([float("nan"), float("nan"), 1.0])).tolist()
        [True, False]
    """
    a = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(a) < 2:
        return np.zeros(0, dtype=bool)
    x, y = a.slice(0, len(a) - 1), a.slice(1)
    eq = pc.or_(pc.fill_null(pc.equal(x, y), False), pc.and_(pc.is_null(x), pc.is_null(y)))
    if pa.types.is_floating(a.type):
        eq = pc.or_(eq, pc.fill_null(pc.and_(pc.is_nan(x), pc.is_nan(y)), False))
    return np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)


def region_runs(values: pa.Table) -> tuple[pa.Array | None, list[tuple[tuple[Any, ...], int, int]]]:
    """Orders rows by region value (a stable sort) and finds each region's run.

    The alternative to :func:`region_groups` when the rows are to be copied once in
    region order (or are already in it: then nothing is copied).

    Args:
        values: Evaluated region values, one column per spec field.

    Returns:
        ``(order, runs)``: ``order`` is the row order (``None`` when the rows are
        already in it) and ``runs`` lists ``(value tuple, start, stop)`` over the
        reordered rows, rows of one run in their original order.

    Example:
        >>> import pyarrow as pa
        >>> order, runs = region_runs(pa.table({"bucket": pa.array([1, 0, 1], pa.int32())}))
        >>> order.to_pylist(), runs
        ([1, 0, 2], [((0,), 0, 1), ((1,), 1, 3)])
    """
    n = values.num_rows
    keys = values.column_names
    if not keys or n == 0:
        return None, ([((), 0, n)] if n else [])
    order: pa.Array | None = pc.sort_indices(values, sort_keys=[(k, "ascending") for k in keys])
    assert order is not None
    if bool(np.array_equal(order.to_numpy(), np.arange(n))):
        order = None
    ordered = values if order is None else values.take(order)
    same = np.ones(n - 1, dtype=bool)
    for k in keys:
        same &= equal_next(ordered.column(k))
    starts = np.concatenate([[0], np.flatnonzero(~same) + 1])
    stops = np.concatenate([starts[1:], [n]])
    firsts = ordered.take(pa.array(starts)).to_pylist()
    runs = [(tuple(row[k] for k in keys), int(a), int(b)) for row, a, b in zip(firsts, starts, stops, strict=True)]
    return order, runs


def encode_field_value(value: Any, arrow_type: pa.DataType) -> bytes:
    """Raw little-endian Arrow scalar bytes, as region manifest field entries hold.

    Fixed-width types give their value bytes (bool: one byte 0/1); strings
    their UTF-8 bytes; binary the bytes themselves.

    Example:
        >>> encode_field_value(3, pa.int32())
        b'\\x03\\x00\\x00\\x00'
        >>> decode_field_value(encode_field_value("é", pa.string()), pa.string())
        'é'
    """
    if value is None:
        raise InvalidArgumentError(f"cannot encode a NULL region field value of type {arrow_type}")
    if pa.types.is_boolean(arrow_type):
        return b"\x01" if value else b"\x00"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return str(value).encode("utf-8")
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return bytes(value)
    width = _byte_width(arrow_type)
    try:
        buf = pa.array([value], type=arrow_type).buffers()[1]
    except (pa.ArrowException, TypeError, ValueError) as err:
        raise InvalidArgumentError(f"cannot encode {value!r} as a region field value of type {arrow_type}") from err
    return bytes(buf.to_pybytes()[:width])


def _byte_width(arrow_type: pa.DataType) -> int:
    try:
        bits = arrow_type.bit_width
    except ValueError:
        bits = 0
    if bits == 0 or bits % 8 or pa.types.is_dictionary(arrow_type):
        raise InvalidArgumentError(f"region field values of type {arrow_type} have no raw scalar encoding")
    return int(bits // 8)


def decode_field_value(data: bytes, arrow_type: pa.DataType) -> Any:
    """Inverse of :func:`encode_field_value`: a Python scalar.

    Example:
        >>> decode_field_value(b"\\xff\\xff\\xff\\xff", pa.int32())
        -1
    """
    if pa.types.is_boolean(arrow_type):
        return data != b"\x00"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return data.decode("utf-8")
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return bytes(data)
    if len(data) != _byte_width(arrow_type):
        raise InvalidArgumentError(f"region field value of {len(data)} bytes does not decode as {arrow_type}")
    return pa.Array.from_buffers(arrow_type, 1, [None, pa.py_buffer(data)])[0].as_py()


class _LanceDatasetLike(Protocol):
    @property
    def lance_schema(self) -> Any: ...


def lance_field_ids(lance_dataset: _LanceDatasetLike) -> dict[int, str]:
    """Lance field id -> top-level column name of a Lance dataset.

    Example:
        >>> import lance, tempfile, pyarrow as pa
        >>> ds = lance.write_dataset(pa.table({"a": [1], "b": ["x"]}), tempfile.mkdtemp())
        >>> lance_field_ids(ds)
        {0: 'a', 1: 'b'}
    """
    return {int(f.id()): str(f.name()) for f in lance_dataset.lance_schema.fields()}
