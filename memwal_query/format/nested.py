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

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["with_parent_nulls", "as_schema", "map_leaves", "map_column_leaves", "has_leaf"]


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


#: Converts a value array that is not a struct, list or map to (towards) a target type.
Leaf = Callable[[pa.Array, pa.DataType], pa.Array]


def has_leaf(t: pa.DataType, target: pa.DataType, wanted: Callable[[pa.DataType, pa.DataType], bool]) -> bool:
    """Whether some value type inside ``t`` (at any depth, matched to ``target`` as
    :func:`map_leaves` matches them) and its target type are ``wanted``."""
    pairs = _children(t, target)
    if pairs is None:
        return wanted(t, target)
    return any(has_leaf(a, b, wanted) for a, b in pairs)


def _children(t: pa.DataType, target: pa.DataType) -> list[tuple[pa.DataType, pa.DataType]] | None:
    """The (child type, its target type) pairs of a container type; None: ``t`` is a leaf (or
    ``target`` is not the same kind of container)."""
    if pa.types.is_struct(t) and pa.types.is_struct(target):
        return [(f.type, target.field(f.name).type) for f in t if target.get_field_index(f.name) >= 0]
    if _is_list(t) and _is_list(target):
        return [(t.value_type, target.value_type)]
    if pa.types.is_map(t) and pa.types.is_map(target):
        return [(t.key_type, target.key_type), (t.item_type, target.item_type)]
    return None


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def map_column_leaves(
    col: pa.ChunkedArray, target: pa.DataType, wanted: Callable[[pa.DataType, pa.DataType], bool], leaf: Leaf
) -> pa.ChunkedArray:
    """Column ``col`` with :func:`map_leaves` applied to each chunk where a value type inside
    it is ``wanted`` (:func:`has_leaf`); ``col`` itself otherwise."""
    if not col.num_chunks or not has_leaf(col.type, target, wanted):
        return col
    chunks = [map_leaves(c, target, leaf) for c in col.chunks]
    return pa.chunked_array(chunks, type=chunks[0].type)


def map_leaves(arr: pa.Array, target: pa.DataType, leaf: Leaf) -> pa.Array:
    """``arr`` with ``leaf`` applied to each value array inside it that is not a struct, list or
    map, given its type in ``target`` (struct children matched by name; a child ``target``
    lacks is kept as it is); the containers rebuilt around the results with their own field
    names, nullability and NULLs (a cast to ``target`` may remain to be done)."""
    t = arr.type
    if _children(t, target) is None:
        return leaf(arr, target)
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_struct(t):
        kids = arr.flatten()  # sliced like ``arr``
        new = [
            map_leaves(k, target.field(f.name).type, leaf) if target.get_field_index(f.name) >= 0 else k
            for f, k in zip(t, kids, strict=True)
        ]
        fields = [f.with_type(k.type) for f, k in zip(t, new, strict=True)]
        return pa.StructArray.from_arrays(new, fields=fields, mask=mask)
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        values = map_leaves(arr.values.slice(arr.offset * size, len(arr) * size), target.value_type, leaf)
        kind = pa.list_(t.value_field.with_type(values.type), size)
        return pa.FixedSizeListArray.from_arrays(values, type=kind, mask=mask)
    offsets, start, count = _rebased(arr)  # a sliced array: its own span of the children
    if pa.types.is_map(t):
        keys = map_leaves(arr.keys.slice(start, count), target.key_type, leaf)
        items = map_leaves(arr.items.slice(start, count), target.item_type, leaf)
        kind = pa.map_(t.key_field.with_type(keys.type), t.item_field.with_type(items.type), t.keys_sorted)
        return pa.MapArray.from_arrays(offsets, keys, items, type=kind, mask=mask)
    values = map_leaves(arr.values.slice(start, count), target.value_type, leaf)
    cls, make = (pa.ListArray, pa.list_) if pa.types.is_list(t) else (pa.LargeListArray, pa.large_list)
    return cls.from_arrays(offsets, values, type=make(t.value_field.with_type(values.type)), mask=mask)


def _rebased(arr: pa.Array) -> tuple[pa.Array, int, int]:
    """A list or map array's offsets counted from its first value, that value's position in
    the whole child array and how many values its rows span."""
    offsets = arr.offsets
    if len(offsets) == 0:
        return offsets, 0, 0
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return (pc.subtract(offsets, start).cast(offsets.type) if start else offsets), start, end - start
