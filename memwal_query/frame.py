"""The DataFrame :meth:`memwal_query.Table.sql` returns: DataFusion's, with memwal's errors.

A query runs when its result is asked for (``to_arrow_table``, ``collect``, ``show``,
``to_pandas`` ...), and what fails then, a scan of the table or DataFusion itself, comes out of
DataFusion as its own ``Exception`` with our message buried in it. :class:`MemWalDataFrame`
is a ``datafusion.DataFrame`` whose methods raise :class:`~memwal_query.errors.MemWalError`
instead (the error raised inside the query when it was ours, see
:mod:`memwal_query.engine_errors`), and whose methods returning a DataFrame (``filter``,
``select``, ``limit`` ...) return one of these again. Streams (``execute_stream``) and the
Arrow C stream interface (``pyarrow.table(df)``, DuckDB) report DataFusion's errors as they are.

Example:
    >>> import datafusion
    >>> from memwal_query.errors import MemWalError
    >>> df = MemWalDataFrame(datafusion.SessionContext().sql("SELECT 1 AS a").df)
    >>> df.limit(1).to_pydict()
    {'a': [1]}
    >>> try:
    ...     df.select("nope")
    ... except MemWalError as err:
    ...     print(type(err).__name__)
    MemWalError
"""

from __future__ import annotations

import functools
import html
import re
from typing import Any

import datafusion
import pyarrow as pa
from datafusion.dataframe_formatter import DataFrameHtmlFormatter

from memwal_query.engine_errors import engine_error
from memwal_query.errors import MemWalError
from memwal_query.forked import check_engine
from memwal_query.interrupt import interruptibly

__all__ = ["MemWalDataFrame", "sql_frame"]

#: The DataFrame methods that run its query (:func:`~memwal_query.interrupt.interruptibly`).
_RUNS_QUERY = frozenset(
    {
        "cache",
        "collect",
        "collect_column",
        "collect_partitioned",
        "count",
        "describe",
        "explain",
        "to_arrow_table",
        "to_pandas",
        "to_polars",
        "to_pydict",
        "to_pylist",
        "write_csv",
        "write_json",
        "write_parquet",
        "write_parquet_with_options",
        "write_table",
    }
)


class MemWalDataFrame(datafusion.DataFrame):
    """A ``datafusion.DataFrame`` raising :class:`~memwal_query.errors.MemWalError`."""

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("__") or name == "df" or not callable(attr):
            return attr

        runs = name in _RUNS_QUERY

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            check_engine("a memwal DataFrame")
            try:  # a query run on a worker thread (main thread only): Ctrl-C ends it at once
                out = interruptibly(lambda: attr(*args, **kwargs)) if runs else attr(*args, **kwargs)
            except MemWalError:
                raise
            except Exception as err:  # DataFusion's; ours raised inside it come back as they were
                raise engine_error(err) from err
            if isinstance(out, datafusion.DataFrame) and not isinstance(out, MemWalDataFrame):
                return MemWalDataFrame(out.df)
            return out

        return call

    def __repr__(self) -> str:
        """The first rows as memwal's text table (names and values escaped: a line break in a
        value does not forge a row); DataFusion's own printed them as they are."""
        from memwal_query.display import format_text_table

        table, more = self._first_rows()
        return format_text_table(table, footer="more rows not shown" if more else None)

    def show(self, num: int = 20) -> None:
        """Print the first ``num`` rows as memwal's text table (DataFusion's printed a stray
        ``DataFrame()`` line first, and names and values as they are)."""
        from memwal_query.display import format_text_table

        first = pa.Table.from_batches(self.limit(num + 1).collect(), schema=self.schema())
        print(format_text_table(first.slice(0, num), footer="more rows not shown" if first.num_rows > num else None))

    def _repr_html_(self) -> str:
        """Jupyter's view: DataFusion's HTML table of the first rows (its formatter, its
        settings and type formatters), names and values HTML-escaped where they hold markup
        (``<``, ``&``, quotes: DataFusion put them in the page as they are, and a value
        ``<script>...`` ran in the notebook)."""
        from datafusion.dataframe_formatter import get_formatter

        table, more = self._first_rows()
        formatter = get_formatter()
        if table.num_rows == 0:
            return formatter.format_html([], table.schema)
        if _holds_markup(table):
            formatter = _EscapingFormatter.like(formatter)
            table = table.rename_columns([html.escape(n) for n in table.column_names])
        return formatter.format_html(table.to_batches(), table.schema, has_more=more)

    def _first_rows(self) -> tuple[pa.Table, bool]:
        from datafusion.dataframe_formatter import get_formatter

        shown = get_formatter().max_rows
        first = pa.Table.from_batches(self.limit(shown + 1).collect(), schema=self.schema())
        return first.slice(0, shown), first.num_rows > shown


def _values(column: pa.ChunkedArray, name: str) -> list[object]:
    from memwal_query.display import python_values

    try:
        return python_values(column, name)
    except MemWalError:  # a value Python cannot hold, nested: Arrow's text of it
        return [str(v) for v in column]


_MARKUP = re.compile("[<>&\"']")


def _holds_markup(table: pa.Table) -> bool:
    """Whether a name or a value of ``table`` would be read as HTML: ``<``, ``>``, ``&`` or a
    quote in its text (numbers, dates and times never hold one)."""
    if any(_MARKUP.search(n) for n in table.column_names):
        return True
    for c, name in zip(table.columns, table.column_names, strict=True):
        t = c.type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t) or pa.types.is_boolean(t):
            continue
        if pa.types.is_decimal(t):
            continue
        if any(v is not None and _MARKUP.search(str(v)) for v in _values(c, name)):
            return True
    return False


class _EscapingFormatter(DataFrameHtmlFormatter):
    """DataFusion's HTML formatter whose cell text is HTML-escaped (after the type formatters).
    The preview of a value longer than ``max_cell_length`` is cut from the text, then escaped
    (cut from the escaped text, it could end inside an entity: ``&am``)."""

    @classmethod
    def like(cls, formatter: DataFrameHtmlFormatter) -> _EscapingFormatter:
        """An escaping formatter with ``formatter``'s settings, type formatters and builders."""
        out = cls.__new__(cls)
        out.__dict__.update(vars(formatter))
        return out

    def _format_cell_value(self, value: Any) -> str:
        return html.escape(str(super()._format_cell_value(value)))

    def _build_expandable_cell(self, formatted_value: str, row_count: int, col_idx: int, table_uuid: str) -> str:
        cell = super()._build_expandable_cell(formatted_value, row_count, col_idx, table_uuid)
        cut = str(formatted_value)[: self.max_cell_length]  # what DataFusion previews
        preview = html.escape(html.unescape(formatted_value)[: self.max_cell_length])
        return cell.replace(f">{cut}</span>", f">{preview}</span>", 1)


def sql_frame(ctx: datafusion.SessionContext, query: str, what: str) -> MemWalDataFrame:
    """``ctx.sql(query)`` as a :class:`MemWalDataFrame` (planning errors raised as MemWalError);
    ``what``: the table queried, named if this process cannot run DataFusion (a fork)."""
    check_engine(what)
    try:
        return MemWalDataFrame(ctx.sql(query).df)
    except MemWalError:
        raise
    except Exception as err:  # DataFusion's; ours raised inside it come back as they were
        raise engine_error(err) from err
