"""Which base rows a newer level shadows, decided lazily, one base fragment at a time.

A base row is live exactly when its key has no version in a newer level (unmerged
generations, MemTables): :class:`BaseMask` asks the snapshot's newer keys
(``merge.NewerKeys``) about a fragment's keys the first time something needs that
fragment's drop list (a scan, ``count(*)``, a search), and remembers the answer for the
snapshot. Opening a snapshot therefore reads no base key: the cost follows the newer
levels and the fragments queries actually read.

A fragment's keys come from, in order: the decoded-column cache (a scan that decodes a
fragment's columns decodes its key column with them and hands it over through
:meth:`BaseMask.decide`), the key runs kept per fragment identity in the
:class:`~memwal_query.snapshot.cache.SnapshotCache` (a refresh reuses them for the
fragments that did not change, within a byte budget), or one read of the key columns:
straight from the fragment's data and deletion files
(:mod:`memwal_query.format.fragment_files`), else through Lance. Integer keys are looked
up in a table over the newer keys' span when it is small enough (:class:`KeyTable`: one
gather per key, a byte or a bit per value of the span); otherwise key-sorted fragments
search the sorted newer keys and unsorted ones hash them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.format.fragment_files import FragmentColumns, read_columns
from memwal_query.format.lance_open import base_read_error
from memwal_query.format.storage import Storage
from memwal_query.mask_delta import PriorDecisions, sorted_hits
from memwal_query.regionspec.spec import lance_field_ids
from memwal_query.snapshot.cache import SnapshotCache, fragment_cache_key

__all__ = ["BaseMask", "KeySet", "KeyTable", "MaskStatus", "fragment_identity"]

_EMPTY = np.empty(0, dtype=np.uint64)


class KeySet(Protocol):
    """The newer levels' keys (``merge.NewerKeys``) as the mask needs them."""

    def __len__(self) -> int: ...

    def contains(self, keys: pa.Table) -> np.ndarray: ...

    def sorted_numeric(self) -> np.ndarray | None: ...


@dataclass(frozen=True)
class MaskStatus:
    """How far the lazy base mask has been decided.

    Attributes:
        fragments: Base fragments of the snapshot.
        decided: Fragments whose drop list is known.
        masked_rows: Base rows shadowed in the decided fragments.
        key_sources: How the decided fragments' keys were found, as (source, fragments)
            pairs: ``"data files"`` (read straight from the data and deletion files),
            ``"Lance scanner"`` (the direct read could not prove it sees Lance's rows),
            ``"earlier snapshot"`` (kept by a refresh), ``"scan"`` (columns a query decoded,
            or the rows a first full scan left out).
    """

    fragments: int
    decided: int
    masked_rows: int
    key_sources: tuple[tuple[str, int], ...] = ()

    @property
    def complete(self) -> bool:
        """Whether every fragment is decided (``masked_rows`` is then the whole mask)."""
        return self.decided == self.fragments


def fragment_identity(frag: lance.fragment.LanceFragment) -> tuple[object, ...]:
    """What makes a fragment's rows: its id, data files and deletion file."""
    m = frag.metadata
    d = m.deletion_file
    deletion = (d.id, d.read_version, d.num_deleted_rows) if d is not None else None
    return (frag.fragment_id, tuple(f.path for f in m.files), deletion)


def _addresses(run: pa.Table | FragmentColumns, positions: np.ndarray) -> np.ndarray:
    """Row addresses (ascending) of the live rows among ``positions`` of a key run."""
    if isinstance(run, FragmentColumns):
        if run.live is not None:
            positions = positions[run.live[positions]]
        return run.addresses(positions)
    return np.sort(np.asarray(run.column("_rowaddr").to_numpy(), dtype=np.uint64)[positions])


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


class BaseMask:
    """Base rows shadowed by a newer level, decided per base fragment on first use.

    Thread-safe (DataFusion scans fragments on several threads). Example:

        >>> mask = BaseMask.none()
        >>> mask.status().complete, mask.count()
        (True, 0)
    """

    def __init__(
        self,
        uri: str,
        base: lance.LanceDataset | None,
        primary_key: Sequence[str],
        newer: KeySet | None,
        cache: SnapshotCache | None,
        storage: Storage | None = None,
    ) -> None:
        self.uri = uri
        self.storage = storage
        self.base = base
        self.primary_key = list(primary_key)
        self.newer = newer if newer is not None and len(newer) else None
        self.cache = cache
        self._drops: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._fragments: list[lance.fragment.LanceFragment] | None = None
        self._all: np.ndarray | None = None
        self._field_ids: dict[str, int] | None = None
        self._sources: dict[int, str] = {}
        self._table: KeyTable | None = None
        self._table_built = False
        self._prior: PriorDecisions | None = None

    @classmethod
    def none(cls) -> BaseMask:
        """A mask that drops nothing (no newer level)."""
        return cls("", None, [], None, None)

    @property
    def trivial(self) -> bool:
        """Whether nothing can be shadowed (no newer key): every drop list is empty."""
        return self.newer is None

    def fragments(self) -> list[lance.fragment.LanceFragment]:
        """The base fragments (listed once)."""
        if self._fragments is None:
            self._fragments = list(self.base.get_fragments()) if self.base is not None else []
        return self._fragments

    def known(self, fragment_id: int) -> np.ndarray | None:
        """The drop list of a fragment if decided (``None``: not yet)."""
        if self.newer is None:
            return _EMPTY
        with self._lock:
            return self._drops.get(fragment_id)

    def decide(self, frag: lance.fragment.LanceFragment, keys: pa.Table | FragmentColumns) -> np.ndarray:
        """Decide ``frag``'s drop list from its key columns and ``_rowaddr`` (all of its rows),
        or from the key columns of every row its data file stores and which are deleted.

        Returns:
            The sorted row addresses of ``frag`` whose key has a newer version.
        """
        got = self.known(frag.fragment_id)
        if got is not None:
            return got
        assert self.newer is not None  # known() answers for a trivial mask
        prior = self._prior_decisions()
        ident = fragment_identity(frag) if prior is not None else None
        drop, key_sorted = (None, None)
        if prior is not None and ident is not None:
            run = (keys.table if isinstance(keys, FragmentColumns) else keys).column(self.primary_key[0])
            drop, key_sorted = prior.redecide(ident, run, partial(_addresses, keys))
        if drop is None:
            drop = self._shadowed(keys)
        if prior is not None and ident is not None:
            prior.remember(ident, drop, key_sorted)
        with self._lock:
            return self._drops.setdefault(frag.fragment_id, drop)

    def settle(self, frag: lance.fragment.LanceFragment, drop: np.ndarray) -> np.ndarray:
        """Record ``frag``'s drop list, found while reading every one of its rows (see :meth:`live`).

        Returns:
            The drop list kept (the first one recorded, if another thread was first).
        """
        drop = np.sort(np.asarray(drop, dtype=np.uint64))
        prior = self._prior_decisions()
        if prior is not None:
            prior.remember(fragment_identity(frag), drop, None)
        with self._lock:
            return self._drops.setdefault(frag.fragment_id, drop)

    def _shadowed(self, run: pa.Table | FragmentColumns) -> np.ndarray:
        """Sorted addresses of the rows of ``run`` (keys and ``_rowaddr``, or a fragment's
        stored rows and which are deleted) whose key has a newer version."""
        if isinstance(run, FragmentColumns):
            hit = self._hit_positions(run.table)
            if run.live is not None:
                hit = hit[run.live[hit]]
            return run.addresses(hit)  # ascending
        addrs = np.asarray(run.column("_rowaddr").to_numpy(), dtype=np.uint64)
        return np.sort(addrs[self._hit_positions(run)])

    def _hit_positions(self, keys: pa.Table) -> np.ndarray:
        """Positions (ascending) of the rows of key columns ``keys`` whose key has a newer version."""
        assert self.newer is not None
        numeric = self.newer.sorted_numeric()
        col = keys.column(self.primary_key[0])
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

    def _hit_mask(self, keys: pa.Table) -> np.ndarray:
        """Boolean per row of key columns ``keys``: whether a newer version of its key exists."""
        assert self.newer is not None
        numeric = self.newer.sorted_numeric()
        col = keys.column(self.primary_key[0])
        if numeric is None or not keys.num_rows or col.null_count:
            return np.asarray(self.newer.contains(keys), dtype=bool)
        hits = self._table_hits(col, numeric.dtype)
        if hits is not None:
            return hits
        hit = np.zeros(keys.num_rows, dtype=bool)
        hit[self._hit_positions(keys)] = True
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
    def lookup_table_bytes(self) -> int:
        """Memory of the table over the newer keys' span (0 until built, or none was)."""
        return int(self._table.table.nbytes) if self._table is not None else 0

    def key_table(self) -> KeyTable | None:
        """The newer integer keys' membership table (built on first use; None when not worth one)."""
        if not self._table_built:
            with self._lock:
                if not self._table_built:
                    numeric = self.newer.sorted_numeric() if self.newer is not None else None
                    self._table = KeyTable.of(numeric) if numeric is not None else None
                    self._table_built = True
        return self._table

    def _prior_decisions(self) -> PriorDecisions | None:
        """Drop lists of earlier snapshots kept in the cache (integer keys only; None otherwise)."""
        if self._prior is None and self.cache is not None and self.newer is not None:
            numeric = self.newer.sorted_numeric()
            if numeric is not None:
                self._prior = PriorDecisions(self.cache, numeric)
        return self._prior

    def live(self, keys: pa.Table) -> np.ndarray:
        """Boolean mask over rows of base key columns ``keys``: ``True`` where no newer version exists.

        Used for rows read before their fragment is decided (a filtered Lance read). Integer
        keys are looked up in a table over the newer keys' span when it is small enough,
        else key-sorted ones (a base batch, usually) search only the newer keys in their range.
        """
        if self.newer is None or keys.num_rows == 0:
            return np.ones(keys.num_rows, dtype=bool)
        return ~self._hit_mask(keys)

    def live_rows(self, batch: pa.RecordBatch, dropped: list[np.ndarray] | None = None) -> pa.RecordBatch:
        """Rows of a base batch whose key has no newer version (:meth:`live`); ``dropped``
        collects the addresses of the rows left out (then ``batch`` has ``_rowaddr``)."""
        live = self.live(pa.Table.from_batches([batch]).select(self.primary_key))
        if dropped is not None and not live.all():
            addrs = np.asarray(batch.column("_rowaddr").to_numpy(), dtype=np.uint64)
            dropped.append(addrs[~live])
        return batch.filter(pa.array(live))

    def fragment(self, frag: lance.fragment.LanceFragment) -> np.ndarray:
        """``frag``'s drop list, deciding it now if needed (reads the fragment's keys)."""
        got = self.known(frag.fragment_id)
        if got is not None:
            return got
        return self.decide(frag, self._keys(frag))

    def _keys(self, frag: lance.fragment.LanceFragment) -> pa.Table | FragmentColumns:
        cache = self.cache
        ident = fragment_identity(frag)
        names = [*self.primary_key, "_rowaddr"]
        if cache is not None:
            with cache.lock:
                hit = cache.base_runs.get(ident)
                source = "earlier snapshot"
                decoded = cache.fragment_columns.get(fragment_cache_key(self.uri, frag), {})
                if hit is None and all(n in decoded for n in names):
                    hit, source = pa.table({n: decoded[n] for n in names}), "scan"  # a scan decoded them
            if hit is not None:
                self._note_source(frag, source)
                return hit
        t: pa.Table | FragmentColumns | None = self._read_columns(frag, self.primary_key)
        self._note_source(frag, "data files" if t is not None else "Lance scanner")
        try:
            if t is None and frag.metadata.deletion_file is None:
                # every row of the fragment, in order: its addresses follow from the row offsets
                t = FragmentColumns(frag.to_table(columns=self.primary_key), None, frag.fragment_id)
            elif t is None:
                t = frag.to_table(columns=self.primary_key, with_row_address=True)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            assert self.base is not None
            what = f"the key columns of base fragment {frag.fragment_id}"
            raise base_read_error(self.base, what, err, frag) from err
        if cache is not None:
            cache.store_base_run(ident, t)
        return t

    def read_rows(self, frag: lance.fragment.LanceFragment, columns: Sequence[str]) -> pa.Table | None:
        """The live rows of flat ``columns`` of base fragment ``frag`` and their ``_rowaddr``, read
        straight from its data and deletion files (2-4x faster than Lance's fragment scanner on a
        fresh process); None when that read cannot prove it sees Lance's rows."""
        got = self._read_columns(frag, columns)
        return got.live_table() if got is not None else None

    def _note_source(self, frag: lance.fragment.LanceFragment, source: str) -> None:
        with self._lock:
            self._sources.setdefault(frag.fragment_id, source)

    def _read_columns(self, frag: lance.fragment.LanceFragment, columns: Sequence[str]) -> FragmentColumns | None:
        """Columns of the fragment straight from its data file (~4x faster than Lance's scanner), or None.

        Local tables only: on an object store each file reader would open its own client
        (credentials, connections) where Lance's scanner reuses the dataset's; not measured
        against a real object store, so Lance reads those."""
        if self.storage is None or self.base is None or self.storage.local_path("") is None:
            return None
        if self._field_ids is None:
            self._field_ids = {name: i for i, name in lance_field_ids(self.base).items()}
        return read_columns(self.storage, frag.metadata, self._field_ids, list(columns), self.base.schema)

    def all(self) -> np.ndarray:
        """Every shadowed base row address, sorted (decides every fragment once)."""
        if self._all is None:
            frags = self.fragments()
            todo = [f for f in frags if self.known(f.fragment_id) is None]
            if len(todo) > 1:
                with ThreadPoolExecutor(min(4, len(todo))) as pool:
                    list(pool.map(self.fragment, todo))
            parts = [self.fragment(f) for f in frags]
            self._all = np.sort(np.concatenate(parts)) if parts else _EMPTY
        return self._all

    @property
    def all_known(self) -> bool:
        """Whether :meth:`all` answers without reading anything (decided already, or nothing to shadow)."""
        return self.newer is None or self._all is not None

    def count(self) -> int:
        """Shadowed base rows in all (decides every fragment once)."""
        return int(self.all().size)

    def status(self) -> MaskStatus:
        """How many fragments are decided and the rows they mask (decides nothing)."""
        frags = self.fragments()
        if self.newer is None:
            return MaskStatus(len(frags), len(frags), 0)
        with self._lock:
            drops, sources = dict(self._drops), dict(self._sources)
        ids = [f.fragment_id for f in frags if f.fragment_id in drops]
        counts = Counter(sources.get(i, "scan") for i in ids)
        return MaskStatus(len(frags), len(ids), sum(int(drops[i].size) for i in ids), tuple(sorted(counts.items())))
