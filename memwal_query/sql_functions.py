"""SQL table functions over merged tables: KNN search and point lookups.

After ``register_functions(ctx, {"events": table})`` (``Table.register`` does this
for the name it registers), SQL can call:

* ``memwal_knn('events', 'vec', [0.1, ...], 10 [, 'category = ''books''' [, nprobes]])``:
  the k nearest merged rows with ``_distance`` (:meth:`memwal_query.Table.nearest`);
* ``memwal_lookup('events', [1, 2, 3])``: the live rows of those keys
  (:meth:`memwal_query.Table.lookup`; single-column keys).

Both are ordinary tables in SQL: join them, filter them, aggregate them.
The search runs while DataFusion plans the query, through Lance only (DataFusion
must not be re-entered from inside a query).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import datafusion
import pyarrow as pa
import pyarrow.dataset as pds
from datafusion import udtf

from memwal_query.errors import InvalidArgumentError

if TYPE_CHECKING:
    from memwal_query.table import Table

__all__ = ["register_functions"]

_ATTR = "_memwal_tables"


def _value(e: Any, what: str) -> Any:
    try:
        v = e.python_value()
    except Exception as err:  # noqa: BLE001
        msg = f"{what} must be a literal, got {e}"
        raise InvalidArgumentError(msg) from err
    return v.as_py() if isinstance(v, pa.Scalar) else v


def _table(tables: Mapping[str, Table], e: Any, fn: str) -> Table:
    name = _value(e, f"{fn}: the table name")
    table = tables.get(str(name))
    if table is None:
        msg = f"{fn}: no memwal table named {name!r} is registered (known: {sorted(tables)})"
        raise InvalidArgumentError(msg)
    return table


def register_functions(ctx: datafusion.SessionContext, tables: Mapping[str, Table]) -> None:
    """Make ``memwal_knn`` and ``memwal_lookup`` available in ``ctx`` for ``tables``.

    Calling it again adds tables (a name registered again points at the new snapshot).

    Example:
        >>> import datafusion
        >>> ctx = datafusion.SessionContext()
        >>> register_functions(ctx, {})
    """
    registry: dict[str, Table] | None = getattr(ctx, _ATTR, None)
    if registry is not None:
        registry.update(tables)
        return
    registry = dict(tables)
    setattr(ctx, _ATTR, registry)

    def knn(*args: Any) -> datafusion.Table:
        if len(args) < 4:
            msg = "memwal_knn(table, column, query_vector, k [, filter [, nprobes]]) takes at least 4 arguments"
            raise InvalidArgumentError(msg)
        table = _table(registry, args[0], "memwal_knn")
        column = _value(args[1], "memwal_knn: the column")
        query = _value(args[2], "memwal_knn: the query vector")
        k = _value(args[3], "memwal_knn: k")
        filt = _value(args[4], "memwal_knn: the filter") if len(args) > 4 else None
        nprobes = _value(args[5], "memwal_knn: nprobes") if len(args) > 5 else None
        result = table.nearest(str(column), query, int(k), filter=filt or None, nprobes=nprobes, _in_query=True)
        return datafusion.Table(pds.dataset(result))

    def lookup(*args: Any) -> datafusion.Table:
        if len(args) != 2:
            msg = "memwal_lookup(table, [key, ...]) takes 2 arguments"
            raise InvalidArgumentError(msg)
        table = _table(registry, args[0], "memwal_lookup")
        keys = _value(args[1], "memwal_lookup: the keys")
        result = table.lookup(keys if isinstance(keys, list) else [keys])
        return datafusion.Table(pds.dataset(result))

    ctx.register_udtf(udtf(knn, "memwal_knn"))
    ctx.register_udtf(udtf(lookup, "memwal_lookup"))
