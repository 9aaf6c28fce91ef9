"""A region's unmerged generations ranked by key, kept on this machine for the next process.

Opening a snapshot read every unmerged generation's keys (one Lance read each, ~1 ms) and
ranked them with the region's MemTable (a sort of all their rows): ~20 of the ~35 ms a
fresh process spent opening a table with 12 generations of 12.5k rows. The ranking of the
generations alone follows from their files only, and a flushed generation never changes:
:class:`RankedGenerations` (each key's newest row among them, and the rows they lose) is
kept as one file per region and set of generations in this machine's cache directory
(:mod:`~memwal_query.format.machine_cache`, folder :data:`KIND`), named by a digest of the
table's real path, the region, the key column and type, and each generation's fragments
(:func:`~memwal_query.format.machine_cache.fragment_stamp`: their data and deletion files'
paths, sizes and modification times). A new process takes it instead of reading the keys;
the merge then only ranks the MemTable's rows against it
(:mod:`memwal_query.region_merge`). Only a region of local generations read in place, with
one integer key, is kept; a file that is not whole, not of these generations or not well
formed is ignored. A data file cut short or a deletion file removed changes the name: the
keys are read again, and the damage found as before.

Example:
    >>> import numpy as np
    >>> # generation 0: key 3, then a tombstone of key 8; generation 1: key 3 again
    >>> r = RankedGenerations(
    ...     np.array([3, 8]), np.array([False, True]), np.array([1, 0], dtype=np.int32),
    ...     np.array([0, 1], dtype=np.uint64), (np.array([0, 1], dtype=np.uint64), np.array([], dtype=np.uint64)), 3)
    >>> name = KeptRanksName(b"n" * 32, ({0: 2}, {0: 1}), np.dtype(np.int64))
    >>> decode(encode(name, r), name).keys.tolist(), decode(encode(name, r)[:-1], name)
    ([3, 8], None)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_query.format import machine_cache
from memwal_query.format.kept_bytes import ArrayReader, ascending, sealed, u8, whole
from memwal_query.format.storage import Storage
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import GenerationSource

__all__ = [
    "KIND",
    "MAX_ROWS",
    "KeptRanksName",
    "RankedGenerations",
    "decode",
    "encode",
    "held",
    "keep",
    "load",
    "ranks_name",
]

KIND = "generation-ranks"
"""The folder of kept rankings in the cache directory."""
MAX_ROWS = 1 << 22
"""Regions whose generations hold more rows than this are not kept (a file of ~90 MiB)."""
_MAGIC = b"MWRANKS1"


@dataclass(frozen=True)
class RankedGenerations:
    """A region's unmerged generations ranked by key, without its MemTable.

    Attributes:
        keys: Each key's, ascending and unique.
        tombstone: Whether the key's newest row is a tombstone.
        level: The index (in the region's generations, oldest first) of its newest row's generation.
        seq: Its newest row's address in that generation.
        drops: Per generation, the sorted addresses of its rows that are not live (a newer
            row of their key, or a tombstone).
        rows: The generations' rows.
    """

    keys: np.ndarray
    tombstone: np.ndarray
    level: np.ndarray
    seq: np.ndarray
    drops: tuple[np.ndarray, ...]
    rows: int


@dataclass(frozen=True)
class KeptRanksName:
    """What a kept ranking is found by and checked against.

    Attributes:
        name: The file's 32-byte name (also written in it).
        fragments: Per generation, fragment id -> rows (addresses must fall in them).
        dtype: The key's type.
        uris: The generations' URIs, oldest first (a ranking serves exactly these).
    """

    name: bytes
    fragments: tuple[dict[int, int], ...]
    dtype: np.dtype
    uris: tuple[str, ...] = ()


def ranks_name(
    storage: Storage, region_id: str, gens: Sequence[GenerationSource], key: str, key_type: pa.DataType
) -> KeptRanksName | None:
    """The name of the ranking of ``gens`` (a region's unmerged generations, oldest first) by
    integer column ``key``; None when nothing is kept (keeping off, an object store, a
    generation read into memory, an integer key it is not, a file that cannot be stamped)."""
    root = storage.local_path("")
    if root is None or not gens or not pa.types.is_integer(key_type) or machine_cache.cache_dir(KIND) is None:
        return None
    stamps = [os.path.realpath(root), region_id, key, str(key_type)]
    shapes = []
    for g in gens:
        if g.rebuilt_from_wal or g.conformed_from or not g.uri.startswith(f"{storage.uri}/"):
            return None
        metas = [f.metadata for f in g.dataset.get_fragments()]
        stamps.append(f"{g.generation}\0{g.uri}\0{g.num_rows}")
        for meta in metas:
            stamp = machine_cache.fragment_stamp(g.uri, meta)
            if stamp is None:
                return None
            stamps.append(stamp)
        shapes.append({int(m.id): int(m.physical_rows) for m in metas})
    name = machine_cache.digest(KIND, *stamps)
    return KeptRanksName(name, tuple(shapes), np.dtype(key_type.to_pandas_dtype()), tuple(g.uri for g in gens))


def held(cache: SnapshotCache, region_id: str, gens: Sequence[GenerationSource]) -> RankedGenerations | None:
    """The ranking of generations ``gens`` of region ``region_id`` that ``cache`` holds, if any."""
    with cache.lock:
        hit = cache.generation_ranks.get(region_id)
    if hit is not None and hit[0] == tuple(g.uri for g in gens) and isinstance(hit[1], RankedGenerations):
        return hit[1]
    return None


def encode(name: KeptRanksName, ranks: RankedGenerations) -> bytes:
    """The file :func:`keep` writes: magic, name, counts (generations, keys, rows), each
    generation's drop count; the keys, addresses, levels, tombstones and drops, little-endian;
    a CRC-32 of all of it."""
    arrays: list[tuple[np.ndarray, Any]] = [(ranks.keys, name.dtype.newbyteorder("<")), (ranks.seq, "<u8")]
    arrays += [(ranks.level, "<i4")]
    arrays += [(ranks.tombstone.view(np.uint8), "u1"), *[(d, "<u8") for d in ranks.drops]]
    parts: list[bytes | memoryview] = [_MAGIC, name.name, u8(len(ranks.drops), ranks.keys.size, ranks.rows)]
    parts += [u8(*[d.size for d in ranks.drops])]
    parts += [memoryview(np.ascontiguousarray(a, dtype=t)).cast("B") for a, t in arrays]  # type: ignore[arg-type]
    return sealed(b"".join(parts))


def _fit(addrs: np.ndarray, fragments: dict[int, int]) -> bool:
    """Whether every address of ``addrs`` is a row of one of ``fragments`` (id -> rows)."""
    if not addrs.size:
        return True
    ids, offsets = addrs >> np.uint64(32), addrs & np.uint64(0xFFFFFFFF)
    lo, hi = int(ids.min()), int(ids.max())
    if lo == hi:  # a flushed generation is one fragment
        return lo in fragments and int(offsets.max()) < fragments[lo]
    for fid in np.unique(ids).tolist():
        rows = fragments.get(int(fid))
        if rows is None or int(offsets[ids == fid].max()) >= rows:
            return False
    return True


def _rows_fit(seq: np.ndarray, level: np.ndarray, fragments: Sequence[dict[int, int]]) -> bool:
    """Whether each address of ``seq`` is a row of generation ``level`` (the same position):
    one gather when each generation is one fragment, as flushed ones are; else per generation."""
    if all(len(f) == 1 for f in fragments):
        ids = np.array([next(iter(f)) for f in fragments], dtype=np.uint64)
        rows = np.array([next(iter(f.values())) for f in fragments], dtype=np.uint64)
        return bool(np.all(seq >> np.uint64(32) == ids[level]) and np.all(seq & np.uint64(0xFFFFFFFF) < rows[level]))
    return all(_fit(seq[level == i], shape) for i, shape in enumerate(fragments))


def decode(data: bytes, name: KeptRanksName) -> RankedGenerations | None:
    """The ranking in ``data`` when it is a whole file of ``name``, of exactly its generations,
    its keys ascending, each address a row of its generation, each drop list ascending, and
    every row either live (a key's newest, not a tombstone) or dropped; None otherwise."""
    head = len(_MAGIC) + len(name.name) + 24
    n = len(name.fragments)
    if len(data) < head + 8 * n + 4 or data[: head - 24] != _MAGIC + name.name:
        return None
    if not whole(data):
        return None
    gens, nkeys, rows = (int(v) for v in np.frombuffer(data, dtype="<u8", count=3, offset=head - 24))
    if gens != n:
        return None
    counts = [int(c) for c in np.frombuffer(data, dtype="<u8", count=n, offset=head)]
    size = head + 8 * n + nkeys * (name.dtype.itemsize + 8 + 4 + 1) + 8 * sum(counts) + 4
    if len(data) != size:
        return None
    take = ArrayReader(data, head + 8 * n).take
    keys = take(name.dtype.newbyteorder("<"), nkeys)
    seq, level, tomb = take("<u8", nkeys), take("<i4", nkeys), take("u1", nkeys)
    drops = tuple(take("<u8", c) for c in counts)
    if not ascending(keys) or (tomb > 1).any() or (nkeys and (level.min() < 0 or level.max() >= n)):
        return None
    tombstone = tomb.view(bool)
    if rows != nkeys - int(tombstone.sum()) + sum(counts):  # each row live or dropped, once
        return None
    if not (_rows_fit(seq, level, name.fragments) and all(ascending(d) for d in drops)):
        return None
    if not all(_fit(d, shape) for d, shape in zip(drops, name.fragments, strict=True)):
        return None
    return RankedGenerations(keys, tombstone, level, seq, drops, rows)


def load(name: KeptRanksName) -> RankedGenerations | None:
    """The ranking kept under ``name``, if any is whole and well formed."""
    most = len(_MAGIC) + len(name.name) + 24 + 8 * len(name.fragments) + MAX_ROWS * (name.dtype.itemsize + 29) + 4
    data = machine_cache.read_kept(KIND, name.name, most)
    return None if data is None else decode(data, name)


def keep(name: KeptRanksName, ranks: RankedGenerations) -> bool:
    """Keep ``ranks`` under ``name`` (not beyond :data:`MAX_ROWS` rows). Returns whether it was kept."""
    if ranks.rows > MAX_ROWS or len(ranks.drops) != len(name.fragments):
        return False
    return machine_cache.keep(KIND, name.name, encode(name, ranks))
