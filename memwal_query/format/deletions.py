"""Lance deletion files: which row offsets of a fragment are deleted.

A fragment's manifest entry names at most one deletion file under ``_deletions/``
(``{fragment}-{read_version}-{id}.{arrow|bin}``) and how many rows it deletes. Two kinds
(pylance 14.0.2 writes both; measured on its files):

* ``array`` (``.arrow``): an Arrow IPC file whose one ``uint32`` column lists the deleted offsets
  (Lance uses it below 5,000 deletions);
* ``bitmap`` (``.bin``): a 32-bit roaring bitmap in the portable serialization
  (github.com/RoaringBitmap/RoaringFormatSpec): a cookie (12346: no run containers, the
  container count follows; 12347 in the low 16 bits: the count minus one in the high 16
  bits, then a bitset of which containers are runs), one (key, cardinality - 1) pair of
  u16 per container, u32 offsets (always without runs, from 4 containers with them),
  then each container: runs (u16 count, then (start, length - 1) u16 pairs), a bitmap
  (1024 u64 words, above 4,096 values) or a sorted u16 array. Values are
  ``key << 16 | low``. Everything is little-endian.

Example:
    >>> import struct
    >>> data = struct.pack("<II", 12346, 1) + struct.pack("<HH", 0, 1) + struct.pack("<I", 16)
    >>> deleted_offsets(data + struct.pack("<HH", 3, 9), "bitmap", "_deletions/0-1-2.bin").tolist()
    [3, 9]
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc

from memwal_query.errors import MemWalCorruptionError, one_line
from memwal_query.format.sets import unique
from memwal_query.format.storage import Storage

__all__ = ["deleted_offsets", "fragment_deletions"]

_NO_RUNS = 12346
_RUNS = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_MAX = 4096


class _Cursor:
    """Bounds-checked little-endian reads over ``data`` (``what`` names the file in errors)."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            msg = f"deletion file {self.what} is truncated or malformed (needs {n} bytes at {self.pos})"
            raise MemWalCorruptionError(msg)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u16s(self, n: int) -> np.ndarray:
        return np.frombuffer(self.take(2 * n), dtype="<u2").astype(np.uint32)


def _roaring(data: bytes, what: str) -> np.ndarray:
    cur = _Cursor(data, what)
    cookie = cur.u32()
    if cookie == _NO_RUNS:
        size, runs = cur.u32(), np.zeros(0, dtype=bool)
    elif cookie & 0xFFFF == _RUNS:
        size = (cookie >> 16) + 1
        runs = np.unpackbits(np.frombuffer(cur.take((size + 7) // 8), np.uint8), bitorder="little")
    else:
        msg = f"deletion file {what} is not a roaring bitmap (cookie {cookie:#x})"
        raise MemWalCorruptionError(msg)
    if size > 65536:
        msg = f"deletion file {what} claims {size} containers (at most 65536)"
        raise MemWalCorruptionError(msg)
    header = cur.u16s(2 * size)
    keys, cards = header[0::2], header[1::2] + 1
    if size and not bool(np.all(keys[1:] > keys[:-1])):
        msg = f"deletion file {what} has unsorted container keys"
        raise MemWalCorruptionError(msg)
    if cookie == _NO_RUNS or size >= _NO_OFFSET_THRESHOLD:
        cur.take(4 * size)  # container offsets: the containers follow in order anyway
    parts = []
    for i in range(size):
        if runs.size and runs[i]:
            n = int(cur.u16s(1)[0])
            pairs = cur.u16s(2 * n)
            starts, lengths = pairs[0::2], pairs[1::2] + 1
            if n and int(lengths.sum()) != int(cards[i]):
                msg = f"deletion file {what}: a run container's runs disagree with its cardinality"
                raise MemWalCorruptionError(msg)
            within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            low = np.repeat(starts, lengths) + within
        elif cards[i] > _ARRAY_MAX:
            bits = np.unpackbits(np.frombuffer(cur.take(8192), np.uint8), bitorder="little")
            low = np.flatnonzero(bits).astype(np.uint32)
            if low.size != int(cards[i]):
                msg = f"deletion file {what}: a bitmap container's bits disagree with its cardinality"
                raise MemWalCorruptionError(msg)
        else:
            low = cur.u16s(int(cards[i]))
        if low.size and (int(low.max()) > 0xFFFF or not bool(np.all(low[1:] > low[:-1]))):
            msg = f"deletion file {what}: container values are not sorted 16-bit values"
            raise MemWalCorruptionError(msg)
        parts.append((np.uint64(keys[i]) << np.uint64(16)) | low.astype(np.uint64))
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def _arrow(data: bytes, what: str) -> np.ndarray:
    try:
        t = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except (pa.ArrowException, OSError) as err:  # invalid, unsupported or absurdly large
        msg = f"deletion file {what} is not a readable Arrow file: {one_line(err)}"
        raise MemWalCorruptionError(msg) from err
    try:  # a column reads its field's name: not UTF-8 in a hostile file
        one = t.num_columns == 1 and pa.types.is_integer(t.schema.field(0).type) and not t.column(0).null_count
        out = t.column(0).to_numpy() if one else None
    except UnicodeDecodeError:
        out = None
    if out is None:
        columns = ", ".join(f"{_name(f)}: {f.type}" for f in t.schema)
        msg = f"deletion file {what} does not hold one column of row offsets ({columns})"
        raise MemWalCorruptionError(msg)
    if out.size and int(out.min()) < 0:
        msg = f"deletion file {what} lists a negative row offset"
        raise MemWalCorruptionError(msg)
    return unique(out.astype(np.uint64))  # Lance writes a set's values in any order


def _name(f: pa.Field) -> str:
    """A field's name, or what it is when its bytes are not UTF-8 (a hostile file's)."""
    try:
        return str(f.name)
    except UnicodeDecodeError:
        return "<a name that is not UTF-8>"


def deleted_offsets(data: bytes, file_type: str, what: str) -> np.ndarray:
    """The sorted, unique row offsets a deletion file deletes.

    Args:
        data: The file's bytes.
        file_type: ``"array"`` (an ``.arrow`` file) or ``"bitmap"`` (the manifest's
            ``DeletionFile.file_type``).
        what: The file's path, for errors.

    Raises:
        MemWalCorruptionError: The bytes are not a deletion file of that kind.
    """
    if file_type == "bitmap":
        return _roaring(data, what)
    if file_type in ("array", "arrow"):
        return _arrow(data, what)
    msg = f"deletion file {what} has an unknown type {file_type!r}"
    raise MemWalCorruptionError(msg)


def fragment_deletions(storage: Storage, meta: Any) -> np.ndarray | None:
    """The row offsets fragment ``meta`` (its manifest entry, with a deletion file) deletes,
    read from its deletion file under ``storage``; None when the file is missing.

    Raises:
        MemWalCorruptionError: The file is not a deletion file of the kind the manifest says.
    """
    d = meta.deletion_file
    rel = d.path(meta.id)
    data = storage.read_bytes(rel)
    return None if data is None else deleted_offsets(data, d.file_type, rel)
