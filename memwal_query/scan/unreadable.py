"""A table DataFusion can list but not read: its scans raise the error that opening it raised.

A catalog lists every MemWAL table under its root, and DataFusion's ``information_schema``
(``SHOW TABLES``, ``information_schema.columns``) asks the catalog for each table it lists.
A table whose newer levels cannot be read (a damaged region manifest, say) would fail that
listing for every table of the session; served as an :class:`UnreadableDataset` with its
base's columns, it is listed, and a query reading it fails with the reason.

Example:
    >>> import pyarrow as pa
    >>> from memwal_query.errors import ManifestError
    >>> ds = UnreadableDataset(pa.schema([("id", pa.int64())]), ManifestError("t: region r: damaged"))
    >>> ds.schema.names
    ['id']
    >>> ds.get_fragments()
    Traceback (most recent call last):
    ...
    memwal_query.errors.ManifestError: t: region r: damaged
"""

from __future__ import annotations

from typing import NoReturn

import pyarrow as pa
import pyarrow.dataset as pds

from memwal_query.engine_errors import raised_in_engine
from memwal_query.errors import MemWalError

__all__ = ["UnreadableDataset"]


class UnreadableDataset(pds.Dataset):  # type: ignore[misc]
    """A dataset of ``schema`` whose every read raises ``error``."""

    def __init__(self, schema: pa.Schema, error: MemWalError) -> None:
        self._schema = schema
        self.error = error

    @property
    def schema(self) -> pa.Schema:
        """The table's columns (its base's)."""
        return self._schema

    def _fail(self) -> NoReturn:
        raise raised_in_engine(self.error)

    def get_fragments(self, filter: object = None) -> NoReturn:  # noqa: A002 - pyarrow's name
        """Raises the error."""
        self._fail()

    def scanner(self, *_: object, **__: object) -> NoReturn:
        """Raises the error."""
        self._fail()

    def count_rows(self, *_: object, **__: object) -> NoReturn:
        """Raises the error."""
        self._fail()

    def to_table(self, *_: object, **__: object) -> NoReturn:
        """Raises the error."""
        self._fail()
