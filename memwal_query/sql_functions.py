"""SQL table functions over merged tables: KNN, full-text and hybrid search, point lookups,
the table's state, changes.

After ``register_functions(ctx, {"events": table})`` (``Table.register`` does this
for the name it registers; :func:`memwal_query.register_catalog` for every table of
its catalog), SQL can call:

* ``memwal_knn('events', 'vec', [0.1, ...], 10 [, 'category = ''books''' [, nprobes [, 'cosine']]])``:
  the k nearest merged rows with ``_distance`` (:func:`memwal_query.vector.nearest`; an empty
  filter and NULL ``nprobes`` / distance mean the defaults: none, ``'l2'``);
* ``memwal_lookup('events', [1, 2, 3])``: the live rows of those keys
  (:func:`memwal_query.lookup.lookup`; single-column keys);
* ``memwal_regions('events')``, ``memwal_generations('events')``, ``memwal_wal('events')``,
  ``memwal_history('events')``: the table's state, what ``memwal inspect`` shows, one row
  per region, flushed generation, WAL tail entry or base version
  (:mod:`memwal_query.state_sql`);
* ``memwal_changes('events', 'mwc1...')``: the net change per key since a change token
  (:mod:`memwal_query.changes`);
* ``memwal_fts('events', 'note', 'late delivery', 10 [, filter])``: the k best
  full-text matches with ``_score`` (:func:`memwal_query.fts.search.search_text`);
* ``memwal_hybrid('events', 'vec', [0.1, ...], 'note', 'late delivery', 10 [, filter])``:
  KNN and full-text search fused by reciprocal rank, with ``_relevance_score``
  (:func:`memwal_query.hybrid.search_hybrid`).

The functions read each table's frozen view (:class:`~memwal_query.view.TableView`).

All are ordinary tables in SQL: join them, filter them, aggregate them.
The search runs while DataFusion plans the query, through Lance only (DataFusion
must not be re-entered from inside a query).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.dataset as pds
from datafusion import udtf

from memwal_query.changes import changes
from memwal_query.compat import check_datafusion_supported
from memwal_query.describe import describe_table
from memwal_query.engine_errors import raised_in_engine
from memwal_query.errors import InvalidArgumentError, MemWalError, one_line
from memwal_query.hybrid import search_hybrid
from memwal_query.lookup import lookup
from memwal_query.planner.predicates import sql_name
from memwal_query.state_sql import generations_table, history_table, regions_table, wal_table
from memwal_query.table_dataset import table_dataset
from memwal_query.vector import nearest
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = ["register_functions", "register_table", "add_table_resolver", "FUNCTION_NAMES", "TableResolver"]

_ATTR = "_memwal_tables"

#: Finds a table by the name a SQL function was given (None: not known to it).
TableResolver = Callable[[str], "HasView | None"]


class _Registry(dict[str, HasView]):
    """Tables registered by name, then the resolvers (catalogs), asked in order."""

    def __init__(self) -> None:
        super().__init__()
        # by the name given to add_table_resolver (a catalog registered again replaces its own)
        self.resolvers: dict[object, TableResolver] = {}
        self.listers: dict[object, Callable[[], list[str]]] = {}

    def find(self, name: str) -> HasView | None:
        """The table ``name`` names as SQL would: a registered table (names are case-insensitive,
        as DataFusion's unquoted ones; ``public.`` optional), else the one catalog holding it.

        Raises:
            InvalidArgumentError: Several catalogs hold a table of that name.
        """
        key = name.lower()
        for prefix in ("datafusion.public.", "public."):
            key = key.removeprefix(prefix)
        found = self.get(key)
        if found is not None:
            return found
        hits = [t for t in (resolve(name) for resolve in self.resolvers.values()) if t is not None]
        if len(hits) > 1:
            msg = f"{name!r} names a table in {len(hits)} catalogs: give its full name ('<catalog>.public.<table>')"
            raise InvalidArgumentError(msg)
        return hits[0] if hits else None

    def known(self) -> list[str]:
        """The names registered, then those the resolvers list (e.g. a catalog's tables)."""
        return sorted(self) + [n for names in self.listers.values() for n in names()]


def _value(e: Any, what: str) -> Any:
    try:
        v = e.python_value()
    except Exception as err:  # noqa: BLE001
        msg = f"{what} must be a literal, got {e}"
        raise InvalidArgumentError(msg) from err
    return v.as_py() if isinstance(v, pa.Scalar) else v


def _table(tables: _Registry, e: Any, fn: str) -> TableView:
    name = _value(e, f"{fn}: the table name")
    table = tables.find(str(name))
    if table is None:
        msg = f"{fn}: no memwal table named {name!r} is registered (known: {tables.known()})"
        raise InvalidArgumentError(msg)
    return view_of(table)


def _filter(e: Any, fn: str) -> Any:
    """A function's filter argument; one SQL expression (Lance, which runs it, reads only the
    first of several statements: ``a = 1; b = 2`` would filter by ``a = 1`` alone)."""
    v = _value(e, f"{fn}: the filter")
    if isinstance(v, str) and ";" in re.sub(r"'(?:[^']|'')*'", "", v):
        msg = f"{fn}: the filter must be one SQL expression, got {v!r}"
        raise InvalidArgumentError(msg)
    return v


def _int(e: Any, what: str) -> int:
    v = _value(e, what)
    if isinstance(v, bool) or not isinstance(v, int):
        msg = f"{what} must be an integer, got {v!r}"
        raise InvalidArgumentError(msg)
    return v


def _optional(args: tuple[Any, ...], i: int, parse: Callable[[Any, str], Any], what: str, default: Any) -> Any:
    """Argument ``i`` parsed by ``parse``, or ``default`` when it is not given or NULL."""
    if len(args) <= i or _value(args[i], what) is None:
        return default
    return parse(args[i], what)


_KNN_USAGE = "memwal_knn(table, column, [vector], k [, filter [, nprobes [, distance]]])"
_LOOKUP_USAGE = "memwal_lookup(table, [key, ...])"
_CHANGES_USAGE = "memwal_changes(table, change_token)"
_FTS_USAGE = "memwal_fts(table, column, query, k [, filter])"
_HYBRID_USAGE = "memwal_hybrid(table, vector_column, [vector], text_column, query, k [, filter])"


def _arity(args: tuple[Any, ...], usage: str, least: int, most: int) -> None:
    """Refuse a call with fewer than ``least`` or more than ``most`` arguments, naming the usage."""
    if not least <= len(args) <= most:
        n = str(least) if least == most else f"{least} {'or' if most == least + 1 else 'to'} {most}"
        msg = f"{usage} takes {n} argument{'' if most == 1 else 's'}, got {len(args)}"
        raise InvalidArgumentError(msg)


def _knn(registry: _Registry, *args: Any) -> pa.Table:
    _arity(args, _KNN_USAGE, 4, 7)
    table = _table(registry, args[0], "memwal_knn")
    column = _value(args[1], "memwal_knn: the column")
    query = _value(args[2], "memwal_knn: the query vector")
    k = _int(args[3], "memwal_knn: k")
    filt = _filter(args[4], "memwal_knn") if len(args) > 4 else None
    nprobes = _optional(args, 5, _int, "memwal_knn: nprobes", None)
    distance = _optional(args, 6, _str, "memwal_knn: the distance", "l2")
    found = nearest(
        table, str(column), query, k=k, filter=filt or None, nprobes=nprobes, distance=distance, in_query=True
    )
    return found.rows


def _lookup(registry: _Registry, *args: Any) -> pa.Table:
    _arity(args, _LOOKUP_USAGE, 2, 2)
    table = _table(registry, args[0], "memwal_lookup")
    keys = _value(args[1], "memwal_lookup: the keys")
    return lookup(table, keys if isinstance(keys, list) else [keys]).rows


def _state(fn: str, build: Callable[[TableView], pa.Table]) -> Callable[..., pa.Table]:
    """The state function ``fn(table)``: ``build`` applied to the named table's view."""

    def call(registry: _Registry, *args: Any) -> pa.Table:
        _arity(args, f"{fn}(table)", 1, 1)
        return build(_table(registry, args[0], fn))

    return call


def _changes(registry: _Registry, *args: Any) -> pa.Table:
    _arity(args, _CHANGES_USAGE, 2, 2)
    table = _table(registry, args[0], "memwal_changes")
    token = _value(args[1], "memwal_changes: the change token")
    if not isinstance(token, str):
        msg = f"memwal_changes: the change token must be a string (see Table.change_token), got {token!r}"
        raise InvalidArgumentError(msg)
    return changes(table, token)


def _str(e: Any, what: str) -> str:
    v = _value(e, what)
    if not isinstance(v, str):
        msg = f"{what} must be a string, got {v!r}"
        raise InvalidArgumentError(msg)
    return v


def _fts(registry: _Registry, *args: Any) -> pa.Table:
    _arity(args, _FTS_USAGE, 4, 5)
    table = _table(registry, args[0], "memwal_fts")
    column = _str(args[1], "memwal_fts: the column")
    query = _str(args[2], "memwal_fts: the query")
    k = _int(args[3], "memwal_fts: k")
    filt = _filter(args[4], "memwal_fts") if len(args) > 4 else None
    from memwal_query.fts.search import search_text  # the full-text modules load on first use

    return search_text(table, column, query, k=k, filter=filt or None, in_query=True).rows


def _hybrid(registry: _Registry, *args: Any) -> pa.Table:
    _arity(args, _HYBRID_USAGE, 6, 7)
    table = _table(registry, args[0], "memwal_hybrid")
    vcol = _str(args[1], "memwal_hybrid: the vector column")
    vector = _value(args[2], "memwal_hybrid: the query vector")
    tcol = _str(args[3], "memwal_hybrid: the text column")
    query = _str(args[4], "memwal_hybrid: the text query")
    k = _int(args[5], "memwal_hybrid: k")
    filt = _filter(args[6], "memwal_hybrid") if len(args) > 6 else None
    return search_hybrid(table, vcol, vector, tcol, query, k=k, filter=filt or None, in_query=True)


# name -> (implementation taking the context's table registry first, usage)
_FUNCTIONS: dict[str, tuple[Callable[..., pa.Table], str]] = {
    "memwal_knn": (_knn, _KNN_USAGE),
    "memwal_lookup": (_lookup, _LOOKUP_USAGE),
    "memwal_regions": (_state("memwal_regions", lambda v: regions_table(describe_table(v))), "memwal_regions(table)"),
    "memwal_generations": (
        _state("memwal_generations", lambda v: generations_table(describe_table(v), v.snapshot)),
        "memwal_generations(table)",
    ),
    "memwal_wal": (_state("memwal_wal", lambda v: wal_table(v.snapshot)), "memwal_wal(table)"),
    "memwal_history": (_state("memwal_history", lambda v: history_table(v.snapshot)), "memwal_history(table)"),
    "memwal_changes": (_changes, _CHANGES_USAGE),
    "memwal_fts": (_fts, _FTS_USAGE),
    "memwal_hybrid": (_hybrid, _HYBRID_USAGE),
}
#: The SQL table functions :func:`register_functions` registers.
FUNCTION_NAMES = tuple(_FUNCTIONS)


def _register(ctx: datafusion.SessionContext, name: str, registry: _Registry) -> None:
    """Register SQL table function ``name`` over ``registry``.

    Its errors come back out of DataFusion as raised (:mod:`memwal_query.engine_errors`):
    ours as they are, anything else (a literal of the wrong type) as an
    :class:`InvalidArgumentError` naming the function and its usage.
    """
    fn, usage = _FUNCTIONS[name]

    def call(*args: Any) -> datafusion.Table:
        try:
            return datafusion.Table(table_dataset(fn(registry, *args)))
        except MemWalError as err:
            failure = err
        except (TypeError, ValueError, OverflowError, pa.ArrowException) as err:
            msg = f"{name}: {' '.join(str(err).split()) or type(err).__name__}; usage: {usage}"
            failure = InvalidArgumentError(msg)
        # Raised with one frame and no chained cause: DataFusion prints the traceback into
        # its message, which a query in the user's own SessionContext shows as it is.
        raise raised_in_engine(failure.with_traceback(None))

    ctx.register_udtf(udtf(call, name))


def register_functions(ctx: datafusion.SessionContext, tables: Mapping[str, HasView]) -> None:
    """Make the SQL table functions (:data:`FUNCTION_NAMES`) available in ``ctx`` for ``tables``.

    Calling it again adds tables (a name registered again points at the new snapshot).

    Example:
        >>> import datafusion
        >>> ctx = datafusion.SessionContext()
        >>> register_functions(ctx, {})
    """
    _registry(ctx).update({_unquoted(name).lower(): table for name, table in tables.items()})


def _unquoted(name: str) -> str:
    """A table name as SQL text names it: ``"events.lance"`` (quoted) is ``events.lance``."""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name


def _registry(ctx: datafusion.SessionContext) -> _Registry:
    """The context's table registry; the functions are registered when it is made."""
    registry: _Registry | None = getattr(ctx, _ATTR, None)
    if registry is None:
        registry = _Registry()
        setattr(ctx, _ATTR, registry)
        for name in FUNCTION_NAMES:
            _register(ctx, name, registry)
    return registry


def add_table_resolver(
    ctx: datafusion.SessionContext,
    resolve: TableResolver,
    names: Callable[[], list[str]] | None = None,
    key: object = None,
) -> None:
    """Let the SQL functions of ``ctx`` find tables through ``resolve`` (registering them if needed).

    Names given to :func:`register_functions` come first; ``resolve(name)`` returns a
    :class:`~memwal_query.Table` (or view) or None. It runs while DataFusion plans a
    query, so it must not call DataFusion. ``names()`` (optional) lists the names it
    resolves, for the error naming an unknown table. ``key`` (e.g. a catalog's name): a
    resolver added under the same key before is replaced (None: always added).

    Example:
        >>> import datafusion
        >>> ctx = datafusion.SessionContext()
        >>> add_table_resolver(ctx, lambda name: None, key="memwal")
    """
    registry = _registry(ctx)
    slot = object() if key is None else key
    registry.resolvers[slot] = resolve
    registry.listers.pop(slot, None)
    if names is not None:
        registry.listers[slot] = names


def register_table(ctx: datafusion.SessionContext, name: str, dataset: pds.Dataset, table: HasView) -> None:
    """Register ``dataset`` as table ``name`` in ``ctx`` (replacing one) and the SQL functions for it.

    Raises:
        InvalidArgumentError: ``ctx`` is not a ``datafusion.SessionContext``, or ``name`` is empty.
    """
    if not isinstance(ctx, datafusion.SessionContext):
        msg = f"register() needs a datafusion.SessionContext, got {type(ctx).__name__}"
        raise InvalidArgumentError(msg)
    if not isinstance(name, str) or not name:
        msg = f"table name must be a non-empty string, got {name!r}"
        raise InvalidArgumentError(msg)
    check_datafusion_supported()
    try:
        ctx.deregister_table(name)
    except Exception:  # noqa: BLE001 - not registered yet
        pass
    try:
        ctx.register_dataset(name, dataset)
    except Exception as err:  # DataFusion's: e.g. a default schema that takes no tables (a memwal catalog)
        why = one_line(err)
        if "_PublicSchema" in why:  # the session's default schema is a memwal catalog's
            why = "its default catalog is a memwal catalog, which serves the tables under its root only"
        elif "." in name and "resolve schema" in why:
            why += f" (DataFusion reads a dotted name as schema.table: quote it, {sql_name(name)})"
        msg = f"cannot register {name!r} in this session: {why}"
        raise InvalidArgumentError(msg) from err
    register_functions(ctx, {name: table})
