"""Vectorised murmur3_x86_32, as the MemWAL ``bucket`` transform computes it.

Every function hashes a whole array at once with numpy ``uint32`` arithmetic,
which wraps like the reference implementation. Variable-length values follow
Spark's ``hashUnsafeBytes``: full 4-byte little-endian blocks are mixed as in
standard murmur3, but each tail byte (when the length is not a multiple of 4)
gets a full mixing round of its own, as a sign-extended ``int8``. So
``mmh3.hash`` agrees only for lengths divisible by 4.

Hashes are returned as signed ``int32`` (like ``mmh3.hash``). ``seed`` may be a
Python int or an array with one seed per value (used to chain hashes over
several columns).

Example:
    >>> import numpy as np
    >>> int(hash_int32_words(np.array([1], dtype=np.uint32))[0])
    -68075478
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["Seed", "hash_int32_words", "hash_int64_words", "hash_offsets_bytes", "hash_binary_array"]

U32 = npt.NDArray[np.uint32]
Seed: TypeAlias = int | npt.NDArray[np.integer]

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_M5 = np.uint32(5)
_N1 = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)


# The mixing steps work in place on their first argument (a fresh array the caller
# owns): a hash of n values then touches a few n-sized buffers instead of allocating
# one per arithmetic step.
def _rotl(x: U32, r: int) -> U32:
    high = x >> np.uint32(32 - r)
    x <<= np.uint32(r)
    x |= high
    return x


def _mix_k1(k: U32) -> U32:
    k *= _C1
    _rotl(k, 15)
    k *= _C2
    return k


def _mix_h1(h: U32, k: U32) -> U32:
    h ^= k
    _rotl(h, 13)
    h *= _M5
    h += _N1
    return h


def _fmix(h: U32, length: npt.NDArray[np.uint32] | int) -> U32:
    h ^= np.asarray(length, dtype=np.uint32)
    h ^= h >> np.uint32(16)
    h *= _F1
    h ^= h >> np.uint32(13)
    h *= _F2
    h ^= h >> np.uint32(16)
    return h


def _seeds(seed: Seed, n: int) -> U32:
    s = np.asarray(seed, dtype=np.int64) & 0xFFFFFFFF
    return np.broadcast_to(s.astype(np.uint32), (n,)).copy()


def hash_int32_words(words: npt.NDArray[np.uint32], seed: Seed = 0) -> npt.NDArray[np.int32]:
    """Hashes each value as one 4-byte little-endian word.

    Args:
        words: The values, as ``uint32`` bit patterns.
        seed: One seed, or one per value.

    Returns:
        The signed 32-bit hashes.

    Example:
        >>> import mmh3, numpy as np
        >>> h = hash_int32_words(np.array([7], dtype=np.uint32), seed=3)
        >>> int(h[0]) == mmh3.hash((7).to_bytes(4, "little"), 3)
        True
    """
    w = np.array(words, dtype=np.uint32)  # a copy: mixed in place
    h = _mix_h1(_seeds(seed, len(w)), _mix_k1(w))
    return _fmix(h, 4).view(np.int32)


def hash_int64_words(words: npt.NDArray[np.uint64], seed: Seed = 0) -> npt.NDArray[np.int32]:
    """Hashes each value as 8 little-endian bytes (low word, then high word).

    Args:
        words: The values, as ``uint64`` bit patterns.
        seed: One seed, or one per value.

    Returns:
        The signed 32-bit hashes.

    Example:
        >>> import mmh3, numpy as np
        >>> h = hash_int64_words(np.array([2**40 + 5], dtype=np.uint64))
        >>> int(h[0]) == mmh3.hash((2**40 + 5).to_bytes(8, "little"), 0)
        True
    """
    w = np.asarray(words, dtype=np.uint64)
    low = (w & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (w >> np.uint64(32)).astype(np.uint32)
    h = _mix_h1(_seeds(seed, len(w)), _mix_k1(low))
    h = _mix_h1(h, _mix_k1(high))
    return _fmix(h, 8).view(np.int32)


def hash_offsets_bytes(
    offsets: npt.NDArray[np.integer], data: npt.NDArray[np.uint8], seed: Seed = 0
) -> npt.NDArray[np.int32]:
    """Hashes variable-length values laid out as Arrow offsets + data.

    Value ``i`` is ``data[offsets[i]:offsets[i + 1]]``. The loop runs over block
    index ``k`` (up to the longest value's block count), never over values:
    values are ordered by block count, so the values with a block ``k`` are a
    prefix of that order.

    Args:
        offsets: ``n + 1`` start offsets into ``data``.
        data: The concatenated value bytes.
        seed: One seed, or one per value.

    Returns:
        The ``n`` signed 32-bit hashes (Spark ``hashUnsafeBytes`` tail rule).

    Example:
        >>> import numpy as np
        >>> offs = np.array([0, 4, 5])
        >>> h = hash_offsets_bytes(offs, np.frombuffer(b"abcd\\xff", dtype=np.uint8))
        >>> import mmh3; int(h[0]) == mmh3.hash(b"abcd")
        True
    """
    offs = np.asarray(offsets, dtype=np.int64)
    n = len(offs) - 1
    starts, lengths = offs[:-1], np.diff(offs)
    h = _seeds(seed, n)
    data = np.asarray(data, dtype=np.uint8)
    if n == 0:
        return h.view(np.int32)
    nblocks = lengths // 4
    order = np.argsort(-nblocks, kind="stable")
    sorted_blocks = nblocks[order]
    sorted_starts = starts[order]
    hs = h[order]
    max_blocks = int(sorted_blocks[0])
    # count[k] = number of values having a block k (a prefix of `order`).
    counts = n - np.searchsorted(sorted_blocks[::-1], np.arange(max_blocks), side="right")
    for k in range(max_blocks):
        m = int(counts[k])
        pos = sorted_starts[:m] + 4 * k
        word = (
            data[pos].astype(np.uint32)
            | (data[pos + 1].astype(np.uint32) << np.uint32(8))
            | (data[pos + 2].astype(np.uint32) << np.uint32(16))
            | (data[pos + 3].astype(np.uint32) << np.uint32(24))
        )
        hs[:m] = _mix_h1(hs[:m], _mix_k1(word))
    h[order] = hs
    tail_len = lengths - nblocks * 4
    tail_start = starts + nblocks * 4
    for t in range(3):
        idx = np.nonzero(tail_len > t)[0]
        if len(idx) == 0:
            break
        byte = data[tail_start[idx] + t].view(np.int8).astype(np.int32).view(np.uint32)
        h[idx] = _mix_h1(h[idx], _mix_k1(byte))
    return _fmix(h, lengths.astype(np.uint32)).view(np.int32)


def hash_binary_array(arr: pa.Array, seed: Seed = 0) -> npt.NDArray[np.int32]:
    """Hashes the bytes of each value of a string/binary Arrow array.

    Null slots hash whatever bytes they span (callers mask them).

    Args:
        arr: A ``string``, ``large_string``, ``binary`` or ``large_binary`` array.
        seed: One seed, or one per value.

    Returns:
        The signed 32-bit hashes.

    Example:
        >>> import mmh3, pyarrow as pa
        >>> int(hash_binary_array(pa.array(["abcd"]))[0]) == mmh3.hash(b"abcd")
        True
    """
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    n = len(arr)
    if bufs[1] is None:
        offsets: npt.NDArray[np.integer] = np.zeros(n + 1, dtype=np.int64)
    else:
        off_dtype = np.int64 if large else np.int32
        # Arrow keeps offsets monotonic and in bounds even under null slots.
        offsets = np.frombuffer(bufs[1], dtype=off_dtype)[arr.offset : arr.offset + n + 1].astype(np.int64)
    data: npt.NDArray[np.uint8] = np.zeros(0, np.uint8)
    if bufs[2] is not None:
        data = np.frombuffer(bufs[2], dtype=np.uint8)
    return hash_offsets_bytes(offsets, data, seed)
