"""Arrow values Python cannot hold exactly, as text, for the text outputs (JSON, CSV, tables).

pyarrow gives a ``time64[ns]`` value as a ``datetime.time``, cutting its nanoseconds without a
word, and a duration as a ``timedelta`` (microseconds; pandas' ``Timedelta`` rounds too when
turned into seconds), or fails on one too long for it. :func:`exact_values` writes such values,
at any depth (lists, structs, maps), as text before Python sees them: a duration as ISO 8601
(``PT0.000000001S``, ``-PT90S``), a time of day with nanoseconds as Arrow writes it
(``23:59:59.999999999``).

Example:
    >>> import pyarrow as pa
    >>> exact_values(pa.array([1, -1_500_000_000, None], pa.duration("ns"))).to_pylist()
    ['PT0.000000001S', '-PT1.5S', None]
    >>> exact_values(pa.array([[86_399_999_999_999]], pa.list_(pa.time64("ns")))).to_pylist()
    [['23:59:59.999999999']]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["exact_values", "needs_text"]

_T = pa.types
_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def needs_text(t: pa.DataType) -> bool:
    """Whether ``t`` holds (at any depth) a duration or a time of day in nanoseconds."""
    if _T.is_duration(t) or (_T.is_time64(t) and t.unit == "ns"):
        return True
    if _T.is_dictionary(t):
        return needs_text(t.value_type)
    if _T.is_list(t) or _T.is_large_list(t) or _T.is_fixed_size_list(t):
        return needs_text(t.value_type)
    if _T.is_map(t):
        return needs_text(t.key_type) or needs_text(t.item_type)
    if _T.is_struct(t):
        return any(needs_text(f.type) for f in t)
    return False


def _iso(count: int | None, digits: int) -> str | None:
    if count is None:
        return None
    sign = "-" if count < 0 else ""
    whole, frac = divmod(abs(count), 10**digits)
    fraction = f".{frac:0{digits}d}".rstrip("0").rstrip(".") if digits else ""
    return f"{sign}PT{whole}{fraction}S"


def exact_values(arr: pa.Array) -> pa.Array:
    """``arr`` with its durations and nanosecond times of day as text (see the module docs)."""
    t = arr.type
    if not needs_text(t):
        return arr
    if _T.is_nested(t) or _T.is_dictionary(t):  # children below are read whole: a slice is copied out
        arr = arr.take(pa.array(np.arange(len(arr), dtype=np.int64)))
    mask = arr.is_null() if arr.null_count else None
    if _T.is_dictionary(t):
        return exact_values(arr.dictionary_decode())
    if _T.is_duration(t):
        return pa.array([_iso(v, _DIGITS[t.unit]) for v in arr.cast(pa.int64()).to_pylist()], pa.string())
    if _T.is_time64(t):
        return pc.cast(arr, pa.string())
    if _T.is_fixed_size_list(t):
        return pa.FixedSizeListArray.from_arrays(exact_values(arr.values), t.list_size, mask=mask)
    if _T.is_list(t) or _T.is_large_list(t):
        return type(arr).from_arrays(arr.offsets, exact_values(arr.values), mask=mask)
    if _T.is_map(t):
        return pa.MapArray.from_arrays(arr.offsets, exact_values(arr.keys), exact_values(arr.items), mask=mask)
    children = [exact_values(arr.field(i)) for i in range(t.num_fields)]
    return pa.StructArray.from_arrays(children, names=[f.name for f in t], mask=mask)
