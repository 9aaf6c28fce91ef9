"""A Lance fragment (base or flushed generation) minus a sorted drop list.

Its columns are decoded once per table lineage and kept in the
:class:`~memwal_query.snapshot.cache.SnapshotCache` (bounded by
:data:`RESIDENT_MAX_BYTES`): fragments are immutable, so later scans of any snapshot
filter memory instead of decoding Lance pages again.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Iterator
from functools import partial

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import serialize_row_addrs

from memwal_query.base_mask import BaseMask
from memwal_query.errors import MemWalError
from memwal_query.planner.nan_order import as_given, reads_whole
from memwal_query.scan.arrays import chain_first, drop_mask, fragment_cache_key, is_gone, one_chunk
from memwal_query.scan.filters import filter_columns, mentions_any, scan_columns
from memwal_query.scan.fragment import HIDDEN_COLUMNS, SCAN_BATCH_ROWS, ScanContext, SourceFragment
from memwal_query.snapshot.cache import SnapshotCache

__all__ = [
    "RESIDENT_MAX_BYTES",
    "LanceFragment",
    "cached_columns",
    "keep_while_streaming",
    "keeps_decoded",
    "store_columns",
]

log = logging.getLogger("memwal_query")
_NO_ROWS = np.empty(0, dtype=np.uint64)

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
            if is_gone(err):
                raise gone(err) from err
            raise
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


def _gone(frag: LanceFragment, err: BaseException) -> MemWalError:
    """The error for a fragment whose files a merger garbage-collected after the snapshot opened."""
    where = f"generation {frag.gen} of region {frag.region}" if frag.gen else "base fragment"
    msg = (
        f"{where} ({frag.label}) of {frag.context.uri} is no longer readable: it was merged and "
        f"garbage-collected after this snapshot was opened; refresh() the table and retry ({err})"
    )
    return MemWalError(msg)


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

    def _live_by_key(self, batch: pa.RecordBatch, dropped: list[np.ndarray] | None = None) -> pa.RecordBatch:
        """Rows of ``batch`` whose key has no newer version (an undecided base fragment);
        ``dropped`` collects the addresses of the rows left out (``batch`` has ``_rowaddr``)."""
        assert self.mask is not None
        keys = pa.Table.from_batches([batch]).select(self.mask.primary_key)
        live = self.mask.live(keys)
        if dropped is not None and not live.all():
            addrs = np.asarray(batch.column("_rowaddr").to_numpy(), dtype=np.uint64)
            dropped.append(addrs[~live])
        return batch.filter(pa.array(live))

    def _resident(self, names: list[str], decode: bool = True) -> pa.Table | None:
        """Rows of columns ``names`` (and ``_rowaddr``), decoded once per table lineage (:func:`cached_columns`)."""
        if self.resident is None:
            return None
        direct = partial(self.mask.read_rows, self.fragment) if self.mask is not None else None
        return cached_columns(
            self.resident, self._cache_key(), self.fragment, names, decode, partial(_gone, self), direct
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
                live = self._live_by_key(b, dropped)
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
        """The drop list as a mask over cached rows; None: keep all. Computed once per drop list:
        the columns without the dropped rows (:attr:`_surviving`) are kept with it in the cache,
        so a refreshed snapshot whose drop list for this fragment is the same reuses both."""
        if not self.drop.size:
            return None
        if self._keep is not None:
            return self._keep
        cache = self.resident
        if cache is None:
            self._keep = drop_mask(rows.column("_rowaddr"), self.drop)
            return self._keep
        key, digest = self._cache_key(), hashlib.blake2b(self.drop.tobytes(), digest_size=16).digest()
        with cache.lock:
            found = cache.survivors.get(key)
        if found is not None and found[0] == digest:
            self._keep, self._surviving = found[1], found[2]
        else:
            self._keep = drop_mask(rows.column("_rowaddr"), self.drop)
            with cache.lock:
                cache.survivors[key] = (digest, self._keep, self._surviving)
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
                rows = rows.filter(filt)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
                return None  # let Lance evaluate it
        return (
            res
            for b in rows.to_batches(max_chunksize=size)
            if (res := self._finish(b, cols, self.gen, self.region, None, out)) is not None
        )

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
        """Whether this scan is the first to read an undecided base fragment (``mark``: it is).

        Decoding its columns into the cache would decode its key column too (to decide the
        mask) and copy what survives: well over what Lance reads for the query alone. The
        first scan reads through Lance (filter pushed down) and checks the keys of the rows
        it returns; a later scan decodes the fragment into the cache and decides its mask.
        """
        cache = self.resident
        if cache is None or not self._undecided():
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
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            if is_gone(err):
                raise _gone(self, err) from err
            raise

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
        read = [c for c in cols if c not in HIDDEN_COLUMNS]
        if owner.with_hidden and mentions_any(filt, [*owner.data_schema.names, *HIDDEN_COLUMNS], HIDDEN_COLUMNS):
            post, lance_filter = filt, None
            read = list(owner.data_schema.names)
        size = max(batch_size or 0, SCAN_BATCH_ROWS)
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
        if not by_key and self.drop.size and filt is None and not owner.with_hidden:
            # Unfiltered scan: let Lance skip the dropped rows while decoding
            # (measured faster than masking whole batches afterwards).
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
            return self.fragment.scanner(
                columns=columns, filter=as_given(f), with_row_address=need_addr, batch_size=size
            ).to_batches()

        try:
            it = scan(lance_filter, read)
            first = next(it, None)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            if is_gone(err):
                raise _gone(self, err) from err
            if lance_filter is None:
                raise
            log.debug("Lance rejected filter %s (%s); filtering in memory", lance_filter, err)
            post, read = lance_filter, list(owner.data_schema.names)
            it = scan(None, read)
            first = next(it, None)
        if first is None:
            return
        for b in self.guard(chain_first(first, it)):
            if by_key:
                b = self._live_by_key(b)
            elif self.drop.size:
                b = b.filter(drop_mask(b.column("_rowaddr"), self.drop))
            res = self._finish(b, cols, self.gen, self.region, post, out)
            if res is not None:
                yield res
