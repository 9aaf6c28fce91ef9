"""Whether data of one Arrow type may be stored in a column of another: the same kind of value.

Arrow's ``cast`` checks overflow and truncation, not kinds: ``pa.array(["12"]).cast(pa.int64())``
is 12, ``True`` is 1.0, ``5`` is ``"5"``, ``"2024-01-01"`` a timestamp. A write that relied on
that would store values of another kind than the ones given, without a word. Kinds here:
booleans; numbers (integers, floats, decimals); text and bytes; dates and timestamps; times of
day; durations; lists (by their items), structs (by their fields, matched by name) and maps. A
NULL-typed column fits anything; a dictionary is its values, an extension type its storage; a
type of none of these kinds is left to Arrow's cast.

Example:
    >>> import pyarrow as pa
    >>> kind_change(pa.int32(), pa.float64(), "x") is None
    True
    >>> kind_change(pa.list_(pa.string()), pa.list_(pa.int64()), "tags")
    "'tags[]' holds string values, the table int64"
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["kind_change"]

_T = pa.types
_KINDS = (
    ("bool", (_T.is_boolean,)),
    ("number", (_T.is_integer, _T.is_floating, _T.is_decimal)),
    (
        "bytes",
        (
            _T.is_string,
            _T.is_large_string,
            _T.is_string_view,
            _T.is_binary,
            _T.is_large_binary,
            _T.is_binary_view,
            _T.is_fixed_size_binary,
        ),
    ),
    ("instant", (_T.is_timestamp, _T.is_date)),
    ("time of day", (_T.is_time,)),
    ("duration", (_T.is_duration,)),
    ("list", (_T.is_list, _T.is_large_list, _T.is_fixed_size_list)),
    ("struct", (_T.is_struct,)),
    ("map", (_T.is_map,)),
)


def _plain(t: pa.DataType) -> pa.DataType:
    """A dictionary as its values, an extension type (``uuid``, a tensor) as its storage."""
    while True:
        if _T.is_dictionary(t):
            t = t.value_type
        elif isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        else:
            return t


def _kind(t: pa.DataType) -> str | None:
    return next((name for name, tests in _KINDS if any(test(t) for test in tests)), None)


def kind_change(src: pa.DataType, dst: pa.DataType, path: str) -> str | None:
    """Where values of type ``src`` would become another kind of value as ``dst`` (the path of
    the first such column or nested field, ``path[]`` for list items, ``path.f`` for struct
    fields, and both types); None when they keep their kind."""
    src, dst = _plain(src), _plain(dst)
    if src == dst or _T.is_null(src):
        return None
    kind, want = _kind(src), _kind(dst)
    if kind is None or want is None:  # a type not sorted here: Arrow's cast decides
        return None
    if kind != want:
        return f"{path!r} holds {src} values, the table {dst}"
    if kind == "list":
        return kind_change(src.value_type, dst.value_type, f"{path}[]")
    if kind == "struct":
        fields = {f.name: f.type for f in dst}
        found = (kind_change(f.type, fields[f.name], f"{path}.{f.name}") for f in src if f.name in fields)
        return next((x for x in found if x is not None), None)
    if kind == "map":
        return kind_change(src.key_type, dst.key_type, f"{path}{{key}}") or kind_change(
            src.item_type, dst.item_type, f"{path}{{value}}"
        )
    return None
