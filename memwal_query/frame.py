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
from typing import Any

import datafusion

from memwal_query.engine_errors import engine_error
from memwal_query.errors import MemWalError

__all__ = ["MemWalDataFrame"]


class MemWalDataFrame(datafusion.DataFrame):
    """A ``datafusion.DataFrame`` raising :class:`~memwal_query.errors.MemWalError`."""

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("__") or name == "df" or not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                out = attr(*args, **kwargs)
            except MemWalError:
                raise
            except Exception as err:  # DataFusion's; ours raised inside it come back as they were
                raise engine_error(err) from err
            if isinstance(out, datafusion.DataFrame) and not isinstance(out, MemWalDataFrame):
                return MemWalDataFrame(out.df)
            return out

        return call
