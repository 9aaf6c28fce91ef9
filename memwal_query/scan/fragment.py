"""The scan's partitions: what DataFusion scans, one fragment per source part.

DataFusion's Python bindings duck-type a ``pyarrow.dataset.Dataset``: per fragment
``scanner(schema, columns=, filter=, batch_size=).to_batches()``. Filters arrive as
``pyarrow.compute.Expression`` and are *Exact*: every fragment applies them.
:class:`SourceFragment` is the public fragment API (``region``, ``label``,
``live_rows()``, ``rows_hint()``, ``scanner()``) that :mod:`memwal_query.spark_read`
ships to Spark tasks; :class:`MemoryFragment` holds MemTable rows,
:class:`~memwal_query.scan.lance_fragment.LanceFragment` a Lance fragment minus its
drop list, :class:`~memwal_query.scan.group.GroupFragment` several small ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.engine_errors import recorded
from memwal_query.errors import InvalidArgumentError
from memwal_query.format.wal import GEN_COLUMN, SEQ_COLUMN
from memwal_query.planner.nan_order import nan_ordered, reads_whole
from memwal_query.scan.arrays import constant_filter, drop_mask, slice_sensitive, unsliced, zero_column_batches
from memwal_query.scan.filters import expression_filter, scan_columns
from memwal_query.scan.lance_eval import NegativeNans, lance_filtered, memory_filtered
from memwal_query.scan_gate import guarded
from memwal_query.snapshot.model import GenerationSource

__all__ = [
    "search_columns",
    "decoded_row_bytes",
    "HIDDEN_COLUMNS",
    "SCAN_BATCH_ROWS",
    "SCAN_BATCH_BYTES",
    "batch_rows",
    "hidden_fields",
    "Scan",
    "ScanContext",
    "SourceFragment",
    "MemoryFragment",
    "rebuilt_rows",
    "check_projection",
    "column_list",
]

HIDDEN_COLUMNS = ("_gen", "_rowaddr", "_region")
SCAN_BATCH_ROWS = 65536
#: Bytes of data files a batch of a Lance scan holds at most (wide rows: fewer rows a batch)
SCAN_BATCH_BYTES = 64 << 20
_MIN_BATCH_ROWS = 16


def batch_rows(fragments: Iterable[Any], asked: int | None = None) -> int:
    """Rows per batch of a Lance scan of ``fragments`` (``lance.LanceFragment``): ``asked`` or
    :data:`SCAN_BATCH_ROWS`, whichever is larger, but no more than hold about
    :data:`SCAN_BATCH_BYTES` of their data files (their on-disk bytes per row, every column),
    so a stream of wide rows that do not compress (blobs, embeddings) holds tens of MB a batch,
    not a generation at once. Rows that compress well decode to more than that: the bound is
    on disk bytes, not decoded ones.

    Example:
        >>> import lance, os, pyarrow as pa, tempfile
        >>> ds = lance.write_dataset(pa.table({"b": [os.urandom(1_000_000) for _ in range(3)]}), tempfile.mkdtemp())
        >>> batch_rows(ds.get_fragments())  # 1 MB rows: 64 MiB a batch
        67
    """
    rows = size = 0
    for f in fragments:
        rows += int(f.metadata.physical_rows or 0)
        size += sum(int(getattr(d, "file_size_bytes", 0) or 0) for d in f.metadata.files)
    want = max(asked or 0, SCAN_BATCH_ROWS)
    if not rows or not size:
        return want
    return max(_MIN_BATCH_ROWS, min(want, int(SCAN_BATCH_BYTES * rows // size)))


def hidden_fields() -> list[pa.Field]:
    """The optional debugging columns: generation (0 = base), row address, region."""
    return [
        pa.field("_gen", pa.int64(), nullable=False),
        pa.field("_rowaddr", pa.uint64(), nullable=False),
        pa.field("_region", pa.string(), nullable=True),
    ]


@dataclass
class Scan:
    """What DataFusion gets back from ``scanner()``: a schema and a batch iterator."""

    projected_schema: pa.Schema
    _batches: Iterator[pa.RecordBatch] | None = None

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """The batches, guarded and error-recorded for DataFusion's threads."""
        # DataFusion pulls these on its own threads: guarded, so none is left running
        # Python when the interpreter exits (see scan_gate); our errors are recorded
        # so they come back out of DataFusion as raised (see engine_errors).
        if self._batches is None:
            return iter(())
        nested = [i for i, f in enumerate(self.projected_schema) if slice_sensitive(f.type)]
        batches = (unsliced(b, nested) for b in self._batches) if nested else self._batches
        return guarded(recorded(batches))

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.to_batches()), schema=self.projected_schema)

    def to_reader(self) -> pa.RecordBatchReader:
        """Refused: DuckDB scans a dataset through it, pushing its filters, which this dataset
        answers as DataFusion does (a NaN with its sign bit set is below every number there,
        above every number in DuckDB). ``Table.to_stream()`` / ``to_reader()`` leave DuckDB
        every filter."""
        msg = (
            "Table.dataset() is DataFusion's: filters pushed into it are answered in DataFusion's order of NaN, "
            "not DuckDB's; hand DuckDB table.to_stream() or table.to_reader() (it then filters every row itself)"
        )
        raise InvalidArgumentError(msg)


@dataclass(frozen=True)
class ScanContext:
    """What a fragment needs from its table: picklable, so fragments can be shipped.

    A pickled fragment carries this context, its Lance dataset (pylance pickles a
    dataset with its manifest, so unpickling reads nothing) and its drop list: a
    Spark task can scan it without opening the table or recomputing the merge.
    """

    uri: str
    data_schema: pa.Schema
    schema: pa.Schema
    with_hidden: bool
    #: Base columns with a scalar index: a filter on one is left to Lance (the index
    #: finds the rows) rather than served by decoding whole columns into the cache.
    indexed: frozenset[str] = frozenset()
    #: Estimated decoded size of every column of the base's rows: a scan of every column
    #: keeps what it decodes only when the whole table fits the column cache's budget.
    full_bytes: int = 0

    @property
    def hidden(self) -> tuple[str, ...]:
        """The debugging columns a scan adds (:data:`HIDDEN_COLUMNS`; none unless asked for):
        without them, a table's own column of one of those names is read as any other."""
        return HIDDEN_COLUMNS if self.with_hidden else ()

    def projected(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of a projection; raises on unknown columns."""
        if columns is None:
            return self.schema
        check_projection(columns, self.schema.names, self.uri)
        return pa.schema([self.schema.field(c) for c in columns])


def column_list(columns: object, uri: str) -> list[str] | None:
    """``columns`` (None: all) as a list of names: one string is refused (its characters
    were taken for column names: "unknown column(s) ['a', 'm', ...]").

    Example:
        >>> column_list(("id", "v"), "t")
        ['id', 'v']
        >>> column_list("v", "t")
        Traceback (most recent call last):
        ...
        memwal_query.errors.InvalidArgumentError: columns of t: a list of names, not the string 'v' (write ['v'])
    """
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)):
        msg = f"columns of {uri}: a list of names, not the string {columns!r} (write [{columns!r}])"
        raise InvalidArgumentError(msg)
    try:
        given: list[object] = list(columns)  # type: ignore[call-overload]
    except TypeError:
        given = [columns]
    names = [c for c in given if isinstance(c, str)]
    if len(names) < len(given):
        odd = next(c for c in given if not isinstance(c, str))
        msg = f"columns of {uri}: a list of names, not {odd!r} among them"
        raise InvalidArgumentError(msg)
    return names


def check_projection(columns: Sequence[str], names: Sequence[str], uri: str) -> None:
    """Raise :class:`InvalidArgumentError` for a column of ``columns`` the table ``uri``
    (columns ``names``) does not have, or one asked for more than once (or a string)."""
    column_list(columns, uri)
    missing = [c for c in columns if c not in names]
    if missing:
        msg = f"unknown column(s) {missing} in {uri}"
        raise InvalidArgumentError(msg)
    twice = sorted(c for c, n in Counter(columns).items() if n > 1)
    if twice:
        msg = f"column(s) {twice} asked for more than once from {uri}"
        raise InvalidArgumentError(msg)


def search_columns(
    columns: object, names: Sequence[str], uri: str, key: Sequence[str]
) -> tuple[list[str], list[str] | None]:
    """The columns a search reads, and those it returns beside its score (None: the ones read).

    ``columns``: None (all), or names the table ``uri`` (columns ``names``) has, each once
    (:class:`InvalidArgumentError` otherwise). None named: the ``key`` is read (a search finds
    rows by it), the score alone returned.
    """
    named = column_list(columns, uri)
    if named is None:
        return list(names), None
    check_projection(named, names, uri)
    return (list(key), []) if not named else (named, None)


class SourceFragment:
    """One partition of the merged table (picklable: see :class:`ScanContext`)."""

    kind = "fragment"
    region: str | None = None
    #: Rows held in memory and filtered by pyarrow: a filter :func:`reads_whole` cannot read
    #: (a user's pyarrow expression) is run by Lance instead, as for the sources Lance reads.
    in_memory = False

    def __init__(self, owner: ScanContext) -> None:
        self.context = owner

    def scanner(
        self,
        schema: pa.Schema | None = None,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **_: object,
    ) -> Scan:
        """Scan this fragment: DataFusion's per-partition call.

        ``columns=[]`` without a filter is a ``count(*)``: answered from metadata.
        """
        out = self._out_schema(columns)
        cols = list(out.names)
        const = constant_filter(expression_filter(filter))
        if const is False:  # DataFusion folded the WHERE clause to false or NULL
            return Scan(out, iter(()))
        given = None if const else filter
        if not cols and given is None:
            return Scan(out, zero_column_batches(self.live_rows()))
        if self.in_memory and given is not None and not reads_whole(given, self.context.schema):
            # pyarrow may answer such a filter (a user's expression) otherwise than Lance does
            return Scan(out, self._by_lance(cols, given, out, batch_size))
        # in memory (pyarrow) as in Lance: DataFusion's order of NaN
        filt = nan_ordered(given, self.context.data_schema) if given is not None else None
        return Scan(out, self.batches(cols, filt, out, batch_size))

    def _by_lance(
        self, cols: list[str], filt: pc.Expression, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        """The rows Lance keeps for ``filt``, as it filters the sources it reads."""
        need = scan_columns(cols, filt, self.context.schema.names)
        rows = lance_filtered(self.scanner(columns=need).to_table(), filt)
        if not cols:
            yield from zero_column_batches(rows.num_rows)
            return
        for b in rows.to_batches(max_chunksize=batch_size or SCAN_BATCH_ROWS):
            yield pa.RecordBatch.from_arrays([b.column(c) for c in cols], schema=out)

    def live_rows(self) -> int:
        """Rows this fragment contributes to the merged table."""
        raise NotImplementedError

    def rows_hint(self) -> int:
        """Rows before masking (cheap; used to pack small sources together)."""
        return self.live_rows()

    def work_hint(self) -> int:
        """Rows a scan of this partition may read (deals partitions to CPUs; metadata, no IO, where it can)."""
        return self.rows_hint()

    def batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def _out_schema(self, columns: Sequence[str] | None) -> pa.Schema:
        return self.context.projected(columns)

    def _finish(
        self,
        batch: pa.RecordBatch,
        columns: list[str],
        gen: int,
        region: str | None,
        post_filter: pc.Expression | None,
        out: pa.Schema,
    ) -> pa.RecordBatch | None:
        n = batch.num_rows
        cols = {name: batch.column(name) for name in batch.schema.names}
        if self.context.with_hidden:
            cols.setdefault("_gen", pa.array(np.full(n, gen, dtype=np.int64)))
            cols.setdefault("_region", pa.array([region] * n, pa.string()) if region else pa.nulls(n, pa.string()))
        if post_filter is not None:  # a filter Lance refused, on the rows it read
            full = pa.RecordBatch.from_pydict(cols)
            full = memory_filtered(pa.Table.from_batches([full]), post_filter).combine_chunks()
            if full.num_rows == 0:
                return None
            batch = full.to_batches()[0]
            n = batch.num_rows
            cols = {name: batch.column(name) for name in batch.schema.names}
        if n == 0:
            return None
        if not columns:
            return pa.record_batch({"_": pa.nulls(n)}).select([])
        arrays = [cols[c] if c in cols else pa.nulls(n, out.field(c).type) for c in columns]
        arrays = [
            a.cast(out.field(c).type) if a.type != out.field(c).type else a
            for a, c in zip(arrays, columns, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=out)


P = TypeVar("P", bound=SourceFragment)


class CompositeFragment(SourceFragment, Generic[P]):
    """One partition made of several source fragments (``parts``)."""

    def __init__(self, owner: ScanContext, parts: Sequence[P]) -> None:
        super().__init__(owner)
        self.parts = list(parts)

    def live_rows(self) -> int:
        return sum(p.live_rows() for p in self.parts)

    def rows_hint(self) -> int:
        return sum(p.rows_hint() for p in self.parts)

    def work_hint(self) -> int:
        return sum(p.work_hint() for p in self.parts)

    def batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        """Each part's batches, one part after the other."""
        for p in self.parts:
            yield from p.batches(cols, filt, out, batch_size)


class MemoryFragment(SourceFragment):
    """A region's surviving MemTable rows."""

    in_memory = True

    def __init__(self, owner: ScanContext, table: pa.Table, region: str) -> None:
        super().__init__(owner)
        self.table = table
        self.region = region
        self.negative_nans = NegativeNans(table)

    def __repr__(self) -> str:
        return f"<memwal memtable region={self.region} rows={self.table.num_rows}>"

    def live_rows(self) -> int:
        return int(self.table.num_rows)

    def batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        t = self.table
        data = {name: t.column(name) for name in self.context.data_schema.names}
        n = t.num_rows
        if self.context.with_hidden:
            data["_gen"] = t.column(GEN_COLUMN)
            data["_rowaddr"] = t.column(SEQ_COLUMN)
            data["_region"] = pa.chunked_array([pa.array([self.region] * n, pa.string())])
        full = pa.table(data)
        if filt is not None:
            full = memory_filtered(full, filt, self.negative_nans)
        sel = full.select(cols) if cols else full.select([])
        for b in sel.to_batches(max_chunksize=batch_size or SCAN_BATCH_ROWS):
            yield pa.RecordBatch.from_arrays(b.columns, schema=out) if cols else b


def rebuilt_rows(g: GenerationSource, drop: np.ndarray) -> pa.Table:
    """The surviving rows of a generation rebuilt from the WAL, laid out as MemTable rows.

    They live in memory anyway, and a shipped fragment (Spark tasks) carries them along
    (the in-process Lance dataset they were put in is not readable elsewhere).
    """
    t = g.dataset.to_table(with_row_address=True)
    if drop.size:
        t = t.filter(drop_mask(t.column("_rowaddr"), drop))
    seq = t.column("_rowaddr")
    t = t.drop_columns(["_rowaddr"])
    t = t.append_column(GEN_COLUMN, pa.array(np.full(t.num_rows, g.generation, dtype=np.int64)))
    return t.append_column(SEQ_COLUMN, seq)


def decoded_row_bytes(schema: pa.Schema) -> int:
    """Estimated decoded bytes of one row of ``schema`` (variable-width values: 16 bytes).

    Example:
        >>> import pyarrow as pa
        >>> decoded_row_bytes(pa.schema([("id", pa.int64()), ("v", pa.list_(pa.float32(), 4)), ("s", pa.string())]))
        40
    """

    def width(t: pa.DataType) -> int:
        if pa.types.is_fixed_size_list(t):
            return int(t.list_size) * width(t.value_type)
        try:
            return max(1, int(t.bit_width) // 8)
        except ValueError:
            return 16

    return sum(width(f.type) for f in schema)
