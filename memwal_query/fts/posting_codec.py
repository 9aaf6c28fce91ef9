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


def _spans(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indexes ``starts[0]..ends[0]-1``, ``starts[1]..ends[1]-1``, ... in one array."""
    sizes = ends - starts
    return np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))


def _segment_cumsum(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Running sums of ``values`` restarting at each segment (``sizes`` values each)."""
    total = np.cumsum(values)
    first = np.cumsum(sizes) - sizes
    return np.asarray(total - np.repeat(total[first] - values[first], sizes), dtype=np.int64)


def _all_varints(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every LEB128 varint of ``data`` (uint8, nothing else in it): (values, end offsets)."""
    if not data.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ends = np.flatnonzero(data < 0x80) + 1
    if not ends.size or ends[-1] != data.size:
        raise UnsupportedPostings("truncated varint in posting tails")
    starts = np.concatenate([[0], ends[:-1]])
    width = ends - starts
    if np.any(width > 5):
        raise UnsupportedPostings("oversized varint in posting tails")
    shift = (np.arange(data.size) - np.repeat(starts, width)) * 7
    parts = (data.astype(np.int64) & 0x7F) << shift
    return np.add.reduceat(parts, starts), ends


def _full_blocks(
    data: np.ndarray, at: np.ndarray, end: np.ndarray, *, freqs: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Document ids and (with ``freqs``) frequencies of the full blocks at byte ranges
    ``at``..``end``, (n, 128) each; every block's lengths are checked either way."""
    docs = np.empty((at.size, BLOCK), np.int64)
    tfs = np.empty((at.size, BLOCK), np.int64) if freqs else None
    if not at.size:
        return docs, tfs
    if np.any(end - at < _SCORE + 6):
        raise UnsupportedPostings("a full posting block shorter than its header")
    first = data[(at + _SCORE)[:, None] + np.arange(4)].astype(np.int64) @ (np.int64(1) << np.arange(0, 32, 8))
    bits = data[at + _SCORE + 4].astype(np.int64)
    freq_at = at + _SCORE + 5 + 16 * bits
    if np.any(bits > 32) or np.any(freq_at >= end):
        raise UnsupportedPostings("a posting block's bit width does not fit its length")
    freq_bits = data[freq_at].astype(np.int64)
    if np.any(freq_bits > 32) or np.any(freq_at + 1 + 16 * freq_bits != end):
        raise UnsupportedPostings("a posting block's lengths do not add up")
    parts = [(at + _SCORE + 5, bits, docs)] + ([(freq_at + 1, freq_bits, tfs)] if tfs is not None else [])
    for start, width, out in parts:
        for b in np.unique(width).tolist():
            sel = np.flatnonzero(width == b)
            raw = data[(start[sel])[:, None] + np.arange(16 * b)]
            out[sel] = _unpack(np.ascontiguousarray(raw).view("<u4").reshape(sel.size, 4 * b), b)
    np.cumsum(docs, axis=1, out=docs)
    docs += first[:, None]
    return docs, tfs


def _buffers(blocks: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A ``large_binary`` array's value offsets (absolute) and data bytes."""
    offsets = np.frombuffer(blocks.buffers()[1], np.int64)[blocks.offset : blocks.offset + len(blocks) + 1]
    raw = blocks.buffers()[2]
    return offsets, (np.frombuffer(raw, np.uint8) if raw is not None else np.zeros(0, np.uint8))


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
    offsets, data = _buffers(blocks)
    docs, _ = _full_blocks(data, offsets[:full], offsets[1 : full + 1], freqs=False)
    out = docs.reshape(-1)
    if rem:
        tail_at, tail_end = offsets[full] + _SCORE, offsets[full + 1]
        if tail_end < tail_at:
            raise UnsupportedPostings("a posting tail shorter than its score")
        values, _ = _all_varints(data[tail_at:tail_end])  # its documents, then their frequencies
        if values.size != 2 * rem:
            raise UnsupportedPostings("a posting tail does not hold its documents and frequencies")
        out = np.concatenate([out, np.cumsum(values[:rem])])
    if out.size and (out[0] < 0 or out[-1] >= num_docs or np.any(out[1:] <= out[:-1])):
        raise UnsupportedPostings("posting document ids are not increasing ids of the docs file")
    return out


def decode_all(lists: pa.Array, lengths: np.ndarray, num_docs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every posting of an ``invert.lance`` file: (token id, document id, frequency) arrays,
    sorted by token id, then document id.

    Args:
        lists: Its ``_posting`` column (a list of blocks per token id).
        lengths: Its ``_length`` column.
        num_docs: Rows of the partition's ``docs`` file.

    Raises:
        UnsupportedPostings: As :func:`decode_doc_ids`, for any of the lists.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    full, rem = np.divmod(lengths, BLOCK)
    nblocks = full + (rem > 0)
    if not pa.types.is_list(lists.type) or len(lists) != lengths.size or lists.null_count:
        raise UnsupportedPostings("posting lists are not one list per token")
    list_at = np.frombuffer(lists.buffers()[1], np.int32)[lists.offset : lists.offset + len(lists) + 1]
    if np.any(np.diff(list_at) != nblocks):
        raise UnsupportedPostings("posting lists do not hold one block per 128 documents")
    blocks = lists.values.slice(int(list_at[0]), int(list_at[-1] - list_at[0]))
    if not pa.types.is_large_binary(blocks.type) or blocks.null_count:
        raise UnsupportedPostings("posting blocks are not binary")
    offsets, data = _buffers(blocks)
    token = np.repeat(np.arange(lengths.size), nblocks)
    index = np.arange(token.size) - np.repeat(np.cumsum(nblocks) - nblocks, nblocks)
    is_full = index < full[token]
    docs, freqs = _full_blocks(data, offsets[:-1][is_full], offsets[1:][is_full])
    assert freqs is not None
    # the tails: each one's documents (first absolute, then deltas) then frequencies, as varints
    tail_tokens = token[~is_full]
    n = rem[tail_tokens]
    tail_at, tail_end = offsets[:-1][~is_full] + _SCORE, offsets[1:][~is_full]
    if np.any(tail_end < tail_at):
        raise UnsupportedPostings("a posting tail shorter than its score")
    values, value_end = _all_varints(data[_spans(tail_at, tail_end)])
    if values.size != int(2 * n.sum()) or (
        n.size and np.any(value_end[np.cumsum(2 * n) - 1] != np.cumsum(tail_end - tail_at))
    ):
        raise UnsupportedPostings("posting tails do not hold their documents and frequencies")
    in_tail = np.arange(values.size) - np.repeat(np.cumsum(2 * n) - 2 * n, 2 * n)
    is_doc = in_tail < np.repeat(n, 2 * n)
    tail_docs = _segment_cumsum(values[is_doc], n) if n.size else np.zeros(0, np.int64)
    tok = np.concatenate([np.repeat(token[is_full], BLOCK), np.repeat(tail_tokens, n)])
    doc = np.concatenate([docs.reshape(-1), tail_docs])
    freq = np.concatenate([freqs.reshape(-1), values[~is_doc]])
    order = np.argsort(tok, kind="stable")  # a token's full blocks in order, then its tail
    tok, doc, freq = tok[order], doc[order], freq[order]
    same = tok[1:] == tok[:-1]
    if doc.size and (doc.min() < 0 or doc.max() >= num_docs or np.any(doc[1:][same] <= doc[:-1][same])):
        raise UnsupportedPostings("posting document ids are not increasing ids of the docs file")
    return tok, doc, freq
