"""Lookup keys as the user gives them, as a table of the primary-key columns.

A key finds a row only if it *is* that row's key: a value of another kind (the string ``'03'``
for an integer key, ``True``, a timestamp, a float for a string key) or one that would change
on the way (``3.5``, ``Decimal('3.5')``, ``Fraction(7, 2)`` for an integer key) is refused with
:class:`~memwal_query.errors.InvalidArgumentError`, whatever shape it comes in (scalars,
lists, numpy, pyarrow arrays, tables, struct arrays, dicts of columns, lists of dicts). Arrow's
``cast`` alone checks overflow and truncation, not kinds: ``pa.array(['03']).cast(pa.int64())``
is 3.

Example:
    >>> import pyarrow as pa
    >>> schema = pa.schema([("id", pa.int64())])
    >>> normalize_keys([3, 1, 3], schema, ["id"]).column("id").to_pylist()
    [3, 1]
    >>> normalize_keys(pa.array(["03"]), schema, ["id"])
    Traceback (most recent call last):
    ...
    memwal_query.errors.InvalidArgumentError: lookup key column 'id' of type string cannot be compared with int64
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.scratch import scratch

__all__ = ["normalize_keys"]

_NOT_FIT = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError, ValueError)


def _key_array(values: list[Any], typ: pa.DataType) -> pa.Array:
    """``values`` as an array of ``typ``; a value of another kind, or one that would change
    (1.5 as an integer), raises."""
    if any(isinstance(v, pa.Scalar) for v in values):  # pa.scalar(5): its value, if of the key's kind
        odd = next((v for v in values if isinstance(v, pa.Scalar) and not _same_kind(v.type, typ)), None)
        if odd is not None:
            raise TypeError(f"{odd!r:.40} is of type {odd.type}")
        values = [v.as_py() if isinstance(v, pa.Scalar) else v for v in values]
    if pa.types.is_integer(typ):
        for v in values:  # pyarrow takes anything int() takes (Fraction(7, 2), a pandas Series)
            if v is not None and (
                isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer | float | np.floating | Decimal)
            ):
                raise TypeError(f"{v!r:.40} is not an integer")
    arr = pa.array(values, typ)
    floats = [v for v in values if isinstance(v, float | np.floating)]
    if floats and not pa.types.is_floating(typ):
        pa.array(floats).cast(typ)  # safe cast: ArrowInvalid on truncation (1.5 was key 1)
    fractions = [v for v in values if isinstance(v, Decimal)]  # Decimal("3.5") was key 3
    if fractions and (pa.types.is_integer(typ) or pa.types.is_decimal(typ)):
        pa.array(fractions).cast(typ)
    return arr


def _same_kind(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether a column of ``src`` may be cast to the key type ``dst`` (values then checked)."""
    if pa.types.is_dictionary(src):
        src = src.value_type
    if src == dst or pa.types.is_null(src):
        return True
    if pa.types.is_integer(dst):
        return bool(pa.types.is_integer(src) or pa.types.is_floating(src) or pa.types.is_decimal(src))
    texts = (
        pa.types.is_string,
        pa.types.is_large_string,
        pa.types.is_string_view,
        pa.types.is_binary,
        pa.types.is_large_binary,
        pa.types.is_binary_view,
    )
    if pa.types.is_string(dst) or pa.types.is_large_string(dst):
        return any(t(src) for t in texts)
    if pa.types.is_binary(dst) or pa.types.is_large_binary(dst) or pa.types.is_fixed_size_binary(dst):
        return any(t(src) for t in texts) or bool(pa.types.is_fixed_size_binary(src))
    return not pa.types.is_boolean(dst)  # a bool key takes bools only


def _listlike(value: object) -> bool:
    return isinstance(value, (list, tuple, np.ndarray, pa.Array, pa.ChunkedArray))


def _from_dicts(keys: Sequence[dict[str, Any]], types: dict[str, pa.DataType]) -> pa.Table:
    """One dict per key (SQL's ``[named_struct('k', 2, 'name', 'b'), ...]``), each with the same names."""
    names = set(keys[0])
    odd = next((d for d in keys if set(d) != names), None)
    if odd is not None:  # from_pylist takes the first dict's names: another's key part would be NULL
        msg = f"lookup keys as dicts must all name the same columns: {sorted(names)} and {sorted(odd)}"
        raise InvalidArgumentError(msg)
    # key columns only (others are not compared); a missing one is named by normalize_keys
    return pa.table({k: _checked([d[k] for d in keys], k, t) for k, t in types.items() if k in names})


def _checked(values: list[Any], name: str, typ: pa.DataType) -> pa.Array:
    try:
        return _key_array(values, typ)
    except _NOT_FIT as err:
        msg = f"lookup keys {values[:5]!r} do not fit the key column {name!r} of type {typ}: {err}"
        raise InvalidArgumentError(msg) from err


def _as_table(keys: Any, types: dict[str, pa.DataType]) -> pa.Table:
    """``keys`` in any accepted shape as a table (columns not yet cast)."""
    pk = list(types)
    if isinstance(keys, pa.Table):
        return keys
    if isinstance(keys, dict):  # of columns, or of one key's parts
        cols = {
            k: _checked(list(v) if isinstance(v, list | tuple) else [v], k, types[k])
            if k in types and not isinstance(v, np.ndarray | pa.Array | pa.ChunkedArray)
            else (v if _listlike(v) else [v])
            for k, v in keys.items()
        }
        try:
            return pa.table(cols)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as err:
            msg = f"lookup keys as a dict take a column of values per key column, got {keys!r:.80}: {err}"
            raise InvalidArgumentError(msg) from err
    if isinstance(keys, pa.StructArray):
        return pa.Table.from_struct_array(keys)
    if isinstance(keys, (list, tuple)) and keys and all(isinstance(k, dict) for k in keys):
        return _from_dicts(list(keys), types)
    if len(pk) != 1:
        msg = (
            f"the key has columns {pk}: pass a struct array, table, dict of columns or list of "
            "dicts (in SQL: [named_struct(...), ...])"
        )
        raise InvalidArgumentError(msg)
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return pa.table({pk[0]: keys})
    if isinstance(keys, np.ndarray) and keys.ndim == 0:
        keys = keys.item()
    values = list(keys) if isinstance(keys, (list, tuple, set, np.ndarray)) else [keys]
    return pa.table({pk[0]: _checked(values, pk[0], types[pk[0]])})


def normalize_keys(keys: Any, schema: pa.Schema, pk: Sequence[str]) -> pa.Table:
    """Keys as a table of the primary-key columns, cast to their types, deduplicated; keys
    with a NULL part are left out (they name no row).

    Accepts a scalar or list (single-column keys), a pyarrow Array / ChunkedArray,
    a StructArray, pyarrow Table, dict of columns or list of dicts (composite keys).

    Raises:
        InvalidArgumentError: Wrong columns, or values that do not fit the key type.
    """
    types = {k: schema.field(k).type for k in pk}
    table = _as_table(keys, types)
    missing = [k for k in pk if k not in table.column_names]
    if missing:
        msg = f"lookup keys lack key column(s) {missing} (key: {list(pk)})"
        raise InvalidArgumentError(msg)
    cols = {}
    for k in pk:
        if table.column_names.count(k) > 1:
            raise InvalidArgumentError(f"lookup keys name the key column {k!r} more than once")
        col = table.column(k)
        if col.type != types[k]:
            if not _same_kind(col.type, types[k]):
                raise InvalidArgumentError(
                    f"lookup key column {k!r} of type {col.type} cannot be compared with {types[k]}"
                )
            try:
                col = col.cast(types[k])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                msg = f"lookup key column {k!r} of type {col.type} cannot be compared with {types[k]}: {err}"
                raise InvalidArgumentError(msg) from err
        cols[k] = col
    out = pa.table(cols)
    for k in pk:  # a key with a NULL part names no row (key columns hold no NULLs)
        if out.column(k).null_count:
            out = out.filter(pc.is_valid(out.column(k)))
    if out.num_rows > 1:  # each key once, where it first appears
        i = scratch("_i", pk, ["_min"])
        numbered = out.append_column(i, pa.array(np.arange(out.num_rows, dtype=np.int64)))
        first = numbered.group_by(list(pk), use_threads=False).aggregate([(i, "min")])
        out = first.sort_by(f"{i}_min").select(list(pk))
    return out
