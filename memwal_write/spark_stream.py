"""Structured Streaming with the ``memwal`` format: a sink and a change-feed source.

**Sink** (``writeStream.format("memwal")``): each micro-batch's rows reach the driver
(the tasks' commit messages) and are applied there in one go (:func:`apply_rows`:
newest row per key by ``order_by``, upserts, and deletes for rows whose ``_change`` is
``"delete"`` or all rows with ``operation=delete``). After the rows are written the
batch id is recorded in the table directory (``_memwal_spark/<sink_id>/``, read it with
:func:`memwal_write.committed_batches`). The guarantee: after a failure and a restart
from the same checkpoint, the table holds exactly what a failure-free run would. A batch
Spark replays that is already recorded is skipped; a batch that failed before it was
recorded (even half-written) is written again whole: upserting the same newest rows and
deleting the same keys again gives the same state. Use one ``sink_id`` per query writing
into one table (two queries sharing a ``sink_id`` would skip each other's batch ids).

**Source** (``readStream.format("memwal").option("readChangeFeed", "true")``): the
change feed (:func:`memwal_query.changes.changes`) as a stream; an offset is
``{"token": <change token>}``. The first batch starts at ``startingToken``; without one, the
first batch is empty and ends at the table's state when it is planned: only later changes
are delivered. (Spark records end offsets only and asks for the start offset again when it
runs, or re-runs, the first batch: a start token taken then, "now" again, skipped the
changes written in between.) Each batch
holds the net change per key from its start token to its end token (``_change`` is
``upsert`` with the newest row, or ``delete``). A batch is computed from the very
snapshot whose token ended it when the source still holds it; a batch replayed after a
restart (the same start) is computed from the table as it is then, which can only bring
newer rows of the same keys (and keys written since, which the next batch repeats).

Example:
    >>> StagedRows(None).rows is None
    True
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from memwal_query.errors import ChangesUnavailableError, InvalidArgumentError, MemWalError, SchemaChangedError
from memwal_query.format.storage import Storage
from memwal_query.table import Table, open_table
from memwal_write.spark_drift import drift
from memwal_write.spark_sink import (
    SinkOptions,
    apply_rows,
    batch_record,
    check_same_query,
    from_ipc,
    record_batch,
    storage_options_of,
    to_ipc,
)

__all__ = ["StagedRows", "MemwalStreamWriter", "MemwalStreamReader"]

log = logging.getLogger("memwal_write")

#: Change rows per partition of a stream batch.
ROWS_PER_PARTITION = 100_000


@dataclass
class StagedRows(WriterCommitMessage):
    """A task's rows on their way to the driver (Arrow IPC bytes, ``None``: no rows)."""

    rows: bytes | None


class MemwalStreamWriter(DataSourceStreamArrowWriter):
    """The streaming sink (see the module docs)."""

    def __init__(self, options: Any) -> None:
        self.opts = SinkOptions.from_options(options)
        if not options.get("checkpointLocation") and not options.get("sink_id"):
            # A checkpoint set for the whole session (spark.sql.streaming.checkpointLocation) is
            # not in the options: every such query would share the "default" record and skip
            # the batch ids another one applied (their rows lost).
            msg = (
                f"stream into {self.opts.uri}: give the writer .option('checkpointLocation', ...) or its own "
                ".option('sink_id', ...): without either the sink cannot tell this query's replayed batches "
                "from another query's"
            )
            raise InvalidArgumentError(msg)
        # testing hook: fail once in this batch (half of its upserts written), marker file
        self.fail_batch = options.get("_fail_batch")
        self.fail_marker = options.get("_fail_marker")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return StagedRows(to_ipc(iterator))

    def _fail_now(self, batch_id: int) -> bool:
        if self.fail_batch is None or int(self.fail_batch) != batch_id or not self.fail_marker:
            return False
        try:
            with open(self.fail_marker, "x"):
                return True
        except FileExistsError:
            return False

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        storage = Storage.open(self.opts.uri, self.opts.storage_options)
        record = batch_record(storage, self.opts.sink_id, batchId)
        if record is not None:
            check_same_query(record, self.opts, batchId)
            log.info("memwal sink %s: batch %d already applied to %s", self.opts.sink_id, batchId, self.opts.uri)
            return
        rows = from_ipc(m.rows for m in messages if isinstance(m, StagedRows))
        n = 0 if rows is None else rows.num_rows
        if rows is not None:
            apply_rows(rows, self.opts, fail_after_half=self._fail_now(batchId))
        record_batch(storage, self.opts, batchId, n)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Nothing is written before :meth:`commit`: nothing to undo."""


#: The start offset of a stream given no ``startingToken``: "the end of the first batch".
_FIRST_END = ""


class MemwalStreamReader(DataSourceStreamReader):
    """The change feed as a stream (see the module docs)."""

    def __init__(self, options: Any, schema: StructType, planned: StructType | None = None) -> None:
        self.options = options  # Spark's CaseInsensitiveDict (dict() would lowercase the keys)
        self.uri = str(options.get("path"))
        self.planned = planned  # the table's columns when the stream was planned (None: a user's schema)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")  # as Spark's own data source reader
        self._latest: Table | None = None

    def _open(self) -> Table:
        consistency = str(self.options.get("consistency", "strong")).lower()
        if consistency not in ("strong", "eventual"):
            msg = f"read of {self.uri}: option consistency must be 'strong' or 'eventual', got {consistency!r}"
            raise InvalidArgumentError(msg)
        so = storage_options_of(self.options)
        return open_table(self.uri, storage_options=so, consistency=consistency)  # type: ignore[arg-type]

    def initialOffset(self) -> dict[str, str]:  # noqa: N802 - Spark's name
        start = self.options.get("startingToken")
        return {"token": str(start) if start else _FIRST_END}

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:  # noqa: N802
        self._latest = self._open() if self._latest is None else self._latest.refresh()
        return {"token": self._latest.change_token}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        if start["token"] == _FIRST_END:  # the first batch without startingToken: it starts the feed
            return [InputPartition(pickle.dumps(None))]
        table = self._latest
        if table is None or table.change_token != end["token"]:
            table = self._open()  # a replayed batch after a restart: the table as it is now
        try:
            got = table.changes(start["token"])
        except (ChangesUnavailableError, InvalidArgumentError):
            raise
        except MemWalError:
            # a file of the planned snapshot was merged and garbage-collected since: the table
            # as it is now (as for a replayed batch: newer rows of the keys, some again next batch)
            self._latest = table = self._open()
            got = table.changes(start["token"])
        changed = None if self.planned is None else drift(self.planned, got.schema, whole=True)
        if changed is not None:  # a cast by name would deliver NULLs and the checkpoint move on
            msg = (
                f"change feed of {self.uri}: the table's columns changed since the stream started ({changed}); "
                "restart the query "
                "(from its checkpoint) to read the table's columns as they are now"
            )
            raise SchemaChangedError(msg)
        got = pa.Table.from_batches(got.to_batches(), schema=got.schema).cast(self.arrow_schema)
        step = ROWS_PER_PARTITION
        parts = [to_ipc(got.slice(i, step).to_batches()) for i in range(0, got.num_rows, step)]
        return [InputPartition(pickle.dumps(p)) for p in parts] or [InputPartition(pickle.dumps(None))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rows = from_ipc([pickle.loads(partition.value)])
        if rows is not None:
            yield from rows.to_batches()

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to release (tokens are values)."""
