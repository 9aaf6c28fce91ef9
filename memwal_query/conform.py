"""Arrange Arrow data as a table schema: column order, types, nullability.

One function for the reader (WAL entries and in-process MemTables, tolerant: a
column missing from old data reads as NULL) and the writer (strict: unknown or
missing required columns and NULLs in non-nullable columns are errors).

Example:
    >>> import pyarrow as pa
    >>> schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    >>> conform(pa.table({"v": ["a"], "id": pa.array([1], pa.int32())}), schema, what="put").schema.names
    ['id', 'v']
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from memwal_query.errors import InvalidArgumentError, MemWalError

__all__ = ["conform", "FIELD_ID", "by_field_id"]

#: Arrow field metadata in which Lance records a column's field id (WAL entries carry it).
FIELD_ID = b"lance:field_id"


def by_field_id(data: pa.Table, names: Mapping[int, str]) -> pa.Table:
    """``data``'s columns named as the table names their Lance field ids now.

    A column renamed since ``data`` was written takes its new name; a column dropped since
    is left out, even when a newer column took its name; a column without a field id keeps
    its name. ``names``: the table's field id -> column name.

    Example:
        >>> x = pa.field("x", pa.int64(), metadata={FIELD_ID: b"1"})
        >>> old = pa.table({"x": [5]}, schema=pa.schema([x]))
        >>> by_field_id(old, {1: "renamed"}).column_names, by_field_id(old, {2: "x"}).column_names
        (['renamed'], [])
    """
    columns: list[pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    for f, col in zip(data.schema, data.columns, strict=True):
        raw = (f.metadata or {}).get(FIELD_ID)
        name = f.name
        if raw is not None:
            try:
                name = names.get(int(raw), "")
            except ValueError:
                name = f.name  # not a field id: matched by name
        if name and name not in (g.name for g in fields):
            columns.append(col)
            fields.append(f.with_name(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def conform(
    data: pa.Table,
    schema: pa.Schema,
    *,
    what: str,
    keys: tuple[str, ...] | None = None,
    strict: bool = True,
    error: type[MemWalError] = InvalidArgumentError,
    field_ids: Mapping[int, str] | None = None,
) -> pa.Table:
    """Arrange ``data`` as ``schema`` with clear errors.

    Args:
        data: Incoming rows.
        schema: The table schema.
        what: Names the target in error messages.
        keys: When given, only these columns are required and returned (deletes).
        strict: Refuse unknown columns, missing non-nullable columns and NULLs in
            non-nullable columns (writes); otherwise only cast and fill missing
            columns with NULLs (reads of data written under an older schema).
        error: The error class to raise.
        field_ids: The table's Lance field id -> column name: columns of ``data`` that
            carry a field id (WAL entries) are matched by it (see :func:`by_field_id`).

    Raises:
        MemWalError: ``error``, naming ``what`` and the column.
    """
    target = pa.schema([schema.field(k) for k in keys]) if keys else schema
    if field_ids is not None:
        data = by_field_id(data, field_ids)
    if strict and not keys:
        extra = [c for c in data.column_names if c not in schema.names]
        if extra:
            msg = f"{what}: column(s) {extra} are not in the table schema {schema.names}"
            raise error(msg)
    arrays = []
    for f in target:
        if f.name not in data.column_names:
            if strict and not f.nullable:
                msg = f"{what}: required column {f.name!r} is missing"
                raise error(msg)
            arrays.append(pa.nulls(data.num_rows, f.type))
            continue
        col = data.column(f.name)
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                msg = f"{what}: column {f.name!r} of type {col.type} cannot be stored as {f.type}: {err}"
                raise error(msg) from err
        if strict and not f.nullable and col.null_count:
            msg = f"{what}: column {f.name!r} is not nullable but has {col.null_count} NULL value(s)"
            raise error(msg)
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=target)
