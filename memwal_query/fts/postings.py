"""In-memory postings of a small set of rows: BM25 without a Lance call.

MemTable rows, base fragments the index does not cover yet and small flushed
generations are tokenized once (:class:`memwal_query.fts.analyzer.Analyzer`) into
postings: per token, the rows holding it and how often. A query then costs a few
whole-array operations per query token instead of one Lance search per source
(each costs a millisecond or more, whatever its size). Which rows are live and
pass a filter is a boolean mask over the rows, so the postings of an immutable
generation serve every snapshot.

Example:
    >>> from memwal_query.fts.analyzer import Doc, Tokens
    >>> docs = [Doc(("a", "b"), (0, 1)), Doc((), ()), Doc(("a", "a"), (0, 1))]
    >>> p = Postings.build(np.array([10, 11, 12], np.uint64), docs)
    >>> live = np.array([True, True, True])
    >>> p.num_docs(live), p.total_tokens(live), p.doc_freq("a", live)
    (2, 4, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from memwal_query.format.sets import member, unique
from memwal_query.fts.analyzer import Doc, Tokens
from memwal_query.fts.bm25 import K1, B, CorpusStats, query_weights
from memwal_query.fts.fst import FstMap
from memwal_query.fts.index_files import InvertedIndexFiles

__all__ = ["Postings", "bm25_from", "bm25_rows", "tf_weights"]

_NONE = (np.empty(0, np.int64), np.empty(0, np.float64))


@dataclass(frozen=True)
class Postings:
    """Token -> (row positions, frequencies) over rows ``rowaddrs`` (sorted)."""

    rowaddrs: np.ndarray = field(repr=False)
    lengths: np.ndarray = field(repr=False)
    tokens: Tokens = field(repr=False)  # in the order given to :meth:`build`
    order: np.ndarray = field(repr=False)  # row position -> index into ``tokens``
    vocab: dict[str, int] | FstMap = field(repr=False)  # token -> its posting list (a slice of the arrays below)
    bounds: np.ndarray = field(repr=False)  # posting list i is rows[bounds[i]:bounds[i + 1]]
    rows: np.ndarray = field(repr=False)
    freqs: np.ndarray = field(repr=False)

    @classmethod
    def build(cls, rowaddrs: np.ndarray, tokens: Tokens | Sequence[Doc]) -> Postings:
        """Postings of the texts ``tokens`` (the rows at ``rowaddrs``, in that order)."""
        if not isinstance(tokens, Tokens):
            tokens = _flatten(tokens)
        n = len(tokens)
        order = np.argsort(rowaddrs, kind="stable")
        addrs = np.asarray(rowaddrs, dtype=np.uint64)[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        per_text = np.diff(tokens.offsets)
        if not len(tokens.words):
            empty = np.zeros(1, np.int64)
            return cls(addrs, per_text[order], tokens, order, {}, empty, *_NONE)
        encoded = tokens.words.dictionary_encode()
        ids = encoded.indices.to_numpy().astype(np.int64)
        pairs, counts = np.unique(ids * n + np.repeat(rank, per_text), return_counts=True)
        tok, row = pairs // n, pairs % n
        # every dictionary entry occurs: posting list i (sorted by token id) is entry i's
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(tok)) + 1, [tok.size]])
        vocab = dict(zip(encoded.dictionary.to_pylist(), range(len(encoded.dictionary)), strict=True))
        return cls(addrs, per_text[order], tokens, order, vocab, bounds, row, counts.astype(np.float64))

    @classmethod
    def from_index(cls, rowaddrs: np.ndarray, files: InvertedIndexFiles) -> Postings:
        """Postings of the rows at ``rowaddrs`` (sorted) read from their INVERTED index instead of
        tokenized (~10x faster): the same postings, frequencies and lengths, but without the
        token stream, so only for an index without positions (no phrase query reaches them).
        A row the index does not hold has no token (Lance leaves such rows out).

        Raises:
            UnsupportedPostings: The index's postings are not decoded here.
        """
        vocab, tok, rowid, freq = files.all_postings()
        addrs = np.asarray(rowaddrs, dtype=np.uint64)
        n = addrs.size
        at = np.minimum(np.searchsorted(addrs, rowid), max(n - 1, 0))
        held = addrs[at] == rowid if n else np.zeros(rowid.size, dtype=bool)  # rows deleted since drop out
        order = np.lexsort((at[held], tok[held]))
        tok, row, freq = tok[held][order], at[held][order], freq[held][order]
        bounds = np.zeros(files.partitions[0].lengths.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(tok, minlength=bounds.size - 1), out=bounds[1:])
        lengths = files.doc_lengths(addrs)
        empty = Tokens(pa.array([], pa.string()), np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
        return cls(addrs, lengths, empty, np.arange(n), vocab, bounds, row, freq.astype(np.float64))

    def doc(self, row: int) -> Doc:
        """The tokens of row position ``row``."""
        return self.tokens.doc(int(self.order[row]))

    def __len__(self) -> int:
        return int(self.rowaddrs.size)

    def mask_of(self, addrs: np.ndarray) -> np.ndarray:
        """Which rows are among ``addrs``."""
        return member(self.rowaddrs, unique(np.asarray(addrs, dtype=np.uint64)))

    def num_docs(self, live: np.ndarray) -> int:
        """Live rows with at least one token."""
        return int(np.count_nonzero(live & (self.lengths > 0)))

    def total_tokens(self, live: np.ndarray) -> int:
        """Tokens of the live rows."""
        return int(self.lengths[live].sum())

    def doc_freq(self, token: str, live: np.ndarray) -> int:
        """Live rows holding ``token``."""
        idx, _ = self.term(token)
        return int(np.count_nonzero(live[idx]))

    def term(self, token: str) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, frequencies) of ``token``."""
        i = self.vocab.get(token)
        if i is None or i >= self.bounds.size - 1:
            return _NONE
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        return self.rows[a:b], self.freqs[a:b]

    def score(self, query: Sequence[str], stats: CorpusStats, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, BM25) of the rows in ``mask`` holding a query token."""
        return bm25_rows(self.lengths, self.term, query, stats, mask)


def bm25_rows(
    lengths: np.ndarray,
    term: Callable[[str], tuple[np.ndarray, np.ndarray]],
    query: Sequence[str],
    stats: CorpusStats,
    mask: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(row positions, BM25) of the rows in ``mask`` holding a query token.

    ``lengths`` are the rows' token counts, ``term(token)`` a token's (row positions,
    frequencies); only the rows of the query's posting lists are touched.
    """
    return bm25_from(lengths.size, lambda tok: tf_weights(lengths, *term(tok), stats.avgdl), query, stats, mask)


def tf_weights(lengths: np.ndarray, idx: np.ndarray, freq: np.ndarray, avgdl: float) -> tuple[np.ndarray, np.ndarray]:
    """(rows, BM25 term-frequency part ``(k1 + 1) f / (f + k1 (1 - b + b |d| / avgdl))``) of a posting list."""
    norm = K1 * (1.0 - B + B * lengths[idx] / avgdl) if avgdl else 1.0
    return idx, (K1 + 1.0) * freq / (freq + norm)


def bm25_from(
    n: int,
    weights: Callable[[str], tuple[np.ndarray, np.ndarray]],
    query: Sequence[str],
    stats: CorpusStats,
    mask: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(row positions, BM25) of the rows in ``mask``; ``weights(token)`` gives :func:`tf_weights`.

    Short posting lists are summed sparsely (cost follows the postings); long ones into a
    dense accumulator over all ``n`` rows.
    """
    lists = []
    for tok, times in query_weights(query).items():
        idx, tf = weights(tok)
        if idx.size:
            lists.append((idx, (times * stats.idf(tok)) * tf))
    if not lists:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    if len(lists) == 1:  # one token: its posting list is the answer
        idx, w = lists[0]
        keep = mask[idx]
        return idx[keep], np.asarray(w[keep], dtype=np.float64)
    if sum(idx.size for idx, _ in lists) * 8 < n:
        rows, inverse = np.unique(np.concatenate([idx for idx, _ in lists]), return_inverse=True)
        acc = np.bincount(inverse, np.concatenate([w for _, w in lists]), minlength=rows.size)
        keep = mask[rows]
        return rows[keep], acc[keep]
    acc = np.zeros(n, dtype=np.float64)
    hit = np.zeros(n, dtype=bool)
    for idx, w in lists:
        acc[idx] += w
        hit[idx] = True
    rows = np.flatnonzero(hit & mask)
    return rows, acc[rows]


def _flatten(docs: Sequence[Doc]) -> Tokens:
    words = pa.array([t for d in docs for t in d.tokens], pa.string())
    positions = np.array([p for d in docs for p in d.positions], dtype=np.int64)
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    return Tokens(words, positions, offsets)
