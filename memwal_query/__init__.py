"""memwal_query: SQL over LSM-merged Lance MemWAL tables through Apache DataFusion.

Example:
    >>> import datafusion, memwal_query as mq
    >>> from memwal_query.demo import write_demo_table
    >>> import tempfile
    >>> uri = tempfile.mkdtemp() + "/events"
    >>> _ = write_demo_table(uri, base_rows=2000, update_rows=300, memtable_rows=200, seed=3)
    >>> table = mq.open_table(uri)
    >>> ctx = datafusion.SessionContext()
    >>> table.register(ctx, "events")
    >>> n = ctx.sql("SELECT count(*) AS n FROM events").to_pydict()["n"][0]
    >>> n == table.count_rows()
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memwal_query.lance_log import quiet_known_noise

quiet_known_noise()  # before anything imports lance

from memwal_query.errors import (  # noqa: E402
    ChangesUnavailableError,
    GenerationLostError,
    InvalidArgumentError,
    ManifestError,
    MemWalCorruptionError,
    MemWalError,
    NoPrimaryKeyError,
    NotAMemWalTableError,
    QueryInterruptedError,
    SchemaChangedError,
    StorageError,
    TableNotFoundError,
    UnsupportedVersionError,
)

if TYPE_CHECKING:
    from memwal_query.catalog import MemWalCatalog, register_catalog
    from memwal_query.planner import catchup as catchup  # mq.catchup: the Indexed Read Plan
    from memwal_query.snapshot.model import LiveMemTable
    from memwal_query.table import Table, open_table

# Imported on first use: ``import memwal_query`` (and the ``memwal`` CLI's --help) does not
# load Lance, DataFusion and pandas (~0.9 s) until a table is opened.
_LAZY = {
    "open_table": "memwal_query.table",
    "Table": "memwal_query.table",
    "register_catalog": "memwal_query.catalog",
    "MemWalCatalog": "memwal_query.catalog",
    "LiveMemTable": "memwal_query.snapshot.model",
}


def __getattr__(name: str) -> Any:
    """The public names above, and submodules (``mq.vector``), imported when first used."""
    where = _LAZY.get(name)
    if where is not None:
        value = getattr(importlib.import_module(where), name)
    elif name == "catchup":
        value = importlib.import_module("memwal_query.planner.catchup")
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Every public name, loaded or not (tab completion in Jupyter lists these)."""
    return sorted({*globals(), *__all__, "catchup"})


__all__ = [
    "open_table",
    "Table",
    "register_catalog",
    "MemWalCatalog",
    "LiveMemTable",
    "MemWalError",
    "TableNotFoundError",
    "NotAMemWalTableError",
    "NoPrimaryKeyError",
    "ManifestError",
    "MemWalCorruptionError",
    "GenerationLostError",
    "ChangesUnavailableError",
    "UnsupportedVersionError",
    "SchemaChangedError",
    "InvalidArgumentError",
    "StorageError",
    "QueryInterruptedError",
]

__version__ = "0.1.0"
