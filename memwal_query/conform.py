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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.format.nested import has_leaf, map_column_leaves
from memwal_query.value_kind import kind_change

__all__ = ["conform", "FIELD_ID", "by_field_id", "field_id", "is_list_like", "with_item"]

#: Arrow field metadata in which Lance records a column's field id (WAL entries carry it).
FIELD_ID = b"lance:field_id"


def field_id(f: pa.Field) -> int | None:
    """The Lance field id recorded in ``f``'s metadata (None: none, or not a number)."""
    raw = (f.metadata or {}).get(FIELD_ID)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def by_field_id(data: pa.Table, ids: pa.Schema) -> pa.Table:
    """``data``'s columns named and nested as the table's fields of the same Lance field id.

    ``ids``: the table's schema with each field's id (children's too) in its metadata
    (:data:`FIELD_ID`). A column or struct child renamed since ``data`` was written takes
    its new name; one added since is NULL; one dropped since is left out, even when a newer
    field took its name; a column without a field id keeps its name.

    Example:
        >>> x = pa.field("x", pa.int64(), metadata={FIELD_ID: b"1"})
        >>> old = pa.table({"x": [5]}, schema=pa.schema([x]))
        >>> renamed = pa.schema([pa.field("renamed", pa.int64(), metadata={FIELD_ID: b"1"})])
        >>> other = pa.schema([pa.field("x", pa.int64(), metadata={FIELD_ID: b"2"})])
        >>> by_field_id(old, renamed).column_names, by_field_id(old, other).column_names
        (['renamed'], [])
    """
    targets = {i: f for f in ids if (i := field_id(f)) is not None}
    columns: list[pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    for f, col in zip(data.schema, data.columns, strict=True):
        i = field_id(f)
        target = targets.get(i) if i is not None else None
        if i is not None and target is None:
            continue  # dropped since
        if target is not None:
            col = pa.chunked_array([_nested(c, f, target) for c in col.chunks], _renamed(f.type, target.type))
            f = f.with_name(target.name).with_type(col.type)
        if f.name not in (g.name for g in fields):
            columns.append(col)
            fields.append(f)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _renamed(have: pa.DataType, want: pa.DataType) -> pa.DataType:
    """``have`` with struct children (in lists too) matched to ``want``'s by field id (see :func:`_nested`)."""
    if is_list_like(have) and is_list_like(want):
        item = have.value_field
        return with_item(have, item.with_type(_renamed(item.type, want.value_type)))
    if not (pa.types.is_struct(have) and pa.types.is_struct(want)):
        return have
    kids = []
    for w in want:
        k = _child(have, w)
        kids.append(w.with_type(_renamed(have.field(k).type, w.type)) if k is not None else w)
    return pa.struct(kids)


def is_list_like(t: pa.DataType) -> bool:
    """A list, large list or fixed-size list type (one child field, ``item``)."""
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def with_item(t: pa.DataType, item: pa.Field) -> pa.DataType:
    """List-like type ``t`` (same kind, same size) holding ``item`` instead.

    Example:
        >>> with_item(pa.large_list(pa.int8()), pa.field("item", pa.string()))
        LargeListType(large_list<item: string>)
    """
    if pa.types.is_fixed_size_list(t):
        return pa.list_(item, t.list_size)
    return pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)


def _child(have: pa.StructType, want: pa.Field) -> int | None:
    """Which child of ``have`` holds ``want``: by field id when both carry ids, else by name."""
    i = field_id(want)
    if i is not None and any(field_id(c) is not None for c in have):
        return next((k for k, c in enumerate(have) if field_id(c) == i), None)
    k = have.get_field_index(want.name)
    return k if k >= 0 else None


def _nested(arr: pa.Array, have: pa.Field, want: pa.Field) -> pa.Array:
    """A struct array's children (in lists too) matched to ``want``'s by field id: renamed,
    added (NULL), dropped."""
    if is_list_like(have.type) and is_list_like(want.type):
        return _nested_items(arr, have, want)
    if not (pa.types.is_struct(have.type) and pa.types.is_struct(want.type)):
        return arr
    assert isinstance(arr, pa.StructArray)
    children = []
    for w in want.type:
        k = _child(have.type, w)
        if k is None:
            children.append(pa.nulls(len(arr), w.type))
        else:
            children.append(_nested(arr.field(k), have.type.field(k), w))
    names = _renamed(have.type, want.type)
    return pa.StructArray.from_arrays(children, fields=list(names), mask=arr.is_null())


def _nested_items(arr: pa.Array, have: pa.Field, want: pa.Field) -> pa.Array:
    """A list array whose items are matched to ``want``'s (same offsets, same NULL lists)."""
    if not _holds_struct(have.type.value_type):  # nothing to match by field id (vectors)
        return arr
    typ = _renamed(have.type, want.type)  # (``==`` would ignore field ids: a child dropped and re-added)
    mask = arr.is_null() if arr.null_count else None
    if isinstance(arr, pa.FixedSizeListArray):
        size = have.type.list_size
        values = arr.values.slice(arr.offset * size, len(arr) * size)
        items = _nested(values, have.type.value_field, want.type.value_field)
        return pa.FixedSizeListArray.from_arrays(items, type=typ, mask=mask)
    assert isinstance(arr, (pa.ListArray, pa.LargeListArray))
    items = _nested(arr.values, have.type.value_field, want.type.value_field)
    return type(arr).from_arrays(arr.offsets, items, type=typ, mask=mask)


def _holds_struct(t: pa.DataType) -> bool:
    """Whether ``t`` is a struct or holds one in its list items, at any depth."""
    return pa.types.is_struct(t) or (is_list_like(t) and _holds_struct(t.value_type))


def _dropped_children(have: pa.DataType, want: pa.DataType, path: str) -> list[str]:
    """Struct children of ``have`` that ``want`` has no field for (paths, at any depth)."""
    if pa.types.is_struct(have) and pa.types.is_struct(want):
        names = {want.field(i).name: want.field(i).type for i in range(want.num_fields)}
        out = []
        for i in range(have.num_fields):
            child = have.field(i)
            if child.name not in names:
                out.append(f"{path}.{child.name}")
            else:
                out += _dropped_children(child.type, names[child.name], f"{path}.{child.name}")
        return out
    if is_list_like(have) and is_list_like(want):
        return _dropped_children(have.value_type, want.value_type, f"{path}[]")
    return []


def conform(
    data: pa.Table,
    schema: pa.Schema,
    *,
    what: str,
    keys: tuple[str, ...] | None = None,
    strict: bool = True,
    error: type[MemWalError] = InvalidArgumentError,
    field_ids: pa.Schema | None = None,
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
        field_ids: The table's schema with Lance field ids in its fields' metadata:
            columns of ``data`` that carry a field id (WAL entries) are matched by it,
            struct children too (see :func:`by_field_id`).

    Raises:
        MemWalError: ``error``, naming ``what`` and the column.
    """
    unknown_keys = [k for k in keys or () if k not in schema.names]
    if unknown_keys:
        msg = f"{what}: key column(s) {unknown_keys} are not in the table schema {schema.names}"
        raise error(msg)
    target = pa.schema([schema.field(k) for k in keys]) if keys else schema
    if field_ids is not None:
        data = by_field_id(data, field_ids)
    twice = sorted({c for c in data.column_names if data.column_names.count(c) > 1})
    if twice:
        msg = f"{what}: column(s) {twice} appear more than once"
        raise error(msg)
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
        # an instant into a column without a time zone (in a struct or a list too): its
        # wall-clock time where it was taken (as Spark, DuckDB and pandas cast; Arrow's
        # cast would give the UTC time)
        col = map_column_leaves(data.column(f.name), f.type, _instant_to_wall_clock, _wall_clock)
        arrays.append(_stored_as(col, f, what=what, strict=strict, error=error))
    return pa.Table.from_arrays(arrays, schema=target)


def _instant_to_wall_clock(src: pa.DataType, dst: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(src) and src.tz and pa.types.is_timestamp(dst) and not dst.tz)


def _wall_clock(values: pa.Array, target: pa.DataType) -> pa.Array:
    return pc.local_timestamp(values) if _instant_to_wall_clock(values.type, target) else values


def _stored_as(
    col: pa.ChunkedArray, f: pa.Field, *, what: str, strict: bool, error: type[MemWalError]
) -> pa.ChunkedArray:
    """Column ``col`` cast to field ``f`` (``strict``: refusing what would drop struct fields,
    change values or put NULLs where ``f`` allows none)."""
    if strict and col.type != f.type:
        lost = _dropped_children(col.type, f.type, f.name)
        if lost:  # pyarrow's struct cast would drop them without a word
            msg = f"{what}: struct field(s) {lost} are not in the table schema ({f.name!r} is {f.type})"
            raise error(msg)
        # pyarrow's cast reads "12" as 12, True as 1.0, 5 as "5" (a column of NULLs alone has no kind)
        other = kind_change(col.type, f.type, f.name) if col.null_count < len(col) else None
        if other is not None:
            msg = f"{what}: column {other}: values of another kind are not converted (cast them first)"
            raise error(msg)
    if strict and has_leaf(col.type, col.type, _is_text):
        try:  # Spark hands over what a binary cast to a string makes; Lance could not read it back
            col.validate(full=True)
        except pa.ArrowInvalid as err:
            msg = f"{what}: column {f.name!r} holds text that is not valid UTF-8 ({err})"
            raise error(msg) from err
    if col.type != f.type:
        try:
            cast = col.cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            msg = f"{what}: column {f.name!r} of type {col.type} cannot be stored as {f.type}: {err}"
            raise error(msg) from err
        changed = _changed_by_cast(col, cast) if strict else None
        if changed is not None:
            msg = f"{what}: column {f.name!r} of type {col.type} cannot be stored as {f.type}: {changed}"
            raise error(msg)
        col = cast
    if strict and not f.nullable and col.null_count:
        msg = f"{what}: column {f.name!r} is not nullable but has {col.null_count} NULL value(s)"
        raise error(msg)
    inner = _null_in_required(col, f.type, f.name) if strict and _has_required_inside(f.type) else None
    if inner is not None:
        msg = f"{what}: {inner!r} (in column {f.name!r}, of type {f.type}) is not nullable but holds NULL value(s)"
        raise error(msg)
    return col


def _is_text(t: pa.DataType, _: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _is_text(t.value_type, _)
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _changed_by_cast(before: pa.ChunkedArray, after: pa.ChunkedArray) -> str | None:
    """Why a cast pyarrow's safe mode lets through changed values (None: it did not):
    floats out of a narrower float's range become infinite; floats into decimals are rounded;
    timestamps into dates lose their time of day.

    Example:
        >>> x = pa.chunked_array([[1.5, 1e300]])
        >>> _changed_by_cast(x, x.cast(pa.float32()))
        '1 value(s) out of its range (e.g. 1e+300)'
        >>> _changed_by_cast(pa.chunked_array([[1.25]]), pa.chunked_array([[1.25]]).cast(pa.decimal128(10, 1)))
        '1 value(s) would be rounded (e.g. 1.25)'
    """
    src, dst = before.type, after.type
    if pa.types.is_timestamp(src) and pa.types.is_date(dst):  # the time of day would be dropped
        bad = pc.not_equal(after.cast(src), before)
        why = "would lose their time of day"
        return _count_of(before, bad, why)
    if not pa.types.is_floating(src):
        return None
    if pa.types.is_floating(dst):
        bad = pc.and_(pc.is_finite(before), pc.invert(pc.is_finite(after)))
        why = "out of its range"
    elif pa.types.is_decimal(dst):
        # moved by more than the source's own precision (float32 0.1 is 0.10; 1.125 is not 1.13)
        wide = before.cast(pa.float64())
        eps = float(np.finfo(src.to_pandas_dtype()).eps)
        bad = pc.greater(pc.abs(pc.subtract(after.cast(pa.float64()), wide)), pc.multiply(pc.abs(wide), eps))
        why = "would be rounded"
    else:
        return None
    return _count_of(before, bad, why)


def _count_of(before: pa.ChunkedArray, bad: pa.ChunkedArray, why: str) -> str | None:
    count = pc.sum(pc.fill_null(bad, False).cast(pa.int64())).as_py() or 0
    if not count:
        return None
    example = before.filter(pc.fill_null(bad, False))[0].as_py()
    return f"{count} value(s) {why} (e.g. {example})"


def _has_required_inside(t: pa.DataType) -> bool:
    """Whether ``t`` holds a non-nullable list item or struct child, at any depth."""
    if is_list_like(t):
        return not t.value_field.nullable or _has_required_inside(t.value_type)
    if pa.types.is_struct(t):
        return any(not c.nullable or _has_required_inside(c.type) for c in t)
    return False


def _null_in_required(col: pa.ChunkedArray | pa.Array, t: pa.DataType, path: str) -> str | None:
    """The path (``l[]``, ``s.a``) of a non-nullable list item or struct child of ``col`` holding a NULL where
    its parent is not NULL (pyarrow's cast does not check them; Lance's writer fails on them
    after other regions were written).

    Example:
        >>> t = pa.list_(pa.field("item", pa.int64(), nullable=False))
        >>> _null_in_required(pa.array([[1], None, [2, None]]), t, "l")
        'l[]'
    """
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    for chunk in chunks:
        if is_list_like(t):
            items = pc.list_flatten(chunk)  # the items of lists that are not NULL
            if not t.value_field.nullable and items.null_count:
                return f"{path}[]"
            found = _null_in_required(items, t.value_type, f"{path}[]")
        elif pa.types.is_struct(t):
            assert isinstance(chunk, pa.StructArray)
            valid = chunk.is_valid()
            found = None
            for i, child in enumerate(t):
                values = chunk.field(i).filter(valid)
                if not child.nullable and values.null_count:
                    return f"{path}.{child.name}"
                found = found or _null_in_required(values, child.type, f"{path}.{child.name}")
        else:
            return None
        if found is not None:
            return found
    return None
