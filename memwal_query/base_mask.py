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
(:mod:`memwal_query.format.fragment_files`), else through Lance. Before that read, a local
fragment of consecutive integer keys is decided from the runs of them an earlier process
kept on this machine (:mod:`memwal_query.key_runs`), and that read keeps them. Before any of
that, every fragment's drop list comes from the whole mask an earlier process of the same
snapshot kept (:mod:`memwal_query.kept_masks`); a mask decided whole is kept so. Keys are
looked up in the newer keys by :class:`~memwal_query.newer_lookup.NewerLookup`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import lance
import numpy as np
import pyarrow as pa

from memwal_query import kept_masks, key_runs
from memwal_query.base_reads import BaseReads
from memwal_query.format.fragment_files import FragmentColumns
from memwal_query.format.lance_open import base_read_error
from memwal_query.format.storage import Storage
from memwal_query.mask_delta import PriorDecisions
from memwal_query.newer_lookup import KeySet, KeyTable, NewerLookup
from memwal_query.snapshot.cache import SnapshotCache, fragment_cache_key

__all__ = ["BaseMask", "KeySet", "KeyTable", "MaskStatus", "fragment_identity"]

_EMPTY = np.empty(0, dtype=np.uint64)


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
            or the rows a first full scan left out), ``"key runs"`` (runs of consecutive keys
            kept on this machine for the fragment's data file: :mod:`memwal_query.key_runs`),
            ``"kept mask"`` (the whole mask an earlier process of this snapshot kept on this
            machine: :mod:`memwal_query.kept_masks`).
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
        self._reads = BaseReads(storage, base)
        self._sources: dict[int, str] = {}
        self._lookup = NewerLookup(self.newer, self.primary_key) if self.newer is not None else None
        self._prior: PriorDecisions | None = None
        self._keeper = kept_masks.MaskKeeper()
        self._offered = False

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
        """A fragment's drop list if decided, or kept for this snapshot (:mod:`.kept_masks`); None: not yet."""
        if self.newer is None:
            return _EMPTY
        with self._lock:
            got = self._drops.get(fragment_id)
        if got is None:
            kept = self._keeper.drops(self._kept_name)
            if kept is not None and fragment_id in kept:
                return self._record(fragment_id, kept[fragment_id], "kept mask")
        return got

    def _record(self, fragment_id: int, drop: np.ndarray, source: str | None = None) -> np.ndarray:
        """Record a drop list (another thread's if first); once all are, offer the whole mask to keep."""
        frags = len(self.fragments())
        with self._lock:
            if source is not None:
                self._sources.setdefault(fragment_id, source)
            got = self._drops.setdefault(fragment_id, drop)
            whole = dict(self._drops) if len(self._drops) == frags and not self._offered else None
            self._offered = self._offered or whole is not None
        if whole is not None and self._keeper.wants():
            self._keeper.offer(whole, self.fragments(), self._runs())
        return got

    def _kept_name(self) -> kept_masks.KeptName | None:
        """The name of this snapshot's mask on this machine (a local base with one integer key)."""
        runs = self._runs() if kept_masks.keeping() else None  # the same conditions
        if runs is None:
            return None
        return kept_masks.mask_name(runs.storage, self.fragments(), self.primary_key[0], runs.field_id, runs.newer)

    def decide(
        self,
        frag: lance.fragment.LanceFragment,
        keys: pa.Table | FragmentColumns,
        runs: key_runs.KeyRuns | None = None,
    ) -> np.ndarray:
        """Decide ``frag``'s drop list (the sorted row addresses of ``frag`` whose key has a newer
        version) from its key columns and ``_rowaddr`` (all of its rows), or from the key
        columns of every row its data file stores and which are deleted (and their ``runs``,
        when they compress: two searches per run instead of a lookup per row)."""
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
            drop = self._shadowed(keys, runs)
        if prior is not None and ident is not None:
            prior.remember(ident, drop, key_sorted)
        return self._record(frag.fragment_id, drop)

    def settle(self, frag: lance.fragment.LanceFragment, drop: np.ndarray) -> np.ndarray:
        """Record ``frag``'s drop list, found while reading every one of its rows (see :meth:`live`);
        returns the drop list kept (the first one recorded, if another thread was first)."""
        drop = np.sort(np.asarray(drop, dtype=np.uint64))
        prior = self._prior_decisions()
        if prior is not None:
            prior.remember(fragment_identity(frag), drop, None)
        return self._record(frag.fragment_id, drop)

    def _shadowed(self, run: pa.Table | FragmentColumns, runs: key_runs.KeyRuns | None = None) -> np.ndarray:
        """Sorted addresses of the rows of ``run`` (keys and ``_rowaddr``, or a fragment's
        stored rows and which are deleted, and their key ``runs`` if known) whose key has a
        newer version."""
        numeric = self.newer.sorted_numeric() if runs is not None and self.newer is not None else None
        if isinstance(run, FragmentColumns):
            hit = runs.hits(numeric) if runs is not None and numeric is not None else self._hit_positions(run.table)
            if run.live is not None:
                hit = hit[run.live[hit]]
            return run.addresses(hit)  # ascending
        addrs = np.asarray(run.column("_rowaddr").to_numpy(), dtype=np.uint64)
        return np.sort(addrs[self._hit_positions(run)])

    def _hit_positions(self, keys: pa.Table) -> np.ndarray:
        assert self._lookup is not None
        return self._lookup.positions(keys)

    @property
    def lookup_table_bytes(self) -> int:
        """Memory of the table over the newer keys' span (0 until built, or none was)."""
        return self._lookup.table_bytes if self._lookup is not None else 0

    def key_table(self) -> KeyTable | None:
        """The newer integer keys' membership table (built on first use; None when not worth one)."""
        return self._lookup.key_table() if self._lookup is not None else None

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
        assert self._lookup is not None
        return ~self._lookup.mask(keys)

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
        got = self._without_reading(frag)
        if got is not None:
            return got
        keys, runs = self._read_keys(frag, self._runs())
        return self.decide(frag, keys, runs)

    def _without_reading(self, frag: lance.fragment.LanceFragment) -> np.ndarray | None:
        """``frag``'s drop list when no key column need be read (decided, kept, keys in memory, key runs)."""
        got = self.known(frag.fragment_id)
        if got is not None:
            return got
        keys = self._kept_keys(frag)
        if keys is not None:
            return self.decide(frag, keys)
        runs = self._runs()
        found = runs.of_fragment(frag.metadata) if runs is not None else None
        drop = runs.shadowed(frag.metadata, found) if runs is not None and found is not None else None
        if drop is None:
            return None
        self._keeper.remember_runs(frag.fragment_id, found)
        return self._record(frag.fragment_id, drop, "key runs")

    def _kept_keys(self, frag: lance.fragment.LanceFragment) -> pa.Table | FragmentColumns | None:
        """The fragment's keys if this process has them: kept by an earlier snapshot, or decoded by a scan."""
        if self.cache is None:
            return None
        names = [*self.primary_key, "_rowaddr"]
        with self.cache.lock:
            hit = self.cache.base_runs.get(fragment_identity(frag))
            source = "earlier snapshot"
            decoded = self.cache.fragment_columns.get(fragment_cache_key(self.uri, frag), {})
            if hit is None and all(n in decoded for n in names):
                hit, source = pa.table({n: decoded[n] for n in names}), "scan"  # a scan decoded them
        if hit is not None:
            self._note_source(frag, source)
        return hit

    def _runs(self) -> key_runs.FragmentRuns | None:
        """Key runs kept on this machine, for a local base with one integer key (None otherwise)."""
        numeric = self.newer.sorted_numeric() if self.newer is not None else None
        if numeric is None or len(self.primary_key) != 1 or self.storage is None or self.base is None:
            return None
        field = self._reads.field_ids().get(self.primary_key[0])
        local = self.storage.local_path("") is not None
        if field is None or not local:
            return None
        return key_runs.FragmentRuns(self.storage, field, numeric)

    def _read_keys(
        self, frag: lance.fragment.LanceFragment, runs: key_runs.FragmentRuns | None
    ) -> tuple[pa.Table | FragmentColumns, key_runs.KeyRuns | None]:
        """The fragment's keys read from its data files (or through Lance), kept for later
        snapshots, and their runs when they compress (kept for later processes)."""
        t: pa.Table | FragmentColumns | None = self._reads.columns(frag, self.primary_key)
        self._note_source(frag, "data files" if t is not None else "Lance scanner")
        found = runs.keep(frag.metadata, t.table.column(0)) if t is not None and runs is not None else None
        self._keeper.remember_runs(frag.fragment_id, found)
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
        if self.cache is not None:
            self.cache.store_base_run(fragment_identity(frag), t)
        return t, found

    def read_rows(self, frag: lance.fragment.LanceFragment, columns: Sequence[str]) -> pa.Table | None:
        """The live rows of flat ``columns`` of base fragment ``frag`` and their ``_rowaddr``, read
        straight from its data and deletion files (:class:`~memwal_query.base_reads.BaseReads`);
        None when that read cannot prove it sees Lance's rows."""
        return self._reads.rows(frag, columns)

    def _note_source(self, frag: lance.fragment.LanceFragment, source: str) -> None:
        with self._lock:
            self._sources.setdefault(frag.fragment_id, source)

    def all(self) -> np.ndarray:
        """Every shadowed base row address, sorted (decides every fragment once)."""
        if self._all is None:
            self.decide_all()
            parts = [self.fragment(f) for f in self.fragments()]
            self._all = np.sort(np.concatenate(parts)) if parts else _EMPTY
        return self._all

    def decide_all(self) -> None:
        """Decide every fragment: without key reads in turn (~0.5 ms each), then key reads on threads."""
        todo = [f for f in self.fragments() if self._without_reading(f) is None]
        if len(todo) > 1:
            with ThreadPoolExecutor(min(4, len(todo))) as pool:
                list(pool.map(self.fragment, todo))

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
