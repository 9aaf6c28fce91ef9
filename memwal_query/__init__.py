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

from memwal_query.lance_log import quiet_known_noise

quiet_known_noise()  # before anything imports lance

from memwal_query.catalog import MemWalCatalog, register_catalog  # noqa: E402
from memwal_query.errors import (  # noqa: E402
    ChangesUnavailableError,
    GenerationLostError,
    InvalidArgumentError,
    ManifestError,
    MemWalCorruptionError,
    MemWalError,
    NoPrimaryKeyError,
    NotAMemWalTableError,
    SchemaChangedError,
    StorageError,
    TableNotFoundError,
    UnsupportedVersionError,
)
from memwal_query.planner import catchup as catchup  # noqa: E402 - mq.catchup: the Indexed Read Plan
from memwal_query.snapshot.model import LiveMemTable  # noqa: E402
from memwal_query.table import Table, open_table  # noqa: E402

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
]

__version__ = "0.1.0"
