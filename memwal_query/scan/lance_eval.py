"""Rows held in memory, filtered by Lance: one engine's answer for every source.

A scan pushes its filter into each source. Lance evaluates it (through DataFusion) for the
base and the generations it reads; rows memwal holds in memory (MemTables, small sources
packed together) are filtered by pyarrow, which answers as DataFusion only for the filters
:func:`memwal_query.planner.nan_order.reads_whole` reads (comparisons, AND/OR/NOT, IS NULL,
IN lists). Any other pyarrow expression a user gives (``if_else``, arithmetic, functions)
may answer differently there: a NaN compares as the largest number in DataFusion and as
nothing in pyarrow, a NULL condition takes ``CASE``'s ELSE branch but makes ``if_else``
NULL. :func:`lance_filtered` runs such a filter over in-memory rows through Lance too.

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

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.planner.lance_filter import for_lance

__all__ = ["lance_filtered", "memory_dataset"]


def memory_dataset(table: pa.Table) -> lance.LanceDataset:
    """An in-memory Lance dataset of ``table`` (MemTable rows, rows to filter)."""
    return lance.write_dataset(table, f"memory://memwal-{uuid.uuid4().hex}")


def lance_filtered(table: pa.Table, filt: pc.Expression) -> pa.Table:
    """The rows of ``table`` that Lance keeps for ``filt``; pyarrow's answer where Lance cannot
    hold these rows (a type its writer refuses) or refuses the filter (as a base scan then
    filters each fragment's rows with pyarrow)."""
    if table.num_rows == 0:
        return table
    try:
        return memory_dataset(table).to_table(filter=for_lance(filt, table.schema))
    except (ValueError, OSError, RuntimeError, pa.ArrowException):
        return table.filter(filt)
