"""A base's whole mask kept on this machine, for the next process reading it.

A base fragment's drop list (the addresses of its live rows whose key has a newer version)
follows from two things only: the fragment's rows (its data and deletion files) and the
newer levels' keys. Once a process has decided every fragment of a local base with one
integer key (a ``count(*)``, a scan of the whole table), :func:`keep` writes the drop lists
as one file of this machine's cache directory (:mod:`~memwal_query.format.machine_cache`,
folder :data:`KIND`) with the newer keys they were decided against and the key runs
(:mod:`~memwal_query.key_runs`) of the fragments whose keys compress. The file is named by
a digest of the base (:func:`mask_name`): each data and deletion file's path, size and
modification time, and the key's field and type.

A new process reading the same base takes its drop lists from it and reads no key
(:class:`MaskKeeper`): all of them when its newer keys are the ones kept (a notebook
restarted, a CLI call on a table nobody wrote to since, a flush), else, when the keys
differ (a write since, an eventual snapshot after a strong one), those of the fragments
with runs, brought up to its keys by the keys added and removed (:func:`taken`: a set
difference over the keys, ~1 ms at 160k, and two searches per run per fragment). A merge
or a deletion changes the base's files and names another file. A file that is not whole,
not for these fragments, or whose keys, lists or runs are not well formed is ignored.

Example:
    >>> import numpy as np
    >>> name = KeptName(b"n" * 32, {0: 10, 1: 5}, keys=np.array([4, 9]))
    >>> drops = {0: np.array([3, 7], dtype=np.uint64), 1: np.array([(1 << 32) | 4], dtype=np.uint64)}
    >>> data = encode(name, KeptMask(name.keys, drops))
    >>> {f: d.tolist() for f, d in decode(data, name).drops.items()}
    {0: [3, 7], 1: [4294967300]}
    >>> decode(data[:-1], name) is None
    True
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwal_query import key_runs
from memwal_query.format import machine_cache
from memwal_query.format.fragment_files import deleted_rows
from memwal_query.format.kept_bytes import ArrayReader, ascending, sealed, u8, whole
from memwal_query.format.sets import member
from memwal_query.format.storage import Storage
from memwal_query.key_runs import KeyRuns

__all__ = [
    "KIND",
    "MAX_KEYS",
    "MAX_ROWS",
    "REKEEP_KEYS",
    "KeptMask",
    "KeptName",
    "Layout",
    "MaskKeeper",
    "changes",
    "decode",
    "encode",
    "keep",
    "keeping",
    "load",
    "mask_name",
    "taken",
]

KIND = "base-masks"
"""The folder of kept masks in the cache directory."""
MAX_ROWS = 1 << 20
"""Masks of more shadowed rows than this (8 MiB) are not kept: a merger that far behind
changes them faster than they are read again."""
MAX_KEYS = 1 << 20
"""Nor masks against more newer keys than this (kept with the mask, 8 MiB of 64-bit keys)."""
REKEEP_KEYS = 4096
"""A process that found a mask kept for newer keys differing from its own by more than this
many keys and an eighth of its keys keeps its own (the next process brings a closer one up
to date; rewriting costs ~7 ms at 160k keys, a delta of 10k keys ~2 ms)."""
_MAGIC = b"MWMASKS2"
_NO_ROWS = np.empty(0, dtype=np.uint32)


@dataclass(frozen=True)
class KeptName:
    """What a kept mask is found by and checked against.

    Attributes:
        name: The file's 32-byte name (also written in it).
        rows: Base fragment id -> rows its data files store.
        table: The base's real path (a process keeps one mask per table: :class:`MaskKeeper`).
        keys: The snapshot's newer keys (sorted, unique integers), which a mask kept for other
            keys is brought up to (:func:`taken`).
    """

    name: bytes
    rows: dict[int, int]
    table: str = ""
    keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


@dataclass(frozen=True)
class Layout:
    """Where a base fragment's keys lie: its data file's key runs and its deleted rows.

    Attributes:
        runs: The runs of keys of every row the data file stores (:class:`~memwal_query.key_runs.KeyRuns`).
        deleted: Offsets of the deleted ones (sorted, unique).
    """

    runs: KeyRuns
    deleted: np.ndarray

    def live_hits(self, fragment_id: int, keys: np.ndarray) -> np.ndarray:
        """Sorted addresses of the live rows holding one of ``keys`` (sorted, unique)."""
        return key_runs.live_addresses(self.runs.hits(keys), self.deleted, fragment_id)


@dataclass(frozen=True)
class KeptMask:
    """A whole base mask as kept.

    Attributes:
        keys: The newer keys it was decided against (sorted, unique).
        drops: Base fragment id -> the sorted addresses of its live rows with one of ``keys``.
        layouts: Base fragment id -> where its keys lie, for the fragments whose keys compress
            into runs: their drop lists follow other keys too (:func:`taken`).
    """

    keys: np.ndarray
    drops: dict[int, np.ndarray]
    layouts: dict[int, Layout] = field(default_factory=dict)


def keeping() -> bool:
    """Whether masks are kept on this machine (a cache directory is set: not ``off``)."""
    return machine_cache.cache_dir(KIND) is not None


def mask_name(
    storage: Storage, fragments: Sequence[Any], key: str, field_id: int, newer: np.ndarray
) -> KeptName | None:
    """The name of the mask of local base ``fragments`` (Lance fragments) for key column ``key``
    (field ``field_id``) against sorted unique integer keys ``newer``; None when keeping is off
    or a file cannot be stamped. The name follows the base's files, not ``newer``: one file per
    base, brought up to the keys of each snapshot reading it (:func:`taken`)."""
    root = storage.local_path("")
    if root is None or not keeping():
        return None
    metas = [f.metadata for f in fragments]
    stamps = []
    for meta in metas:
        stamp = machine_cache.fragment_stamp(root, meta)
        if stamp is None:
            return None
        stamps.append(stamp)
    table = os.path.realpath(root)
    name = machine_cache.digest(KIND, table, key, str(field_id), newer.dtype.str, *stamps)
    return KeptName(name, {int(m.id): int(m.physical_rows) for m in metas}, table, newer)


def encode(name: KeptName, mask: KeptMask) -> bytes:
    """The file :func:`keep` writes: magic, name, key type, counts; per fragment its id and the
    lengths of its list, runs and deleted rows (runs 0: no layout); the keys, the lists (row
    addresses), each layout's runs (first rows, first keys, last keys) and deleted rows, all
    little-endian; a CRC-32 of all of it."""
    ids = sorted(mask.drops)
    keys = np.ascontiguousarray(mask.keys, dtype=mask.keys.dtype.newbyteorder("<"))
    kind = keys.dtype.str.encode().ljust(8, b" ")
    laid = [mask.layouts.get(i) for i in ids]
    table = [
        [i, mask.drops[i].size, len(x.runs) if x else 0, x.deleted.size if x else 0]
        for i, x in zip(ids, laid, strict=True)
    ]
    parts = [_MAGIC, name.name, kind, u8(len(ids), keys.size), np.array(table, dtype="<u8").tobytes(), keys.tobytes()]
    parts += [np.asarray(mask.drops[i], dtype="<u8").tobytes() for i in ids]
    for x in laid:
        if x is not None:
            r = x.runs
            parts += [r.starts.astype("<u4").tobytes(), r.firsts.astype(keys.dtype).tobytes()]
            parts += [r.lasts.astype(keys.dtype).tobytes(), x.deleted.astype("<u4").tobytes()]
    return sealed(b"".join(parts))


def _drop_fits(drop: np.ndarray, fid: int, rows: int) -> bool:
    """Whether ``drop`` is ascending addresses of fragment ``fid``'s ``rows`` rows."""
    if not drop.size:
        return True
    within = int(drop[0]) >> 32 == fid == int(drop[-1]) >> 32  # ascending: the ends bound the rest
    return within and int(drop[-1]) & 0xFFFFFFFF < rows and ascending(drop)


def _layout(read: ArrayReader, dtype: np.dtype, runs: int, deleted: int, rows: int) -> Layout | None:
    """The next layout in a kept file (``runs`` runs, ``deleted`` rows of a fragment of
    ``rows`` rows) when well formed."""
    starts = read.take("<u4", runs).astype(np.int64)
    firsts, lasts = read.take(dtype, runs).copy(), read.take(dtype, runs).copy()  # not views of the file
    gone = read.take("<u4", deleted).copy()
    layout = Layout(KeyRuns(starts, firsts, lasts, rows), gone)
    fits = not gone.size or (ascending(gone) and int(gone[-1]) < rows)
    return layout if fits and layout.runs.well_formed() else None


def decode(data: bytes, name: KeptName, layouts: bool = True) -> KeptMask | None:
    """The mask in ``data`` when it is a whole file of ``name`` for keys of ``name.keys``' type,
    of exactly its fragments, each list ascending and within its fragment's rows, and (with
    ``layouts``) the keys ascending and each layout well formed over its fragment; None
    otherwise. Without ``layouts`` none is decoded: the keys are then only of use compared
    with keys known to be sorted and unique (~1 ms less at 24 fragments and 160k keys)."""
    dtype = name.keys.dtype.newbyteorder("<")
    at = len(_MAGIC) + len(name.name)
    head = at + 8 + 16
    if len(data) < head + 4 or data[:at] != _MAGIC + name.name or data[at : at + 8].rstrip(b" ") != dtype.str.encode():
        return None
    if not whole(data):
        return None
    n, nkeys = (int(v) for v in np.frombuffer(data, dtype="<u8", count=2, offset=at + 8))
    if n != len(name.rows) or len(data) < head + 32 * n + 4:
        return None
    table = np.frombuffer(data, dtype="<u8", count=4 * n, offset=head).reshape(n, 4).tolist()
    lists, runs, gone = (sum(t[i] for t in table) for i in (1, 2, 3))  # Python ints: no wrapping
    size = head + 32 * n + dtype.itemsize * (nkeys + 2 * runs) + 8 * lists + 4 * (runs + gone) + 4
    if {t[0] for t in table} != set(name.rows) or len(data) != size or any(t[3] and not t[2] for t in table):
        return None
    read = ArrayReader(data, head + 32 * n)
    keys = read.take(dtype, nkeys)
    drops = {int(t[0]): read.take("<u8", t[1]).astype(np.uint64) for t in table}  # a copy: the caller's
    if not all(_drop_fits(d, f, name.rows[f]) for f, d in drops.items()):
        return None
    if not layouts:
        return KeptMask(keys, drops)
    if not ascending(keys):
        return None
    laid: dict[int, Layout] = {}
    for fid, _, count, deleted in table:
        if count:
            layout = _layout(read, dtype, count, deleted, name.rows[fid])
            if layout is None:
                return None
            laid[fid] = layout
    return KeptMask(keys, drops, laid)


def _most_bytes(name: KeptName) -> int:
    """The largest file a mask of ``name``'s fragments can be."""
    rows = sum(name.rows.values())
    runs = sum(key_runs.most_runs(r) for r in name.rows.values())
    size = name.keys.dtype.itemsize
    head = len(_MAGIC) + len(name.name) + 24 + 32 * len(name.rows)
    return head + size * (MAX_KEYS + 2 * runs) + 8 * min(rows, MAX_ROWS) + 4 * (runs + rows) + 4


def load(name: KeptName) -> KeptMask | None:
    """The mask kept for ``name``'s base, if any (for whichever newer keys it was kept), with
    its layouts when its keys are not ``name.keys``."""
    data = machine_cache.read_kept(KIND, name.name, _most_bytes(name))
    if data is None:
        return None
    kept = decode(data, name, layouts=False)
    if kept is None or (kept.keys.size == name.keys.size and np.array_equal(kept.keys, name.keys)):
        return kept
    return decode(data, name)


def keep(name: KeptName, mask: KeptMask) -> bool:
    """Keep ``mask`` of every fragment of ``name`` (not kept beyond :data:`MAX_ROWS` rows or
    :data:`MAX_KEYS` keys; layouts only of ``name``'s fragments, of their rows). Returns whether it was kept."""
    if set(mask.drops) != set(name.rows) or sum(int(d.size) for d in mask.drops.values()) > MAX_ROWS:
        return False
    if mask.keys.size > MAX_KEYS or mask.keys.dtype != name.keys.dtype:
        return False
    laid = {
        f: x
        for f, x in mask.layouts.items()
        if name.rows.get(f) == x.runs.rows and x.runs.firsts.dtype == mask.keys.dtype
    }
    return machine_cache.keep(KIND, name.name, encode(name, KeptMask(mask.keys, mask.drops, laid)))


def changes(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys ``new`` has and ``old`` lacks, and those ``old`` has and ``new`` lacks (both
    sorted, unique; ~1 ms at 160k keys when only added, the usual case; ~0.05 ms when equal)."""
    if old.size == new.size and np.array_equal(old, new):
        return new[:0], old[:0]
    added = np.setdiff1d(new, old, assume_unique=True)
    if new.size - added.size == old.size:  # every old key is still there
        return added, old[:0]
    return added, np.setdiff1d(old, new, assume_unique=True)


def taken(mask: KeptMask, added: np.ndarray, removed: np.ndarray) -> dict[int, np.ndarray]:
    """The drop lists for newer keys that differ from ``mask.keys`` by ``added`` and ``removed``:
    every fragment's when none does; else those of the fragments with a layout, each less its
    rows of keys ``removed`` and plus its live rows of keys ``added`` (fragments without one
    are left out: decided as if nothing were kept)."""
    if not added.size and not removed.size:
        return dict(mask.drops)
    out: dict[int, np.ndarray] = {}
    for fid, layout in mask.layouts.items():
        drop = mask.drops[fid]
        if removed.size:
            drop = drop[~member(drop, key_runs.live_addresses(layout.runs.hits(removed), _NO_ROWS, fid))]
        joined = layout.live_hits(fid, added) if added.size else drop[:0]
        # a row has one key: ``joined`` (keys added) and ``drop`` (keys kept) share no row
        out[fid] = np.insert(drop, np.searchsorted(drop, joined), joined) if joined.size else drop
    return out


_kept_tables: set[str] = set()
_kept_lock = threading.Lock()


class MaskKeeper:
    """One snapshot's kept mask: read on first need, kept once every fragment is decided.

    A process keeps one mask per table, its first whole one that the mask it found (if any)
    does not serve well: a long-lived reader refreshing a table written to all the time would
    otherwise write a file per refresh. It holds no reference to its owner (a cycle would
    leave the owner's Lance datasets to the garbage collector, on whatever thread).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read = False
        self._name: KeptName | None = None
        self._found = False  # a mask was kept for this base
        self._found_layouts: dict[int, Layout] = {}  # the layouts of the mask found (when decoded)
        self._drops: dict[int, np.ndarray] | None = None
        self._changed = 0
        self._runs: dict[int, KeyRuns] = {}  # fragment id -> its data file's runs, when known

    def drops(self, name_of: Callable[[], KeptName | None]) -> dict[int, np.ndarray] | None:
        """The drop lists the kept mask gives this snapshot (fragment id -> sorted row
        addresses; maybe not every fragment's: :func:`taken`), if one is kept; ``name_of``:
        the snapshot's :class:`KeptName` (called once; None: nothing is kept)."""
        with self._lock:  # one read: the scans asking at once wait for it
            if not self._read:
                self._name = name_of()
                kept = load(self._name) if self._name is not None else None
                if kept is not None and self._name is not None:  # not held: its keys are the file's bytes
                    added, removed = changes(kept.keys, self._name.keys)
                    self._found, self._changed, self._found_layouts = True, added.size + removed.size, kept.layouts
                    self._drops = taken(kept, added, removed)
                self._read = True
            return self._drops

    def remember_runs(self, fragment_id: int, runs: KeyRuns | None) -> None:
        """Remember a fragment's key runs, to keep them with the whole mask."""
        if runs is not None:
            with self._lock:
                self._runs[fragment_id] = runs

    def _layouts(self, fragments: Sequence[Any], runs: key_runs.FragmentRuns | None) -> dict[int, Layout]:
        """Where the keys lie of every fragment of ``fragments`` (Lance fragments) with a layout
        in the mask found, key runs remembered or kept for its data file (read now), and
        deletions that can be read directly."""
        with self._lock:
            found = dict(self._found_layouts)
            known = dict(self._runs)
        out: dict[int, Layout] = {}
        for frag in fragments:
            fid, meta = frag.fragment_id, frag.metadata
            if fid in found:
                out[fid] = found[fid]
                continue
            got = known.get(fid)
            if got is None and runs is not None:
                got = runs.of_fragment(meta)
            if got is None or runs is None:
                continue
            gone = deleted_rows(runs.storage, meta) if meta.deletion_file is not None else _NO_ROWS
            if gone is not None:
                out[fid] = Layout(got, gone)
        return out

    def wants(self) -> bool:
        """Whether :meth:`offer` would keep a mask: one was looked for, none was found kept
        for keys close to this snapshot's (:data:`REKEEP_KEYS`), and this process has kept none
        of the table yet."""
        with self._lock:
            name, found, changed = self._name, self._found, self._changed
        if name is None or (found and changed <= max(REKEEP_KEYS, name.keys.size // 8)):
            return False
        with _kept_lock:
            return name.table not in _kept_tables

    def offer(
        self, drops: Mapping[int, np.ndarray], fragments: Sequence[Any], runs: key_runs.FragmentRuns | None
    ) -> bool:
        """Keep ``drops`` (of every one of ``fragments``, Lance fragments) with the layouts known
        (:meth:`remember_runs`, ``runs``) when :meth:`wants` it, off the query's path
        (:func:`~memwal_query.format.machine_cache.later`: writing 3 MiB at 160k keys cost a
        `count(*)` ~7 ms). Returns whether they will be kept."""
        name = self._name
        if name is None or not self.wants():
            return False
        with _kept_lock:
            if name.table in _kept_tables:
                return False
            _kept_tables.add(name.table)
        machine_cache.later(self._keep, name, dict(drops), fragments, runs)
        return True

    def _keep(
        self, name: KeptName, drops: dict[int, np.ndarray], fragments: Sequence[Any], runs: key_runs.FragmentRuns | None
    ) -> None:
        keep(name, KeptMask(name.keys, drops, self._layouts(fragments, runs)))
