"""Base fragments read by one Lance scan: through a base scalar index, or small ones first touched.

A scan of one base fragment through an index costs Lance ~1 ms of planning and index
search whatever it returns: a point query on a base of 24 fragments paid that 24
times (pylance, on the base alone, once). Likewise a first filtered read of a small base
fragment (merges leave one per region and merge) costs ~4 ms of opening its file and
planning, whatever its size. :class:`IndexedBaseFragment` is one partition holding base
fragments; the ones Lance reads for this query (the index serves the filter; or, for a
group of small fragments, the query is the first to touch them) are read by one Lance
scan restricted to them, keeping the rows whose key has no newer version (the test each
fragment's mask is made of). Fragments whose columns are decoded in memory already and
filters Lance rejects go fragment by fragment, as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import says_missing
from memwal_query.planner.lance_filter import for_lance
from memwal_query.planner.nan_order import as_given
from memwal_query.scan.arrays import chain_first
from memwal_query.scan.filters import filter_columns, scan_columns
from memwal_query.scan.fragment import CompositeFragment, ScanContext, SourceFragment, batch_rows
from memwal_query.scan.group import SMALL_SOURCE_ROWS
from memwal_query.scan.lance_fragment import LanceFragment, read_error

__all__ = ["IndexedBaseFragment", "join_indexed_base"]


class IndexedBaseFragment(CompositeFragment[LanceFragment]):
    """Base fragments as one partition, read by one Lance scan where Lance reads them anyway.

    ``first_touch``: small fragments grouped for a filtered query; those this query is the
    first to read go through the shared Lance scan (else: those a base scalar index serves).
    """

    def __init__(self, owner: ScanContext, parts: list[LanceFragment], *, first_touch: bool = False) -> None:
        super().__init__(owner, parts)
        self.first_touch = first_touch

    def __repr__(self) -> str:
        how = "small, first read together" if self.first_touch else "searched through an index"
        return f"<memwal {len(self.parts)} base fragments {how}>"

    def batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        owner = self.context
        read = [c for c in cols if c not in owner.hidden]
        names = scan_columns(read, filt, owner.data_schema.names)
        served = [
            p
            for p in self.parts
            if not owner.with_hidden
            and (p.index_serves(filt, names) or (self.first_touch and p.first_touch(names, mark=False)))
        ]
        if len(served) >= 2 and self.first_touch:
            for p in served:
                p.first_touch(names)  # read now: a later scan decodes it into the cache
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
                # Lance orders NaN as DataFusion does itself; a plain IN is an index lookup
                filter=for_lance(as_given(filt), first_part.dataset.schema),
                fragments=[p.fragment for p in served],
                batch_size=batch_rows([p.fragment for p in served], batch_size),
            ).to_batches()
            first = next(it, None)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            if says_missing(err):
                raise read_error(first_part, err) from err
            # e.g. a filter Lance rejects: each fragment filters on its own (in memory if need be)
            for p in served:
                yield from p.batches(cols, filt, out, batch_size)
            return
        if first is None:
            return
        for b in first_part.guard(chain_first(first, it)):
            if mask is not None and not mask.trivial:
                b = mask.live_rows(b)
            res = self._finish(b, cols, 0, None, None, out)
            if res is not None:
                yield res


def join_indexed_base(
    frags: list[SourceFragment], filt: pc.Expression | None, owner: ScanContext
) -> list[SourceFragment]:
    """``frags`` with the base fragments as one :class:`IndexedBaseFragment` when ``filt`` uses a
    base column with a scalar index, else with the small base fragments as one (several of
    them; otherwise unchanged)."""
    if filt is None or owner.with_hidden:
        return frags
    base = [f for f in frags if isinstance(f, LanceFragment) and f.gen == 0]
    used = filter_columns(filt, owner.data_schema.names)
    if owner.indexed and used and any(c in owner.indexed for c in used):
        if len(base) >= 2 and all(f.index_serves(filt, sorted(used)) for f in base):
            rest = [f for f in frags if not (isinstance(f, LanceFragment) and f.gen == 0)]
            return [IndexedBaseFragment(owner, base), *rest]
        return frags  # e.g. the filter's columns are decoded in memory: filtered there, in parallel
    small = [f for f in base if f.fragment.physical_rows <= SMALL_SOURCE_ROWS]
    if len(small) < 2 or not isinstance(filt, pc.Expression) or used == frozenset():  # (a constant filter)
        return frags
    rest = [f for f in frags if all(f is not s for s in small)]
    return [IndexedBaseFragment(owner, small, first_touch=True), *rest]
