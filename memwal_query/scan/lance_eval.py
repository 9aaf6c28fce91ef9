"""Rows held in memory, filtered by Lance: one engine's answer for every source.

A scan pushes its filter into each source. Lance evaluates it (through DataFusion) for the
base and the generations it reads; rows memwal holds in memory (MemTables, small sources
packed together) are filtered by pyarrow, which answers as DataFusion only for the filters
:func:`memwal_query.planner.nan_order.reads_whole` reads (comparisons, AND/OR/NOT, IS NULL,
IN lists). Any other pyarrow expression a user gives (``if_else``, arithmetic, functions)
may answer differently there: a NaN compares as the largest number in DataFusion and as
nothing in pyarrow, a NULL condition takes ``CASE``'s ELSE branch but makes ``if_else``
NULL. :func:`lance_filtered` runs such a filter over in-memory rows through Lance too.

A NaN with its sign bit set (what ``0/0``, ``inf - inf`` give on x86, in numpy and pyarrow)
is the smallest value of all to Lance and DataFusion, which order floats by IEEE 754's total
order, and not equal to ``'NaN'``; the rewrite of :mod:`memwal_query.planner.nan_order`
cannot tell one NaN from the other (no pyarrow kernel reads a NaN's sign).
:func:`memory_filtered` filters rows held in memory with pyarrow unless a float column the
filter names holds such a NaN: then Lance filters them, with the user's filter as given.

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> rows = pa.table({"f": [float("nan"), 0.5]})
    >>> rows.filter(pc.if_else(pc.field("f") > 1, True, False)).num_rows  # pyarrow: NaN > 1 is false
    0
    >>> lance_filtered(rows, pc.if_else(pc.field("f") > 1, True, False)).column("f").to_pylist()
    [nan]
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.format.row_address import LANCE_ROW_COLUMNS
from memwal_query.format.scratch import scratch
from memwal_query.planner.lance_filter import for_lance, lance_scanner
from memwal_query.planner.nan_order import as_given
from memwal_query.scan.filters import filter_columns

__all__ = ["NegativeNans", "lance_filtered", "memory_dataset", "memory_filtered", "negative_nan"]


def memory_dataset(table: pa.Table) -> lance.LanceDataset:
    """An in-memory Lance dataset of ``table`` (MemTable rows, rows to filter)."""
    return lance.write_dataset(table, f"memory://memwal-{uuid.uuid4().hex}")


def lance_filtered(table: pa.Table, filt: pc.Expression | str, otherwise: pc.Expression | None = None) -> pa.Table:
    """The rows of ``table`` that Lance keeps for ``filt``; pyarrow's answer (to ``otherwise``,
    ``filt`` by default) where Lance cannot hold these rows (a type its writer refuses) or
    refuses the filter (as a base scan then filters each fragment's rows with pyarrow)."""
    if table.num_rows == 0:
        return table
    try:
        return lance_scanner(memory_dataset(table), filt).to_table()
    except (ValueError, OSError, RuntimeError, pa.ArrowException):
        return table.filter(filt if otherwise is None else otherwise)


def memory_filtered(
    rows: pa.Table, filt: pc.Expression, holds_negative_nan: Callable[[str], bool] | None = None
) -> pa.Table:
    """``rows.filter(filt)`` for a filter :func:`~memwal_query.planner.nan_order.nan_ordered`
    rewrote: by Lance (the filter as the user gave it) where a float column it names holds a
    NaN with its sign bit set, which only Lance orders as DataFusion does, or is a float16
    (pyarrow compares none; Lance gets them as float32, the same values).

    Args:
        rows: Rows held in memory.
        filt: The rewritten filter.
        holds_negative_nan: Whether a column of ``rows`` (by name) may hold such a NaN, as
            the source holding them remembers it (a pass over the column otherwise).

    Example:
        >>> import math
        >>> from memwal_query.planner.nan_order import nan_ordered
        >>> rows = pa.table({"f": [math.copysign(math.nan, -1.0), 2.0]})
        >>> memory_filtered(rows, nan_ordered(pc.field("f") > 1, rows.schema)).column("f").to_pylist()
        [2.0]
    """
    text = str(filt)
    floats = [f for f in rows.schema if pa.types.is_floating(f.type) and f.name in text]
    holds = holds_negative_nan or (lambda name: negative_nan(rows.column(name)))
    half = any(pa.types.is_float16(f.type) for f in floats)  # pyarrow has no float16 comparison
    if not half and not any(holds(f.name) for f in floats):
        return rows.filter(filt)
    given = as_given(filt)
    used = filter_columns(given, rows.column_names)  # Lance holds no `_rowaddr` column: only these
    # not read (a bare boolean column in it): every column Lance can hold (with `_rowaddr` the
    # write failed, and pyarrow's answer, which puts a sign-bit NaN above every number, was used)
    names = [c for c in rows.column_names if (c in used if used is not None else c not in LANCE_ROW_COLUMNS)]
    at = scratch("_at", rows.column_names)
    probe = rows.select(names)
    lance_filter = for_lance(given, probe.schema)  # by the column types as stored (SQL for a float16)
    probe = _float16_widened(probe).append_column(at, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    kept = lance_filtered(probe, lance_filter, otherwise=filt).column(at).to_numpy()
    return rows.take(pa.array(np.sort(kept)))


def _float16_widened(rows: pa.Table) -> pa.Table:
    """``rows`` with float16 columns as float32 (the same values, NaN signs kept): Lance
    refuses a literal such as ``'NaN'`` compared with a float16 column."""
    for i, f in enumerate(rows.schema):
        if pa.types.is_float16(f.type):
            rows = rows.set_column(i, f.with_type(pa.float32()), rows.column(i).cast(pa.float32()))
    return rows


def negative_nan(column: pa.ChunkedArray | pa.Array) -> bool:
    """Whether a float ``column`` holds a NaN with its sign bit set (one pass over it).

    Example:
        >>> import math
        >>> negative_nan(pa.array([1.0, math.nan])), negative_nan(pa.array([math.copysign(math.nan, -1.0)]))
        (False, True)
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    for chunk in chunks:
        values = chunk.to_numpy(zero_copy_only=False)  # a NULL: a (positive) NaN in the copy
        nan = np.isnan(values)
        if nan.any() and np.signbit(values[nan]).any():
            return True
    return False


class NegativeNans:
    """Which float columns of rows that never change (a MemTable) hold a NaN with its sign
    bit set: one pass per column, remembered (a query filters them again and again)."""

    def __init__(self, rows: pa.Table) -> None:
        self._rows = rows
        self._known: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        found = self._known.get(name)
        if found is None:
            found = self._known[name] = negative_nan(self._rows.column(name))
        return found
