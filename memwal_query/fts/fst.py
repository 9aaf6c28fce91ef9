"""Key lookups in a finite state transducer map (the ``fst`` crate's format, version 1-3).

Lance stores the token dictionary of an INVERTED index partition as an ``fst::Map``
(token -> token id, ``part_N_tokens.lance``). Looking a handful of query tokens up
walks one node per byte, so reading a document frequency costs microseconds and
never decodes the posting lists. The node encodings follow ``fst/src/raw/node.rs``
(BurntSushi/fst 0.4): every node is addressed by its *last* byte and read backwards.

Example:
    >>> tokens = FstMap(_tiny_fst())  # the dictionary of an index over "cat", "dog dog", "cat bird"
    >>> tokens.get("cat"), tokens.get("dog"), tokens.get("bird"), tokens.get("ca"), tokens.len
    (0, 1, 2, None, 3)
"""

from __future__ import annotations

import struct

from memwal_query.errors import MemWalCorruptionError

__all__ = ["FstMap"]

# The 63 most common key bytes, encoded in a node's state byte (common_inputs.rs).
_COMMON = b"te/oasripcnw.hlm-du012g=:bf3y5&_4v9678k%?xCDASFIBEjPTzRNM+LOqHG"
_EMPTY_ADDRESS = 0
_TRANS_INDEX_THRESHOLD = 32


def _uint(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "little") if size else 0


class FstMap:
    """A read-only ``fst::Map`` over its serialized bytes."""

    __slots__ = ("_data", "_version", "_root", "len")

    def __init__(self, data: bytes) -> None:
        if len(data) < 32:
            msg = f"token dictionary too short for an FST ({len(data)} bytes)"
            raise MemWalCorruptionError(msg)
        version = struct.unpack_from("<Q", data, 0)[0]
        if not 1 <= version <= 3:
            msg = f"unsupported FST version {version} in a token dictionary"
            raise MemWalCorruptionError(msg)
        end = len(data) - 4 if version >= 3 else len(data)
        self._data = data
        self._version = version
        self._root = struct.unpack_from("<Q", data, end - 8)[0]
        self.len = struct.unpack_from("<Q", data, end - 16)[0]
        if self._root >= end:
            msg = "FST root address outside the token dictionary"
            raise MemWalCorruptionError(msg)

    def get(self, key: str | bytes) -> int | None:
        """The value stored for ``key`` (None when absent)."""
        raw = key.encode() if isinstance(key, str) else key
        addr, out = self._root, 0
        try:
            for b in raw:
                step = self._step(addr, b)
                if step is None:
                    return None
                addr, o = step
                out += o
            final = self._final(addr)
        except (IndexError, struct.error) as err:
            msg = f"malformed FST token dictionary: {err}"
            raise MemWalCorruptionError(msg) from err
        return None if final is None else out + final

    # -- node decoding (addresses point at the node's state byte) ------------
    def _final(self, addr: int) -> int | None:
        if addr == _EMPTY_ADDRESS:
            return 0
        state = self._data[addr]
        if state & 0b1000_0000 or not state & 0b0100_0000:
            return None  # one-transition nodes are never final
        ntrans, nlen = self._ntrans(addr, state)
        sizes = self._data[addr - nlen - 1]
        tsize, osize = sizes >> 4, sizes & 0x0F
        if osize == 0:
            return 0
        at = addr - nlen - 1 - self._total_trans(ntrans, tsize) - ntrans * osize - osize
        return _uint(self._data, at, osize)

    def _ntrans(self, addr: int, state: int) -> tuple[int, int]:
        n = state & 0b0011_1111
        if n:
            return n, 0
        n = self._data[addr - 1]
        return (256 if n == 1 else n), 1

    def _total_trans(self, ntrans: int, tsize: int) -> int:
        index = 256 if self._version >= 2 and ntrans > _TRANS_INDEX_THRESHOLD else 0
        return ntrans + ntrans * tsize + index

    def _step(self, addr: int, b: int) -> tuple[int, int] | None:
        """(next node, output) of the transition on byte ``b`` from node ``addr``."""
        if addr == _EMPTY_ADDRESS:
            return None
        data = self._data
        state = data[addr]
        kind = state >> 6
        if kind >= 0b10:  # one transition: 0b11 = to the next node, no output; 0b10 = general
            idx = state & 0b0011_1111
            inp = _COMMON[idx - 1] if idx else data[addr - 1]
            ilen = 0 if idx else 1
            if inp != b:
                return None
            if kind == 0b11:
                return addr - ilen - 1, 0
            sizes = data[addr - ilen - 1]
            tsize, osize = sizes >> 4, sizes & 0x0F
            end = addr - ilen - 1 - tsize - osize
            delta = _uint(data, addr - ilen - 1 - tsize, tsize)
            out = _uint(data, addr - ilen - 1 - tsize - osize, osize)
            return (_EMPTY_ADDRESS if delta == _EMPTY_ADDRESS else end - delta), out
        ntrans, nlen = self._ntrans(addr, state)
        sizes = data[addr - nlen - 1]
        tsize, osize = sizes >> 4, sizes & 0x0F
        final_osize = osize if state & 0b0100_0000 else 0
        index_size = 256 if self._version >= 2 and ntrans > _TRANS_INDEX_THRESHOLD else 0
        if index_size:
            i = data[addr - nlen - 1 - index_size + b]
            if i >= ntrans:
                return None
        else:
            start = addr - nlen - 1 - ntrans
            pos = data.find(bytes([b]), start, start + ntrans)
            if pos < 0:
                return None
            i = ntrans - (pos - start) - 1
        end = addr - nlen - 1 - self._total_trans(ntrans, tsize) - ntrans * osize - final_osize
        delta = _uint(data, addr - nlen - 1 - index_size - ntrans - i * tsize - tsize, tsize)
        out = _uint(data, addr - nlen - 1 - self._total_trans(ntrans, tsize) - i * osize - osize, osize) if osize else 0
        return (_EMPTY_ADDRESS if delta == _EMPTY_ADDRESS else end - delta), out


def _tiny_fst() -> bytes:
    """The token dictionary Lance wrote for an index over "cat", "dog dog", "cat bird" (for examples)."""
    return bytes.fromhex(
        "03000000000000000000000000000000001092c7c8001081c5001097c40100020105096463621103030000000000000027"
        "000000000000005fd7df6b"
    )
