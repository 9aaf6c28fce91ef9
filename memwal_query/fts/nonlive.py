"""What the indexed rows that are no longer live contribute to an index's statistics.

An INVERTED index still counts rows a newer level replaced or deleted. To score as one
index over the live rows, their document count, lengths and document frequencies are
subtracted. Those rows are never search results, so only their token counts are kept:
per dataset, column and analyzer, flat arrays of (row, distinct token) pairs and row
lengths, grown as refreshed snapshots meet new non-live rows (each row tokenized once).

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

from memwal_query.format.sets import difference, member, unique
from memwal_query.fts.analyzer import Analyzer

__all__ = ["NonLiveCounts", "TokenCounts"]

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
        self, analyzer: Analyzer, addrs: np.ndarray, read: Callable[[np.ndarray], Sequence[str | None]]
    ) -> NonLiveCounts:
        """Counts of the rows at ``addrs`` (their texts read by ``read`` the first time)."""
        addrs = np.asarray(addrs, dtype=np.uint64)
        with self._lock:
            missing = difference(addrs, self.addrs)
            if missing.size:
                self._add(analyzer, missing, read(missing))
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
