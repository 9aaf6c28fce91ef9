"""Newer levels written before the base's columns changed.

pylance lets a table with a MemWAL add an all-NULL column and rename or drop columns
(it refuses computed columns and type changes). Rows flushed or logged before such a
change keep the columns they were written with; what ties them to the base's columns is
the Lance field id, which generations and WAL entries keep. A reader matches columns by
field id: a renamed column's old rows take its new name, an added column is NULL in
older rows, a dropped column's data is never read (even where a newer column took its
name).

WAL entries are matched as they are decoded (:func:`memwal_query.conform.conform`). A
flushed generation whose columns are not the base's is read once into an in-memory Lance
dataset with the base's columns, in its own row order (the merge ranks its rows as it
ranks the generation's), so every access path reads it like any other generation; its
own indexes are not carried over (it is searched flat until a merger folds it in).

Example:
    >>> import lance, tempfile, pyarrow as pa
    >>> gen = lance.write_dataset(pa.table({"id": [1], "x": [2.0], "_tombstone": [False]}), tempfile.mkdtemp())
    >>> stale_columns(gen, {0: "id", 1: "x"}), stale_columns(gen, {0: "id", 1: "x2"})
    (False, True)
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence

import lance
import pyarrow as pa

from memwal_query.conform import FIELD_ID, conform
from memwal_query.errors import MemWalCorruptionError
from memwal_query.format.wal import TOMBSTONE

__all__ = ["column_ids", "generation_schema", "stale_columns", "conformed_copy", "conformed_rows", "conformed_uri"]


def column_ids(ds: lance.LanceDataset) -> dict[int, str]:
    """Lance field id -> top-level column name of ``ds``."""
    return {int(f.id()): str(f.name()) for f in ds.lance_schema.fields()}


def generation_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """A generation's columns: the base's plus ``_tombstone`` (tombstones leave non-key columns NULL)."""
    fields = [f if f.name in primary_key else f.with_nullable(True) for f in schema]
    return pa.schema([*fields, pa.field(TOMBSTONE, pa.bool_(), nullable=False)])


def stale_columns(gen: lance.LanceDataset, names: Mapping[int, str]) -> bool:
    """Whether generation ``gen`` was written with other columns than the base's now
    (``names``: the base's field id -> column name): a base column it lacks, or one of its
    columns that the base renamed, or whose name a newer base column took."""
    mine = {i: n for i, n in column_ids(gen).items() if n != TOMBSTONE}
    if any(i not in mine for i in names):
        return True
    taken = set(names.values())
    return any(names.get(i, n if n not in taken else "") != n for i, n in mine.items())


def conformed_uri(uri: str, names: Mapping[int, str]) -> str:
    """The name a generation's conformed copy goes by (one per base column layout)."""
    layout = ",".join(f"{i}:{n}" for i, n in sorted(names.items()))
    return f"{uri}#columns-{hashlib.sha1(layout.encode()).hexdigest()[:12]}"


def conformed_copy(
    gen: lance.LanceDataset, names: Mapping[int, str], schema: pa.Schema, primary_key: Sequence[str], what: str
) -> lance.LanceDataset:
    """Generation ``gen``'s rows with the base's columns, in an in-memory Lance dataset
    (see :func:`conformed_rows`)."""
    rows = conformed_rows(gen, names, schema, primary_key, what)
    return lance.write_dataset(rows, f"memory://memwal-conformed-{uuid.uuid4().hex}")


def conformed_rows(
    gen: lance.LanceDataset, names: Mapping[int, str], schema: pa.Schema, primary_key: Sequence[str], what: str
) -> pa.Table:
    """Generation ``gen``'s rows, in order, with the base's columns (``names``: its field id ->
    column name; ``schema``: its Arrow schema) plus ``_tombstone``.

    Raises:
        MemWalCorruptionError: A column cannot be read as the base's column of its field id.
    """
    ids = {n: i for i, n in column_ids(gen).items()}
    rows = gen.to_table()
    tagged = pa.schema(
        [f.with_metadata({**(f.metadata or {}), FIELD_ID: str(ids[f.name]).encode()}) for f in rows.schema]
    )
    return conform(
        pa.Table.from_arrays(rows.columns, schema=tagged),
        generation_schema(schema, primary_key),
        what=what,
        strict=False,
        error=MemWalCorruptionError,
        field_ids={**names, ids.get(TOMBSTONE, -1): TOMBSTONE},
    )
