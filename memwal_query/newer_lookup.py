"""Which keys of base rows have a version in a newer level, for integer and other keys.

The newer levels' keys (``merge.NewerKeys``, as :class:`KeySet`) are asked about a base
fragment's keys: integer keys are looked up in a table over the newer keys' span when it is
small enough (:class:`KeyTable`: one gather per key, a byte or a bit per value of the span);
otherwise key-sorted fragments search the sorted newer keys and unsorted ones hash them
(:class:`NewerLookup`).

Example:
    >>> import numpy as np
    >>> t = KeyTable.of(np.array([3, 5, 9]))
    >>> t.hits(np.array([1, 3, 5, 8, 9, 10])).tolist()
    [False, True, True, False, True, False]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.mask_delta import sorted_hits

__all__ = ["BITMAP_MAX_SPAN", "DENSE_MAX_SPAN", "KeySet", "KeyTable", "NewerLookup"]


class KeySet(Protocol):
    """The newer levels' keys (``merge.NewerKeys``) as the mask needs them."""

    def __len__(self) -> int: ...

    def contains(self, keys: pa.Table) -> np.ndarray: ...

    def sorted_numeric(self) -> np.ndarray | None: ...


_DENSE_CHUNK = 1 << 16
DENSE_MAX_SPAN = 1 << 25
"""Largest key span (max - min + 1 of the newer keys) held as a table of one byte per key value."""
BITMAP_MAX_SPAN = 1 << 28
"""Largest key span held as a bitmap (one bit per key value, 32 MiB at most): wider spans
(and spans over 2,048 values per newer key) search the sorted newer keys instead."""


@dataclass(frozen=True)
class KeyTable:
    """Membership of integer keys in the newer keys, by one gather per key.

    ``table[k - lo]`` is true for the newer keys: one byte per value of their span, or one
    bit per value (``packed``) when the span is too wide for bytes. Order-independent: a
    base fragment whose keys are not sorted costs the same as a sorted one (an ``argsort``
    of 10M keys takes ~2 s, the gather ~20 ms).
    """

    lo: int
    table: np.ndarray
    packed: bool

    @staticmethod
    def of(newer: np.ndarray) -> KeyTable | None:
        """The table of the sorted, unique integer keys ``newer``; None when their span is too
        wide or too sparse to be worth one (a sparse span costs more to allocate than searching)."""
        if not newer.size or newer.dtype.kind not in "iu":
            return None
        lo, hi = int(newer[0]), int(newer[-1])
        span = hi - lo + 1
        if abs(lo) >= 1 << 62 or abs(hi) >= 1 << 62:
            return None
        offsets = newer.astype(np.int64) - np.int64(lo)
        if span <= DENSE_MAX_SPAN and span <= 256 * newer.size:
            table = np.zeros(span, dtype=bool)
            table[offsets] = True
            return KeyTable(lo, table, packed=False)
        if span <= BITMAP_MAX_SPAN and span <= 2048 * newer.size:
            bits = np.zeros((span + 7) // 8, dtype=np.uint8)
            np.bitwise_or.at(bits, offsets >> 3, np.left_shift(1, offsets & 7).astype(np.uint8))
            return KeyTable(lo, bits, packed=True)
        return None

    @property
    def span(self) -> int:
        """Key values the table covers."""
        return self.table.size * 8 if self.packed else self.table.size

    def hits(self, k: np.ndarray) -> np.ndarray:
        """Boolean per integer key of ``k`` (any order, the newer keys' dtype): whether it is a newer key."""
        out = np.empty(k.size, dtype=bool)
        off = np.empty(min(k.size, _DENSE_CHUNK), dtype=np.int64)
        span = np.uint64(self.span)
        # uint64 keys subtract in uint64 (keys below lo wrap to huge): uint64 - int64 would
        # compute in float64, which rounds keys over 2^53 to a neighbour's offset
        lo = np.uint64(self.lo) if k.dtype == np.uint64 else np.int64(self.lo)
        for at in range(0, k.size, _DENSE_CHUNK):  # chunks that stay in cache
            part = k[at : at + _DENSE_CHUNK]
            o = off[: part.size]
            np.subtract(part, lo, out=o.view(np.uint64) if k.dtype == np.uint64 else o, casting="unsafe")
            hit = out[at : at + part.size]
            inside = o.view(np.uint64) < span  # negatives wrap to huge
            if self.packed:
                np.clip(o, 0, self.span - 1, out=o)
                hit[:] = (self.table[o >> 3] >> (o & 7).astype(np.uint8)) & np.uint8(1)
            else:
                np.take(self.table, o, mode="clip", out=hit)
            hit &= inside
        return out


class NewerLookup:
    """Which keys of a base fragment's key columns have a newer version: the integer table over
    the newer keys' span (:class:`KeyTable`, built on first use), else a search of the sorted
    newer keys or a hash of them (thread-safe)."""

    def __init__(self, newer: KeySet, primary_key: Sequence[str]) -> None:
        self.newer = newer
        self.key = primary_key[0]
        self._table: KeyTable | None = None
        self._table_built = False
        self._lock = threading.Lock()

    def positions(self, keys: pa.Table) -> np.ndarray:
        """Positions (ascending) of the rows of key columns ``keys`` whose key has a newer version."""
        numeric = self.newer.sorted_numeric()
        col = keys.column(self.key)
        if numeric is None or not keys.num_rows or col.null_count:
            return np.flatnonzero(np.asarray(self.newer.contains(keys), dtype=bool))
        hits = self._table_hits(col, numeric.dtype)
        if hits is not None:
            return np.flatnonzero(hits)
        k = np.asarray(col.to_numpy(), dtype=numeric.dtype)
        if bool(np.all(k[1:] >= k[:-1])):
            return sorted_hits(k, numeric)
        # unsorted keys over a wide span: a hash lookup (5x faster than sorting 10M keys)
        hit = pc.is_in(pa.array(k), value_set=pa.array(numeric))
        return np.flatnonzero(hit.to_numpy(zero_copy_only=False))

    def mask(self, keys: pa.Table) -> np.ndarray:
        """Boolean per row of key columns ``keys``: whether a newer version of its key exists."""
        numeric = self.newer.sorted_numeric()
        col = keys.column(self.key)
        if numeric is None or not keys.num_rows or col.null_count:
            return np.asarray(self.newer.contains(keys), dtype=bool)
        hits = self._table_hits(col, numeric.dtype)
        if hits is not None:
            return hits
        hit = np.zeros(keys.num_rows, dtype=bool)
        hit[self.positions(keys)] = True
        return hit

    def _table_hits(self, col: pa.ChunkedArray, dtype: np.dtype) -> np.ndarray | None:
        """Boolean per key of ``col`` (no NULLs) from the key table, chunk by chunk (no copy
        of the keys: ``to_numpy`` of a chunked column concatenates); None without a table."""
        table = self.key_table()
        if table is None:
            return None
        parts = [table.hits(np.asarray(c.to_numpy(), dtype=dtype)) for c in col.chunks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @property
    def table_bytes(self) -> int:
        """Memory of the table over the newer keys' span (0 until built, or none was)."""
        return int(self._table.table.nbytes) if self._table is not None else 0

    def key_table(self) -> KeyTable | None:
        """The newer integer keys' membership table (built on first use; None when not worth one)."""
        if not self._table_built:
            with self._lock:
                if not self._table_built:
                    numeric = self.newer.sorted_numeric()
                    self._table = KeyTable.of(numeric) if numeric is not None else None
                    self._table_built = True
        return self._table
