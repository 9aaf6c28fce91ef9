"""The document ids of one token's posting list in a Lance INVERTED index, decoded here.

pylance 14.0.2 writes ``part_N_invert.lance`` with schema metadata ``format_version = 2``,
``posting_block_size = 128`` and ``posting_tail_codec = varint_delta_v1``; column
``_posting`` holds, per token id, a list of binary blocks (measured on real indexes and
checked against every token's ``_length`` and every document's ``_num_tokens``):

* a full block (128 documents): ``f32`` block max score, ``u32`` first document id,
  ``u8`` bit width ``b``, ``16 * b`` bytes of document-id deltas packed by the
  ``bitpacking`` crate's ``BitPacker4x`` (the first delta is 0), ``u8`` bit width ``c``
  and ``16 * c`` bytes of packed term frequencies;
* the last block, when the list does not fill it: ``f32`` score, then the document ids
  as LEB128 varints (the first absolute, then deltas), then the frequencies as varints.

``BitPacker4x`` packs 128 values as 32 rows of 4 lanes: value ``i`` is lane ``i % 4``, row
``i // 4``; each lane's 32 values are bit-packed LSB first into ``b`` 32-bit words, and
the lanes' words are interleaved (word ``j`` of lane ``l`` is the ``4 * j + l``-th).

Document ids index the rows of ``part_N_docs.lance``. Only the document ids are decoded
(the frequencies' width is read to check each block's length). Any other layout, and
any block whose lengths, order or range do not add up, raises
:class:`UnsupportedPostings`: callers then count from the rows' text instead.

Example:
    >>> import numpy as np, pyarrow as pa
    >>> tail = np.float32(0).tobytes() + bytes([3, 4, 1, 2])  # ids 3, 3 + 4; frequencies 1, 2
    >>> decode_doc_ids(pa.array([tail], pa.large_binary()), 2, 10).tolist()
    [3, 7]
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

__all__ = ["UnsupportedPostings", "layout_supported", "decode_doc_ids"]

BLOCK = 128
_SCORE = 4  # the f32 block max score opening every block
_ROWS = np.arange(32)


class UnsupportedPostings(Exception):
    """A posting list this module cannot decode or prove consistent: count another way."""


def layout_supported(meta: Mapping[str, str]) -> bool:
    """Whether ``part_N_invert.lance``'s schema metadata names the layout decoded here."""
    return (
        meta.get("format_version") == "2"
        and meta.get("posting_block_size") == str(BLOCK)
        and meta.get("posting_tail_codec") == "varint_delta_v1"
    )


def _unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """``BitPacker4x`` blocks (``(n, 4 * bits)`` uint32 words) -> ``(n, 128)`` values."""
    n = words.shape[0]
    if bits == 0:
        return np.zeros((n, BLOCK), np.int64)
    w = words.reshape(n, bits, 4).astype(np.uint64)  # [block, word, lane]
    start = _ROWS * bits
    first = start // 32
    shift = (start % 32).astype(np.uint64)
    value = w[:, first, :] >> shift[None, :, None]
    spills = (start % 32) + bits > 32  # the value continues in the lane's next word
    if spills.any():
        nxt = np.minimum(first + 1, bits - 1)
        high = w[:, nxt, :] << (np.uint64(32) - shift)[None, :, None]
        value |= np.where(spills[None, :, None], high, np.uint64(0))
    value &= np.uint64((1 << bits) - 1)
    return value.astype(np.int64).reshape(n, BLOCK)  # value index = row * 4 + lane


def _varints(buf: bytes, pos: int, count: int) -> tuple[list[int], int]:
    out = []
    for _ in range(count):
        value = shift = 0
        while True:
            if pos >= len(buf) or shift > 28:
                raise UnsupportedPostings("truncated or oversized varint in a posting tail")
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        out.append(value)
    return out, pos


def decode_doc_ids(blocks: pa.Array, length: int, num_docs: int) -> np.ndarray:
    """The sorted document ids of one posting list (its ``_posting`` blocks, ``_length`` documents).

    Args:
        blocks: The token's blocks (a ``large_binary`` array without nulls).
        length: The token's ``_length``.
        num_docs: Rows of the partition's ``docs`` file (every id is below it).

    Raises:
        UnsupportedPostings: The blocks do not decode to ``length`` increasing ids below ``num_docs``.
    """
    full, rem = divmod(int(length), BLOCK)
    if not pa.types.is_large_binary(blocks.type) or blocks.null_count or len(blocks) != full + (rem > 0):
        raise UnsupportedPostings(f"{len(blocks)} posting blocks for {length} documents")
    offsets = np.frombuffer(blocks.buffers()[1], np.int64)[blocks.offset : blocks.offset + len(blocks) + 1]
    data = np.frombuffer(blocks.buffers()[2], np.uint8) if blocks.buffers()[2] is not None else np.zeros(0, np.uint8)
    out = np.empty(full * BLOCK + rem, np.int64)
    if full:
        at = offsets[:full]
        if np.any(offsets[1 : full + 1] - at < _SCORE + 6):
            raise UnsupportedPostings("a full posting block shorter than its header")
        first = data[(at + _SCORE)[:, None] + np.arange(4)].astype(np.int64) @ (np.int64(1) << np.arange(0, 32, 8))
        bits = data[at + _SCORE + 4].astype(np.int64)
        freq_at = at + _SCORE + 5 + 16 * bits
        if np.any(bits > 32) or np.any(freq_at >= offsets[1 : full + 1]):
            raise UnsupportedPostings("a posting block's bit width does not fit its length")
        freq_bits = data[freq_at].astype(np.int64)
        if np.any(freq_bits > 32) or np.any(freq_at + 1 + 16 * freq_bits != offsets[1 : full + 1]):
            raise UnsupportedPostings("a posting block's lengths do not add up")
        ids = np.empty((full, BLOCK), np.int64)
        for b in np.unique(bits).tolist():
            sel = np.flatnonzero(bits == b)
            raw = data[(at[sel] + _SCORE + 5)[:, None] + np.arange(16 * b)]
            ids[sel] = _unpack(np.ascontiguousarray(raw).view("<u4").reshape(sel.size, 4 * b), b)
        np.cumsum(ids, axis=1, out=ids)
        ids += first[:, None]
        out[: full * BLOCK] = ids.reshape(-1)
    if rem:
        tail = data[offsets[full] : offsets[full + 1]].tobytes()
        deltas, pos = _varints(tail, _SCORE, rem)
        _, pos = _varints(tail, pos, rem)  # the frequencies
        if pos != len(tail):
            raise UnsupportedPostings("trailing bytes after a posting tail")
        out[full * BLOCK :] = np.cumsum(np.array(deltas, np.int64))
    if out.size and (out[0] < 0 or out[-1] >= num_docs or np.any(out[1:] <= out[:-1])):
        raise UnsupportedPostings("posting document ids are not increasing ids of the docs file")
    return out
