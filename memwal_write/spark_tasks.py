"""The task write path: each Spark task dedupes its key-sorted rows and writes its regions.

A retried task attempt opens new pylance writers, which bumps the writer epoch of its
regions: the failed attempt is fenced and its WAL is replayed by the new writer before
the new attempt re-writes the same (deduplicated) rows, so no row is lost and no older
value wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from memwal_query.errors import MemWalError
from memwal_write.arrow_writer import REGION_STATS_SCHEMA, RoutedWriter
from memwal_write.dedupe import Dedup
from memwal_write.spark_routing import check_routing

__all__ = ["WRITE_STATS_SCHEMA", "WriteJob", "fencing_explained", "with_task_columns", "write_partition", "task_fn"]

WRITE_STATS_SCHEMA = pa.schema(
    [
        *REGION_STATS_SCHEMA,
        ("duplicates_dropped", pa.int64()),
        ("task_partition", pa.int32()),
        ("task_attempt", pa.int32()),
    ]
)


# -- the write task ---------------------------------------------------------------------------
@dataclass(frozen=True)
class WriteJob:
    """Everything a write task needs (picklable)."""

    uri: str
    mode: str  # "put" | "delete"
    columns: tuple[str, ...]
    key: tuple[str, ...]
    order_by: str | None
    storage_options: Mapping[str, str] | None
    region_id: str | None
    max_rows_per_put: int | None
    writer_options: Mapping[str, Any]
    check_bucket: bool
    fail_after_puts: int | None = None


@contextmanager
def fencing_explained(uri: str) -> Iterator[None]:
    """Re-raise a writer's "fenced" error (or a lost race to claim a region) with what it means
    for a write job."""
    try:
        yield
    except MemWalError as err:
        if not fenced(err):
            raise
        msg = (
            f"a region writer of {uri} was fenced: another writer claimed the region (a concurrent write job, "
            "or a task attempt still running). Rows this attempt wrote are in the WAL and are replayed by the "
            f"newer writer; write jobs sharing regions fence each other: run them one at a time. Cause: {err}"
        )
        raise MemWalError(msg) from err


def fenced(err: BaseException) -> bool:
    """Whether ``err`` says a region writer lost its region to another writer (fenced, or
    beaten to claiming it)."""
    text = str(err).lower()
    return "fenced" in text or "another writer claimed" in text


def with_task_columns(stats: pa.Table, dropped: int, partition: int, attempt: int) -> pa.Table:
    """Per-region writer statistics as :data:`WRITE_STATS_SCHEMA` (duplicates on the first row)."""
    n = stats.num_rows
    stats = stats.append_column("duplicates_dropped", pa.array([dropped if i == 0 else 0 for i in range(n)]))
    stats = stats.append_column("task_partition", pa.array([partition] * n, pa.int32()))
    stats = stats.append_column("task_attempt", pa.array([attempt] * n, pa.int32()))
    return stats.cast(WRITE_STATS_SCHEMA)


def write_partition(
    job: WriteJob, batches: Iterable[pa.RecordBatch], partition: int, attempt: int
) -> Iterator[pa.RecordBatch]:
    """Write one task's rows (sorted by partition key, key, order_by); yield its stats."""
    writer: RoutedWriter | None = None
    dedup = Dedup(job.key, job.order_by, job.mode == "put", job.uri)
    buffer: list[pa.Table] = []
    buffered = 0
    puts = 0

    def flush() -> None:
        nonlocal buffered, puts
        if not buffered or writer is None:
            return
        data = pa.concat_tables(buffer).select(list(job.columns))
        buffer.clear()
        buffered = 0
        with fencing_explained(job.uri):
            if job.mode == "put":
                writer.put(data)
            else:
                writer.delete(data)
        puts += 1
        if job.fail_after_puts is not None and attempt == 0 and puts >= job.fail_after_puts:
            msg = f"injected failure of task {partition} attempt {attempt} after {puts} put(s)"
            raise RuntimeError(msg)

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                writer = RoutedWriter.open(
                    job.uri,
                    storage_options=job.storage_options,
                    region_id=job.region_id,
                    max_rows_per_put=job.max_rows_per_put,
                    **job.writer_options,
                )
            table = pa.Table.from_batches([batch])
            if job.check_bucket:
                check_routing(writer, table)
            done = dedup.push(table)
            if done is not None and done.num_rows:
                buffer.append(done)
                buffered += done.num_rows
                if buffered >= writer.max_rows_per_put:
                    flush()
        rest = dedup.finish()
        if rest is not None and rest.num_rows:
            buffer.append(rest)
            buffered += rest.num_rows
        flush()
        if writer is None:
            return
        with fencing_explained(job.uri):
            writer.close()
        stats = writer.stats()
    except BaseException:
        if writer is not None:
            try:
                writer.close()
            except MemWalError:
                pass
        raise
    yield from with_task_columns(stats, dedup.dropped, partition, attempt).to_batches()


def task_fn(job: WriteJob) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of a write job."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        yield from write_partition(job, batches, partition, attempt)

    return run
