"""What the indexed rows that are no longer live contribute to an index's statistics.

An INVERTED index still counts rows a newer level replaced or deleted. To score as one
index over the live rows, their document count, lengths and document frequencies are
subtracted. The count and lengths come from the index's docs file; a query token's
document frequency among them (:class:`NonLiveFreq`) from the token's posting list
(:mod:`memwal_query.fts.posting_codec`: what Lance itself reads for the query), while the
non-live rows are tokenized on the background thread; once they are, every token is a
lookup. Where the postings cannot be decoded, the rows are tokenized on first use.

Tokenized rows are kept as token counts only (they are never search results): per
dataset, column and analyzer, flat arrays of (row, distinct token) pairs and row lengths,
grown as refreshed snapshots meet new non-live rows (each row tokenized once).

Example:
    >>> import numpy as np
    >>> from memwal_query.fts.analyzer import Analyzer
    >>> seen = TokenCounts()
    >>> texts = {1: "red fox", 2: "red red dog", 3: None}
    >>> read = lambda addrs: [texts[a] for a in addrs.tolist()]
    >>> counts = seen.of(Analyzer.from_params({"base_tokenizer": "simple"}), np.array([1, 2, 3], np.uint64), read)
    >>> sorted(counts.doc_freq.items()), counts.lengths.tolist()
    ([('dog', 1), ('fox', 1), ('red', 2)], [2, 3, 0])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from memwal_query import vector_background as background
from memwal_query.format.sets import difference, member, unique
from memwal_query.fts.analyzer import Analyzer
from memwal_query.fts.index_files import InvertedIndexFiles
from memwal_query.fts.posting_codec import UnsupportedPostings

__all__ = ["NonLiveCounts", "NonLiveFreq", "TokenCounts"]

_MEMO_TOKENS = 100_000
_CHUNK = 8192  # non-live rows read and tokenized at a time (a background read stops between them)

_EMPTY_U64 = np.empty(0, np.uint64)


@dataclass(frozen=True)
class NonLiveCounts:
    """Token counts of some rows: their lengths (in the order asked) and document frequencies."""

    lengths: np.ndarray
    doc_freq: dict[str, int]


class TokenCounts:
    """(row, distinct token) pairs and lengths of the rows tokenized so far (one dataset column)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.addrs = _EMPTY_U64  # sorted
        self.lengths = np.empty(0, np.int64)  # per row of ``addrs``
        self.pair_addr = _EMPTY_U64
        self.pair_token = np.empty(0, np.int64)
        self.vocab: list[str] = []
        self._ids: dict[str, int] = {}

    def of(
        self,
        analyzer: Analyzer,
        addrs: np.ndarray,
        read: Callable[[np.ndarray], Sequence[str | None]],
        stop: Callable[[], bool] | None = None,
    ) -> NonLiveCounts | None:
        """Counts of the rows at ``addrs`` (their texts read by ``read`` the first time, a
        chunk at a time); None when ``stop()`` turned true between chunks (what was read is kept)."""
        addrs = np.asarray(addrs, dtype=np.uint64)
        with self._lock:
            missing = difference(addrs, self.addrs)
        for lo in range(0, missing.size, _CHUNK):
            if stop is not None and stop():
                return None
            with self._lock:
                part = difference(missing[lo : lo + _CHUNK], self.addrs)  # another thread may have read some
                if part.size:
                    self._add(analyzer, part, read(part))
        with self._lock:
            at = np.searchsorted(self.addrs, addrs)
            lengths = self.lengths[at] if addrs.size else np.empty(0, np.int64)
            picked = self.pair_token[member(self.pair_addr, unique(addrs))]
            counts = np.bincount(picked, minlength=len(self.vocab))
            hit = np.flatnonzero(counts)
            df = dict(zip([self.vocab[i] for i in hit.tolist()], counts[hit].tolist(), strict=True))
        return NonLiveCounts(lengths, df)

    def _add(self, analyzer: Analyzer, addrs: np.ndarray, texts: Sequence[str | None]) -> None:
        tokens = analyzer.tokenize_flat(texts)
        per_row = np.diff(tokens.offsets)
        if len(tokens.words):
            encoded = tokens.words.dictionary_encode()
            local = np.array([self._id(w) for w in encoded.dictionary.to_pylist()], dtype=np.int64)
            token = local[encoded.indices.to_numpy().astype(np.int64)]
            row = np.repeat(np.arange(addrs.size, dtype=np.int64), per_row)
            pairs = unique(row << 32 | token)
            new_addr, new_token = addrs[pairs >> 32], pairs & 0xFFFFFFFF
        else:
            new_addr, new_token = _EMPTY_U64, np.empty(0, np.int64)
        all_addrs = np.concatenate([self.addrs, addrs])
        order = np.argsort(all_addrs, kind="stable")
        self.addrs = all_addrs[order]
        self.lengths = np.concatenate([self.lengths, per_row])[order]
        self.pair_addr = np.concatenate([self.pair_addr, new_addr])
        self.pair_token = np.concatenate([self.pair_token, new_token])

    def _id(self, word: str) -> int:
        got = self._ids.get(word)
        if got is None:
            got = self._ids[word] = len(self.vocab)
            self.vocab.append(word)
        return got


class NonLiveFreq:
    """Document frequency of a token among an index's non-live rows.

    Args:
        files: The index's directories.
        nonlive: The non-live row ids, sorted and distinct.
        lengths: Their token counts in the index (to tell rows whose text could not be read).
        count_all: Tokenizes every non-live row (:meth:`TokenCounts.of`), stopping (None)
            between chunks once the callable it is given returns true.
    """

    def __init__(
        self,
        files: Sequence[InvertedIndexFiles],
        nonlive: np.ndarray,
        lengths: np.ndarray,
        count_all: Callable[[Callable[[], bool] | None], NonLiveCounts | None],
    ) -> None:
        self._files = tuple(files)
        self._nonlive = nonlive
        self._lengths = lengths
        self._count_all = count_all
        self._lock = threading.Lock()
        self._memo: dict[str, int] = {}
        self._counts: NonLiveCounts | None = None
        self._postings = bool(nonlive.size) and all(f.postings_decodable for f in self._files)
        self.unreadable_rows = 0  # rows whose text could not be read, when counting from text

    @property
    def rows(self) -> int:
        """The non-live rows."""
        return int(self._nonlive.size)

    @property
    def from_text(self) -> bool:
        """Whether the counts come from the tokenized rows (else from posting lists, per token)."""
        return self._counts is not None

    def get(self, token: str) -> int:
        """Non-live documents holding ``token``."""
        if not self._nonlive.size:
            return 0
        counts = self._counts
        if counts is not None:
            return counts.doc_freq.get(token, 0)
        if self._postings:
            hit = self._memo.get(token)
            if hit is not None:
                return hit
            try:
                got = sum(f.doc_freq_among(token, self._nonlive) for f in self._files)
            except UnsupportedPostings:
                self._postings = False  # from now on, from the rows' text
            else:
                with self._lock:
                    if len(self._memo) >= _MEMO_TOKENS:
                        self._memo.clear()
                    self._memo[token] = got
                return got
        return self._from_text().doc_freq.get(token, 0)

    def count_later(self) -> None:
        """Tokenize the non-live rows on the background thread (then every token is a lookup)."""
        if self._postings and self._counts is None:
            background.later(self._settle)

    def _settle(self) -> None:
        counts = self._count_all(background.EXITING.is_set)  # an exiting interpreter does not wait for it
        if counts is None or not np.array_equal(counts.lengths, self._lengths):
            return  # stopped, or some rows' text is gone: the posting lists stay exact, keep them
        with self._lock:
            self._counts = counts

    def _from_text(self) -> NonLiveCounts:
        with self._lock:
            if self._counts is None:
                counts = self._count_all(None)
                assert counts is not None  # not stopped
                self.unreadable_rows = int(np.count_nonzero(counts.lengths != self._lengths))
                self._counts = counts
            return self._counts
