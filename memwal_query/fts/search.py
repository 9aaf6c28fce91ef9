"""Full-text search over the merged table, scored as one index over the live rows.

Each source's own index ranks by *local* statistics (its ``N``, ``avgdl``, ``df``),
so a naive union ranks rows by where they sit. Here every candidate is re-scored
with the snapshot's live statistics (:mod:`memwal_query.fts.corpus`), and each
indexed source is asked for more candidates until no row it has not returned yet
could enter the top k:

* Lance returns a source's rows best first by its local score ``L`` (live,
  filter-passing rows; rows the merge drops are removed from what Lance returns,
  the filter as a prefilter). We recompute ``L`` for the rows returned; when it does
  not match Lance's ``_score`` the source is searched exhaustively instead.
* For a row of that source, global score ``G <= C * L`` with
  ``C = max_t(idf_G(t) / idf_L(t)) * max(1, avgdl_G / avgdl_L)`` (BM25's term weight
  grows by at most ``avgdl_G / avgdl_L`` when only ``avgdl`` changes). A row not
  returned yet has ``L`` at most the last score returned, so once ``C`` times that
  score is below the k-th best global score found, the source is done; otherwise
  it is asked for four times as many rows.
* Rows without an index (MemTables, base fragments not indexed yet) are scored
  directly from their tokens.

A filter applies to the live version of each row and prunes regions (SQL strings).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.query import MatchQuery, PhraseQuery

from memwal_query.errors import InvalidArgumentError, MemWalError, positive_k
from memwal_query.forked import ThreadPool
from memwal_query.format.beside import start_beside
from memwal_query.format.index_restriction import indexed_only
from memwal_query.format.lance_open import lance_message, vanished_error
from memwal_query.format.nested import as_schema
from memwal_query.format.row_address import address_option, addresses, take_rows
from memwal_query.format.sets import member
from memwal_query.format.topk import smallest
from memwal_query.fts.analyzer import Doc
from memwal_query.fts.bm25 import CorpusStats, phrase_match, score_docs_under
from memwal_query.fts.corpus import (
    Corpus,
    FlatSource,
    IndexedSource,
    corpus_of,
    fragments_of,
    tokenize_rows,
)
from memwal_query.planner.filter_refusal import blamed_on_filter, check_search_filter, refusal
from memwal_query.planner.lance_filter import lance_scanner
from memwal_query.scan.fragment import search_columns
from memwal_query.view.table_view import TableView

__all__ = ["TextSearchResult", "TextSearchStats", "search_text"]

_SCORE = "_score"
_SMALL_SOURCE = 4096  # documents: such an index is searched exhaustively at once
_BACKGROUND = ThreadPool(1, "memwal-fts")
_FIRST_EXTRA = 6  # rows beyond k asked of an indexed source first (more when the bound says so)
_REL = 1e-3  # our recomputation of Lance's local score must agree this closely


@dataclass
class TextSearchStats:
    """What a text search touched."""

    sources: list[str] = field(default_factory=list)
    pruned_regions: list[str] = field(default_factory=list)
    rounds: int = 0
    exhaustive: list[str] = field(default_factory=list)
    approximate_rows: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class _Query:
    corpus: Corpus
    text: str
    tokens: Doc
    phrase: bool
    stats: CorpusStats
    filter: str | pc.Expression | None
    k: int
    uri: str  # the table's, for errors

    def lance(self) -> MatchQuery | PhraseQuery:
        """The same query for Lance's own search of one source."""
        if self.phrase:
            return PhraseQuery(self.text, self.corpus.column)
        return MatchQuery(self.text, self.corpus.column)


def _bound_factor(src: IndexedSource, q: _Query) -> float:
    """``C``: how much larger than its local score a row's global score can be."""
    local = src.index_stats(q.tokens.tokens)
    ratio = 0.0
    for t in set(q.tokens.tokens):
        li = local.idf(t)
        if li > 0:
            ratio = max(ratio, q.stats.idf(t) / li)
    grow = q.stats.avgdl / local.avgdl if local.avgdl else 1.0
    return ratio * max(1.0, grow)


@dataclass
class _Fetch:
    """The candidates of one indexed source so far."""

    src: IndexedSource
    limit: int | None
    addrs: np.ndarray | None = None  # row addresses of the candidates so far
    scores: np.ndarray = field(default_factory=lambda: np.empty(0))
    bound: float = 0.0  # no row not fetched yet scores above this (0: exhausted)

    def scanner(self, q: _Query) -> lance.LanceScanner:
        """The Lance search of this round (built in the calling thread: it needs the GIL)."""
        src = self.src
        # only scores and addresses: the output columns are read for the winners alone (16
        # rows' ids read in the search plan cost ~0.9 ms, ten taken after it ~0.6 ms)
        kwargs: dict[str, Any] = {
            "columns": [_SCORE],
            "full_text_query": q.lance(),
            "prefilter": True,
            "limit": self.limit,
            "disable_scoring_autoprojection": True,
            **address_option(src.dataset),
        }
        kwargs.update(indexed_only(src.dataset, src.indexed_only, q.filter is not None))
        try:
            return lance_scanner(src.dataset, q.filter, **kwargs)
        except (ValueError, OSError, RuntimeError) as err:
            raise _search_error(err, q, src.name, src.dataset) from err

    def read(self, scanner: lance.LanceScanner, q: _Query, stats: TextSearchStats) -> pa.Table:
        """Run ``scanner`` (Lance releases the GIL while it searches)."""
        try:
            rows = scanner.to_table()
        except (ValueError, OSError, RuntimeError) as err:
            raise _search_error(err, q, self.src.name, self.src.dataset) from err
        stats.rounds += 1
        return rows

    def run(self, q: _Query, stats: TextSearchStats) -> None:
        """One round: search, then :meth:`accept` what came back."""
        self.accept(self.read(self.scanner(q), q, stats), q, stats)

    def accept(self, rows: pa.Table, q: _Query, stats: TextSearchStats) -> None:
        """Keep a round's live rows with their global scores and the bound on the rest."""
        src = self.src
        returned = rows.column(_SCORE).to_numpy().astype(np.float64)
        addrs = addresses(rows)
        live = ~member(addrs, src.drop)  # rows a newer level shadows are dropped here, not by Lance
        addrs, lance_scores = addrs[live], returned[live]
        docs = tokenize_rows(src, q.corpus, addrs)
        local, scores = score_docs_under(docs, q.tokens.tokens, [src.index_stats(q.tokens.tokens), q.stats])
        agree = bool(np.all(np.abs(local - lance_scores) <= 1e-6 + _REL * np.abs(lance_scores)))
        if self.limit is not None and not agree:
            stats.exhaustive.append(src.name)  # Lance ranks by something else: take every match
            self.limit = None
            self.run(q, stats)
            return
        self.addrs, self.scores = addrs, scores
        exhausted = self.limit is None or rows.num_rows < self.limit
        # a row not returned yet scores at most the last score returned (dropped rows included)
        self.bound = 0.0 if exhausted or not rows.num_rows else _bound_factor(src, q) * float(returned.min())


def _read_all(
    fetches: list[_Fetch], scanners: list[lance.LanceScanner], q: _Query, stats: TextSearchStats
) -> list[pa.Table]:
    return [f.read(s, q, stats) for f, s in zip(fetches, scanners, strict=True)]


def _search_error(err: Exception, q: _Query, what: str, ds: lance.LanceDataset) -> MemWalError:
    text = lance_message(err)
    if q.filter is not None and (why := refusal(text)) is not None:
        return InvalidArgumentError(f"invalid text search filter {str(q.filter)!r} for {q.uri} (in {what}): {why}")
    gone = vanished_error(ds, f"text search in {what}", err)
    return gone or MemWalError(f"text search in {what} of {q.uri} failed: {text}")


@dataclass(frozen=True)
class _Hits:
    """Scored candidates of one source: row ``i`` is ``rows[positions[i]]`` (in-memory rows)
    or the row at address ``addrs[i]`` of ``dataset`` (read when it makes the top k)."""

    scores: np.ndarray
    rows: pa.Table | None = None
    positions: np.ndarray | None = None
    dataset: lance.LanceDataset | None = None
    addrs: np.ndarray | None = None

    fragments: tuple[int, ...] | None = None  # the fragments of ``dataset`` holding ``addrs``

    def load(self, picked: np.ndarray, columns: list[str]) -> pa.Table:
        if self.rows is None or not set(columns) <= set(self.rows.column_names):
            assert self.dataset is not None and self.addrs is not None
            try:
                return take_rows(self.dataset, self.addrs[picked], columns, self.fragments)
            except (ValueError, OSError, RuntimeError) as err:  # e.g. merged and collected since
                what = "the rows a text search found"
                gone = vanished_error(self.dataset, what, err)
                raise gone or MemWalError(f"{what} in {self.dataset.uri} cannot be read: {lance_message(err)}") from err
        at = picked if self.positions is None else self.positions[picked]
        return self.rows.select(columns).take(pa.array(at))


def _pool_hits(corpus: Corpus, q: _Query, pruned: set[str]) -> list[_Hits]:
    """The best ``k`` in-memory rows (every flat source scored at once), one hit list per source."""
    pool = corpus.pool
    keep = [f.region_id not in pruned for f in corpus.flat]
    mask = pool.live & pool.part_mask(keep) if not all(keep) else pool.live
    if q.filter is not None:
        flat = zip(corpus.flat, keep, strict=True)
        passing = [_passing(f, q) if k else np.zeros(len(f.postings), bool) for f, k in flat]
        mask = mask & (np.concatenate(passing) if passing else np.zeros(0, bool))
    rows, scores = pool.score(q.tokens.tokens, q.stats, mask)
    if q.phrase and rows.size and not q.corpus.analyzer.phrase_is_match:
        hold = np.array([phrase_match(pool.doc(r), q.tokens) for r in rows.tolist()], dtype=bool)
        rows, scores = rows[hold], scores[hold]
    best = _top(scores, q.k)
    part, local = pool.locate(rows[best])
    out = []
    for i in np.unique(part).tolist():
        mine = part == i
        src = corpus.flat[i]
        addrs = src.postings.rowaddrs[local[mine]]
        out.append(_Hits(scores[best][mine], src.rows, local[mine], src.dataset, addrs, src.fragments))
    return out


def _passing(src: FlatSource, q: _Query) -> np.ndarray:
    """Which rows of ``src``'s postings pass the query's filter."""
    try:
        frags = fragments_of(src.dataset, src.fragments)
        scan = lance_scanner(src.dataset, q.filter, columns=[], fragments=frags, **address_option(src.dataset))
        addrs = addresses(scan.to_table())
    except (ValueError, OSError, RuntimeError) as err:
        raise _search_error(err, q, src.name, src.dataset) from err
    return src.postings.mask_of(addrs)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` largest ``scores`` (any order)."""
    return smallest(-scores, k)


def _kth(scores: Sequence[np.ndarray], k: int) -> float:
    allv = np.concatenate([s for s in scores if s.size]) if any(s.size for s in scores) else np.empty(0)
    if allv.size < k:
        return -np.inf
    return float(np.partition(allv, allv.size - k)[allv.size - k])


def _check(
    view: TableView, column: str, query: object, columns: Sequence[str] | None
) -> tuple[list[str], list[str] | None]:
    schema = view.snapshot.schema
    if not isinstance(query, str):
        msg = f"the text query must be a string, got {query!r}"
        raise InvalidArgumentError(msg)
    if column not in schema.names:
        msg = f"unknown text column {column!r} in {view.uri} (columns: {schema.names})"
        raise InvalidArgumentError(msg)
    if _SCORE in schema.names:
        msg = f"{view.uri} has its own column {_SCORE!r}, the column a text search adds for each row's score"
        raise InvalidArgumentError(msg)
    typ = schema.field(column).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        msg = f"column {column!r} of {view.uri} is {typ}, not a string column"
        raise InvalidArgumentError(msg)
    return search_columns(columns, schema.names, view.uri, view.snapshot.primary_key)


def _output(hits: list[_Hits], q: _Query, out: list[str], schema: pa.Schema) -> pa.Table:
    """The top ``k`` of all candidates, best first, with their columns (only those rows are read)."""
    target = pa.schema([schema.field(c) for c in out])
    hits = [h for h in hits if h.scores.size]
    if not hits:
        return target.append(pa.field(_SCORE, pa.float32())).empty_table()
    scores = np.concatenate([h.scores for h in hits])
    part = np.concatenate([np.full(h.scores.size, i) for i, h in enumerate(hits)])
    pos = np.concatenate([np.arange(h.scores.size) for h in hits])
    # ties by source, then by row address (or position): Lance returns tied rows of an index of
    # several segments in another order each time, and a hybrid search's ranks followed it
    at = np.concatenate(
        [np.arange(h.scores.size, dtype=np.uint64) if h.addrs is None else h.addrs.astype(np.uint64) for h in hits]
    )
    order = np.lexsort((at, part, -scores))[: q.k]
    by_part = np.argsort(part[order], kind="stable")  # the winners grouped by source
    pieces = []
    for i in np.unique(part[order]).tolist():
        mine = order[part[order] == i]
        piece = hits[i].load(pos[mine], out).select(out)
        pieces.append(as_schema(piece, target))
    rows = pa.concat_tables(pieces).take(pa.array(np.argsort(by_part, kind="stable")))
    return rows.append_column(_SCORE, pa.array(scores[order].astype(np.float32)))


class TextSearchResult(NamedTuple):
    """A text search's rows (with ``_score``, best first) and what it searched."""

    rows: pa.Table
    stats: TextSearchStats


def search_text(
    view: TableView,
    column: str,
    query: str,
    *,
    k: int = 10,
    filter: str | pc.Expression | None = None,
    columns: Sequence[str] | None = None,
    phrase: bool = False,
    in_query: bool = False,
) -> TextSearchResult:
    """Top-k live rows for ``query`` with ``_score``, best first; see the module docs.

    ``in_query``: called from inside a running DataFusion query (the SQL table
    function): a SQL filter is applied but cannot be planned for region pruning there.
    """
    t0 = time.perf_counter()
    k = positive_k(k)
    out, shown = _check(view, column, query, columns)
    check_search_filter(filter, view.uri, view.snapshot.schema, "text search ")
    corpus = corpus_of(view, column)
    stats = TextSearchStats()
    if phrase and not corpus.analyzer.with_position:
        msg = f"phrase queries need positions: index {corpus.index_name} on {column!r} of {view.uri} has none"
        raise InvalidArgumentError(msg)
    tokens = corpus.analyzer.query(query)
    q = _Query(corpus, query, tokens, phrase, corpus.stats(tokens.tokens), filter, k, view.uri)
    stats.approximate_rows = sum(s.unreadable_rows for s in corpus.indexed)  # known once the statistics are
    with blamed_on_filter(filter, view.snapshot.schema, view.uri, "text search "):
        pruned = view.search_pruned(filter, in_query)
        stats.pruned_regions = sorted(pruned)
        hits: list[_Hits] = []
        fetches: list[_Fetch] = []
        if tokens.tokens:
            for src in corpus.indexed:
                if src.region_id in pruned:
                    continue
                small = sum(f.num_docs for f in src.files) <= _SMALL_SOURCE
                fetches.append(_Fetch(src, None if small else k + max(k // 2, _FIRST_EXTRA)))
                stats.sources.append(src.name)
            # Lance searches the indexed sources (it releases the GIL) while the in-memory rows are
            # scored (start_beside: the search is running before the scoring takes the GIL)
            scanners = [f.scanner(q) for f in fetches]
            read = partial(_read_all, fetches, scanners, q, stats)
            first = start_beside(_BACKGROUND.get(), 1, [read])[0] if fetches else None
            hits += _pool_hits(corpus, q, pruned)
            if first is not None:
                for f, rows in zip(fetches, first.result(), strict=True):
                    f.accept(rows, q, stats)
            stats.sources += [f.name for f in corpus.flat if f.region_id not in pruned]
            while True:
                theta = _kth([f.scores for f in fetches] + [h.scores for h in hits], k)
                more = [f for f in fetches if f.bound > 0 and f.bound >= theta * (1 + 1e-9)]
                if not more:
                    break
                for f in more:
                    f.limit = 4 * (f.limit or 0)
                    f.run(q, stats)
        hits += [_Hits(f.scores, dataset=f.src.dataset, addrs=f.addrs) for f in fetches if f.addrs is not None]
        result = _output(hits, q, out, view.snapshot.schema)
        if shown is not None:  # no column asked for: the scores alone
            result = result.drop_columns([c for c in out if c not in shown])
    stats.seconds = time.perf_counter() - t0
    return TextSearchResult(result, stats)
