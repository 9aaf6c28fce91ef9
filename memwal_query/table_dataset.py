"""An in-memory Arrow table as a dataset DataFusion can scan, even when it has no rows.

SQL table functions hand DataFusion their result as a ``pyarrow.dataset.Dataset``.
``pyarrow.dataset.dataset(table)`` of an empty table has no fragment (nor of any table,
for a filter DataFusion folded to NULL), and DataFusion rejects a scan of zero partitions
under a sort (``SanityCheckPlan ... SinglePartition``): ``SELECT * FROM memwal_wal('t')
ORDER BY position`` would fail on a table with no WAL tail. :func:`table_dataset` always
has one fragment, and filters the way DataFusion does (NaN above every number and equal to
itself, as the merged table's scans: :mod:`memwal_query.planner.nan_order`), not as
pyarrow's comparisons do.

Example:
    >>> import datafusion, pyarrow as pa
    >>> empty = pa.schema([("a", pa.int64())]).empty_table()
    >>> ctx = datafusion.SessionContext()
    >>> ctx.register_udtf(datafusion.udtf(lambda: datafusion.Table(table_dataset(empty)), "nothing"))
    >>> ctx.sql("SELECT a FROM nothing() ORDER BY a").to_pydict()
    {'a': []}
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from memwal_query.planner.nan_order import nan_ordered
from memwal_query.scan.arrays import constant_filter
from memwal_query.scan.lance_eval import memory_filtered

__all__ = ["table_dataset"]


@dataclass(frozen=True)
class _Scan:
    projected_schema: pa.Schema
    batches: tuple[pa.RecordBatch, ...]

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        return iter(self.batches)

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches), schema=self.projected_schema)


def _scan(table: pa.Table, columns: Sequence[str] | None, filt: pc.Expression | None) -> _Scan:
    const = constant_filter(filt)  # DataFusion may fold the WHERE clause to a constant
    if const is False:
        table = table.slice(0, 0)
    elif const is None and filt is not None:
        table = memory_filtered(table, nan_ordered(filt, table.schema))  # DataFusion's order of NaN
    names = list(table.schema.names) if columns is None else list(columns)
    out = pa.schema([table.schema.field(c) for c in names])
    if not names:  # count(*): batches with row counts and no columns
        return _Scan(out, (pa.record_batch({"_": pa.nulls(table.num_rows)}).select([]),))
    return _Scan(out, tuple(table.select(names).combine_chunks().to_batches()))


class _Fragment:
    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def scanner(
        self,
        schema: pa.Schema | None = None,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **_: object,
    ) -> _Scan:
        return _scan(self._table, columns, filter)


class _TableDataset(pds.Dataset):  # type: ignore[misc]
    """One fragment over an in-memory table (DataFusion's duck-typed dataset protocol)."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    @property
    def schema(self) -> pa.Schema:
        return self._table.schema

    def scanner(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None, **_: object) -> _Scan:
        return _scan(self._table, columns, filter)

    def get_fragments(self, filter: pc.Expression | None = None) -> list[_Fragment]:
        return [_Fragment(self._table)]


def table_dataset(table: pa.Table) -> pds.Dataset:
    """``table`` as a dataset for ``datafusion.Table``: one fragment, also when empty."""
    return _TableDataset(table)
