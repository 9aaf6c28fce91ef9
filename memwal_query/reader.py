"""Streaming the merged rows out as Arrow: for DuckDB, Polars, pandas, any Arrow consumer.

:func:`to_reader` gives a ``pyarrow.RecordBatchReader``: one pass, batch by batch, in
bounded memory (:func:`memwal_query.scan.stream.stream_batches`: one Lance scanner over
the base, masked by key; nothing is added to the column cache; a batch holds up to 65,536
rows and about 64 MiB of data files: rows that compress well decode to more). A pyarrow reader is
one-shot: once consumed it yields nothing more, so call :func:`to_reader` again (cheap:
the snapshot is not re-read) or use :class:`MergedStream`, which starts a new pass every
time a consumer asks (the Arrow PyCapsule stream protocol, ``__arrow_c_stream__``).

A filter is a ``pyarrow.compute`` expression (pushed into every source; regions it
cannot match are pruned) or a SQL boolean expression (run through DataFusion over the
same dataset: pushed down and pruned the same way).

Example:
    >>> import duckdb, tempfile, memwal_query as mq
    >>> from memwal_query.demo import write_demo_table
    >>> uri = write_demo_table(tempfile.mkdtemp() + "/t", base_rows=500, update_rows=100, memtable_rows=50, seed=3)
    >>> events = mq.open_table(uri).to_stream(columns=["id", "amount"], filter="amount > 10")
    >>> n = events.read_all().num_rows
    >>> [duckdb.sql("SELECT count(*) FROM events").fetchall()[0][0] == n for _ in range(2)]  # read twice
    [True, True]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias

import datafusion
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.engine_errors import engine_error, raised_error
from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.forked import check_engine
from memwal_query.planner.filter_refusal import check_filter
from memwal_query.scan.dataset import MergedDataset
from memwal_query.scan.filters import applying
from memwal_query.scan.fragment import column_list
from memwal_query.scan.stream import stream_batches
from memwal_query.view.table_view import TableView

__all__ = ["MergedStream", "stream_of", "to_reader"]

Filter: TypeAlias = str | pc.Expression | None


def to_reader(view: TableView, columns: Sequence[str] | None = None, filter: Filter = None) -> pa.RecordBatchReader:
    """The merged rows of ``view`` as a one-shot ``pyarrow.RecordBatchReader``.

    Args:
        view: The snapshot to read.
        columns: Columns to return, in this order (``None``: all).
        filter: A ``pyarrow.compute.Expression`` or a SQL boolean expression.

    Raises:
        InvalidArgumentError: Unknown columns, an invalid SQL filter or filter type.
    """
    dataset = view.dataset(cache=False)
    out = dataset.projected(columns)
    if isinstance(filter, str):
        return pa.RecordBatchReader.from_batches(out, _sql_batches(dataset, out, filter))
    check_filter(filter, view.uri, view.snapshot.schema)
    batches = stream_batches(dataset, columns, filter)
    return pa.RecordBatchReader.from_batches(out, batches if filter is None else applying(batches, filter, view.uri))


def _sql_batches(dataset: MergedDataset, out: pa.Schema, predicate: str) -> Iterator[pa.RecordBatch]:
    """Rows matching a SQL predicate, through DataFusion (planned now: a bad predicate raises here).

    The predicate is parsed as one expression: text after it (``ORDER BY``, ``UNION``, ``;``)
    is an error, never a part of the query."""
    check_engine(dataset.context.uri)
    ctx = datafusion.SessionContext()
    ctx.register_dataset("t", dataset)
    names = ['"' + c.replace('"', '""') + '"' for c in out.names] or ["1 AS _one"]
    try:
        df = ctx.table("t")
        stream = df.filter(df.parse_sql_expr(predicate)).select_exprs(*names).execute_stream()
    except MemWalError:
        raise
    except Exception as err:  # DataFusion's parsing or planning error: the predicate
        ours = raised_error(err)  # or one of ours planning the scan (a file gone since the snapshot)
        if ours is not None:
            raise ours from err
        msg = f"invalid filter {predicate!r} for {dataset.context.uri}: {engine_error(err)}"
        raise InvalidArgumentError(msg) from err
    return _converted(stream, out)


def _converted(stream: object, out: pa.Schema) -> Iterator[pa.RecordBatch]:
    try:
        for b in stream:  # type: ignore[attr-defined]
            batch = b.to_pyarrow()
            if not out.names:
                yield pa.record_batch({"_": pa.nulls(batch.num_rows)}).select([])
            elif batch.num_rows:
                arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(batch.columns, out, strict=True)]
                yield pa.RecordBatch.from_arrays(arrays, schema=out)
    except GeneratorExit:  # closed unfinished, maybe at exit when module globals are gone
        raise
    except MemWalError:
        raise
    except Exception as err:  # raised inside DataFusion: ours come back as they were
        raise engine_error(err) from err


class MergedStream:
    """The merged rows as an Arrow stream that can be read any number of times.

    Each read (``__arrow_c_stream__``, :meth:`reader`, :meth:`read_all`, iteration) is
    a new one-shot pass over the same snapshot, so DuckDB can query it twice and
    Polars / ``pyarrow.table()`` can import it directly.
    """

    def __init__(self, view: TableView, columns: Sequence[str] | None = None, filter: Filter = None) -> None:
        self._view = view
        self._columns = column_list(columns, view.uri)
        self._filter = filter
        self.schema: pa.Schema = to_reader(view, columns, filter).schema  # validates now

    def __repr__(self) -> str:
        return f"<memwal MergedStream {self._view.uri} columns={self.schema.names}>"

    def reader(self) -> pa.RecordBatchReader:
        """A new one-shot reader (a new pass)."""
        return to_reader(self._view, self._columns, self._filter)

    def read_all(self) -> pa.Table:
        """Every row of a new pass as one table."""
        return self.reader().read_all()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self.reader())

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        """The Arrow PyCapsule stream protocol: a new pass per call."""
        return self.reader().__arrow_c_stream__(requested_schema)


def stream_of(view: TableView, columns: Sequence[str] | None = None, filter: Filter = None) -> MergedStream:
    """A re-readable :class:`MergedStream` of the merged rows (arguments as :func:`to_reader`)."""
    return MergedStream(view, columns, filter)
