"""Whole-array helpers of the scan: drop masks, fragment ranges, cache keys, chunks.

Example:
    >>> import numpy as np, pyarrow as pa
    >>> drop_mask(pa.array([1, 2, 3], pa.uint64()), np.array([2], dtype=np.uint64)).to_pylist()
    [True, False, True]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.snapshot.cache import fragment_cache_key

__all__ = [
    "drop_mask",
    "fragment_cache_key",
    "in_fragment",
    "one_chunk",
    "constant_filter",
    "zero_column_batches",
    "chain_first",
    "slice_sensitive",
    "unsliced",
]

COUNT_CHUNK = 1 << 20


def drop_mask(rowaddr: pa.Array | pa.ChunkedArray, drop: np.ndarray) -> pa.Array:
    """``True`` for rows whose address is *not* in the sorted ``drop`` array."""
    ra = np.asarray(rowaddr.to_numpy() if isinstance(rowaddr, pa.Array) else rowaddr.to_numpy(), dtype=np.uint64)
    if ra.size and bool(np.all(ra[1:] >= ra[:-1])):
        # Scans return a fragment's rows in address order: look up only the drops
        # inside this batch's address range (few), not every row (many).
        d = drop[np.searchsorted(drop, ra[0]) : np.searchsorted(drop, ra[-1], "right")]
        keep = np.ones(ra.size, dtype=bool)
        if d.size:
            pos = np.searchsorted(ra, d)
            ok = pos < ra.size
            pos, d = pos[ok], d[ok]
            keep[pos[ra[pos] == d]] = False
        return pa.array(keep)
    idx = np.searchsorted(drop, ra)
    idx[idx == drop.size] = 0
    return pa.array(drop[idx] != ra)


def constant_filter(filt: object) -> bool | None:
    """What a pushed filter DataFusion folded to a constant keeps: every row (True) or none
    (False: also a NULL, as in ``WHERE c IN (NULL)``); None for a filter over columns.

    Example:
        >>> import pyarrow as pa
        >>> constant_filter(pa.scalar(None, pa.bool_())), constant_filter(pa.scalar(True)), constant_filter(None)
        (False, True, None)
    """
    if filt is None or isinstance(filt, pc.Expression):
        return None
    value = filt.as_py() if isinstance(filt, pa.Scalar) else filt
    return bool(value)


def in_fragment(drop: np.ndarray, frag: lance.fragment.LanceFragment) -> np.ndarray:
    """The part of a sorted row-address list that falls in ``frag`` (addresses are fragment id << 32 | offset)."""
    lo = np.searchsorted(drop, np.uint64(frag.fragment_id << 32))
    hi = np.searchsorted(drop, np.uint64((frag.fragment_id + 1) << 32))
    return drop[lo:hi]


def one_chunk(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """``col`` as one contiguous chunk when it fits one Arrow array.

    Lance decodes ~8k-row chunks; kept columns are filtered by every later query, and
    each output chunk is one Python round trip into DataFusion: one chunk per fragment
    makes a filtered scan of a cached fragment one kernel call and a few batches.
    """
    if col.num_chunks <= 1:
        return col
    try:
        return pa.chunked_array([col.combine_chunks()], col.type)
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # e.g. > 2 GiB of string data
        return col


def zero_column_batches(n: int) -> Iterator[pa.RecordBatch]:
    """``n`` rows of no column (a ``count(*)``), in chunks."""
    while n > 0:
        k = min(n, COUNT_CHUNK)
        yield pa.record_batch({"_": pa.nulls(k)}).select([])
        n -= k


def chain_first(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``first``, then the rest of the batches."""
    yield first
    yield from rest


def slice_sensitive(t: pa.DataType) -> bool:
    """Whether ``t`` holds (at any depth) a struct with a struct field, or a fixed-size list
    of structs: types whose slices DataFusion cannot read (see :func:`unsliced`)."""
    if pa.types.is_struct(t):
        return any(pa.types.is_struct(f.type) or slice_sensitive(f.type) for f in t)
    if pa.types.is_fixed_size_list(t) and pa.types.is_struct(t.value_type):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return slice_sensitive(t.value_type)
    if pa.types.is_map(t):
        return slice_sensitive(t.key_type) or slice_sensitive(t.item_type)
    return False


def _offset_inside(arr: pa.Array) -> bool:
    if arr.offset:
        return True
    t = arr.type
    if pa.types.is_struct(t):
        return any(_offset_inside(arr.field(i)) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _offset_inside(arr.keys) or _offset_inside(arr.items)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _offset_inside(arr.values)
    return False


def unsliced(batch: pa.RecordBatch, columns: Sequence[int]) -> pa.RecordBatch:
    """``batch`` with those of ``columns`` (each of a :func:`slice_sensitive` type) that are
    slices somewhere inside copied whole.

    DataFusion's arrow-rs panics (``assertion failed: end <= self.len()``) on a slice of a
    longer array (what a cached column cut by a refreshed snapshot's drop list, or a
    MemTable in batches, is) of a struct with a struct field, also under a list, or of a
    fixed-size list of structs.

    Example:
        >>> s = pa.array([{"a": {"x": i}} for i in range(4)]).slice(1, 2)
        >>> b = unsliced(pa.record_batch([s], names=["s"]), [0])
        >>> b.column(0).offset, b.column(0).to_pylist()
        (0, [{'a': {'x': 1}}, {'a': {'x': 2}}])
    """
    arrays = list(batch.columns)
    changed = False
    for i in columns:
        if _offset_inside(arrays[i]):
            arrays[i] = pa.concat_arrays([arrays[i]])
            changed = True
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema) if changed else batch
