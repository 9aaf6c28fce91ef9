"""The one exception hierarchy of memwal.

Every error a user can see derives from :class:`MemWalError` and names the table,
region or file involved, so a message read in a log says where to look.

Example:
    >>> from memwal_query.errors import MemWalError, TableNotFoundError
    >>> issubclass(TableNotFoundError, MemWalError)
    True
"""

from __future__ import annotations

__all__ = [
    "MemWalError",
    "TableNotFoundError",
    "NotAMemWalTableError",
    "NoPrimaryKeyError",
    "ManifestError",
    "MemWalCorruptionError",
    "GenerationLostError",
    "UnsupportedVersionError",
    "InvalidArgumentError",
    "StorageError",
]


class MemWalError(Exception):
    """Base class of every error raised by memwal."""


class TableNotFoundError(MemWalError):
    """No Lance table exists at the given URI."""


class NotAMemWalTableError(MemWalError):
    """The Lance table exists but has no MemWAL index (``initialize_mem_wal`` never ran)."""


class NoPrimaryKeyError(MemWalError):
    """The table schema declares no primary key, so rows cannot be merged by key."""


class ManifestError(MemWalError):
    """A manifest (Lance manifest or region manifest) cannot be read or decoded."""


class MemWalCorruptionError(MemWalError):
    """Stored MemWAL data is damaged in a way that cannot be read past safely."""


class GenerationLostError(MemWalCorruptionError):
    """A flushed generation that is not merged yet cannot be read and its rows cannot be served.

    Its directory is missing, unreadable or partly deleted, the base table does not hold
    its rows (the region's merged generation is below it), and either the region's WAL
    does not hold every entry needed to rebuild it or ``on_missing_generation="error"``
    forbade the rebuild.
    """


class UnsupportedVersionError(MemWalError):
    """An installed dependency has a version this code cannot work with."""


class InvalidArgumentError(MemWalError, ValueError):
    """A caller passed an argument that cannot be used (bad region id, option, column)."""


class StorageError(MemWalError, OSError):
    """The storage layer failed (bad storage options, unreachable object store)."""
