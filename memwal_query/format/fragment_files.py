"""A Lance fragment's flat columns read straight from its data file, deleted rows left out.

Lance's fragment scanner decodes a 1M-row ``int64`` key column in ~30 ms on the 2-core
machine we measure on; the data file's own reader (``lance.file.LanceFileReader``) in
~8 ms, plus the deletion file decoded here (:mod:`memwal_query.format.deletions`).
:func:`read_columns` takes that route when it can prove it reads the same rows
Lance would, and returns ``None`` otherwise (the caller asks Lance):

* every column asked is a top-level non-nested field stored in one data file of the
  fragment, found there by its Lance field id (the file keeps the name a column had when
  it was written), of the same type (a file of another base, or a layout the ids cannot
  be matched against, falls back);
* the file holds ``physical_rows`` rows;
* the deletion file decodes to exactly ``num_deleted_rows`` offsets below that.

A file Lance cannot read raises the same way through either route: errors of the
direct read are not reported, the caller's Lance read reports them.

Example:
    >>> import lance, tempfile, pyarrow as pa
    >>> from memwal_query.format.storage import Storage
    >>> d = tempfile.mkdtemp()
    >>> ds = lance.write_dataset(pa.table({"id": [5, 6, 7], "x": ["a", "b", "c"]}), d)
    >>> _ = ds.delete("id = 6")
    >>> ds = lance.dataset(d)
    >>> frag = ds.get_fragments()[0]
    >>> t = read_live_columns(Storage.open(d), frag.metadata, {"id": 0, "x": 1}, ["id"])
    >>> t.column("id").to_pylist(), t.column("_rowaddr").to_pylist()
    ([5, 7], [0, 2])
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from lance.file import LanceFileReader

from memwal_query.errors import MemWalError, is_panic
from memwal_query.format.deletions import fragment_deletions
from memwal_query.format.storage import Storage

__all__ = ["FragmentColumns", "column_file", "read_columns", "deleted_rows", "read_live_columns"]

log = logging.getLogger(__name__)

_BATCH = 1 << 20


def _leaves(t: pa.DataType) -> int:
    """How many field ids a data file lists for a column of type ``t`` (measured on pylance
    14.0.2: a list or map lists its values' ids, a struct its children's, a leaf its own)."""
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _leaves(t.value_type)
    return 1


def _file_positions(schema: pa.Schema, fields: Sequence[int]) -> dict[int, int] | None:
    """Field id -> top-level position in the file's schema, for leaf top-level columns."""
    out: dict[int, int] = {}
    at = 0
    for pos, f in enumerate(schema):
        n = _leaves(f.type)
        if n == 1 and at < len(fields):
            out[int(fields[at])] = pos
        at += n
    return out if at == len(fields) else None


def _data_file(meta: Any, ids: Sequence[int]) -> Any | None:
    """The one data file of the fragment holding fields ``ids``, if its ``i``-th listed field is
    its ``i``-th column (what :func:`_file_positions` relies on) and it lives in this dataset."""
    files = [f for f in meta.files if all(i in f.fields for i in ids)]
    if len(files) != 1 or getattr(files[0], "base_id", None) is not None:
        return None
    f = files[0]
    return f if list(f.column_indices) == list(range(len(f.fields))) else None


def _live(storage: Storage, meta: Any, rows: int) -> np.ndarray | None:
    """Which of the fragment's rows are not deleted (None: none is)."""
    if meta.deletion_file is None:
        return None
    keep = np.ones(rows, dtype=bool)
    keep[_deleted(storage, meta, rows).astype(np.int64)] = False
    return keep


def _deleted(storage: Storage, meta: Any, rows: int) -> np.ndarray:
    """The sorted offsets of the fragment's deleted rows (of ``rows`` stored)."""
    d = meta.deletion_file
    if d is None:
        return np.empty(0, dtype=np.uint64)
    if getattr(d, "base_id", None) is not None:
        raise _Fallback
    gone = fragment_deletions(storage, meta)
    if gone is None:
        raise _Fallback
    if gone.size != int(d.num_deleted_rows) or (gone.size and int(gone[-1]) >= rows):
        raise _Fallback
    return gone


class _Fallback(Exception):
    """The direct read cannot prove it matches Lance: ask Lance."""


@dataclass(frozen=True)
class FragmentColumns:
    """Columns of every row a fragment's data file stores, and which rows are not deleted.

    Attributes:
        table: The columns, one row per stored row (``physical_rows``), in row order.
        live: Boolean per row, False where the deletion file deletes it (None: no deletions).
        fragment_id: The fragment's id (row address ``fragment_id << 32 | offset``).
    """

    table: pa.Table
    live: np.ndarray | None
    fragment_id: int

    def addresses(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Row addresses of row offsets ``rows`` (default: every live row), as uint64."""
        if rows is None:
            rows = np.arange(self.table.num_rows) if self.live is None else np.flatnonzero(self.live)
        out = np.asarray(rows, dtype=np.int64).view(np.uint64)
        return out + (np.uint64(self.fragment_id) << np.uint64(32))

    def live_table(self) -> pa.Table:
        """The live rows and their ``_rowaddr`` (what Lance's scanner returns with row addresses)."""
        t = self.table if self.live is None else self.table.filter(pa.array(self.live))
        return t.append_column("_rowaddr", pa.array(self.addresses()))


@dataclass(frozen=True)
class _Plan:
    """A direct read proven to see Lance's rows: the file's reader, names and row count."""

    reader: LanceFileReader
    columns: list[str]
    rows: int
    live: np.ndarray | None
    fragment_id: int


def _plan(
    storage: Storage, meta: Any, field_ids: Mapping[str, int], columns: Sequence[str], expect: pa.Schema | None
) -> _Plan | None:
    ids = [field_ids[c] for c in columns]
    f = _data_file(meta, ids) if ids else None
    if f is None:
        return None
    uri = storage.child_uri(f"data/{f.path}")
    options = storage.storage_options or None
    try:  # one open when the file keeps the columns' names (its metadata covers every column)
        named = LanceFileReader(uri, storage_options=options, columns=list(columns))
        info = named.metadata()
        reader: LanceFileReader | None = named
    except OSError:  # a name the file does not have (renamed since): open it for its schema
        reader, info = None, LanceFileReader(uri, storage_options=options).metadata()
    schema, rows = info.schema, int(meta.physical_rows)
    where = _file_positions(schema, list(f.fields))
    if where is None or any(i not in where for i in ids) or int(info.num_rows) != rows or rows >= 1 << 32:
        return None
    stored = [schema.field(where[i]) for i in ids]  # a renamed column keeps its old name here
    if expect is not None and any(s.type != expect.field(c).type for s, c in zip(stored, columns, strict=True)):
        return None
    names = [s.name for s in stored]
    if reader is None or names != list(columns):  # the names are another column's: read by the stored ones
        reader = LanceFileReader(uri, storage_options=options, columns=names)
    return _Plan(reader, list(columns), rows, _live(storage, meta, rows), int(meta.id))


def read_columns(
    storage: Storage, meta: Any, field_ids: Mapping[str, int], columns: Sequence[str], expect: pa.Schema | None = None
) -> FragmentColumns | None:
    """Flat ``columns`` of one fragment, every stored row, and its deleted rows; or None.

    Args:
        storage: The dataset's storage (its root holds ``data/`` and ``_deletions/``).
        meta: The fragment's ``lance.fragment.FragmentMetadata``.
        field_ids: Column name -> Lance field id in the dataset's schema.
        columns: The columns to read.
        expect: The dataset's schema: a file whose column types differ falls back.

    Returns:
        The :class:`FragmentColumns`, or None when this route cannot prove it reads what
        Lance would.
    """

    try:
        plan = _plan(storage, meta, field_ids, columns, expect)
        if plan is None:
            return None
        t = plan.reader.read_all(batch_size=_BATCH).to_table()
        if t.num_rows != plan.rows:
            return None
        return FragmentColumns(t.rename_columns(plan.columns), plan.live, plan.fragment_id)
    except (_Fallback, MemWalError, KeyError, OSError, ValueError, RuntimeError, pa.ArrowException) as err:
        log.debug("fragment %s of %s: direct read failed (%s); Lance reads it", meta.id, storage.uri, err)
        return None
    except BaseException as err:
        if not is_panic(err):
            raise
        return None


def read_live_columns(
    storage: Storage, meta: Any, field_ids: Mapping[str, int], columns: Sequence[str], expect: pa.Schema | None = None
) -> pa.Table | None:
    """The live rows of flat ``columns`` of one fragment and their ``_rowaddr``, or None
    (arguments as :func:`read_columns`)."""
    got = read_columns(storage, meta, field_ids, columns, expect)
    return got.live_table() if got is not None else None


def column_file(storage: Storage, meta: Any, field_id: int) -> str | None:
    """The local path of the one data file of a fragment holding field ``field_id`` as a
    top-level column (what :func:`read_columns` reads it from); None otherwise."""
    f = _data_file(meta, [field_id])
    return storage.local_path(f"data/{f.path}") if f is not None else None


def deleted_rows(storage: Storage, meta: Any) -> np.ndarray | None:
    """The sorted offsets of a fragment's deleted rows (empty: none is), as Lance reads its
    deletion file; None when that cannot be proven (a file elsewhere, missing, or unlike its manifest entry)."""
    try:
        return _deleted(storage, meta, int(meta.physical_rows))
    except (_Fallback, MemWalError, OSError, ValueError, RuntimeError, pa.ArrowException) as err:
        log.debug("fragment %s of %s: deletions not read directly (%s)", meta.id, storage.uri, err)
        return None
