"""Rows of small unmerged generations held in memory for point lookups, one matrix per region.

Generations never change. A lookup touching a small one (``<= 200k`` rows) reads it
whole the first time, when it fits what is left of ``LOOKUP_ROWS_BUDGET`` (bytes,
all held generations together), and takes rows from memory afterwards. A lookup of
many keys touches many generations (a lagging merger leaves hundreds): one Arrow
``take`` per generation would cost more than the rows themselves, so when a lookup
touches at least ``MATRIX_MIN_GENERATIONS`` generations of one region, the region's
held generations are laid end to end in one table (:class:`RegionRows`, rebuilt when
the set of held generations changes; each generation's entry then becomes a view of
it, so the rows are in memory once) and the lookup takes all its rows in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pyarrow as pa

from memwal_query.errors import MemWalError, says_missing
from memwal_query.format.lance_open import base_read_error
from memwal_query.snapshot.generations import generation_read_error
from memwal_query.snapshot.model import GenerationSource, RegionSnapshot
from memwal_query.view.table_view import TableView

__all__ = [
    "LOOKUP_ROWS_BUDGET",
    "MATRIX_MIN_GENERATIONS",
    "RegionRows",
    "generation_failed",
    "held_rows",
    "region_rows",
    "take_held",
]

LOOKUP_ROWS_BUDGET = 256 * 2**20  # bytes of small generations held whole for lookups
MATRIX_MIN_GENERATIONS = 8
_HELD_MAX_ROWS = 200_000
_ADDR = "_rowaddr"


def held_rows(view: TableView, gen: GenerationSource) -> pa.Table | None:
    """The whole rows (with ``_rowaddr``) of a small generation, read once and kept (``None``: over budget)."""
    cache = view.cache
    with cache.lock:
        hit = cache.generation_rows.get(gen.uri)
        used = sum(t.nbytes for t in cache.generation_rows.values()) if hit is None else 0
    if hit is not None:
        return hit
    try:
        rows = sum(f.count_rows() for f in gen.dataset.get_fragments())
        if rows > _HELD_MAX_ROWS or used >= LOOKUP_ROWS_BUDGET:
            return None
        table = gen.dataset.to_table(with_row_address=True)
    except (OSError, ValueError, RuntimeError) as err:
        raise generation_failed(view, gen, err) from err
    if used + table.nbytes > LOOKUP_ROWS_BUDGET:
        return None
    with cache.lock:
        cache.generation_rows[gen.uri] = table
    return cast("pa.Table", table)


def generation_failed(view: TableView, gen: GenerationSource, err: BaseException) -> MemWalError:
    """The error for a failed read of generation ``gen`` by a lookup: the table removed since the
    snapshot opened (its base no longer opens), else the generation merged and collected since."""
    base = view.snapshot.base
    if says_missing(err) and base is not None:
        try:
            _ = base.latest_version
        except (OSError, ValueError, RuntimeError):
            return base_read_error(base, f"generation {gen.generation} of region {gen.region_id}", err)
    return generation_read_error(gen, err)


def take_held(held: pa.Table, addrs: np.ndarray) -> pa.Table | None:
    """The rows of ``held`` at row addresses ``addrs`` (``None``: an address is missing)."""
    pos = _positions(np.asarray(held.column(_ADDR).to_numpy()), addrs)
    return None if pos is None else held.take(pa.array(pos))


def _positions(have: np.ndarray, addrs: np.ndarray) -> np.ndarray | None:
    """Where sorted ``have`` holds each of ``addrs`` (``None``: one is missing)."""
    if not have.size:
        return None
    pos = np.minimum(np.searchsorted(have, addrs), have.size - 1)
    return pos if np.array_equal(have[pos], addrs) else None


@dataclass(frozen=True)
class RegionRows:
    """A region's held generations end to end: generation ``uri`` is rows ``starts[uri]`` on."""

    uris: tuple[str, ...]
    table: pa.Table = field(repr=False)
    starts: dict[str, int] = field(repr=False)
    addrs: dict[str, np.ndarray] = field(repr=False)

    def positions(self, uri: str, addrs: np.ndarray) -> np.ndarray | None:
        """Rows of :attr:`table` holding generation ``uri``'s row addresses ``addrs`` (``None``: not held)."""
        have = self.addrs.get(uri)
        pos = None if have is None else _positions(have, addrs)
        return None if pos is None else pos + self.starts[uri]


def region_rows(view: TableView, region: RegionSnapshot, touched: Sequence[GenerationSource]) -> RegionRows | None:
    """The held generations of ``region`` as one table, ``touched`` ones read first (``None``: none held)."""
    for gen in touched:
        held_rows(view, gen)
    cache = view.cache
    with cache.lock:
        held = {g.uri: cache.generation_rows[g.uri] for g in region.generations if g.uri in cache.generation_rows}
        hit = cache.region_rows.get(region.region_id)
    uris = tuple(held)
    if isinstance(hit, RegionRows) and hit.uris == uris:
        return hit
    if not uris:
        return None
    try:
        table = pa.concat_tables(list(held.values())).combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None  # generations written with different schemas: taken one by one
    sizes = np.array([held[u].num_rows for u in uris], dtype=np.int64)
    starts = dict(zip(uris, (np.cumsum(sizes) - sizes).tolist(), strict=True))
    views = {u: table.slice(starts[u], held[u].num_rows) for u in uris}
    found = RegionRows(uris, table, starts, {u: np.asarray(v.column(_ADDR).to_numpy()) for u, v in views.items()})
    with cache.lock:
        for u, v in views.items():
            if u in cache.generation_rows:
                cache.generation_rows[u] = v  # one copy of the rows: the matrix
        cache.region_rows[region.region_id] = found
    return found
