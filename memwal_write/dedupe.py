"""Newest row per key, in Arrow (nothing Spark-specific): streaming and whole-table.

Used by the Spark write tasks (streaming over key-sorted batches) and the driver path
(one whole table). Rows of one key are either equal (any one may stay), ordered by an
``order_by`` column (the largest wins), or refused as ambiguous.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.scratch import scratch
from memwal_query.regionspec.spec import equal_next

__all__ = ["Dedup", "numeric_key_order"]


# -- in-task dedup ----------------------------------------------------------------------------
@dataclass
class Dedup:
    """Keeps the newest row of each key from key-sorted batches (streaming)."""

    key: tuple[str, ...]
    order_by: str | None
    strict: bool
    uri: str
    dropped: int = 0
    _pending: list[pa.Table] = field(default_factory=list)

    def push(self, table: pa.Table) -> pa.Table | None:
        """Add rows; return the rows whose key is complete (all but the last key run)."""
        t = pa.concat_tables([*self._pending, table]) if self._pending else table
        self._pending = []
        if t.num_rows == 0:
            return None
        same = self._same_key(t)
        boundaries = np.flatnonzero(~same)
        start = int(boundaries[-1]) + 1 if boundaries.size else 0
        self._pending = [t.slice(start)]
        return self._resolve(t.slice(0, start), same[: max(start - 1, 0)]) if start else None

    def finish(self) -> pa.Table | None:
        """The rows still held back."""
        if not self._pending:
            return None
        t = pa.concat_tables(self._pending)
        self._pending = []
        return self._resolve(t, self._same_key(t)) if t.num_rows else None

    def _same_key(self, t: pa.Table) -> np.ndarray:
        same = np.ones(max(t.num_rows - 1, 0), dtype=bool)
        for k in self.key:
            same &= equal_next(t.column(k))
        return same

    def _duplicates(
        self, t: pa.Table, same: np.ndarray, order_col: str | None, rows: Callable[[np.ndarray], pa.Table]
    ) -> np.ndarray:
        """Positions of key-sorted ``t`` superseded by the next row (the newest row of a
        key is the last); ambiguous duplicates are refused. ``rows(positions)``: the whole
        rows there (tied duplicates must be equal)."""
        dup = np.flatnonzero(same)
        if self.strict and dup.size:
            ties = dup
            if order_col is not None:
                ties = dup[equal_next(t.column(order_col))[dup]]
            if ties.size:
                for a, b in zip(rows(ties).to_pylist(), rows(ties + 1).to_pylist(), strict=True):
                    if not _same_value(a, b):
                        key = {k: a[k] for k in self.key}
                        why = f"with the same {self.order_by!r} value" if self.order_by else "and no order_by= column"
                        msg = (
                            f"write to {self.uri}: key {key} appears more than once with different values {why}; "
                            "deduplicate the input or pass order_by= (the newest row per key wins)"
                        )
                        raise InvalidArgumentError(msg)
        self.dropped += int(dup.size)
        return dup

    def _resolve(self, t: pa.Table, same: np.ndarray) -> pa.Table:
        if not same.any():
            return t
        dup = self._duplicates(t, same, self.order_by, lambda pos: t.take(pa.array(pos)))
        keep = np.ones(t.num_rows, dtype=bool)
        keep[dup] = False
        return t.filter(pa.array(keep))

    def newest_order(self, table: pa.Table) -> pa.Array:
        """Row indices of ``table`` in key order, the newest row of each key only.

        The whole-table form of :meth:`push` / :meth:`finish` (same rules): only the key
        and ``order_by`` columns are sorted and compared; the rows are not copied.
        """
        keys = [(k, "ascending") for k in self.key]
        small = table.select(list(self.key))
        order_col = None
        if self.order_by is not None:
            # NULL order_by values sort first (the oldest), as Spark's ascending sort puts them
            order_col, valid = scratch("__order", self.key), scratch("__valid", self.key)
            small = small.append_column(valid, pc.is_valid(table.column(self.order_by)))
            small = small.append_column(order_col, table.column(self.order_by))
            keys += [(valid, "ascending"), (order_col, "ascending")]
        order = numeric_key_order(small) if order_col is None else None
        if order is None:
            order = pc.sort_indices(small, sort_keys=keys)
        if table.num_rows < 2:
            return order
        ordered = small.take(order)
        same = self._same_key(ordered)
        if not same.any():
            return order
        dup = self._duplicates(ordered, same, order_col, lambda pos: table.take(order.take(pa.array(pos))))
        keep = np.ones(table.num_rows, dtype=bool)
        keep[dup] = False
        return order.filter(pa.array(keep))


def numeric_key_order(keys: pa.Table) -> pa.Array | None:
    """Row order sorting one numeric key column without NULLs (numpy's ``argsort``:
    2-15x faster than Arrow's ``sort_indices`` on 2M int64 keys); ``None`` for other keys.

    The sort need not be stable: rows with equal keys are either equal (any one may
    stay) or refused as ambiguous, whatever their order.
    """
    if keys.num_columns != 1:
        return None
    col = keys.column(0)
    t = col.type
    if col.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)):
        return None
    if pa.types.is_float16(t) or pa.types.is_interval(t):
        return None
    values = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pa.array(np.argsort(values.to_numpy(zero_copy_only=False)), pa.int64())


def _same_value(a: object, b: object) -> bool:
    """``a == b`` where a NaN equals a NaN (an exact duplicate row holding NaN is a duplicate).

    Example:
        >>> _same_value({"x": float("nan"), "l": [1.0, float("nan")]}, {"x": float("nan"), "l": [1.0, float("nan")]})
        True
    """
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b
