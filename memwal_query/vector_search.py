"""The per-source searches of one vector search, each returning exact distances.

* The **base** is searched through its index (or flat) without the base mask: it asks
  for a few more rows than ``k``, drops the hits whose key has a newer version
  (:class:`memwal_query.merge.NewerKeys`) and asks again for four times as many while
  fewer than ``k`` survive and the index could return more. A filter applies to the
  base rows' own values: a row it keeps whose key is newer is dropped anyway.
* **Large generations** (and those over the memory budget) are searched through
  Lance with the same ``nprobes`` / ``refine_factor`` as the base; their rows whose
  key has a newer version are dropped from what Lance returns (asking for more while
  short). A large generation *held* in memory is asked for row addresses only (and,
  with ``refine_factor``, for ``k * refine_factor`` of them, re-ranked exactly here as
  Lance's refine would): vectors and columns come from memory.
* **Small generations and MemTables** are searched together in memory
  (:mod:`memwal_query.vector_pool`); with a filter, through Lance, flat.

Every candidate's ``_distance`` is recomputed from its stored vector (Lance's
definitions: squared l2, 1 - cosine similarity, 1 - dot product), so distances from
every source are exact and comparable, whatever index found the row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import serialize_row_addrs

from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.format.index_restriction import IndexedOnly, indexed_only
from memwal_query.format.lance_open import lance_message, vanished_error
from memwal_query.format.nested import as_schema
from memwal_query.format.row_address import address_option, addresses, take_rows
from memwal_query.format.sets import member
from memwal_query.format.topk import smallest
from memwal_query.planner.filter_refusal import refusal
from memwal_query.planner.lance_filter import lance_scanner
from memwal_query.vector_distance import exact_distances, vector_matrix
from memwal_query.vector_pool import PoolPart

__all__ = [
    "SearchSpec",
    "lance_search",
    "overfetch",
    "overfetch_rows",
    "Candidates",
    "RowsOf",
    "Scored",
    "by_source",
]


@dataclass(frozen=True)
class SearchSpec:
    """What one vector search asks: the column, query, k, metric and index parameters."""

    column: str
    q: np.ndarray
    k: int
    metric: str
    nprobes: int | None
    refine_factor: int | None
    filter: str | pc.Expression | None
    out_cols: tuple[str, ...]
    key_cols: tuple[str, ...]

    def args(self, k: int, *, index: bool = True) -> dict[str, Any]:
        """Lance ``nearest`` arguments for ``k`` rows (``index=False``: an exact flat search)."""
        a: dict[str, Any] = {"column": self.column, "q": self.q, "k": k, "metric": self.metric}
        if not index:
            a["use_index"] = False
            return a
        if self.nprobes is not None:
            a["nprobes"] = int(self.nprobes)
        if self.refine_factor is not None:
            a["refine_factor"] = int(self.refine_factor)
        return a

    @property
    def fetch_cols(self) -> list[str]:
        """Columns read from each hit: the output, the key and the vector."""
        return list(dict.fromkeys([*self.out_cols, *self.key_cols, self.column]))


def lance_search(
    ds: lance.LanceDataset,
    what: str,
    spec: SearchSpec,
    args: dict[str, Any],
    block: np.ndarray | None,
    *,
    indexed: IndexedOnly | None = None,
    vectors: bool = True,
    row_addrs: bool = False,
    columns: list[str] | None = None,
) -> pa.Table:
    """One Lance search of ``ds`` (the spec's columns, filter and ``args``) minus ``block``.

    ``vectors``: also read the vector column (to recompute exact distances);
    ``row_addrs``: add the row addresses (read them with :func:`addresses`);
    ``columns``: read these columns instead (besides ``_distance``).
    """
    cols = spec.fetch_cols if columns is None else columns
    if not vectors and spec.column not in spec.out_cols:
        cols = [c for c in cols if c != spec.column]
    kwargs: dict[str, Any] = {
        "columns": [*cols, "_distance"],
        "nearest": args,
        "disable_scoring_autoprojection": True,
    }
    if row_addrs:
        kwargs.update(address_option(ds))
    filt = spec.filter
    if filt is not None:
        kwargs["prefilter"] = True
    # rows outside the index are served by catch-up generations
    kwargs.update(indexed_only(ds, indexed, filt is not None))
    if block is not None and block.size:
        if ds.has_stable_row_ids:  # Lance would take the addresses for row ids (pylance's generations have none)
            raise MemWalError(f"vector search in {what}: cannot leave out rows of a dataset with stable row ids")
        kwargs["row_addr_blocklist"] = serialize_row_addrs(block.tolist())
        kwargs["prefilter"] = True
    try:
        return lance_scanner(ds, filt, **kwargs).to_table()
    except (ValueError, OSError, RuntimeError) as err:
        text = lance_message(err)
        if filt is not None and (why := refusal(text)) is not None:  # e.g. a column this source lacks
            raise InvalidArgumentError(f"invalid vector search filter {str(filt)!r} for {what}: {why}") from err
        if "Invalid user input" in text:
            raise InvalidArgumentError(f"Lance refused the vector search of {what}: {text}") from err
        msg = f"vector search in {what} failed: {text}"
        raise vanished_error(ds, f"vector search in {what}", err) or MemWalError(msg) from err


def by_source(source: np.ndarray, read: Callable[[int, np.ndarray], pa.Table]) -> pa.Table:
    """Rows from several sources, in the order of ``source`` (each row's source).

    ``read(s, positions)`` reads the rows at ``positions`` (into ``source``) that come from
    source ``s``: one call per source holding some.
    """
    pieces, ranks = [], []
    for s in np.unique(source).tolist():
        mine = np.flatnonzero(source == s)
        pieces.append(read(s, mine))
        ranks.append(mine)
    if len(pieces) == 1:
        return pieces[0]
    return pa.concat_tables(pieces).take(pa.array(np.argsort(np.concatenate(ranks))))


def _dead_by_address(drop: np.ndarray | None) -> Callable[[pa.Table], np.ndarray]:
    """Which hits (searched with row addresses) are in the sorted drop list ``drop``."""

    def dead(hits: pa.Table) -> np.ndarray:
        assert drop is not None  # asked only when some share is dead (see overfetch)
        return member(addresses(hits), drop)

    return dead


def _share(drop: np.ndarray | None, rows: int) -> float:
    """The share of a source's ``rows`` its drop list supersedes."""
    return 0.0 if drop is None else drop.size / max(rows, 1)


def overfetch_rows(k: int, dead_share: float) -> int:
    """Rows asked of a source for ``k`` live ones when ``dead_share`` of them may be superseded."""
    return k if dead_share <= 0 else k + 4 + math.ceil(3 * k * min(1.0, dead_share))


def overfetch(
    search: Callable[[int], pa.Table], dead: Callable[[pa.Table], np.ndarray], k: int, dead_share: float
) -> pa.Table:
    """The top ``k`` hits of ``search(n)`` that are not ``dead``, asking for more while short.

    ``search(n)`` returns up to ``n`` hits, best first; ``dead_share`` guesses the share
    of hits that are dead. Asks for four times as many while fewer than ``k`` survive and
    the source returned all it was asked for.
    """
    want = overfetch_rows(k, dead_share)
    while True:
        hits = search(want)
        live = hits.filter(pa.array(~dead(hits))) if dead_share > 0 and hits.num_rows else hits
        if live.num_rows >= k or hits.num_rows < want:
            return live
        want *= 4


def _held_rows(held: PoolPart | None, addrs: np.ndarray, cols: list[str], what: str) -> pa.Table | None:
    """Rows at ``addrs`` from rows held in memory (None: nothing held, or not all of them held)."""
    if held is None:
        return None
    try:
        at = held.positions(addrs, what)
    except MemWalError:
        return None  # held for another base version: read them from Lance
    return held.table.select(cols).take(pa.array(at))


RowsOf = Callable[[np.ndarray], pa.Table]
"""Output columns of a source's candidates at the given positions, in that order."""


@dataclass(frozen=True)
class Scored:
    """A source's candidates scored already: exact distances, and how to read their output columns."""

    dist: np.ndarray
    rows: RowsOf


@dataclass(frozen=True)
class _Found:
    """One source's candidates: exact distances (NaN: unusable) and how to read their rows."""

    label: str
    dist: np.ndarray
    rows: RowsOf


class Candidates:
    """Candidates of the sources of one search: exact distances, rows read for the winners only."""

    def __init__(self, spec: SearchSpec, schema: pa.Schema) -> None:
        self.spec = spec
        self.schema = schema
        self.found: list[_Found] = []

    @property
    def labels(self) -> list[str]:
        """The sources added, in order."""
        return [f.label for f in self.found]

    def distances(self, hits: pa.Table) -> np.ndarray:
        """Exact distances of ``hits`` (the fetched columns); NaN for a null vector.

        Hits without the vector column carry Lance's own exact distance (a flat or refined search).
        """
        spec = self.spec
        if hits.num_rows == 0 or spec.column not in hits.schema.names:
            return np.asarray(hits.column("_distance").to_numpy(zero_copy_only=False), dtype=np.float32)
        col = self.schema.field(spec.column)
        vec = hits.column(spec.column)
        mat, valid = vector_matrix(vec if vec.type == col.type else vec.cast(col.type), col.type.list_size)
        d = exact_distances(mat, spec.q, spec.metric)
        d[~valid] = np.nan
        return d

    def add(self, hits: pa.Table | Scored, label: str) -> None:
        """Keep ``hits`` (fetched columns, or scored already) of a source."""
        if isinstance(hits, Scored):
            self.found.append(_Found(label, np.asarray(hits.dist, dtype=np.float32), hits.rows))
            return
        cols = list(self.spec.out_cols)
        self.found.append(_Found(label, self.distances(hits), lambda at: hits.take(pa.array(at)).select(cols)))

    def base(
        self,
        ds: lance.LanceDataset,
        what: str,
        newer: Any,
        base_rows: int,
        *,
        indexed: IndexedOnly | None,
        exact: bool,
        refined: bool = False,
        shadowed: Callable[[], np.ndarray] | None = None,
        held: PoolPart | None = None,
    ) -> pa.Table:
        """The base's top k live hits: over-fetch, drop rows whose key is newer, widen if short.

        Args:
            ds: The base.
            what: Names it in errors.
            newer: The newer levels' keys (``merge.NewerKeys``).
            base_rows: Rows of the base.
            indexed: Search these fragments only, by the index (catch-up generations serve the rest).
            exact: Lance's distances are exact already (flat or refined search).
            refined: An index search with ``refine_factor``.
            shadowed: Every superseded base row address, sorted (given when most base rows are
                superseded: a lagging merger). Hits are then dropped by address and only the
                live ones' vectors and columns read, one take per search.
            held: The base's live rows in memory (with ``shadowed``): the live hits' rows come
                from there instead of a take.
        """
        spec = self.spec
        share = len(newer) / max(base_rows, 1)

        def dead(hits: pa.Table) -> np.ndarray:
            return np.asarray(newer.contains(hits.select(list(spec.key_cols))))

        if (refined or not exact) and not ds.has_stable_row_ids:
            if shadowed is not None:
                drop = shadowed()
                share = drop.size / max(base_rows, 1)
                return self._live_then_read(
                    ds,
                    what,
                    _dead_by_address(drop),
                    share,
                    keys=False,
                    refined=refined,
                    indexed=indexed,
                    held=held,
                )
            if refined and overfetch_rows(spec.k, share) > 2 * spec.k:
                return self._live_then_read(ds, what, dead, share, keys=True, refined=True, indexed=indexed)

        def search(n: int) -> pa.Table:
            return lance_search(ds, what, spec, spec.args(n), None, indexed=indexed, vectors=not exact)

        return overfetch(search, dead, spec.k, share)

    def _live_then_read(
        self,
        ds: lance.LanceDataset,
        what: str,
        dead: Callable[[pa.Table], np.ndarray],
        share: float,
        *,
        keys: bool,
        refined: bool,
        indexed: IndexedOnly | None,
        held: PoolPart | None = None,
    ) -> pa.Table:
        """Live hits found first (row addresses, and ``keys`` to tell the dead ones), then their rows read.

        Lance reads a column of a search's hits row by row (~20-35 us a vector): with most hits
        superseded, reading every hit's vector (or refining inside Lance, which re-ranks the dead
        hits too: 360 vectors read for 100 on the lagging benchmark) costs more than one take of
        the live ones. ``refined``: the ``k * refine_factor`` best live hits by the index's own
        distances, re-ranked exactly (:meth:`distances`) as Lance's refine does over live rows.
        """
        spec = self.spec
        search = self._addresses_search(ds, what, list(spec.key_cols) if keys else [], indexed=indexed)
        want = spec.k * int(spec.refine_factor or 1) if refined else spec.k
        live = overfetch(search, dead, want, share)
        if refined:
            live = live.slice(0, want)
        rows = _held_rows(held, addresses(live), spec.fetch_cols, what)
        if rows is None:
            rows = take_rows(ds, addresses(live), spec.fetch_cols)
        return rows.append_column("_distance", pa.array(np.full(rows.num_rows, np.nan), pa.float32()))

    def generation(
        self, ds: lance.LanceDataset, what: str, drop: np.ndarray | None, rows: int, *, index: bool
    ) -> pa.Table:
        """A generation's top k live hits: searched without its mask, dead rows dropped after."""
        spec = self.spec
        exact = not index or spec.refine_factor is not None

        def search(n: int) -> pa.Table:
            return lance_search(ds, what, spec, spec.args(n, index=index), None, vectors=not exact, row_addrs=True)

        return overfetch(search, _dead_by_address(drop), spec.k, _share(drop, rows))

    def small_generation(self, ds: lance.LanceDataset, what: str, drop: np.ndarray | None) -> Scored:
        """A small generation's exact top k: its vectors read with their row addresses and scored
        here (a Lance flat search costs twice the read), output columns read for winners only."""
        spec = self.spec
        try:
            hits = ds.to_table(columns=[spec.column], **address_option(ds))
        except (ValueError, OSError, RuntimeError) as err:
            msg = f"vector search in {what} failed: {lance_message(err)}"
            raise vanished_error(ds, f"vector search in {what}", err) or MemWalError(msg) from err
        addrs = addresses(hits)
        d = self.distances(hits) if hits.num_rows else np.empty(0, dtype=np.float32)
        if drop is not None and drop.size:
            d[member(addrs, drop)] = np.nan  # superseded or deleted
        top = smallest(d, spec.k)
        top = top[~np.isnan(d[top])]
        found = addrs[top]
        cols = list(spec.out_cols)
        return Scored(d[top], lambda at: take_rows(ds, found[at], cols))

    def held(self, ds: lance.LanceDataset, what: str, drop: np.ndarray | None, part: PoolPart, rows: int) -> pa.Table:
        """A held large generation's hits by its own index: row addresses from Lance, the rest from memory.

        With ``refine_factor`` Lance is asked for ``k * refine_factor`` rows without refining;
        :meth:`distances` then re-ranks them exactly (what Lance's refine does).
        """
        spec = self.spec
        search = self._addresses_search(ds, what, [], indexed=None)
        hits = overfetch(search, _dead_by_address(drop), spec.k * (spec.refine_factor or 1), _share(drop, rows))
        at = part.positions(addresses(hits), what)
        return part.table.select(spec.fetch_cols).take(pa.array(at))

    def _addresses_search(
        self, ds: lance.LanceDataset, what: str, cols: list[str], *, indexed: IndexedOnly | None
    ) -> Callable[[int], pa.Table]:
        """A search of ``ds`` by its index returning ``cols``, row addresses and the index's own
        distances, without Lance's refine (the caller re-ranks exactly what it keeps)."""
        spec = self.spec

        def search(n: int) -> pa.Table:
            args = spec.args(n)
            args.pop("refine_factor", None)
            return lance_search(ds, what, spec, args, None, indexed=indexed, row_addrs=True, columns=cols)

        return search

    def top(self) -> pa.Table:
        """The best k of every source's candidates (ties: the source added first), with ``_distance``."""
        fields = [self.schema.field(c) for c in self.spec.out_cols]
        target = pa.schema(fields)
        dists = [f.dist for f in self.found]
        d = np.concatenate(dists) if dists else np.empty(0, dtype=np.float32)
        order = np.argsort(d, kind="stable")[: self.spec.k]  # NaN (no distance) sorts last
        order = order[~np.isnan(d[order])]
        if not order.size:
            return target.append(pa.field("_distance", pa.float32())).empty_table()
        starts = np.cumsum([0] + [x.size for x in dists])

        def piece(s: int, mine: np.ndarray) -> pa.Table:
            t = self.found[s].rows(order[mine] - starts[s]).select(target.names)
            return as_schema(t, target)

        rows = by_source(np.searchsorted(starts, order, side="right") - 1, piece)
        return rows.append_column("_distance", pa.array(d[order], pa.float32()))
