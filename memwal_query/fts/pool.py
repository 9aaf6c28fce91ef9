"""The in-memory sources of a snapshot searched as one set of postings.

MemTable rows, base fragments the index does not cover yet and small generations
each have :class:`~memwal_query.fts.postings.Postings` (built once per immutable
source, kept across snapshots). A query against each of them costs a few array
operations *per source*; with tens of generations that overhead dominates. A
:class:`PostingsPool` lays the sources end to end: a query token's posting list is
the sources' lists concatenated (built on first use, kept for the snapshot), and a
query scores every in-memory row in one pass.

Example:
    >>> from memwal_query.fts.analyzer import Doc
    >>> from memwal_query.fts.bm25 import CorpusStats
    >>> a = Postings.build(np.array([0, 1], np.uint64), [Doc(("x",), (0,)), Doc(("y",), (0,))])
    >>> b = Postings.build(np.array([0], np.uint64), [Doc(("x", "x"), (0, 1))])
    >>> pool = PostingsPool.of([a, b], [np.array([True, True]), np.array([True])])
    >>> rows, scores = pool.score(["x"], CorpusStats(3, 4, {"x": 2}), pool.live)
    >>> rows.tolist(), pool.locate(rows)[0].tolist()
    ([0, 2], [0, 1])
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from memwal_query.fts.analyzer import Doc
from memwal_query.fts.bm25 import CorpusStats
from memwal_query.fts.postings import Postings, bm25_from, tf_weights

__all__ = ["PostingsPool"]

_NONE = (np.empty(0, np.int64), np.empty(0, np.float64))


@dataclass(frozen=True)
class PostingsPool:
    """Several sources' postings as one: pooled row ``starts[i] + r`` is row ``r`` of ``parts[i]``."""

    parts: tuple[Postings, ...] = field(repr=False)
    starts: np.ndarray = field(repr=False)  # len(parts) + 1
    live: np.ndarray = field(repr=False)
    lengths: np.ndarray = field(repr=False)
    _terms: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _tf: dict[tuple[str, float], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, parts: Sequence[Postings], live: Sequence[np.ndarray]) -> PostingsPool:
        """The pool of ``parts`` (with which of their rows are live)."""
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=starts[1:])
        return cls(
            tuple(parts),
            starts,
            _cat([np.asarray(m, dtype=bool) for m in live]).astype(bool),
            _cat([p.lengths for p in parts]).astype(np.int64),
        )

    def __len__(self) -> int:
        return int(self.starts[-1])

    def term(self, token: str) -> tuple[np.ndarray, np.ndarray]:
        """(pooled row positions, frequencies) of ``token`` (built once per pool)."""
        with self._lock:
            hit = self._terms.get(token)
        if hit is not None:
            return hit
        found = [(idx + self.starts[i], freq) for i, p in enumerate(self.parts) for idx, freq in [p.term(token)]]
        found = [f for f in found if f[0].size]
        out = (np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found])) if found else _NONE
        with self._lock:
            self._terms[token] = out
        return out

    def doc_freq(self, token: str, mask: np.ndarray | None = None) -> int:
        """Rows in ``mask`` (default: the live rows) holding ``token``."""
        idx, _ = self.term(token)
        return int(np.count_nonzero((self.live if mask is None else mask)[idx]))

    def score(self, query: Sequence[str], stats: CorpusStats, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pooled row positions, BM25) of the rows in ``mask`` holding a query token."""
        return bm25_from(len(self), lambda tok: self._weights(tok, stats.avgdl), query, stats, mask)

    def _weights(self, token: str, avgdl: float) -> tuple[np.ndarray, np.ndarray]:
        """:func:`tf_weights` of ``token`` (kept per pool: ``avgdl`` is the snapshot's)."""
        key = (token, avgdl)
        with self._lock:
            hit = self._tf.get(key)
        if hit is None:
            hit = tf_weights(self.lengths, *self.term(token), avgdl)
            with self._lock:
                self._tf[key] = hit
        return hit

    def part_mask(self, keep: Sequence[bool]) -> np.ndarray:
        """A row mask that is ``keep[i]`` over the rows of part ``i``."""
        return np.repeat(np.asarray(keep, dtype=bool), np.diff(self.starts))

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(part index, row position within the part) of pooled ``rows``."""
        part = np.searchsorted(self.starts, rows, side="right") - 1
        return part, rows - self.starts[part]

    def doc(self, row: int) -> Doc:
        """The tokens of pooled row ``row``."""
        part, local = self.locate(np.array([row]))
        return self.parts[int(part[0])].doc(int(local[0]))


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0)
