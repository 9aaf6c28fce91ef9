"""Arrow struct columns as every reader expects them: a NULL struct's fields are NULL too.

Arrow leaves the child values under a NULL struct undefined. Lance's reader makes them NULL;
a WAL entry (the writer's own batch, logged as it was put) may keep whatever the writer's
pyarrow built there, e.g. ``{"a": 0}`` under a NULL ``s``, and DataFusion's ``s['a']`` reads
the child without its parent's validity: the same row would answer ``s['a'] = 0`` in a
MemTable and ``NULL`` once flushed. :func:`with_parent_nulls` pushes struct validity down.

pyarrow's ``Table.cast`` refuses a struct column whose non-nullable child holds NULLs under
NULL parents (as Lance reads them) even when casting to the column's own type;
:func:`as_schema` casts only the columns whose type differs.

Example:
    >>> import pyarrow as pa
    >>> s = pa.StructArray.from_arrays([pa.array([0, 5])], names=["a"], mask=pa.array([True, False]))
    >>> s.field(0).to_pylist()  # the child under the NULL struct
    [0, 5]
    >>> with_parent_nulls(pa.table({"s": s})).column("s").chunk(0).field(0).to_pylist()
    [None, 5]
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["with_parent_nulls", "as_schema"]


def with_parent_nulls(table: pa.Table) -> pa.Table:
    """``table`` with the nullable fields under NULL structs made NULL (at any depth, lists too)."""
    for i, f in enumerate(table.schema):
        if not _has_struct(f.type):
            continue
        col = table.column(i)
        chunks = [_pushed(c) for c in col.chunks]
        if any(a is not b for a, b in zip(chunks, col.chunks, strict=True)):
            table = table.set_column(i, f, pa.chunked_array(chunks, f.type))
    return table


def as_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table.cast(schema)``, leaving columns of the right type as they are."""
    if table.schema.equals(schema):
        return table
    if table.schema.names != schema.names:
        return table.cast(schema)  # pyarrow's error names the mismatch
    cols = [c if c.type == f.type else c.cast(f.type) for c, f in zip(table.columns, schema, strict=True)]
    return pa.Table.from_arrays(cols, schema=schema)


def _has_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_struct(t.value_type)
    return False


def _pushed(arr: pa.Array) -> pa.Array:
    """``arr`` with struct validity pushed into nullable children (``arr`` itself if nothing changes)."""
    t = arr.type
    if pa.types.is_struct(t):
        kids = [arr.field(j) for j in range(t.num_fields)]
        if arr.null_count:
            merged = arr.flatten()  # each child sliced like ``arr``, ANDed with its validity
            kids = [m if t.field(j).nullable else k for j, (m, k) in enumerate(zip(merged, kids, strict=True))]
        new = [_pushed(k) for k in kids]
        if arr.null_count == 0 and all(a is b for a, b in zip(new, kids, strict=True)):
            return arr
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(new, fields=list(t), mask=mask)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = arr.values
        new_values = _pushed(values)
        if new_values is values:
            return arr
        cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return cls.from_arrays(arr.offsets, new_values, type=t, mask=arr.is_null() if arr.null_count else None)
    return arr
