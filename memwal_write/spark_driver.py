"""The driver write path: rows collected with ``toArrow``, deduped in Arrow, every region
written from the driver (regions in parallel threads, one pylance writer each)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from memwal_query.conform import conform
from memwal_write.arrow_writer import RoutedWriter
from memwal_write.dedupe import Dedup
from memwal_write.spark_tasks import fencing_explained, with_task_columns

__all__ = ["write_on_driver"]


def write_on_driver(
    table: pa.Table,
    probe: RoutedWriter,
    *,
    mode: str,
    columns: tuple[str, ...],
    order_by: str | None,
    storage_options: Mapping[str, str] | None,
) -> pa.Table:
    """``via="driver"``: dedupe the collected rows in Arrow, write every region from
    this process (regions in parallel threads, one pylance writer each)."""
    w = RoutedWriter.open(
        probe.uri,
        storage_options=storage_options,
        region_id=probe.region_id,
        max_rows_per_put=probe.max_rows_per_put,
        max_workers=None,
        **probe.writer_options,
    )
    pk = probe.primary_key
    # Sort and dedupe the keys only (numpy / Arrow sorts release the GIL) while the
    # region values of all rows are computed in a second thread; the writer then orders
    # the surviving rows by region (a stable sort of small values) and copies each
    # region's rows once, in its own thread.
    dedup = Dedup(pk, order_by, mode == "put", probe.uri)
    typed_keys = conform(table.select(list(pk)), probe.dataset.schema, what=f"{mode} on {probe.uri}", keys=pk)
    with ThreadPoolExecutor(1) as pool:
        values_future = pool.submit(w.region_values, typed_keys)
        newest = dedup.newest_order(table)
        values = values_future.result()
    routed = None if values is None else values.take(newest)
    rows = table.select(list(columns))
    with fencing_explained(probe.uri), w:
        if mode == "put":
            w.put(rows, _region_values=routed, _rows=newest)
        else:
            w.delete(rows, _region_values=routed, _rows=newest)
    return with_task_columns(w.stats(), dedup.dropped, 0, 0)
