"""A snapshot's whole base mask kept on this machine, for the next process reading the same snapshot.

A base fragment's drop list (the addresses of its live rows whose key has a newer version)
follows from two things only: the fragment's rows (its data and deletion files) and the
newer levels' keys. Once a process has decided every fragment of a local base with one
integer key (a ``count(*)``, a scan of the whole table), :func:`keep` writes the drop lists
as one file of this machine's cache directory (:mod:`~memwal_query.format.machine_cache`,
folder :data:`KIND`), named by a digest of both (:func:`mask_name`): each data and deletion
file's path, size and modification time, the key's field, and the newer keys themselves.
A new process whose snapshot has the same files and the same newer keys (a notebook
restarted, a CLI call on a table nobody wrote to since) takes its drop lists from it
(:func:`load`) and reads no key. Any write since (a WAL entry, a flush, a merge) names
another file: that process decides as before (:mod:`~memwal_query.key_runs`, key reads),
then keeps its own. A file that is not whole, not for these fragments, or whose lists do
not fit their fragments' rows is ignored.

Example:
    >>> import numpy as np
    >>> name = KeptName(b"n" * 32, {0: 10, 1: 5})
    >>> data = encode(name, {0: np.array([3, 7], dtype=np.uint64), 1: np.array([(1 << 32) | 4], dtype=np.uint64)})
    >>> {f: d.tolist() for f, d in decode(data, name).items()}
    {0: [3, 7], 1: [4294967300]}
    >>> decode(data[:-1], name) is None
    True
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memwal_query.format import machine_cache
from memwal_query.format.storage import Storage

__all__ = ["KIND", "MAX_ROWS", "KeptName", "MaskKeeper", "decode", "encode", "keep", "keeping", "load", "mask_name"]

KIND = "base-masks"
"""The folder of kept masks in the cache directory."""
MAX_ROWS = 1 << 20
"""Masks of more shadowed rows than this (8 MiB) are not kept: a merger that far behind
changes them faster than they are read again."""
_MAGIC = b"MWMASKS1"


@dataclass(frozen=True)
class KeptName:
    """What a kept mask is found by and checked against.

    Attributes:
        name: The file's 32-byte name (also written in it).
        rows: Base fragment id -> rows its data files store.
        table: The base's real path (a process keeps one mask per table: :class:`MaskKeeper`).
    """

    name: bytes
    rows: dict[int, int]
    table: str = ""


def _file_stamp(path: str | None) -> str | None:
    """A local file's :func:`~memwal_query.format.machine_cache.file_stamp`; None when there is none."""
    return machine_cache.file_stamp(path) if path is not None else None


def _fragment_stamp(storage: Storage, meta: Any) -> str | None:
    """What a fragment's rows are made of: its data files and deletion file, each stamped
    (:func:`_file_stamp`); None when one lives elsewhere or cannot be stat'ed."""
    parts = [f"{meta.id}\0{meta.physical_rows}"]
    for f in meta.files:
        stamp = _file_stamp(storage.local_path(f"data/{f.path}")) if getattr(f, "base_id", None) is None else None
        if stamp is None:
            return None
        parts.append(f"{stamp}\0{list(f.fields)}\0{list(f.column_indices)}")
    d = meta.deletion_file
    if d is not None:
        stamp = _file_stamp(storage.local_path(d.path(meta.id))) if getattr(d, "base_id", None) is None else None
        if stamp is None:
            return None
        parts.append(f"{stamp}\0{d.file_type}\0{d.num_deleted_rows}")
    return "\0".join(parts)


def keeping() -> bool:
    """Whether masks are kept on this machine (a cache directory is set: not ``off``)."""
    return machine_cache.cache_dir(KIND) is not None


def mask_name(
    storage: Storage, fragments: Sequence[Any], key: str, field_id: int, newer: np.ndarray
) -> KeptName | None:
    """The name of the mask of local base ``fragments`` (Lance fragments) against sorted unique
    integer keys ``newer`` of key column ``key`` (field ``field_id``); None when keeping is
    off or a file cannot be stamped."""
    root = storage.local_path("")
    if root is None or not keeping():
        return None
    metas = [f.metadata for f in fragments]
    stamps = []
    for meta in metas:
        stamp = _fragment_stamp(storage, meta)
        if stamp is None:
            return None
        stamps.append(stamp)
    keys = hashlib.sha256(np.ascontiguousarray(newer).tobytes()).hexdigest()
    table = os.path.realpath(root)
    name = machine_cache.digest(KIND, table, key, str(field_id), newer.dtype.str, keys, *stamps)
    return KeptName(name, {int(m.id): int(m.physical_rows) for m in metas}, table)


def encode(name: KeptName, drops: Mapping[int, np.ndarray]) -> bytes:
    """The file :func:`keep` writes: magic, name, the fragments' ids and list lengths, the
    lists (row addresses, little-endian), a CRC-32 of all of it."""
    ids = sorted(drops)
    head = _MAGIC + name.name + np.array([len(ids)], dtype="<u8").tobytes()
    table = np.array([[i, drops[i].size] for i in ids], dtype="<u8").reshape(-1, 2).tobytes()
    body = b"".join(np.asarray(drops[i], dtype="<u8").tobytes() for i in ids)
    data = head + table + body
    return data + zlib.crc32(data).to_bytes(4, "little")


def decode(data: bytes, name: KeptName) -> dict[int, np.ndarray] | None:
    """The drop lists in ``data`` when it is a whole file of ``name``, of exactly its
    fragments, each list ascending and within its fragment's rows; None otherwise."""
    at = len(_MAGIC) + len(name.name)
    if len(data) < at + 12 or data[:at] != _MAGIC + name.name:
        return None
    if zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "little"):
        return None
    n = int(np.frombuffer(data, dtype="<u8", count=1, offset=at)[0])
    if n != len(name.rows) or len(data) < at + 8 + 16 * n + 4:
        return None
    table = np.frombuffer(data, dtype="<u8", count=2 * n, offset=at + 8).reshape(n, 2)
    sizes = table[:, 1]
    if set(table[:, 0].tolist()) != set(name.rows) or len(data) != at + 8 + 16 * n + 8 * int(sizes.sum()) + 4:
        return None
    out: dict[int, np.ndarray] = {}
    offset = at + 8 + 16 * n
    for fid, size in table.tolist():
        drop = np.frombuffer(data, dtype="<u8", count=size, offset=offset).astype(np.uint64)
        offset += 8 * size
        rows = drop & np.uint64(0xFFFFFFFF)
        if drop.size and (
            bool(np.any(drop >> np.uint64(32) != np.uint64(fid)))
            or int(rows[-1]) >= name.rows[fid]
            or not bool(np.all(drop[1:] > drop[:-1]))
        ):
            return None
        out[int(fid)] = drop
    return out


def _most_bytes(name: KeptName) -> int:
    """The largest file a mask of ``name``'s fragments can be."""
    rows = min(sum(name.rows.values()), MAX_ROWS)
    return len(_MAGIC) + len(name.name) + 8 + 16 * len(name.rows) + 8 * rows + 4


def load(name: KeptName) -> dict[int, np.ndarray] | None:
    """The drop lists kept under ``name`` (fragment id -> sorted row addresses), if any."""
    data = machine_cache.read_kept(KIND, name.name, _most_bytes(name))
    return decode(data, name) if data is not None else None


def keep(name: KeptName, drops: Mapping[int, np.ndarray]) -> bool:
    """Keep the drop lists of every fragment of ``name`` (not kept beyond :data:`MAX_ROWS`
    rows). Returns whether they were kept."""
    if set(drops) != set(name.rows) or sum(int(d.size) for d in drops.values()) > MAX_ROWS:
        return False
    return machine_cache.keep(KIND, name.name, encode(name, drops))


_kept_tables: set[str] = set()
_kept_lock = threading.Lock()


class MaskKeeper:
    """One snapshot's kept mask: read on first need, kept once every fragment is decided.

    A process keeps one mask per table, its first whole one: a long-lived reader refreshing
    a table written to all the time would otherwise write a file per refresh, each for
    newer keys the next process will not see. It holds no reference to its owner (a cycle
    would leave the owner's Lance datasets to the garbage collector, on whatever thread).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read = False
        self._name: KeptName | None = None
        self._drops: dict[int, np.ndarray] | None = None

    def drops(self, name_of: Callable[[], KeptName | None]) -> dict[int, np.ndarray] | None:
        """The kept drop lists of this snapshot (fragment id -> sorted row addresses), if any;
        ``name_of``: the snapshot's :class:`KeptName` (called once; None: nothing is kept)."""
        with self._lock:  # one read: the scans asking at once wait for it
            if not self._read:
                self._name = name_of()
                self._drops = load(self._name) if self._name is not None else None
                self._read = True
            return self._drops

    def offer(self, drops: Mapping[int, np.ndarray]) -> bool:
        """Keep ``drops`` (every fragment's) unless they came from a kept file, none was looked
        for, or this process kept a mask of the table already. Returns whether they were kept."""
        with self._lock:
            name, kept = self._name, self._drops
        if kept is not None or name is None:
            return False
        with _kept_lock:
            if name.table in _kept_tables:
                return False
            _kept_tables.add(name.table)
        return keep(name, drops)
