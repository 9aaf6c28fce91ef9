"""Decoded columns of Lance fragments, kept per table lineage (the column cache).

Fragments are immutable, so a column of a fragment is decoded from Lance once and later
scans of any snapshot of the lineage filter it in memory (:class:`SnapshotCache`
``fragment_columns``); beyond :data:`RESIDENT_MAX_BYTES` scans read Lance. Per fragment
with superseded rows, the columns without them are kept too, per drop list
(:func:`survivor_entry`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import lance
import numpy as np
import pyarrow as pa

from memwal_query.errors import MemWalError
from memwal_query.mask_delta import absent, is_sorted
from memwal_query.scan.arrays import drop_mask, one_chunk
from memwal_query.scan.fragment import ScanContext
from memwal_query.scan.lance_eval import negative_nan
from memwal_query.snapshot.cache import SnapshotCache

__all__ = [
    "RESIDENT_MAX_BYTES",
    "cached_columns",
    "keep_while_streaming",
    "keeps_decoded",
    "negative_nan_of",
    "store_columns",
    "survivor_entry",
]

#: Decoded columns kept per table lineage (:class:`SnapshotCache`): fragments are
#: immutable, so a column of a fragment is decoded from Lance once and later scans of
#: any snapshot of the lineage filter it in memory. Beyond the budget, scans read Lance.
RESIDENT_MAX_BYTES = 512 << 20


def store_columns(cache: SnapshotCache, key: tuple[object, ...], add: dict[str, pa.ChunkedArray]) -> None:
    """Keep decoded columns of a fragment if they fit the budget (else: later scans read Lance)."""
    size = sum(a.nbytes for a in add.values())
    with cache.lock:
        if cache.resident_bytes + size > RESIDENT_MAX_BYTES:
            cache.over_budget.add(key)  # this scan uses what it decoded; later ones read Lance
            return
        stored = cache.fragment_columns.setdefault(key, {})
        known = stored.get("_rowaddr")
        if known is not None and "_rowaddr" in add and not known.equals(add["_rowaddr"]):
            return  # not the rows cached for this key (never seen): keep what is there
        cache.resident_bytes += sum(a.nbytes for c, a in add.items() if c not in stored)
        for c, a in add.items():
            stored.setdefault(c, a)


def cached_columns(
    cache: SnapshotCache,
    key: tuple[object, ...],
    fragment: lance.fragment.LanceFragment,
    names: list[str],
    decode: bool,
    gone: Callable[[BaseException], MemWalError],
    direct: Callable[[list[str]], pa.Table | None] | None = None,
) -> pa.Table | None:
    """Rows of ``fragment``'s columns ``names`` (and ``_rowaddr``) from the cache, the missing
    ones decoded and kept (``decode=False``: ``None`` unless all are cached already).

    Fragments never change (a new deletion file makes a new cache key), so their
    columns are kept in the table's :class:`SnapshotCache` (shared with refreshed
    snapshots, bounded by ``RESIDENT_MAX_BYTES``); ``LanceFragment.survivors`` applies the
    snapshot's drop list. A query then filters memory instead of decoding Lance pages.
    ``direct`` reads columns straight from the fragment's files (base fragments), or None.
    """
    with cache.lock:
        if key in cache.over_budget:
            return None
        entry = dict(cache.fragment_columns.get(key, {}))
    missing = [c for c in names if c not in entry]
    if (missing or "_rowaddr" not in entry) and not decode:
        return None
    if missing or "_rowaddr" not in entry:
        size = _decoded_bytes(fragment, missing) + (0 if "_rowaddr" in entry else 8 * fragment.physical_rows)
        with cache.lock:
            if cache.resident_bytes + size > RESIDENT_MAX_BYTES:
                cache.over_budget.add(key)  # it would not be kept: read Lance (filters pushed down) instead
                return None
        t = direct(missing) if direct is not None else None  # straight from the data file
        try:
            if t is None:
                t = fragment.to_table(columns=missing, with_row_address=True)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            raise gone(err) from err
        known = entry.get("_rowaddr")
        if known is not None and not known.equals(t.column("_rowaddr")):
            return None  # not the rows cached for this key: read Lance (never seen)
        add = {c: one_chunk(t.column(c)) for c in [*missing, "_rowaddr"] if c not in entry}
        entry.update(add)
        store_columns(cache, key, add)
    return pa.table({**{c: entry[c] for c in names}, "_rowaddr": entry["_rowaddr"]})


def _decoded_bytes(fragment: lance.fragment.LanceFragment, names: list[str]) -> int:
    """At least what decoding columns ``names`` of ``fragment`` takes (fixed-width types exactly)."""
    schema = fragment.schema
    width = sum(_fixed_width(schema.field(n).type) for n in names if n in schema.names)
    return width * int(fragment.physical_rows)


def _fixed_width(typ: pa.DataType) -> int:
    """Bytes per value of a fixed-width type (0: variable or unknown; counted after decoding)."""
    if pa.types.is_fixed_size_list(typ):
        return int(typ.list_size) * _fixed_width(typ.value_type)
    try:
        return max(int(typ.bit_width) // 8, 1)
    except ValueError:
        return 0


def negative_nan_of(
    cache: SnapshotCache | None, key: tuple[object, ...], name: str, rows: pa.Table | None = None
) -> bool:
    """Whether fragment ``key``'s decoded column ``name`` (or ``rows``' when it is not kept)
    holds a NaN with its sign bit set: one pass per decoded column, remembered in ``cache``
    (fragments never change). Unknown (True) without either."""
    if cache is not None:
        with cache.lock:
            known = cache.negative_nans.get((key, name))
            whole = cache.fragment_columns.get(key, {}).get(name)
        if known is not None:
            return known
        if whole is not None:  # every row: what a scan keeps of them holds no more
            found = negative_nan(whole)
            with cache.lock:
                cache.negative_nans[(key, name)] = found
            return found
    return True if rows is None else negative_nan(rows.column(name))


def keep_while_streaming(
    batches: Iterator[pa.RecordBatch],
    add: list[str],
    cache: SnapshotCache,
    key: tuple[object, ...],
    kept: list[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """``batches`` passed on; each also appended to ``kept`` until columns ``add`` of them
    exceed the budget (then ``kept`` is emptied and the fragment marked over budget)."""
    nbytes = 0
    keeping = bool(add)
    for b in batches:
        if keeping:
            kept.append(b)
            nbytes += sum(b.column(c).nbytes for c in add)
            if cache.resident_bytes + nbytes > RESIDENT_MAX_BYTES:  # stop keeping: bounded memory
                keeping = False
                kept.clear()
                with cache.lock:
                    cache.over_budget.add(key)
        yield b


def keeps_decoded(
    cache: SnapshotCache | None, key: Callable[[], tuple[object, ...]], read: list[str], owner: ScanContext
) -> bool:
    """Whether an unfiltered scan of columns ``read`` (of ``width``) keeps what it decodes.

    Scans of some columns (aggregates, joins: read again and again) keep the batches
    they pass on (no copy) up to the cache's budget (:func:`keep_while_streaming`). A
    scan of every column (``SELECT *``, an export) keeps them only when the whole table
    fits the budget (``owner.full_bytes``): keeping the first fragments of a larger one
    would cost the pass memory and time for little. ``to_reader`` keeps nothing.
    """
    if cache is None or not read:
        return False
    if len(read) >= len(owner.data_schema) and cache.resident_bytes + owner.full_bytes > RESIDENT_MAX_BYTES:
        return False
    with cache.lock:
        return key() not in cache.over_budget


def survivor_entry(
    cache: SnapshotCache, key: tuple[object, ...], drop: np.ndarray, rows: pa.Table
) -> tuple[pa.Array, dict[str, pa.ChunkedArray]]:
    """The mask keeping a cached fragment's rows not in ``drop`` (over ``rows``' ``_rowaddr``)
    and the dict of its columns without the dropped rows, filled as queries need them: kept
    in the cache per fragment and drop list (one entry per fragment), so a refreshed
    snapshot whose drop list for the fragment did not change copies nothing again, and one
    whose drop list only gained a few rows slices the columns kept for the older list."""
    digest = hashlib.blake2b(drop.tobytes(), digest_size=16).digest()
    with cache.lock:
        found = cache.survivors.get(key)
    if found is not None and found[0] == digest:
        return found[1], found[2]
    grown = _grown(found[1], found[2], found[3], drop, rows) if found is not None else None
    keep, columns = grown if grown is not None else (drop_mask(rows.column("_rowaddr"), drop), {})
    with cache.lock:
        cache.survivors[key] = (digest, keep, columns, drop)
    return keep, columns


SLICED_MAX_ROWS = 64
"""Rows newly dropped from a fragment that are cut out of its kept columns by slicing."""
SLICED_MAX_CHUNKS = 16
"""Chunks a sliced column may have (each is one more batch per scan); beyond, it is copied again."""


def _grown(
    keep: pa.Array, columns: dict[str, pa.ChunkedArray], old: np.ndarray, drop: np.ndarray, rows: pa.Table
) -> tuple[pa.Array, dict[str, pa.ChunkedArray]] | None:
    """The mask and kept columns of an older drop list ``old`` without the rows newly in
    ``drop`` (slices, no copy), when ``drop`` only adds a few rows to ``old``; else None."""
    extra = absent(drop, old)
    if old.size + extra.size != drop.size or extra.size > SLICED_MAX_ROWS:
        return None  # a row came back (its key left the newer levels), or many more go
    addrs = np.asarray(rows.column("_rowaddr").to_numpy(), dtype=np.uint64)
    if not addrs.size or not is_sorted(addrs):
        return None
    at = np.minimum(np.searchsorted(addrs, extra), addrs.size - 1)
    if not np.array_equal(addrs[at], extra):
        return None
    mask = keep.to_numpy(zero_copy_only=False).copy()
    mask[at] = False
    kept = at - np.searchsorted(np.searchsorted(addrs, old), at)  # positions among the kept rows
    filled = dict(columns)  # a copy: the older snapshot may be filling it meanwhile
    return pa.array(mask), {c: s for c, col in filled.items() if (s := _without(col, kept)) is not None}


def _without(col: pa.ChunkedArray, at: np.ndarray) -> pa.ChunkedArray | None:
    """``col`` without the rows at ascending positions ``at``, as slices of it (None: too many chunks)."""
    pieces: list[pa.Array] = []
    start = 0
    for p in at.tolist():
        if p > start:
            pieces.extend(col.slice(start, p - start).chunks)
        start = p + 1
    if start < len(col):
        pieces.extend(col.slice(start).chunks)
    if len(pieces) > SLICED_MAX_CHUNKS:
        return None
    return pa.chunked_array(pieces, type=col.type)
