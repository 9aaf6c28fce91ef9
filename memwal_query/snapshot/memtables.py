"""MemTable rows: a region's replayed WAL tail and in-process (live) MemTables."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

import numpy as np
import pyarrow as pa

from memwal_query.conform import conform
from memwal_query.errors import ManifestError
from memwal_query.format.nested import with_parent_nulls
from memwal_query.format.wal import GEN_COLUMN, SEQ_COLUMN, TOMBSTONE, WalEntry, WalTail
from memwal_query.snapshot.model import LiveMemTable

__all__ = ["memtable_from_wal", "memtable_from_live", "LIVE_SEQ"]

#: Sequence numbers of in-process (``live=``) rows start here: above every WAL row's.
LIVE_SEQ = 1 << 63


def _conform(table: pa.Table, schema: pa.Schema, what: str, field_ids: pa.Schema | None = None) -> pa.Table:
    return conform(table, schema, what=what, strict=False, error=ManifestError, field_ids=field_ids)


def memtable_from_wal(
    region_id: str,
    tail: WalTail,
    data_schema: pa.Schema,
    field_ids: pa.Schema | None = None,
    done: MutableMapping[tuple[str, int], tuple[bytes, pa.Table]] | None = None,
) -> pa.Table | None:
    """The WAL tail's rows as MemTable rows (``_gen``, ``_seq`` = position << 32 | row).

    ``field_ids``: the base's schema with Lance field ids in its fields' metadata; entry
    columns are matched by the field ids they carry (columns renamed, added or dropped
    since they were logged). ``done``: entries' rows made before, by (region, position),
    reused when made for the same schemas (entries never change)."""
    target = data_schema.serialize().to_pybytes() + (field_ids.serialize().to_pybytes() if field_ids else b"")
    parts: list[pa.Table] = []
    todo: list[WalEntry] = []  # consecutive entries of one schema: conformed at once

    def conform_todo() -> None:
        if not todo:
            return
        where = f"position {todo[0].position}" + (f"-{todo[-1].position}" if len(todo) > 1 else "")
        rows = pa.concat_tables([e.table for e in todo]).combine_chunks() if len(todo) > 1 else todo[0].table
        t = _ranked(with_parent_nulls(_conform(rows, data_schema, f"region {region_id} WAL {where}", field_ids)), todo)
        parts.append(t)
        if done is not None:
            at = 0
            for e in todo:
                done[(region_id, e.position)] = (target, t.slice(at, e.num_rows))
                at += e.num_rows
        todo.clear()

    for e in tail.entries:
        if e.num_rows == 0:
            continue
        known = done.get((region_id, e.position)) if done is not None else None
        if known is not None and known[0] == target:
            conform_todo()
            parts.append(known[1])
        else:
            if todo and not todo[-1].table.schema.equals(e.table.schema, check_metadata=True):
                conform_todo()
            todo.append(e)
    conform_todo()
    if not parts:
        return None
    table = pa.concat_tables(parts)
    return table.combine_chunks() if table.column(0).num_chunks > _MAX_CHUNKS else table


#: Chunks a MemTable's columns may be in before they are laid end to end (one per WAL entry
#: otherwise: every later filter and merge pays per chunk).
_MAX_CHUNKS = 16


def _ranked(t: pa.Table, entries: Sequence[WalEntry]) -> pa.Table:
    """The conformed rows ``t`` of ``entries`` (in order) with their generation and ``_seq``
    (position << 32 | row within the entry)."""
    counts = np.array([e.num_rows for e in entries], dtype=np.int64)
    starts = np.cumsum(counts) - counts
    row = np.arange(int(counts.sum()), dtype=np.uint64) - np.repeat(starts, counts).astype(np.uint64)
    seq = np.repeat(np.array([e.position << 32 for e in entries], dtype=np.uint64), counts) + row
    gen = np.repeat(np.array([e.generation for e in entries], dtype=np.int64), counts)
    return t.append_column(GEN_COLUMN, pa.array(gen)).append_column(SEQ_COLUMN, pa.array(seq))


def memtable_from_live(live: Sequence[LiveMemTable], data_schema: pa.Schema) -> pa.Table | None:
    """In-process MemTable rows, ranked above WAL rows of the same generation."""
    parts = []
    for i, m in enumerate(live):
        batches = list(m.to_batches())
        if not batches:
            continue
        t = pa.Table.from_batches(batches)
        if TOMBSTONE not in t.column_names:
            t = t.append_column(TOMBSTONE, pa.array([False] * t.num_rows, pa.bool_()))
        t = with_parent_nulls(_conform(t, data_schema, f"live MemTable of region {m.region_id}"))
        n = t.num_rows
        # Live rows rank above WAL rows of the same generation: high bit set.
        base = LIVE_SEQ | (i << 40)
        seq = pa.compute.add(pa.array(range(n), pa.uint64()), pa.scalar(base, pa.uint64()))
        t = t.append_column(GEN_COLUMN, pa.array([int(m.generation)] * n, pa.int64()))
        t = t.append_column(SEQ_COLUMN, seq)
        parts.append(t)
    return pa.concat_tables(parts) if parts else None
