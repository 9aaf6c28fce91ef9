"""The byte layout the machine's kept files share (:mod:`~memwal_query.format.machine_cache`):
little-endian counts and arrays, sealed by a CRC-32 of everything before it.

Example:
    >>> import numpy as np
    >>> data = sealed(u8(3) + np.arange(3, dtype="<i8").tobytes())
    >>> whole(data), whole(data[:-1])
    (True, False)
    >>> read = ArrayReader(data, 8)
    >>> read.take("<i8", 3).tolist(), ascending(np.array([1, 2, 2]))
    ([0, 1, 2], False)
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["ArrayReader", "ascending", "sealed", "u8", "whole"]


def u8(*values: int) -> bytes:
    """``values`` as little-endian unsigned 64-bit integers."""
    return np.array(values, dtype="<u8").tobytes()


def sealed(data: bytes) -> bytes:
    """``data`` followed by a CRC-32 of it (what :func:`whole` checks)."""
    return data + zlib.crc32(data).to_bytes(4, "little")


def whole(data: bytes) -> bool:
    """Whether ``data`` ends with the CRC-32 of what comes before it (no copy of the file)."""
    return len(data) >= 4 and zlib.crc32(memoryview(data)[:-4]) == int.from_bytes(data[-4:], "little")


class ArrayReader:
    """Arrays read in turn from a kept file's bytes: read-only views of them, in this machine's
    byte order (a copy only where that differs from the file's little-endian order)."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at

    def take(self, dtype: str | np.dtype, count: int) -> np.ndarray:
        """The next ``count`` values of type ``dtype``."""
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at += out.nbytes
        return out.astype(out.dtype.newbyteorder("="), copy=False)


def ascending(a: np.ndarray) -> bool:
    """Whether ``a`` strictly ascends (sorted, no value twice)."""
    return bool(np.all(a[1:] > a[:-1]))
