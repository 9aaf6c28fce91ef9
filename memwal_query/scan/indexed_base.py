"""Base fragments read by one Lance scan when a base scalar index serves the filter.

A scan of one base fragment through an index costs Lance ~1 ms of planning and index
search whatever it returns: a point query on a base of 24 fragments paid that 24
times (pylance, on the base alone, once). :class:`IndexedBaseFragment` is one partition
holding the base fragments; when the index serves the query's filter it asks Lance once,
restricted to those fragments, and keeps the rows whose key has no newer version (the
test each fragment's mask is made of). Fragments whose columns are decoded in memory
already (the index does not serve them then) and filters Lance rejects go fragment by
fragment, as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.scan.arrays import chain_first, is_gone
from memwal_query.scan.filters import filter_columns, scan_columns
from memwal_query.scan.fragment import HIDDEN_COLUMNS, SCAN_BATCH_ROWS, ScanContext, SourceFragment
from memwal_query.scan.lance_fragment import LanceFragment

__all__ = ["IndexedBaseFragment", "join_indexed_base"]


class IndexedBaseFragment(SourceFragment):
    """The base fragments as one partition for a filter a base scalar index serves."""

    def __init__(self, owner: ScanContext, parts: list[LanceFragment]) -> None:
        super().__init__(owner)
        self.parts = parts

    def __repr__(self) -> str:
        return f"<memwal {len(self.parts)} base fragments searched through an index>"

    def live_rows(self) -> int:
        return sum(p.live_rows() for p in self.parts)

    def rows_hint(self) -> int:
        return sum(p.rows_hint() for p in self.parts)

    def batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        owner = self.context
        read = [c for c in cols if c not in HIDDEN_COLUMNS]
        names = scan_columns(read, filt, owner.data_schema.names)
        served = [p for p in self.parts if not owner.with_hidden and p.index_serves(filt, names)]
        for p in self.parts:
            if p not in served:
                yield from p.batches(cols, filt, out, batch_size)
        if len(served) < 2:
            for p in served:
                yield from p.batches(cols, filt, out, batch_size)
            return
        first_part = served[0]
        mask = first_part.mask
        keys = [] if mask is None or mask.trivial else [k for k in mask.primary_key if k not in read]
        try:
            it = first_part.dataset.scanner(
                columns=[*read, *keys],
                filter=filt,
                fragments=[p.fragment for p in served],
                batch_size=max(batch_size or 0, SCAN_BATCH_ROWS),
            ).to_batches()
            first = next(it, None)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            if is_gone(err):
                raise
            # e.g. a filter Lance rejects: each fragment filters on its own (in memory if need be)
            for p in served:
                yield from p.batches(cols, filt, out, batch_size)
            return
        if first is None:
            return
        for b in first_part.guard(chain_first(first, it)):
            if mask is not None and not mask.trivial:
                b = b.filter(pa.array(mask.live(pa.Table.from_batches([b]).select(mask.primary_key))))
            res = self._finish(b, cols, 0, None, None, out)
            if res is not None:
                yield res


def join_indexed_base(
    frags: list[SourceFragment], filt: pc.Expression | None, owner: ScanContext
) -> list[SourceFragment]:
    """``frags`` with the base fragments as one :class:`IndexedBaseFragment` when ``filt`` uses a
    base column with a scalar index (several base fragments; otherwise unchanged)."""
    if filt is None or not owner.indexed or owner.with_hidden:
        return frags
    used = filter_columns(filt, owner.data_schema.names)
    if not used or not any(c in owner.indexed for c in used):
        return frags
    base = [f for f in frags if isinstance(f, LanceFragment) and f.gen == 0]
    if len(base) < 2 or not all(f.index_serves(filt, sorted(used)) for f in base):
        return frags  # e.g. the filter's columns are decoded in memory: filtered there, in parallel
    rest = [f for f in frags if not (isinstance(f, LanceFragment) and f.gen == 0)]
    return [IndexedBaseFragment(owner, base), *rest]
