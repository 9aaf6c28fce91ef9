"""Primary-key bloom filters of flushed generations (``bloom_filter.bin``).

Format (FORMAT.md, measured on pylance 14.0.2): a raw split-block bloom filter
(Parquet SBBF) of 1024 blocks x 8 little-endian u32, no header. A key's hash is
Rust's ``DefaultHasher`` (SipHash-1-3 with key (0, 0)) over one ``is_null`` byte
then the value bytes: fixed-width integers little-endian, UTF-8 strings followed
by ``0xff``, binary as a u64 little-endian length then the bytes; a composite key
concatenates its columns. Block ``((h >> 32) * num_blocks) >> 32``; bit ``i`` of
the block's word ``i`` is ``(lo32(h) * SALT[i] mod 2**32) >> 27``.

Example:
    >>> f = BloomFilter(bytes(32 * 1024))
    >>> f.might_contain_keys([(5,)], ["int64"])
    [False]
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from memwal_query.errors import MemWalCorruptionError
from memwal_query.format.storage import Storage

__all__ = ["BloomFilter", "siphash13", "key_hash", "read_bloom_filter", "MAX_BLOOM_BYTES"]

MAX_BLOOM_BYTES = 128 * 1024 * 1024
"""Largest bloom filter read (Parquet's SBBF limit); pylance writes 32 KiB."""

_M64 = (1 << 64) - 1
_SALT = np.array(
    [0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31],
    dtype=np.uint64,
)
_INT_FORMATS = {
    "int8": "<b",
    "int16": "<h",
    "int32": "<i",
    "int64": "<q",
    "uint8": "<B",
    "uint16": "<H",
    "uint32": "<I",
    "uint64": "<Q",
}


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def siphash13(data: bytes, k0: int = 0, k1: int = 0) -> int:
    """SipHash-1-3 of ``data`` (Rust's ``DefaultHasher``), as an unsigned 64-bit int.

    Example:
        >>> hex(siphash13(b""))
        '0xd1fba762150c532c'
    """
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573

    def rnd() -> None:
        nonlocal v0, v1, v2, v3
        v0 = (v0 + v1) & _M64
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _M64
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _M64
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _M64
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)

    n = len(data)
    end = n - (n % 8)
    for off in range(0, end, 8):
        m = int.from_bytes(data[off : off + 8], "little")
        v3 ^= m
        rnd()
        v0 ^= m
    tail = int.from_bytes(data[end:], "little") | ((n & 0xFF) << 56)
    v3 ^= tail
    rnd()
    v0 ^= tail
    v2 ^= 0xFF
    rnd()
    rnd()
    rnd()
    return v0 ^ v1 ^ v2 ^ v3


def _encode(value: Any, type_name: str) -> bytes:
    if value is None:
        return b"\x01"
    if type_name in _INT_FORMATS:
        return b"\x00" + struct.pack(_INT_FORMATS[type_name], int(value))
    if type_name in ("string", "large_string", "utf8", "large_utf8"):
        return b"\x00" + str(value).encode("utf-8") + b"\xff"
    if type_name in ("binary", "large_binary"):
        raw = bytes(value)
        return b"\x00" + struct.pack("<Q", len(raw)) + raw
    raise ValueError(f"bloom filter key hashing does not support type {type_name}")


def key_hash(key: Sequence[Any], type_names: Sequence[str]) -> int:
    """Hash of one (possibly composite) key, as Lance's writer computes it."""
    return siphash13(b"".join(_encode(v, t) for v, t in zip(key, type_names, strict=True)))


class BloomFilter:
    """A generation's primary-key bloom filter."""

    __slots__ = ("_words", "_num_blocks")

    def __init__(self, data: bytes) -> None:
        if len(data) == 0 or len(data) % 32 or len(data) > MAX_BLOOM_BYTES:
            msg = f"bloom filter of {len(data)} bytes is not 1 to {MAX_BLOOM_BYTES // 32} whole 32-byte blocks"
            raise ValueError(msg)
        self._words = np.frombuffer(data, dtype="<u4").reshape(-1, 8).astype(np.uint64)
        self._num_blocks = self._words.shape[0]

    def might_contain_hashes(self, hashes: Sequence[int]) -> np.ndarray:
        """Vectorised check of key hashes: ``False`` = certainly absent."""
        h = np.asarray(hashes, dtype=np.uint64)
        block = ((h >> np.uint64(32)) * np.uint64(self._num_blocks)) >> np.uint64(32)
        lo = h & np.uint64(0xFFFFFFFF)
        bits = ((lo[:, None] * _SALT[None, :]) & np.uint64(0xFFFFFFFF)) >> np.uint64(27)
        words = self._words[block.astype(np.int64)]
        present = (words >> bits) & np.uint64(1)
        return np.asarray(present.all(axis=1), dtype=bool)

    def might_contain_keys(self, keys: Sequence[Sequence[Any]], type_names: Sequence[str]) -> list[bool]:
        """Check keys (tuples of column values): ``False`` = certainly absent."""
        if not keys:
            return []
        return [bool(x) for x in self.might_contain_hashes([key_hash(k, type_names) for k in keys])]


def read_bloom_filter(storage: Storage, rel: str) -> BloomFilter | None:
    """Read a generation's ``bloom_filter.bin``.

    Args:
        storage: The table's storage.
        rel: The file, relative to the table root.

    Returns:
        The filter, or None when the file does not exist.

    Raises:
        MemWalCorruptionError: The file is not a bloom filter (names the file).
    """
    data = storage.read_bytes(rel, limit=MAX_BLOOM_BYTES + 1)
    if data is None:
        return None
    try:
        return BloomFilter(data)
    except ValueError as err:
        msg = f"bloom filter {storage.child_uri(rel)} is damaged: {err}"
        raise MemWalCorruptionError(msg) from err
