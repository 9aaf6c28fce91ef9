"""BM25 as Lance scores it, over corpus statistics we supply.

Lance's INVERTED index scores a document ``d`` for query tokens ``q1..qn`` (repeats
count: "apple apple" weighs apple twice) as::

    sum_i idf(q_i) * (k1 + 1) * f(q_i, d) / (f(q_i, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t) = ln((N - df(t) + 0.5) / (df(t) + 0.5) + 1)

with ``k1 = 1.2``, ``b = 0.75`` (``lance-index/src/scalar/inverted/scorer.rs``;
reproduced to 1e-7 against pylance 14.0.2). ``N`` counts the documents with at
least one token, ``avgdl`` is their mean token count. A phrase query returns the
documents holding the phrase and scores them the same way (measured).

Example:
    >>> stats = CorpusStats(num_docs=3, total_tokens=5, doc_freq={"cat": 2})
    >>> round(float(score_docs([Doc(("cat",), (0,))], ("cat",), stats)[0]), 6)
    0.561961
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from memwal_query.fts.analyzer import Doc

__all__ = ["K1", "B", "CorpusStats", "score_docs", "score_docs_under", "idf", "phrase_match", "query_weights"]

K1 = 1.2
B = 0.75


def idf(df: int, n: int) -> float:
    """Lance's BM25 inverse document frequency."""
    return math.log((n - df + 0.5) / (df + 0.5) + 1.0)


@dataclass(frozen=True)
class CorpusStats:
    """``N``, total tokens and per-token document counts of one corpus."""

    num_docs: int
    total_tokens: int
    doc_freq: Mapping[str, int]

    @property
    def avgdl(self) -> float:
        """Mean tokens per document."""
        return self.total_tokens / self.num_docs if self.num_docs else 0.0

    def idf(self, token: str) -> float:
        """``idf`` of ``token`` (0 for a token no document holds)."""
        df = self.doc_freq.get(token, 0)
        return idf(df, self.num_docs) if df > 0 else 0.0


def query_weights(query: Sequence[str]) -> dict[str, int]:
    """Each distinct query token with its number of occurrences."""
    out: dict[str, int] = {}
    for t in query:
        out[t] = out.get(t, 0) + 1
    return out


def score_docs(docs: Sequence[Doc], query: Sequence[str], stats: CorpusStats) -> np.ndarray:
    """BM25 of each document for ``query`` under ``stats`` (float64)."""
    return score_docs_under(docs, query, [stats])[0]


def score_docs_under(docs: Sequence[Doc], query: Sequence[str], stats: Sequence[CorpusStats]) -> list[np.ndarray]:
    """BM25 of each document for ``query`` under each of ``stats`` (documents counted once)."""
    weights = query_weights(query)
    terms = list(weights)
    freq = np.zeros((len(docs), len(terms)), dtype=np.float64)
    if docs and terms:
        freq[:] = [[d.counts.get(t, 0) for t in terms] for d in docs]
    dl = np.array([len(d) for d in docs], dtype=np.float64)
    out = []
    for st in stats:
        if not len(docs) or st.num_docs == 0:
            out.append(np.zeros(len(docs)))
            continue
        norm = K1 * (1.0 - B + B * dl / st.avgdl)
        w = np.array([weights[t] * st.idf(t) for t in terms])
        tf = (K1 + 1.0) * freq / (freq + norm[:, None])
        out.append(np.asarray(tf @ w, dtype=np.float64))
    return out


def phrase_match(doc: Doc, phrase: Doc) -> bool:
    """Whether ``doc`` holds ``phrase``: its tokens at the same relative positions. Tokens of
    the phrase at one position are alternatives (the ``code`` analyzer with
    ``preserve_original`` gives ``foo_bar`` and ``foo`` both position 0): one of them must be
    there, as Lance matches phrases (checked against Lance on 78 such queries).

    Example:
        >>> phrase_match(Doc(("a", "b", "c"), (0, 1, 2)), Doc(("b", "c"), (0, 1)))
        True
        >>> phrase_match(Doc(("a", "b", "c"), (0, 1, 3)), Doc(("b", "c"), (0, 1)))
        False
        >>> phrase_match(Doc(("x", "foo", "bar"), (0, 1, 2)), Doc(("foo_bar", "foo", "bar"), (0, 0, 1)))
        True
    """
    if not phrase.tokens:
        return False
    at: dict[str, set[int]] = {}
    for tok, pos in zip(doc.tokens, doc.positions, strict=True):
        at.setdefault(tok, set()).add(pos)
    p0 = min(phrase.positions)
    groups: dict[int, set[str]] = {}
    for tok, pos in zip(phrase.tokens, phrase.positions, strict=True):
        groups.setdefault(pos - p0, set()).add(tok)
    starts = set().union(*(at.get(t, set()) for t in groups[0]))
    return any(all(any(s + off in at.get(t, ()) for t in alts) for off, alts in groups.items()) for s in starts)
