"""A DataFusion catalog of every MemWAL table under one folder or object-store prefix.

``register_catalog(ctx, "s3://bucket/warehouse")`` makes each MemWAL table directly
under the root queryable as ``memwal.public.<folder name>``, without registering tables
one by one:

* **Lazy.** Nothing is opened when the catalog is registered; listing the tables
  (``information_schema.tables``, ``SHOW TABLES``) lists the root and asks each Lance
  table there whether it has a MemWAL index; a table is opened when a query names it.
* **Fresh.** Each query that names a table gets a snapshot taken while DataFusion plans
  it: the catalog keeps the last snapshot per table and :meth:`~memwal_query.Table.refresh`
  es it, so the cost of a query's snapshot follows what was written since the last one
  (one snapshot per table per query, also when a query names it twice).
* **Pinned** on request: :meth:`MemWalCatalog.pin` makes every query read one snapshot
  (the current one, or any :class:`~memwal_query.Table` given, e.g. one taken earlier)
  until :meth:`MemWalCatalog.unpin`.
* **MemWAL tables only.** Folders that are not Lance tables are skipped; Lance tables
  without a MemWAL index are not listed either, and naming one in a query is an error
  saying so (read those with pylance).
* The SQL table functions (``memwal_knn``, ``memwal_regions``, ``memwal_changes`` ...)
  take the catalog's tables by folder name or full name (``'events'``,
  ``'memwal.public.events'``), with the same fresh snapshot rule: each call takes its own
  snapshot, so with writers running a query joining a table with a function of it may read
  two (pin the table for one).

DataFusion calls the catalog while it plans a query; the catalog reads storage and
Lance only, never DataFusion (which would panic there: docs/DESIGN.md "Sharp edges").

Example:
    >>> import datafusion, tempfile, memwal_query as mq
    >>> from memwal_query.demo import write_demo_table
    >>> root = tempfile.mkdtemp()
    >>> _ = write_demo_table(root + "/events", base_rows=300, update_rows=50, memtable_rows=20, seed=6)
    >>> ctx = datafusion.SessionContext()
    >>> catalog = mq.register_catalog(ctx, root)
    >>> catalog.table_names()
    ['events']
    >>> n = ctx.sql("SELECT count(*) AS n FROM memwal.public.events").to_pydict()["n"][0]
    >>> n == catalog.table("events").count_rows()
    True
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, cast

import datafusion
import datafusion.catalog as dfc
import lance
import pyarrow as pa

from memwal_query.compat import check_datafusion_supported
from memwal_query.engine_errors import raised_in_engine
from memwal_query.errors import (
    InvalidArgumentError,
    ManifestError,
    MemWalError,
    NotAMemWalTableError,
    TableNotFoundError,
)
from memwal_query.format.lance_open import lance_message
from memwal_query.format.storage import Storage
from memwal_query.scan.unreadable import UnreadableDataset
from memwal_query.snapshot.model import Consistency
from memwal_query.sql_functions import add_table_resolver
from memwal_query.table import Table, open_table

__all__ = ["MemWalCatalog", "register_catalog", "SCHEMA_NAME"]

log = logging.getLogger("memwal_query")

#: The one schema of a memwal catalog.
SCHEMA_NAME = "public"


class _Names(tuple[str, ...]):
    """Table names: a sequence, and callable.

    datafusion-python 55 reads a Python schema provider's ``table_names`` as an
    attribute (calling it fails with "'method' object is not an instance of
    'Sequence'") although its ``SchemaProvider`` declares a method; this works both ways.
    """

    def __call__(self) -> set[str]:
        return set(self)


class _PublicSchema:
    """The ``public`` schema: DataFusion's ``SchemaProvider`` protocol over the catalog."""

    def __init__(self, catalog: MemWalCatalog) -> None:
        self._catalog = catalog

    @property
    def table_names(self) -> _Names:
        return _Names(self._catalog.table_names())

    def table(self, name: str) -> dfc.Table | None:
        try:
            if not self._catalog.has_table(name):
                self._catalog.check_name(name)  # a plain Lance table: say so
                return None
            return dfc.Table(self._catalog.table(name).dataset())
        except (TableNotFoundError, NotAMemWalTableError) as err:
            raise raised_in_engine(err) from None
        except MemWalError as err:
            # listed but cannot be opened: a query reading it fails; information_schema lists it
            schema = self._catalog.base_schema(name)
            if schema is None:
                raise raised_in_engine(err) from None
            self._catalog.warn_unreadable(name, str(err))
            return dfc.Table(UnreadableDataset(schema, err))

    def table_exist(self, name: str) -> bool:
        return self._catalog.has_table(name)

    def owner_name(self) -> str | None:
        return None


class MemWalCatalog:
    """The MemWAL tables under one root, as a DataFusion catalog (see :func:`register_catalog`).

    Also DataFusion's ``CatalogProvider`` protocol (``schema_names``, ``schema``).
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: dict[str, str] | None = None,
        consistency: Consistency = "strong",
    ) -> None:
        if consistency not in ("strong", "eventual"):
            msg = f"consistency must be 'strong' or 'eventual', got {consistency!r}"
            raise InvalidArgumentError(msg)
        self._storage = Storage.open(root, storage_options)
        local = self._storage.local_path("")
        if local is not None and not os.path.isdir(local):  # an object-store prefix exists once written to
            msg = f"catalog root {root!r} is not a folder ({local})"
            raise InvalidArgumentError(msg)
        self._options = dict(storage_options or {})
        self._consistency: Consistency = consistency
        self._latest: dict[str, Table] = {}
        self._pinned: dict[str, Table] = {}
        self._memwal: set[str] = set()
        self._warned: set[tuple[str, str]] = set()  # unreadable tables warned about (once each)
        self._lock = threading.RLock()

    @property
    def root(self) -> str:
        """The folder or prefix whose tables the catalog serves."""
        return self._storage.uri

    # -- DataFusion's CatalogProvider protocol --------------------------------
    def schema_names(self) -> set[str]:
        """``{"public"}``."""
        return {SCHEMA_NAME}

    def schema(self, name: str) -> Any:
        """The ``public`` schema provider (None for any other name): made per call, so that no
        reference cycle holds the catalog and the tables it opened (see ``view.table_view._Datasets``)."""
        return _PublicSchema(self) if name == SCHEMA_NAME else None

    # -- tables ------------------------------------------------------------------
    def _uri(self, name: str) -> str:
        return self._storage.child_uri(name)

    def check_name(self, name: str) -> None:
        """Raise unless ``name`` could be a table of this catalog; a plain Lance table is an error.

        Raises:
            InvalidArgumentError: Not a folder name directly under the root.
            NotAMemWalTableError: A Lance table without a MemWAL index.
            ManifestError: A Lance table (a ``_versions`` folder) that cannot be read.
        """
        if not _folder_name(name):
            msg = f"{name!r} is not a table folder name directly under {self.root}"
            raise InvalidArgumentError(msg)
        if self._storage.exists(f"{name}/_versions"):
            found = self._probe(name)
            if isinstance(found, str):
                msg = f"{self._uri(name)} cannot be read as a Lance table: {found}"
                raise ManifestError(msg)
            if not found:
                msg = (
                    f"{self._uri(name)} is a Lance table without a MemWAL index: the memwal catalog serves "
                    "MemWAL tables only (read it with pylance)"
                )
                raise NotAMemWalTableError(msg)

    def _is_memwal(self, name: str, *, fresh: bool = False) -> bool:
        found = self._probe(name, fresh=fresh)
        if isinstance(found, str):
            self.warn_unreadable(name, found, "not readable as a Lance table, not listed")
            return False
        return found

    def warn_unreadable(self, name: str, why: str, what: str = "cannot be read") -> None:
        """Warn once (per reason) that table ``name`` cannot be read."""
        with self._lock:
            first = (name, why) not in self._warned
            self._warned.add((name, why))
        log.log(logging.WARNING if first else logging.DEBUG, "%s: %s: %s", self._uri(name), what, why)

    def base_schema(self, name: str) -> pa.Schema | None:
        """The columns of table ``name``'s base (None: it cannot be read)."""
        try:
            return lance.dataset(self._uri(name), storage_options=self._options or None).schema.remove_metadata()
        except (OSError, ValueError, RuntimeError):
            return None

    def _probe(self, name: str, *, fresh: bool = False) -> bool | str:
        """Whether ``name`` has a MemWAL index, or why it cannot be read (``fresh``: asked again
        of a table that had one: its folder may have been replaced)."""
        if name in self._memwal and not fresh:
            return True  # a query finds out when it reads another table (see ``table``)
        try:
            ds = lance.dataset(self._uri(name), storage_options=self._options or None)
            found = ds.mem_wal_index_details() is not None
        except (OSError, ValueError, RuntimeError) as err:
            return lance_message(err)
        if found:
            self._memwal.add(name)
        else:
            self._memwal.discard(name)
        return found

    def has_table(self, name: str) -> bool:
        """Whether ``name`` is a MemWAL table directly under the root (a probe, no listing)."""
        return _folder_name(name) and self._storage.exists(f"{name}/_versions") and self._is_memwal(name)

    def table_names(self) -> list[str]:
        """Folder names of the MemWAL tables directly under the root, sorted (lists the root)."""
        # a folder name with a backslash cannot be named (``has_table``): not listed either
        names = [n for n, d in self._storage.list_dir("") if d and not n.startswith(".") and "\\" not in n]
        found = [n for n in names if self._storage.exists(f"{n}/_versions") and self._is_memwal(n, fresh=True)]
        with self._lock:
            for gone in set(self._latest) - set(found):
                del self._latest[gone]
        return sorted(found)

    def table(self, name: str) -> Table:
        """The snapshot a query naming ``name`` reads now: the pinned one, or a fresh one.

        A fresh snapshot refreshes the last one this catalog took of the table (reusing
        what did not change).

        Raises:
            TableNotFoundError: No table of that name under the root.
            NotAMemWalTableError: A Lance table without a MemWAL index.
            ManifestError: A Lance table (a ``_versions`` folder) that cannot be read.
        """
        with self._lock:
            pinned = self._pinned.get(name)
            if pinned is not None:
                return pinned
            last = self._latest.get(name)
            try:
                fresh = last.refresh() if last is not None else self._open(name)
            except TableNotFoundError:
                self._latest.pop(name, None)
                raise
            except MemWalError:
                if last is None:
                    raise
                # the folder may hold another table now (replaced, e.g. by a plain Lance table)
                self._latest.pop(name, None)
                self._memwal.discard(name)
                fresh = self._open(name)
            self._latest[name] = fresh
            return fresh

    def _open(self, name: str) -> Table:
        self.check_name(name)
        if not self._storage.exists(f"{name}/_versions"):
            msg = f"no table {name!r} under {self.root}"
            raise TableNotFoundError(msg)
        return open_table(self._uri(name), storage_options=self._options or None, consistency=self._consistency)

    def pin(self, name: str, table: Table | None = None) -> Table:
        """Make every query of ``name`` read one snapshot until :meth:`unpin`.

        Args:
            name: The table's folder name.
            table: The snapshot to serve, e.g. one ``catalog.table("events")`` returned
                earlier; default: a fresh one now.

        Returns:
            The pinned snapshot.

        Example:
            >>> # snapshot = catalog.pin("events"); ...; catalog.unpin("events")
        """
        if table is not None and not _same_place(table.uri, self._uri(name)):
            msg = f"cannot pin {table.uri} as {name!r} of the catalog over {self.root}: it is {self._uri(name)}"
            raise InvalidArgumentError(msg)
        with self._lock:
            self._pinned.pop(name, None)
            table = table if table is not None else self.table(name)
            self._pinned[name] = table
            return table

    def unpin(self, name: str) -> None:
        """Let queries of ``name`` see fresh snapshots again."""
        with self._lock:
            self._pinned.pop(name, None)

    def resolve(self, name: str, catalog_name: str) -> Table | None:
        """The table a SQL function names: ``'events'``, ``'public.events'`` or ``'<catalog>.public.events'``
        (a folder name may hold dots: ``'v1.2'``, ``'memwal.public.v1.2'``)."""
        prefixes = ("", f"{SCHEMA_NAME}.", f"{catalog_name}.{SCHEMA_NAME}.")
        candidates = [name[len(p) :] for p in prefixes if name.startswith(p) and len(name) > len(p)]
        for rest in candidates:
            if self.has_table(rest):
                return self.table(rest)
        for rest in candidates:  # a plain Lance table, or one that cannot be read: say so
            if _folder_name(rest) and self._storage.exists(f"{rest}/_versions"):
                self.check_name(rest)
        return None


def _folder_name(name: str) -> bool:
    """Whether ``name`` can name a folder directly under the root."""
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _same_place(uri: str, other: str) -> bool:
    """Whether two table URIs name one place (local paths through symlinks)."""
    if "://" not in uri and "://" not in other:
        return os.path.realpath(uri) == os.path.realpath(other)
    return uri.rstrip("/") == other.rstrip("/")


def register_catalog(
    ctx: datafusion.SessionContext,
    root: str,
    name: str = "memwal",
    storage_options: dict[str, str] | None = None,
    consistency: Consistency = "strong",
) -> MemWalCatalog:
    """Register every MemWAL table under ``root`` as ``<name>.public.<folder name>`` in ``ctx``.

    Args:
        ctx: The DataFusion session.
        root: A local folder or object-store prefix (``s3://bucket/warehouse``) holding tables.
        name: The catalog name in SQL.
        storage_options: Object-store options, as pylance takes them.
        consistency: ``"strong"`` (default) or ``"eventual"`` for every snapshot it opens.

    Returns:
        The :class:`MemWalCatalog` (pin snapshots, list tables, get the current snapshot).

    Raises:
        InvalidArgumentError: ``ctx`` is not a session, or a bad ``root`` or ``consistency``.

    Tip: ``datafusion.SessionContext(datafusion.SessionConfig().with_default_catalog_and_schema
    ("memwal", "public"))`` lets queries say ``FROM events``.
    """
    if not isinstance(ctx, datafusion.SessionContext):
        msg = f"register_catalog() needs a datafusion.SessionContext, got {type(ctx).__name__}"
        raise InvalidArgumentError(msg)
    if not isinstance(name, str) or not name:
        msg = f"catalog name must be a non-empty string, got {name!r}"
        raise InvalidArgumentError(msg)
    check_datafusion_supported()
    catalog = MemWalCatalog(root, storage_options=storage_options, consistency=consistency)
    ctx.register_catalog_provider(name, cast(Any, catalog))
    add_table_resolver(
        ctx,
        lambda table: catalog.resolve(table, name),
        lambda: [f"{name}.{SCHEMA_NAME}.{table}" for table in catalog.table_names()],
        key=("catalog", name),  # registered again (a notebook cell run twice): replaces this one
    )
    return catalog
