"""The rows whose primary key is one of a table of keys: a filter Lance runs, then an exact match.

Lance filters one key column exactly (``k IN (...)``, by its scalar index where there is one);
a composite key is filtered per column (a superset: each column in its values) and matched
exactly afterwards. Key types Substrait cannot carry (``uint64``, ``large_string``, ...) go to
Lance as SQL text (:func:`memwal_query.planner.lance_filter.for_lance`).

Example:
    >>> import lance, pyarrow as pa, tempfile
    >>> ds = lance.write_dataset(
    ...     pa.table({"a": pa.array([1, 1, 2], pa.uint64()), "b": ["x", "y", "x"], "v": [10, 11, 12]}),
    ...     tempfile.mkdtemp(),
    ... )
    >>> keys = pa.table({"a": pa.array([1, 2], pa.uint64()), "b": ["y", "y"]})
    >>> rows_of_keys(ds, keys, ["a", "b"]).column("v").to_pylist()  # (1, 'y') only: (2, 'y') is no row
    [11]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.format.scratch import scratch
from memwal_query.planner.lance_filter import expression_runs, for_lance

__all__ = ["key_filter", "lance_key_filter", "of_keys", "rows_of_keys"]


def key_filter(keys: pa.Table, pk: Sequence[str]) -> pc.Expression:
    """Each key column in its values: exact for one column, a superset for composite keys
    (refine with :func:`of_keys`)."""
    expr: pc.Expression | None = None
    for k in pk:
        e = pc.field(k).isin(pc.unique(keys.column(k)))
        expr = e if expr is None else expr & e
    assert expr is not None
    return expr


def lance_key_filter(keys: pa.Table, pk: Sequence[str], schema: pa.Schema) -> str | pc.Expression | None:
    """:func:`key_filter` in a form Lance runs over a dataset of ``schema`` (SQL text where it
    cannot filter by expression: key types, or another column of the dataset); None (read
    every row) when it cannot be written as SQL either."""
    out = for_lance(key_filter(keys, pk), schema)
    return None if isinstance(out, pc.Expression) and not expression_runs(out, schema) else out


def of_keys(rows: pa.Table, keys: pa.Table, pk: Sequence[str], exact: bool = True) -> pa.Table:
    """``rows`` whose key is one of ``keys``, in their order (``exact``: ``rows`` were filtered
    by :func:`key_filter`, so one key column needs nothing more).

    Joined on the key columns and a row number, then taken: a join carries every column of
    its left side, and Acero refuses list columns (vectors) that are not join keys."""
    if (len(pk) == 1 and exact) or rows.num_rows == 0:
        return rows
    at = scratch("_at", pk)
    numbered = rows.select(list(pk)).append_column(at, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hit = numbered.join(keys.select(list(pk)), keys=list(pk), join_type="left semi", use_threads=False)
    return rows.take(pa.array(np.sort(np.asarray(hit.column(at).to_numpy()))))


def rows_of_keys(ds: Any, keys: pa.Table, pk: Sequence[str], **read: Any) -> pa.Table:
    """The rows of Lance dataset ``ds`` whose key is one of ``keys`` (``read``: more
    ``to_table`` options, e.g. ``columns``, ``with_row_address``)."""
    filt = lance_key_filter(keys, pk, ds.schema)
    return of_keys(ds.to_table(filter=filt, **read), keys, pk, exact=filt is not None)
