"""A Lance fragment (base or flushed generation) minus a sorted drop list.

Its columns are decoded once per table lineage and kept in the
:class:`~memwal_query.snapshot.cache.SnapshotCache` (:mod:`~memwal_query.scan.column_cache`,
bounded): fragments are immutable, so later scans of any snapshot filter memory instead
of decoding Lance pages again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from functools import partial

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import serialize_row_addrs

from memwal_query.base_mask import BaseMask
from memwal_query.errors import MemWalError, says_missing
from memwal_query.format.lance_open import base_read_error
from memwal_query.planner.lance_filter import for_lance
from memwal_query.planner.nan_order import as_given, reads_whole
from memwal_query.scan.arrays import chain_first, drop_mask, fragment_cache_key
from memwal_query.scan.column_cache import (
    cached_columns,
    keep_while_streaming,
    keeps_decoded,
    negative_nan_of,
    store_columns,
    survivor_entry,
)
from memwal_query.scan.filters import filter_columns, mentions_any, scan_columns
from memwal_query.scan.fragment import HIDDEN_COLUMNS, ScanContext, SourceFragment, batch_rows
from memwal_query.scan.lance_eval import memory_filtered
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.generations import generation_read_error

__all__ = ["LanceFragment", "read_error"]

log = logging.getLogger("memwal_query")
_NO_ROWS = np.empty(0, dtype=np.uint64)


def read_error(frag: LanceFragment, err: BaseException) -> MemWalError:
    """The error for a failed Lance read of ``frag``: a base fragment's says whether the table
    changed since (refresh) or is damaged (:func:`base_read_error`); a generation's files
    missing were merged and garbage-collected since the snapshot opened."""
    if frag.gen == 0 and frag.region is None:
        return base_read_error(frag.dataset, f"base fragment {frag.fragment.fragment_id}", err, frag.fragment)
    where = f"generation {frag.gen} of region {frag.region} ({frag.label}) of {frag.context.uri}"
    return generation_read_error(where, err)


def _shipped(ds: lance.LanceDataset, frag: lance.fragment.LanceFragment) -> dict[str, object]:
    """What replaces a fragment's dataset when shipped: nothing, or the rows of a dataset held
    in this process only (a generation rebuilt from the WAL or read with the base's current
    columns), written again in the same layout where it lands (:func:`_landed`)."""
    if not str(ds.uri).startswith("memory://"):
        return {}
    return {"dataset": None, "fragment": None, "_memory": (ds.to_table(), frag.fragment_id)}


def _landed(state: dict[str, object]) -> dict[str, object]:
    """A shipped fragment's state with its in-memory dataset written again (see :func:`_shipped`)."""
    memory = state.pop("_memory", None)
    if not isinstance(memory, tuple):
        return state
    rows, fragment_id = memory
    ds = lance.write_dataset(rows, f"memory://memwal-shipped-{uuid.uuid4().hex}")
    frag = ds.get_fragment(int(fragment_id))
    assert frag is not None  # the same layout as the shipped dataset
    return {**state, "dataset": ds, "fragment": frag}


class LanceFragment(SourceFragment):
    """A Lance fragment (base or flushed generation) minus a sorted drop list."""

    def __init__(
        self,
        owner: ScanContext,
        dataset: lance.LanceDataset,
        fragment: lance.fragment.LanceFragment,
        drop: np.ndarray | None,
        gen: int,
        region: str | None,
        label: str,
        mask: BaseMask | None = None,
    ) -> None:
        super().__init__(owner)
        if drop is None and mask is None:
            raise ValueError(f"fragment {label} of {owner.uri} needs a drop list or a base mask")
        self.dataset = dataset
        self.fragment = fragment
        self._drop = drop  # None: decided lazily by ``mask`` (base fragments)
        self.mask = mask
        self._blocklist: bytes | None = None
        self._rows: int | None = None
        self.gen = gen
        self.region = region
        self.label = label
        self.resident: SnapshotCache | None = None  # where decoded columns are kept
        self.source_uri = str(dataset.uri)  # the snapshot's name for the dataset (cache key)
        self._key: tuple[object, ...] | None = None
        self._keep: pa.Array | None = None  # this snapshot's drop list as a mask over cached rows
        self._surviving: dict[str, pa.ChunkedArray] = {}  # cached columns with the mask applied

    def __repr__(self) -> str:
        dropped = "undecided" if self._drop is None else self._drop.size
        return f"<memwal fragment {self.label} dropped={dropped}>"

    def __getstate__(self) -> dict[str, object]:
        # shipped fragments (Spark tasks) carry their drop list, no process-local cache
        state = {**self.__dict__, "_drop": self.drop, "mask": None, "resident": None, "_keep": None, "_surviving": {}}
        return {**state, **_shipped(self.dataset, self.fragment)}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(_landed(state))

    @property
    def drop(self) -> np.ndarray:
        """Sorted row addresses of this fragment that are not live (decided now if needed)."""
        if self._drop is None:
            assert self.mask is not None
            self._drop = self.mask.fragment(self.fragment)
        return self._drop

    def _undecided(self) -> bool:
        """Whether the base mask has not decided this fragment yet (nothing is read)."""
        if self._drop is None and self.mask is not None:
            self._drop = self.mask.known(self.fragment.fragment_id)
        return self._drop is None

    def _key_columns(self) -> list[str]:
        return self.mask.primary_key if self.mask is not None else []

    def _resident(self, names: list[str], decode: bool = True) -> pa.Table | None:
        """Rows of columns ``names`` (and ``_rowaddr``), decoded once per table lineage (:func:`cached_columns`)."""
        if self.resident is None:
            return None
        direct = partial(self.mask.read_rows, self.fragment) if self.mask is not None else None
        return cached_columns(
            self.resident, self._cache_key(), self.fragment, names, decode, partial(read_error, self), direct
        )

    def _cache_key(self) -> tuple[object, ...]:
        if self._key is None:
            self._key = fragment_cache_key(self.source_uri, self.fragment)
        return self._key

    def _kept_stream(self, read: list[str], cols: list[str], out: pa.Schema, size: int) -> Iterator[pa.RecordBatch]:
        """An unfiltered scan streamed from Lance batch by batch; once the whole fragment was
        read, what it decoded is kept as it came (no copy), if it fits the budget."""
        cache = self.resident
        assert cache is not None
        key = self._cache_key()
        by_key = self._undecided()  # an undecided base fragment: keys checked as read, then decided
        if by_key:
            read = [*read, *[k for k in self._key_columns() if k not in read]]
        with cache.lock:
            have = set(cache.fragment_columns.get(key, {}))
        add = [c for c in [*read, "_rowaddr"] if c not in have]
        kept: list[pa.RecordBatch] = []
        dropped: list[np.ndarray] = []
        scanner = self.fragment.scanner(columns=read, with_row_address=True, batch_size=size)
        for b in keep_while_streaming(self.guard(scanner.to_batches()), add, cache, key, kept):
            if by_key:
                assert self.mask is not None
                live = self.mask.live_rows(b, dropped)
            else:
                live = b.filter(drop_mask(b.column("_rowaddr"), self.drop)) if self.drop.size else b
            res = self._finish(live, cols, self.gen, self.region, None, out)
            if res is not None:
                yield res
        if kept:  # the whole fragment was read, within the budget
            if by_key:  # every row was read: the rows left out are the fragment's mask
                assert self.mask is not None
                self._drop = self.mask.settle(self.fragment, np.concatenate(dropped) if dropped else _NO_ROWS)
            store_columns(cache, key, {c: pa.chunked_array([b.column(c) for b in kept]) for c in add})

    def _keep_mask(self, rows: pa.Table) -> pa.Array | None:
        """The drop list as a mask over cached rows; None: keep all. Computed once per drop list
        (:func:`~memwal_query.scan.column_cache.survivor_entry`): a refreshed snapshot whose
        drop list for this fragment is the same reuses it and the columns without those rows."""
        if not self.drop.size:
            return None
        if self._keep is None:
            cache = self.resident
            if cache is None:
                self._keep = drop_mask(rows.column("_rowaddr"), self.drop)
            else:
                self._keep, self._surviving = survivor_entry(cache, self._cache_key(), self.drop, rows)
        return self._keep

    def survivors(self, names: list[str], decode: bool = True) -> pa.Table | None:
        """Cached rows of ``names`` (and ``_rowaddr``) that survive the merge (None when not cached).

        The drop list is applied once per snapshot and column (a column copy lives as long
        as this snapshot's dataset): a later query filters only its own predicate, as over
        the raw base.
        """
        undecided = self._undecided()
        keys = [k for k in self._key_columns() if k not in names] if undecided else []
        rows = self._resident([*names, *keys], decode)  # an undecided fragment: its keys decoded alongside
        if rows is None:
            return None
        if undecided:
            assert self.mask is not None
            self._drop = self.mask.decide(self.fragment, rows.select([*self.mask.primary_key, "_rowaddr"]))
            rows = rows.select([*names, "_rowaddr"])
        keep = self._keep_mask(rows)
        if keep is None:
            return rows
        out = {}
        for c in rows.column_names:
            col = self._surviving.get(c)
            if col is None:
                col = self._surviving[c] = pc.filter(rows.column(c), keep)
            out[c] = col
        return pa.table(out)

    def _resident_batches(
        self, rows: pa.Table, cols: list[str], filt: pc.Expression | None, out: pa.Schema, size: int
    ) -> Iterator[pa.RecordBatch] | None:
        if filt is not None:
            try:
                rows = memory_filtered(rows, filt, lambda name: self.holds_negative_nan(name, rows))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
                return None  # let Lance evaluate it
        return (
            res
            for b in rows.to_batches(max_chunksize=size)
            if (res := self._finish(b, cols, self.gen, self.region, None, out)) is not None
        )

    def holds_negative_nan(self, name: str, rows: pa.Table | None = None) -> bool:
        """Whether column ``name`` holds a sign-bit NaN (:func:`.column_cache.negative_nan_of`)."""
        return negative_nan_of(self.resident, self._cache_key(), name, rows)

    def index_serves(self, filt: pc.Expression | None, names: list[str]) -> bool:
        """Whether a base scalar index serves ``filt`` and ``names`` are not all decoded yet.

        Then Lance searches the index and decodes only the matching rows (a selective
        first query), instead of this scan decoding whole columns into the cache.
        """
        indexed = self.context.indexed
        if self.gen != 0 or filt is None or not indexed:
            return False
        used = filter_columns(filt, self.context.data_schema.names)
        if not used or not any(c in indexed for c in used):
            return False
        cache, key = self.resident, self._key
        if cache is None:
            return True
        key = key or fragment_cache_key(self.source_uri, self.fragment)
        with cache.lock:
            have = cache.fragment_columns.get(key, {})
            return not all(c in have for c in names)

    def first_touch(self, names: list[str], *, mark: bool = True) -> bool:
        """Whether this scan is the first of this table lineage to read a base fragment (``mark``: it is).

        Decoding its columns into the cache (and its keys, undecided) and copying what survives
        cost well over what Lance reads for the query alone (2x for a fresh filtered aggregate).
        The first scan reads through Lance (filter pushed down; keys checked, undecided); a
        later scan decodes the fragment into the cache (and decides its mask).
        """
        cache = self.resident
        if cache is None or self.gen != 0:
            return False
        key = self._key = self._key or fragment_cache_key(self.source_uri, self.fragment)
        with cache.lock:
            have = cache.fragment_columns.get(key, {})
            if all(c in have for c in names) or key in cache.touched:
                return False
            if mark:
                cache.touched.add(key)
            return True

    def live_rows(self) -> int:
        return int(self.fragment.count_rows()) - int(self.drop.size)

    def guard(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except GeneratorExit:  # closed unfinished (a LIMIT), maybe at exit when ``pa`` is gone
            raise
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            raise read_error(self, err) from err

    def rows_hint(self) -> int:
        if self._rows is None:
            self._rows = int(self.fragment.count_rows())
        return self._rows

    def work_hint(self) -> int:  # a base fragment's from its metadata (counting reads its deletion file)
        return int(self.fragment.physical_rows) if self.region is None else self.rows_hint()

    def batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        owner = self.context
        post = None
        lance_filter = filt
        read = [c for c in cols if c not in owner.hidden]
        if owner.with_hidden and mentions_any(filt, [*owner.data_schema.names, *HIDDEN_COLUMNS], HIDDEN_COLUMNS):
            post, lance_filter = filt, None
            read = list(owner.data_schema.names)
        size = batch_rows([self.fragment], batch_size)
        lance_first = False
        if post is None:
            # An unfiltered scan returns every surviving row: unless its columns are cached
            # already, it streams from Lance batch by batch (and may keep what it decodes).
            names = scan_columns(read, filt, owner.data_schema.names)
            # a filter pyarrow may answer otherwise (a user's expression) is Lance's on every scan
            foreign = filt is not None and not reads_whole(filt, owner.data_schema)
            lance_first = foreign or self.index_serves(filt, names) or self.first_touch(names)
            rows = None if lance_first else self.survivors(names, decode=filt is not None)
            if rows is not None:
                resident = self._resident_batches(rows, cols, lance_filter, out, size)
                if resident is not None:
                    yield from resident
                    return
            if filt is None and not owner.with_hidden and keeps_decoded(self.resident, self._cache_key, read, owner):
                yield from self._kept_stream(read, cols, out, size)
                return
        # An undecided fragment read through Lance on purpose (first touch, a scalar index
        # serving the filter) checks the keys of the rows it reads; any other scan (no
        # cache, over its budget) decides the fragment's mask once (one key read).
        by_key = lance_first and self._undecided()
        if by_key:
            read = [*read, *[k for k in self._key_columns() if k not in read]]
        need_addr = (not by_key and self.drop.size > 0) or "_rowaddr" in cols or post is not None
        blockable = not (by_key or filt is not None or owner.with_hidden or self.dataset.has_stable_row_ids)
        if blockable and self.drop.size:
            # Unfiltered scan: Lance skips the dropped rows while decoding (faster than masking
            # batches after; with stable row ids it takes the list as row ids: masked after)
            if self._blocklist is None:
                self._blocklist = serialize_row_addrs(self.drop.tolist())
            scanner = self.dataset.scanner(
                fragments=[self.fragment], columns=read, row_addr_blocklist=self._blocklist, batch_size=size
            )
            for b in self.guard(scanner.to_batches()):
                res = self._finish(b, cols, self.gen, self.region, None, out)
                if res is not None:
                    yield res
            return

        def scan(f: pc.Expression | None, columns: list[str]) -> Iterator[pa.RecordBatch]:
            given = for_lance(as_given(f), self.dataset.schema)  # as SQL where Substrait has no such type
            return self.fragment.scanner(
                columns=columns, filter=given, with_row_address=need_addr, batch_size=size
            ).to_batches()

        try:
            it = scan(lance_filter, read)
            first = next(it, None)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            if says_missing(err) or lance_filter is None:
                raise read_error(self, err) from err
            log.debug("Lance rejected filter %s (%s); filtering in memory", lance_filter, err)
            post, read = lance_filter, list(owner.data_schema.names)
            it = self.guard(scan(None, read))
            first = next(it, None)
        if first is None:
            return
        for b in self.guard(chain_first(first, it)):
            if by_key:
                assert self.mask is not None
                b = self.mask.live_rows(b)
            elif self.drop.size:
                b = b.filter(drop_mask(b.column("_rowaddr"), self.drop))
            res = self._finish(b, cols, self.gen, self.region, post, out)
            if res is not None:
                yield res
