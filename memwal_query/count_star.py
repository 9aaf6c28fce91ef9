"""``SELECT count(*) FROM t`` answered from the merged table's row count, not by a scan.

DataFusion answers a ``count(*)`` of a whole table from the table's statistics when the
table gives an exact row count (its ``AggregateStatistics`` rule: a Parquet listing, for
one). The merged table reaches DataFusion as a pyarrow dataset, which gives none: the
query scans every fragment and DataFusion counts a literal ``1`` over every row (at 20M
rows, 160 MB of ones written to be summed: ~8 ms on two cores). :func:`counts_whole_table`
recognizes the plan that rule would answer, and :func:`count_frame` gives the same result
as a one-row plan of the count :meth:`~memwal_query.scan.dataset.MergedDataset.count_rows`
takes from fragment metadata and drop lists.

Recognized: one aggregate, no ``GROUP BY``; each aggregate ``count(*)`` or ``count(1)``
(no ``DISTINCT``, ``FILTER`` or ``ORDER BY``); directly over the table registered as
``name`` with no filter and no limit; each output column that count, under any name.
Anything else (a ``WHERE``, ``count(col)``, ``count(NULL)``, ``count(*) + 1``, a join, a
``LIMIT`` above) is planned and run by DataFusion as written.

Example:
    >>> import datafusion, pyarrow as pa, pyarrow.dataset as ds
    >>> ctx = datafusion.SessionContext()
    >>> ctx.register_dataset("t", ds.dataset(pa.table({"a": [1, None, 3]})))
    >>> [counts_whole_table(ctx.sql(q), "t") for q in ("SELECT count(*) AS n FROM t", "SELECT count(a) FROM t")]
    [True, False]
    >>> count_frame(ctx, ctx.sql("SELECT count(*) AS n FROM t"), 3).to_pydict()
    {'n': [3]}
"""

from __future__ import annotations

from collections.abc import Callable

import datafusion
import pyarrow as pa
from datafusion import lit

from memwal_query.frame import MemWalDataFrame

__all__ = ["count_frame", "counted", "counts_whole_table"]

_COUNT = "count(Int64(1))"
"""How DataFusion writes ``count(*)`` and ``count(1)`` in a plan (an aggregate's output column)."""


def _unaliased(e: datafusion.Expr) -> datafusion.Expr:
    while e.variant_name() == "Alias":
        e = e.to_variant().expr()
    return e


def counts_whole_table(df: datafusion.DataFrame, name: str) -> bool:
    """Whether ``df`` is only ``count(*)`` of the whole table ``name`` (see the module's doc)."""
    try:
        top = df.logical_plan().to_variant()
        if type(top).__name__ != "Projection":
            return False
        for e in top.projections():
            col = _unaliased(e)
            if col.variant_name() != "Column" or col.to_variant().name() != _COUNT:
                return False
        (agg_plan,) = top.input()
        agg = agg_plan.to_variant()
        if type(agg).__name__ != "Aggregate" or agg.group_by_exprs():
            return False
        counts = agg.aggregate_exprs()
        if not counts or any(e.variant_name() != "AggregateFunction" or str(e) != f"Expr({_COUNT})" for e in counts):
            return False
        (scan_plan,) = agg.input()
        scan = scan_plan.to_variant()
        return (
            type(scan).__name__ == "TableScan"
            and scan.table_name() == name
            and not scan.filters()
            and scan.fetch() is None
        )
    except Exception:  # noqa: BLE001 - a plan node Python cannot inspect: DataFusion runs it as written
        return False


def count_frame(ctx: datafusion.SessionContext, df: datafusion.DataFrame, rows: int) -> datafusion.DataFrame:
    """A one-row DataFrame with ``df``'s columns (each a count), every one ``rows``."""
    value = pa.scalar(rows, pa.int64())
    return ctx.sql("SELECT 1").select(*[lit(value).alias(f.name) for f in df.schema()])


def counted(
    ctx: datafusion.SessionContext, frame: MemWalDataFrame, name: str, query: str, rows: Callable[[], int]
) -> MemWalDataFrame:
    """``frame`` (``query`` over table ``name``) answered from ``rows()`` when it only counts the
    whole table; else ``frame`` itself, also when ``rows()`` fails (a damaged table then fails
    when the query runs, with the error any scan of it raises)."""
    if "count" not in query.lower() or not counts_whole_table(frame, name):
        return frame
    try:
        n = rows()
    except Exception:  # noqa: BLE001 - raised as the query's own error when it runs
        return frame
    return MemWalDataFrame(count_frame(ctx, frame, n).df)
