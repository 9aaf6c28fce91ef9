"""Newer levels written before the base's columns changed.

pylance lets a table with a MemWAL add an all-NULL column and rename or drop columns,
struct children included (it refuses computed columns and type changes). Rows flushed or
logged before such a change keep the columns they were written with; what ties them to
the base's columns is the Lance field id, which generations and WAL entries keep (every
struct child has its own). A reader matches columns by field id: a renamed column's old
rows take its new name, an added column is NULL in older rows, a dropped column's data is
never read (even where a newer column took its name).

WAL entries are matched as they are decoded (:func:`memwal_query.conform.conform`). A
flushed generation whose columns are not the base's is read once into an in-memory Lance
dataset with the base's columns, in its own row order (the merge ranks its rows as it
ranks the generation's), so every access path reads it like any other generation; its
own indexes are not carried over (it is searched flat until a merger folds it in).

Example:
    >>> import lance, tempfile, pyarrow as pa
    >>> gen = lance.write_dataset(pa.table({"id": [1], "x": [2.0], "_tombstone": [False]}), tempfile.mkdtemp())
    >>> mine = field_paths(gen)
    >>> stale_columns(mine, {0: ("id",), 1: ("x",)}), stale_columns(mine, {0: ("id",), 1: ("x2",)})
    (False, True)
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import lance
import pyarrow as pa

from memwal_query.conform import FIELD_ID, conform, is_list_like, with_item
from memwal_query.errors import MemWalCorruptionError
from memwal_query.format.wal import TOMBSTONE

__all__ = [
    "field_paths",
    "tagged_schema",
    "generation_schema",
    "merged_schema",
    "stale_columns",
    "conformed_copy",
    "conformed_rows",
    "conformed_uri",
]


def field_paths(ds: lance.LanceDataset) -> dict[int, tuple[str, ...]]:
    """Lance field id -> the field's path of names (``("s", "a")`` for child ``a`` of ``s``)."""
    out: dict[int, tuple[str, ...]] = {}

    def walk(fields: Iterable[Any], parent: tuple[str, ...]) -> None:
        for f in fields:
            path = (*parent, str(f.name()))
            out[int(f.id())] = path
            walk(f.children(), path)

    walk(ds.lance_schema.fields(), ())
    return out


def tagged_schema(ds: lance.LanceDataset) -> pa.Schema:
    """``ds``'s Arrow schema with each field's Lance field id (struct children's too) in its metadata."""

    def tag(f: pa.Field, lance_field: Any) -> pa.Field:
        t = f.type
        if pa.types.is_struct(t):
            kids = {str(c.name()): c for c in lance_field.children()}
            t = pa.struct([tag(c, kids[c.name]) if c.name in kids else c for c in t])
        elif is_list_like(t) and len(item := lance_field.children()) == 1:
            t = with_item(t, tag(t.value_field, item[0]))
        return pa.field(f.name, t, f.nullable, {**(f.metadata or {}), FIELD_ID: str(lance_field.id()).encode()})

    top = {str(f.name()): f for f in ds.lance_schema.fields()}
    schema = ds.schema
    return pa.schema([tag(f, top[f.name]) if f.name in top else f for f in schema], metadata=schema.metadata)


def merged_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The merged table's columns: the base's, every non-key column nullable.

    Newer levels declare every non-key column nullable (tombstones leave them NULL), and a
    generation written while a column was nullable keeps its NULLs after the base is
    restored (or opened at a version) where the column is NOT NULL: declaring it NOT NULL
    would let a query engine answer ``IS NULL`` as false without reading it.

    Example:
        >>> import pyarrow as pa
        >>> st = pa.struct([pa.field("a", pa.int64(), False)])
        >>> s = pa.schema([pa.field("id", pa.int64(), False), pa.field("y", pa.int64(), False), ("s", st)])
        >>> m = merged_schema(s, ["id"])
        >>> [f.nullable for f in m], m.field("s").type.field("a").nullable
        ([False, True, True], True)
    """
    fields = [f if f.name in primary_key else _nullable(f) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def _nullable(f: pa.Field) -> pa.Field:
    """``f`` nullable, and so are its struct children and list items, at any depth
    (``alter_columns`` can change theirs)."""
    if pa.types.is_struct(f.type):
        f = f.with_type(pa.struct([_nullable(c) for c in f.type]))
    elif is_list_like(f.type):
        f = f.with_type(with_item(f.type, _nullable(f.type.value_field)))
    return f.with_nullable(True)


def generation_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """A generation's columns: the merged table's (:func:`merged_schema`) plus ``_tombstone``."""
    return pa.schema([*merged_schema(schema, primary_key), pa.field(TOMBSTONE, pa.bool_(), nullable=False)])


def stale_columns(generation: Mapping[int, tuple[str, ...]], paths: Mapping[int, tuple[str, ...]]) -> bool:
    """Whether a generation whose :func:`field_paths` are ``generation`` was written with
    other columns than the base's now (``paths``: the base's): a field it lacks or holds
    under another name, or a field the base dropped from a column it reads (or whose name a
    newer base column took)."""
    mine = {i: p for i, p in generation.items() if p[0] != TOMBSTONE}
    if any(mine.get(i) != p for i, p in paths.items()):
        return True
    taken = set(paths.values())
    return any(i not in paths and (p[:1] in taken or p in taken) for i, p in mine.items())


def conformed_uri(uri: str, paths: Mapping[int, tuple[str, ...]]) -> str:
    """The name a generation's conformed copy goes by (one per base column layout)."""
    layout = ",".join(f"{i}:{'.'.join(p)}" for i, p in sorted(paths.items()))
    return f"{uri}#columns-{hashlib.sha1(layout.encode()).hexdigest()[:12]}"


def conformed_copy(
    gen: lance.LanceDataset, tagged: pa.Schema, schema: pa.Schema, primary_key: Sequence[str], what: str
) -> lance.LanceDataset:
    """Generation ``gen``'s rows with the base's columns, in an in-memory Lance dataset
    (see :func:`conformed_rows`)."""
    rows = conformed_rows(gen, tagged, schema, primary_key, what)
    return lance.write_dataset(rows, f"memory://memwal-conformed-{uuid.uuid4().hex}")


def conformed_rows(
    gen: lance.LanceDataset, tagged: pa.Schema, schema: pa.Schema, primary_key: Sequence[str], what: str
) -> pa.Table:
    """Generation ``gen``'s rows, in order, with the base's columns plus ``_tombstone``.

    Args:
        gen: The generation.
        tagged: The base's :func:`tagged_schema`.
        schema: The base's Arrow schema.
        primary_key: The primary key columns.
        what: Names the generation in errors.

    Raises:
        MemWalCorruptionError: A column cannot be read as the base's column of its field id.
    """
    rows = gen.to_table()
    mine = tagged_schema(gen)
    # the tombstone flag is matched by name: its field id may be a base column's
    fields = [f.remove_metadata() if f.name == TOMBSTONE else f for f in mine]
    data = pa.Table.from_arrays(rows.columns, schema=pa.schema(fields))
    target = generation_schema(schema, primary_key)
    return conform(data, target, what=what, strict=False, error=MemWalCorruptionError, field_ids=tagged)
