"""In-memory postings of a small set of rows: BM25 without a Lance call.

MemTable rows, base fragments the index does not cover yet and small flushed
generations are tokenized once (:class:`memwal_query.fts.analyzer.Analyzer`) into
postings: per token, the rows holding it and how often. A query then costs a few
whole-array operations per query token instead of one Lance search per source
(each costs a millisecond or more, whatever its size). Which rows are live and
pass a filter is a boolean mask over the rows, so the postings of an immutable
generation serve every snapshot.

Example:
    >>> from memwal_query.fts.analyzer import Doc
    >>> docs = [Doc(("a", "b"), (0, 1)), Doc((), ()), Doc(("a", "a"), (0, 1))]
    >>> p = Postings.build(np.array([10, 11, 12], np.uint64), docs)
    >>> live = np.array([True, True, True])
    >>> p.num_docs(live), p.total_tokens(live), p.doc_freq("a", live)
    (2, 4, 2)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from memwal_query.fts.analyzer import Doc
from memwal_query.fts.bm25 import K1, B, CorpusStats, query_weights

__all__ = ["Postings"]

_NONE = (np.empty(0, np.int64), np.empty(0, np.float64))


@dataclass(frozen=True)
class Postings:
    """Token -> (row positions, frequencies) over rows ``rowaddrs`` (sorted)."""

    rowaddrs: np.ndarray = field(repr=False)
    lengths: np.ndarray = field(repr=False)
    docs: tuple[Doc, ...] = field(repr=False)
    terms: dict[str, tuple[np.ndarray, np.ndarray]] = field(repr=False)

    @classmethod
    def build(cls, rowaddrs: np.ndarray, docs: Sequence[Doc]) -> Postings:
        """Postings of ``docs`` (the rows at ``rowaddrs``, in that order)."""
        order = np.argsort(rowaddrs, kind="stable")
        addrs = np.asarray(rowaddrs, dtype=np.uint64)[order]
        ordered = tuple(docs[i] for i in order.tolist())
        lists: dict[str, tuple[list[int], list[int]]] = {}
        for i, d in enumerate(ordered):
            for tok, n in Counter(d.tokens).items():
                entry = lists.setdefault(tok, ([], []))
                entry[0].append(i)
                entry[1].append(n)
        terms = {t: (np.array(ix, np.int64), np.array(fr, np.float64)) for t, (ix, fr) in lists.items()}
        lengths = np.array([len(d) for d in ordered], dtype=np.int64)
        return cls(addrs, lengths, ordered, terms)

    def __len__(self) -> int:
        return int(self.rowaddrs.size)

    def mask_of(self, addrs: np.ndarray) -> np.ndarray:
        """Which rows are among ``addrs``."""
        return np.isin(self.rowaddrs, np.asarray(addrs, dtype=np.uint64))

    def num_docs(self, live: np.ndarray) -> int:
        """Live rows with at least one token."""
        return int(np.count_nonzero(live & (self.lengths > 0)))

    def total_tokens(self, live: np.ndarray) -> int:
        """Tokens of the live rows."""
        return int(self.lengths[live].sum())

    def doc_freq(self, token: str, live: np.ndarray) -> int:
        """Live rows holding ``token``."""
        idx, _ = self.terms.get(token, _NONE)
        return int(np.count_nonzero(live[idx]))

    def score(self, query: Sequence[str], stats: CorpusStats, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, BM25) of the rows in ``mask`` holding a query token."""
        acc = np.zeros(len(self), dtype=np.float64)
        hit = np.zeros(len(self), dtype=bool)
        norm = K1 * (1.0 - B + B * self.lengths / stats.avgdl) if stats.avgdl else np.ones(len(self))
        for tok, times in query_weights(query).items():
            idx, freq = self.terms.get(tok, _NONE)
            if not idx.size:
                continue
            acc[idx] += times * stats.idf(tok) * (K1 + 1.0) * freq / (freq + norm[idx])
            hit[idx] = True
        rows = np.flatnonzero(hit & mask)
        return rows, acc[rows]
