"""A base fragment's integer keys as runs of consecutive values, kept on this machine's disk.

Keys written in order (an auto-increment id, a timestamp-ordered id) form long runs in a
base fragment's data file: rows ``s, s+1, ...`` hold keys ``k, k+1, ...``. :class:`KeyRuns`
keeps one ``(first row, first key, last key)`` triple per run, and answers which rows hold a
newer level's key with two binary searches per run instead of one lookup per row: a
fragment of 1M sequential keys is one run, where reading its key column costs ~8 ms.

A fragment's data file never changes, so its runs stay true: :func:`load` and :func:`store`
keep them per data file in this machine's cache directory (:mod:`~memwal_query.format.machine_cache`:
``MEMWAL_CACHE_DIR``, default ``~/.cache/memwal``; ``off`` keeps nothing), so a new
process decides such a fragment without reading its keys. A file is found by the data
file's path, size and modification time, the key's field id and type; one that does not
decode to well-formed runs over the fragment's rows is ignored. Only compressible keys are
kept (at most one run per :data:`ROWS_PER_RUN` rows), and small fragments' keys whatever they
are (up to :data:`SMALL_ROWS` rows: a merge writes such fragments of scattered keys, whose read
costs ~1 ms, mostly opening the file): other fragments are read as before.

Example:
    >>> import numpy as np
    >>> keys = np.concatenate([np.arange(10, 500), np.arange(1000, 1300)])  # rows 0-489, 490-789
    >>> runs = KeyRuns.of(keys)
    >>> len(runs), runs.hits(np.array([11, 12, 1001, 2000])).tolist()
    (2, [1, 2, 491])
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_query.format import machine_cache
from memwal_query.format.fragment_files import column_file, deleted_rows
from memwal_query.format.kept_bytes import sealed, whole
from memwal_query.format.sets import member
from memwal_query.format.storage import Storage

__all__ = [
    "KIND",
    "ROWS_PER_RUN",
    "SMALL_ROWS",
    "FragmentRuns",
    "KeyRuns",
    "live_addresses",
    "load",
    "most_runs",
    "store",
]

log = logging.getLogger(__name__)

ROWS_PER_RUN = 128
"""Runs are kept for a fragment with at most one run per this many rows (1M rows: 7,813 runs, 180 KiB)."""
SMALL_ROWS = 1 << 14
"""A fragment of at most this many rows has its runs kept however many (its keys, in effect: a
merge writes such fragments of scattered keys, and reading one costs ~1 ms, mostly opening it)."""
_CHUNK = 1 << 16
_MAGIC = b"MWKRUNS1"
_EMPTY = np.empty(0, dtype=np.int64)
KIND = "key-runs"
"""The folder of run files in the cache directory (:mod:`~memwal_query.format.machine_cache`)."""


@dataclass(frozen=True)
class KeyRuns:
    """Rows ``starts[i]`` .. ``starts[i+1] - 1`` of a fragment hold keys ``firsts[i]`` .. ``lasts[i]``, one apart.

    Attributes:
        starts: First row (offset in the data file) of each run, ascending from 0.
        firsts: Key of each run's first row (the fragment's key type).
        lasts: Key of each run's last row.
        rows: Rows of the data file.
    """

    starts: np.ndarray
    firsts: np.ndarray
    lasts: np.ndarray
    rows: int

    def __len__(self) -> int:
        return int(self.starts.size)

    @staticmethod
    def of(keys: np.ndarray) -> KeyRuns | None:
        """The runs of integer ``keys`` (every row of a data file, in order); None when there
        are more than :func:`most_runs` (or the keys are not integers)."""
        if keys.dtype.kind not in "iu" or not keys.size:
            return None
        limit = most_runs(keys.size)  # as many breaks make one run too many
        breaks: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        found = 0
        step = np.empty(min(_CHUNK, keys.size), dtype=keys.dtype)
        broken = np.empty(step.size, dtype=bool)
        for at in range(0, keys.size - 1, _CHUNK):  # chunks that stay in cache; give up early
            part = keys[at : at + _CHUNK + 1]
            n = part.size - 1
            np.subtract(part[1:], part[:-1], out=step[:n])  # wraps at the type's ends: checked below
            np.not_equal(step[:n], 1, out=broken[:n])
            if not broken[:n].any():
                continue
            b = np.flatnonzero(broken[:n])
            found += b.size
            if found >= limit:
                return None
            breaks.append(b.astype(np.int64) + at + 1)
        starts = np.concatenate(breaks)
        ends = np.append(starts[1:], keys.size)
        runs = KeyRuns(starts, keys[starts], keys[ends - 1], int(keys.size))
        return runs if runs.well_formed() else None  # a run across the type's largest value

    @property
    def scattered(self) -> bool:
        """Whether there are more runs than a large fragment keeps (a small fragment's keys, in
        effect): a lookup of each key beats two searches per run then."""
        return len(self) > max(1, self.rows // ROWS_PER_RUN)

    def lengths(self) -> np.ndarray:
        """Rows of each run."""
        return np.diff(np.append(self.starts, self.rows))

    def keys(self) -> np.ndarray:
        """Every row's key, in row order."""
        lengths = self.lengths()
        offsets = np.arange(self.rows) - np.repeat(self.starts, lengths)
        firsts = np.repeat(self.firsts, lengths)
        return np.asarray(firsts + offsets.astype(firsts.dtype))

    def well_formed(self) -> bool:
        """Whether the runs tile the rows and each run's keys fit its length (a damaged file's do not)."""
        s, f, last = self.starts, self.firsts, self.lasts
        if not (s.size and s.size == f.size == last.size and f.dtype == last.dtype and f.dtype.kind in "iu"):
            return False
        if int(s[0]) != 0 or not bool(np.all(s[1:] > s[:-1])) or int(s[-1]) >= self.rows or self.rows >= 1 << 32:
            return False
        lengths = self.lengths()
        if not bool(np.all(last >= f)):
            return False
        # last - first in uint64 (no overflow: last >= first) must be the run's length - 1
        span = last.astype(np.uint64, copy=False) - f.astype(np.uint64, copy=False)
        return bool(np.all(span == (lengths - 1).astype(np.uint64)))

    def hits(self, newer: np.ndarray) -> np.ndarray:
        """Rows (ascending offsets) whose key is one of ``newer`` (sorted, unique, the keys' type):
        two searches per run, or one per key when the runs are :attr:`scattered`."""
        if not newer.size:
            return _EMPTY
        if self.scattered:  # a search per key (no table over the newer keys' span to build for it)
            return np.flatnonzero(member(self.keys(), newer))
        lo = np.searchsorted(newer, self.firsts, "left")
        hi = np.searchsorted(newer, self.lasts, "right")
        counts = hi - lo
        total = int(counts.sum())
        if not total:
            return _EMPTY
        run = np.repeat(np.arange(counts.size), counts)
        at = lo[run] + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        off = newer[at].astype(np.uint64, copy=False) - self.firsts[run].astype(np.uint64, copy=False)
        return np.asarray(off.astype(np.int64) + self.starts[run])

    def encode(self, identity: bytes) -> bytes:
        """The file :func:`store` writes: header, the three arrays, a CRC-32 of all of it."""
        dtype = self.firsts.dtype.str.encode().ljust(8, b" ")
        head = _MAGIC + identity + dtype + np.array([self.rows, len(self)], dtype="<u8").tobytes()
        body = self.starts.astype("<u4").tobytes() + self.firsts.tobytes() + self.lasts.tobytes()
        return sealed(head + body)

    @staticmethod
    def decode(data: bytes, identity: bytes, dtype: np.dtype) -> KeyRuns | None:
        """The runs in ``data`` when it is a whole, well-formed file for ``identity`` of keys ``dtype``."""
        head = _file_size(len(identity), dtype, 0) - 4
        if len(data) < head + 4 or data[: len(_MAGIC) + len(identity)] != _MAGIC + identity:
            return None
        if not whole(data):
            return None
        at = len(_MAGIC) + len(identity)
        if data[at : at + 8].rstrip(b" ") != dtype.str.encode():
            return None
        rows, n = (int(v) for v in np.frombuffer(data, dtype="<u8", count=2, offset=at + 8))
        if len(data) != _file_size(len(identity), dtype, n):
            return None
        starts = np.frombuffer(data, dtype="<u4", count=n, offset=head).astype(np.int64)
        firsts = np.frombuffer(data, dtype=dtype, count=n, offset=head + 4 * n)
        lasts = np.frombuffer(data, dtype=dtype, count=n, offset=head + (4 + dtype.itemsize) * n)
        runs = KeyRuns(starts, firsts, lasts, rows)
        return runs if runs.well_formed() else None


def _identity(data_file: str, field_id: int, dtype: np.dtype) -> bytes | None:
    """The name of the runs of a data file's key column: a digest of the file's path, size and
    modification time, the field and the type (32 bytes, also written in the file)."""
    ident = machine_cache.file_identity(data_file)
    return machine_cache.digest(KIND, ident, str(field_id), dtype.str) if ident is not None else None


def load(data_file: str, field_id: int, dtype: np.dtype, rows: int) -> KeyRuns | None:
    """The runs kept for key field ``field_id`` of local ``data_file`` of ``rows`` rows, if any."""
    ident = _identity(data_file, field_id, dtype) if machine_cache.cache_dir(KIND) is not None else None
    if ident is None:
        return None
    most = _file_size(len(ident), dtype, most_runs(rows))  # KeyRuns.of keeps no more
    data = machine_cache.read_kept(KIND, ident, most)
    runs = KeyRuns.decode(data, ident, dtype) if data is not None else None
    return runs if runs is not None and runs.rows == rows else None


def most_runs(rows: int) -> int:
    """The most runs kept for a fragment of ``rows`` rows: one per :data:`ROWS_PER_RUN` rows, any
    number up to :data:`SMALL_ROWS` rows."""
    return rows if rows <= SMALL_ROWS else max(1, rows // ROWS_PER_RUN)


def _file_size(ident: int, dtype: np.dtype, runs: int) -> int:
    """The size of a run file of ``runs`` runs of keys ``dtype`` (identity of ``ident`` bytes):
    magic, identity, type, rows and runs, then starts, first and last keys, a CRC-32."""
    return len(_MAGIC) + ident + 8 + 16 + runs * (4 + 2 * dtype.itemsize) + 4


def store(data_file: str, field_id: int, runs: KeyRuns) -> bool:
    """Keep ``runs`` for key field ``field_id`` of local ``data_file`` (written whole or not at
    all; a cache directory that cannot be written keeps nothing). Returns whether it was kept."""
    ident = _identity(data_file, field_id, runs.firsts.dtype) if machine_cache.cache_dir(KIND) is not None else None
    return ident is not None and machine_cache.keep(KIND, ident, runs.encode(ident))


@dataclass(frozen=True)
class FragmentRuns:
    """The key runs of one local base's fragments, against one snapshot's newer keys.

    Attributes:
        storage: The base's storage (local).
        field_id: The Lance field id of its integer key.
        newer: The newer levels' keys, sorted and unique.
    """

    storage: Storage
    field_id: int
    newer: np.ndarray

    def of_fragment(self, meta: Any) -> KeyRuns | None:
        """The runs kept for fragment ``meta``'s data file, if any."""
        path = column_file(self.storage, meta, self.field_id)
        return load(path, self.field_id, self.newer.dtype, int(meta.physical_rows)) if path is not None else None

    def shadowed(self, meta: Any, runs: KeyRuns) -> np.ndarray | None:
        """Sorted addresses of the live rows of fragment ``meta`` (whose data file's runs are
        ``runs``) with a newer key; None when its deletions cannot be read directly."""
        rows = runs.hits(self.newer)
        gone = deleted_rows(self.storage, meta) if rows.size and meta.deletion_file is not None else _EMPTY
        return live_addresses(rows, gone, int(meta.id)) if gone is not None else None

    def keep(self, meta: Any, keys: pa.ChunkedArray) -> KeyRuns | None:
        """Keep the runs of fragment ``meta``'s key column ``keys`` (every stored row, as
        :func:`~memwal_query.format.fragment_files.read_columns` reads it) when they
        compress. Returns the runs when they were kept."""
        path = column_file(self.storage, meta, self.field_id)
        if path is None or keys.null_count or machine_cache.cache_dir(KIND) is None:
            return None
        runs = KeyRuns.of(np.asarray(keys.to_numpy(), dtype=self.newer.dtype))
        return runs if runs is not None and store(path, self.field_id, runs) else None


def live_addresses(rows: np.ndarray, deleted: np.ndarray, fragment_id: int) -> np.ndarray:
    """Row addresses (ascending) of fragment ``fragment_id``'s rows at ascending offsets ``rows``
    (:meth:`KeyRuns.hits`), less those at sorted offsets ``deleted``."""
    rows = rows.astype(np.uint64)
    if rows.size and deleted.size:
        rows = rows[~member(rows, deleted.astype(np.uint64, copy=False))]  # not the deleted ones
    return np.asarray(rows | (np.uint64(fragment_id) << np.uint64(32)))
