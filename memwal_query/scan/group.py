"""Small sources (generations, MemTables) packed into shared partitions.

Each partition costs DataFusion a Python round trip; dozens of small generations
would cost more in partitions than in rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.format.nested import as_schema
from memwal_query.scan.arrays import one_chunk
from memwal_query.scan.filters import scan_columns
from memwal_query.scan.fragment import SCAN_BATCH_ROWS, CompositeFragment, MemoryFragment, ScanContext, SourceFragment
from memwal_query.scan.lance_eval import memory_filtered
from memwal_query.scan.lance_fragment import LanceFragment

__all__ = ["GroupFragment", "pack_small", "SMALL_SOURCE_ROWS", "GROUP_ROWS"]

SMALL_SOURCE_ROWS = 200_000
GROUP_ROWS = 1_000_000


class GroupFragment(CompositeFragment[SourceFragment]):
    """Several small sources (generations, MemTables) scanned as one partition.

    Each partition costs DataFusion a Python round trip; dozens of small
    generations would cost more in partitions than in rows.
    """

    in_memory = True

    def __init__(
        self, owner: ScanContext, parts: list[SourceFragment], memo: dict[object, pa.Table] | None = None
    ) -> None:
        super().__init__(owner, parts)
        self._memo = memo

    def __repr__(self) -> str:
        return f"<memwal group of {len(self.parts)} small sources>"

    def _holds_negative_nan(self, name: str) -> bool:
        """Whether a part's column ``name`` holds a NaN with its sign bit set (as each knows it)."""
        for p in self.parts:
            if isinstance(p, MemoryFragment) and p.negative_nans(name):
                return True
            if isinstance(p, LanceFragment) and p.holds_negative_nan(name):
                return True
        return False

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_memo": None}

    def _combined(self, names: list[str], decode: bool = True) -> pa.Table | None:
        """Surviving rows of every part (columns ``names``) as one table, built once per
        snapshot from cached columns: one filter per query instead of one per source.

        ``decode=False`` (an unfiltered scan): only from columns cached already."""
        if self._memo is None or self.context.with_hidden or not names:
            return None  # (no columns: a zero-column table would lose its row count)
        key = (tuple(id(p) for p in self.parts), tuple(names))
        got = self._memo.get(key)
        if got is not None:
            return got
        target = pa.schema([self.context.data_schema.field(n) for n in names])
        tables = []
        for p in self.parts:
            if isinstance(p, MemoryFragment):
                t: pa.Table | None = p.table.select(names)
            elif isinstance(p, LanceFragment):
                t = p.survivors(names, decode)
                t = None if t is None else t.select(names)
            else:
                t = None
            if t is None:
                return None
            try:
                tables.append(as_schema(t, target))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return None
        combined = pa.concat_tables(tables) if tables else target.empty_table()
        combined = pa.table({c: one_chunk(combined.column(c)) for c in combined.column_names})
        if len(self._memo) >= 64:  # distinct pruning patterns: keep the memo small
            self._memo.clear()
        self._memo[key] = combined
        return combined

    def batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        rows = self._combined(scan_columns(cols, filt, self.context.data_schema.names), decode=filt is not None)
        if rows is not None and filt is not None:
            try:
                rows = memory_filtered(rows, filt, self._holds_negative_nan)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
                rows = None  # let each source evaluate it
        if rows is not None:
            for b in rows.to_batches(max_chunksize=max(batch_size or 0, SCAN_BATCH_ROWS)):
                res = self._finish(b, cols, 0, None, None, out)
                if res is not None:
                    yield res
            return
        yield from super().batches(cols, filt, out, batch_size)


def pack_small(frags: list[SourceFragment], memo: dict[object, pa.Table] | None = None) -> list[SourceFragment]:
    """Base fragments stay one partition each; small sources share partitions."""
    out: list[SourceFragment] = []
    group: list[SourceFragment] = []
    rows = 0
    for f in frags:
        if f.region is None:  # a base fragment (its size is not needed)
            out.append(f)
            continue
        n = f.rows_hint()
        if n > SMALL_SOURCE_ROWS:
            out.append(f)
            continue
        if group and rows + n > GROUP_ROWS:
            out.append(group[0] if len(group) == 1 else GroupFragment(group[0].context, group, memo))
            group, rows = [], 0
        group.append(f)
        rows += n
    if group:
        out.append(group[0] if len(group) == 1 else GroupFragment(group[0].context, group, memo))
    return out
