"""Hybrid search: merged KNN and merged full-text search fused by reciprocal rank.

Vector distances and BM25 scores are on unrelated scales, so the two result lists
are fused by rank, not by value (reciprocal rank fusion, Cormack, Clarke and
Büttcher, SIGIR 2009, also LanceDB's default reranker)::

    relevance(row) = sum over the lists that hold it of 1 / (rrf_k + rank)

with ranks counted from 1 and ``rrf_k = 60``, the constant of that paper (it damps
the weight of the very first ranks; LanceDB uses the same default). Each list is
the merged search of the table (:meth:`memwal_query.Table.nearest`,
:meth:`memwal_query.Table.search_text`), so both see live rows only and the same
filter; rows are matched by primary key. A row found by one search only gets
that list's term.

Example:
    >>> fused = rrf([["a", "b", "c"], ["c", "a"]])  # two best-first lists of keys
    >>> sorted(fused, key=fused.get, reverse=True), round(fused["a"], 5)
    (['a', 'c', 'b'], 0.03252)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError, positive_k
from memwal_query.format.nested import as_schema
from memwal_query.scan.fragment import search_columns
from memwal_query.vector import nearest
from memwal_query.view.table_view import TableView

__all__ = ["RRF_K", "rrf", "search_hybrid"]

#: The reciprocal rank fusion constant (Cormack et al. 2009).
RRF_K = 60


def rrf(rankings: Sequence[Sequence[Hashable]], rrf_k: float = RRF_K) -> dict[Hashable, float]:
    """Reciprocal rank fusion of best-first lists of keys."""
    out: dict[Hashable, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            out[key] = out.get(key, 0.0) + 1.0 / (rrf_k + rank)
    return out


def _keys(t: pa.Table, pk: Sequence[str]) -> list[Hashable]:
    cols = [t.column(c).to_pylist() for c in pk]
    return list(zip(*cols, strict=True)) if len(cols) > 1 else cols[0]


def search_hybrid(  # noqa: PLR0913 - the union of both searches' options
    view: TableView,
    vector_column: str,
    vector: object,
    text_column: str,
    text: str,
    *,
    k: int = 10,
    filter: str | pc.Expression | None = None,
    columns: Sequence[str] | None = None,
    depth: int | None = None,
    rrf_k: float = RRF_K,
    nprobes: int | None = None,
    refine_factor: int | None = None,
    distance: str = "l2",
    in_query: bool = False,
) -> pa.Table:
    """The ``k`` best rows by reciprocal rank fusion of merged KNN and merged full-text search.

    Returns the requested columns plus ``_distance`` (null: not among the vector
    results), ``_score`` (BM25; null: not among the text results) and
    ``_relevance_score`` (the fused score), best first. Each search returns its
    ``depth`` best rows (default ``max(4 * k, 50)``).
    """
    k = positive_k(k)
    if not isinstance(rrf_k, numbers.Real) or isinstance(rrf_k, bool) or not 0 <= float(rrf_k) < math.inf:
        msg = f"rrf_k must be a finite non-negative number, got {rrf_k!r}"
        raise InvalidArgumentError(msg)
    rrf_k = float(rrf_k)
    depth = max(4 * k, 50) if depth is None else depth
    if not isinstance(depth, numbers.Integral) or isinstance(depth, bool) or depth < k:
        msg = f"depth must be an integer of at least k ({k}), got {depth!r}"
        raise InvalidArgumentError(msg)
    depth = int(depth)
    schema, pk = view.snapshot.schema, list(view.snapshot.primary_key)
    out, shown = search_columns(columns, schema.names, view.uri, pk)
    read = list(dict.fromkeys([*pk, *out]))
    out = out if shown is None else shown
    knn = nearest(
        view,
        vector_column,
        vector,
        k=depth,
        filter=filter,
        nprobes=nprobes,
        refine_factor=refine_factor,
        distance=distance,
        columns=read,
        in_query=in_query,
    ).rows
    from memwal_query.fts.search import search_text  # the full-text modules load on first use

    fts = search_text(view, text_column, text, k=depth, filter=filter, columns=read, in_query=in_query).rows
    kk, tk = _keys(knn, pk), _keys(fts, pk)
    fused = rrf([kk, tk], rrf_k)
    best = sorted(fused, key=lambda key: -fused[key])[:k]
    row_of: dict[Hashable, tuple[pa.Table, int]] = {key: (fts, i) for i, key in enumerate(tk)}
    row_of.update({key: (knn, i) for i, key in enumerate(kk)})
    dist = dict(zip(kk, knn.column("_distance").to_pylist(), strict=True))
    score = dict(zip(tk, fts.column("_score").to_pylist(), strict=True))
    target = pa.schema([schema.field(c) for c in out])
    rows = [as_schema(row_of[key][0].slice(row_of[key][1], 1).select(out), target) for key in best]
    result = pa.concat_tables(rows).combine_chunks() if rows else target.empty_table()  # one chunk, not one per row
    if not out:  # the scores alone (tables of no column lose their rows when concatenated)
        result = pa.table({"_": pa.nulls(len(best))}).drop_columns(["_"])
    return (
        result.append_column("_distance", pa.array([dist.get(key) for key in best], pa.float32()))
        .append_column("_score", pa.array([score.get(key) for key in best], pa.float32()))
        .append_column("_relevance_score", pa.array([fused[key] for key in best], pa.float64()))
    )
