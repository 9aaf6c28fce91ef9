"""The change feed: the net change per key between an older state of a table and a snapshot.

``changes(table, since)`` returns one row per key written since ``since`` (an older
snapshot or its :mod:`change token <memwal_query.change_token>`): ``_change =
"upsert"`` with the key's newest row, or ``_change = "delete"`` with the key columns
(other columns NULL) when the key has no live row now. Applied to the older snapshot's
rows (upserts replace or add, deletes remove), they give exactly the newer snapshot's
rows, whatever puts, deletes, flushes and merges happened in between.

Which keys: every write after the token is in a WAL entry after the position the token
records, and it is now in one of three places, per region:

* the newer snapshot's WAL tail (its entries after that position);
* a generation above the token's highest flushed generation that is not merged yet;
* a generation above it that was merged since: its rows are the rows the merge brought
  into the base (and its tombstones the rows it removed), so reading the generation
  tells what the merge changed without diffing the base.

The candidate keys are those levels' keys; each one's state now comes from a point
lookup (:func:`memwal_query.lookup.lookup`). So the cost follows what was written since
the token, not the table. The result is a superset of the keys whose row changed: a key
written back to its old row, or put and deleted again, appears too (an idempotent
change), and so does a key the token saw only in its WAL tail once that tail is flushed
(the generation above the token's highest is read whole: which of its rows the token saw
is not recorded); a key in no level written since never appears.

When a generation merged since the token was garbage-collected, its WAL entries are
read instead, all of them, as its directory would be (a merger may keep them longer than
the generations); every entry of that generation must still be there (their rows add up to
what the region manifest records: a new writer may reuse the positions of removed
entries), otherwise :class:`~memwal_query.errors.ChangesUnavailableError` names the
table, region and generation. (Comparing base versions cannot replace them: a key written before the
token into a MemTable and deleted after it never reaches the base.) Writes made to the
base table directly (not through MemWAL) are not seen. Rows handed in with
``open_table(..., live=...)`` are not durable: they count as written after any token (an
older snapshot holding such rows has no token, and is given as a Table). A base
``restore()``d to before a merge reads that merge's generations again, as unmerged ones: a
token taken after the merge still answers.

Example:
    >>> import memwal_query as mq, tempfile, pyarrow as pa
    >>> from memwal_query.demo import write_demo_table
    >>> from memwal_write import write_arrow
    >>> uri = write_demo_table(tempfile.mkdtemp() + "/t", base_rows=300, update_rows=50, memtable_rows=20, seed=4)
    >>> before = mq.open_table(uri)
    >>> token = before.change_token
    >>> _ = write_arrow(uri, pa.table({"id": [10_000_001]}), deletes=pa.table({"id": [3]}))
    >>> after = before.refresh()
    >>> got = after.changes(token).select(["id", "_change"]).to_pylist()
    >>> got == [{"id": 3, "_change": "delete"}, {"id": 10_000_001, "_change": "upsert"}]
    True
"""

from __future__ import annotations

import logging

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.change_token import ChangeToken, RegionMark, generation_path, index_anchor, token_of
from memwal_query.errors import ChangesUnavailableError, InvalidArgumentError
from memwal_query.format.layer_restart import restarted
from memwal_query.format.model import FlushedGeneration
from memwal_query.format.nested import as_schema
from memwal_query.format.paths import generation_rel
from memwal_query.format.storage import Storage
from memwal_query.format.wal import SEQ_COLUMN, scan_generations
from memwal_query.lookup import lookup, read_failed
from memwal_query.snapshot.memtables import LIVE_SEQ
from memwal_query.snapshot.model import GenerationSource, RegionSnapshot, Snapshot
from memwal_query.view.table_view import HasView, TableView

__all__ = ["CHANGE_COLUMN", "UPSERT", "DELETE", "changes", "change_schema"]

log = logging.getLogger("memwal_query")

#: Base versions since a token whose operations are read (the newest ones): a MemWAL layer set
#: up anew among them refuses the token (~0.3 ms a version on local disk).
_HISTORY_READ = 1024

#: The column saying what happened to a key.
CHANGE_COLUMN = "_change"
UPSERT = "upsert"
DELETE = "delete"


def _view(source: object) -> TableView | None:
    got = getattr(source, "view", None)
    return got if isinstance(got, TableView) else None


def change_schema(schema: pa.Schema, primary_key: tuple[str, ...] | list[str]) -> pa.Schema:
    """The schema of a change feed: the table's columns (non-key ones nullable) + ``_change``.

    Example:
        >>> s = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.int64(), False)])
        >>> change_schema(s, ["id"]).to_string().splitlines()
        ['id: int64 not null', 'v: int64', '_change: string not null']
    """
    fields = [f if f.name in primary_key else f.with_nullable(True) for f in schema]
    return pa.schema([*fields, pa.field(CHANGE_COLUMN, pa.string(), nullable=False)])


def changes(table: HasView, since: HasView | str) -> pa.Table:
    """The net change per key from ``since`` to ``table`` (see the module docs).

    Args:
        table: The newer snapshot (a :class:`~memwal_query.Table` or its view).
        since: An older snapshot of the same table, or its change token.

    Returns:
        Rows of :func:`change_schema`, sorted by key.

    Raises:
        InvalidArgumentError: ``since`` is not a change token, belongs to another table,
            or is newer than ``table``.
        ChangesUnavailableError: A generation merged since ``since`` and the WAL entries
            written since were both garbage-collected.
    """
    view = _view(table)
    if view is None:
        msg = f"changes() reads a memwal Table, got {type(table).__name__}"
        raise InvalidArgumentError(msg)
    snap = view.snapshot
    if CHANGE_COLUMN in snap.schema.names:
        msg = (
            f"{snap.uri} has a column named {CHANGE_COLUMN!r}, the column the change feed adds to say "
            "what happened to each key: its changes cannot be read (rename the table's column)"
        )
        raise InvalidArgumentError(msg)
    storage = view.storage
    new = token_of(snap, storage)
    extra: list[pa.Table] = []
    older = _view(since)
    if isinstance(since, str):
        old = ChangeToken.decode(since)
    elif older is not None:
        old = token_of(older.snapshot, older.storage)
        extra = _in_process_keys(older.snapshot)
    else:
        msg = f"changes(since=...) takes an older Table of {snap.uri} or a change token, got {type(since).__name__}"
        raise InvalidArgumentError(msg)
    _check(old, new, snap, storage)
    return _net(view, _candidate_keys(view, old) + extra)


def _check(old: ChangeToken, new: ChangeToken, snap: Snapshot, storage: Storage) -> None:
    """Refuse a token of another table, or one newer than the snapshot."""
    uri = snap.uri
    if old.fingerprint != new.fingerprint:
        msg = f"{uri}: the change token belongs to another table (its primary key differs)"
        raise InvalidArgumentError(msg)
    if old.base_version > new.base_version:
        msg = (
            f"{uri}: the change token is newer than this snapshot (base version {old.base_version} > "
            f"{new.base_version}); refresh() the table"
        )
        raise InvalidArgumentError(msg)
    if old.anchor:
        anchor = index_anchor(storage, old.base_version)
        if anchor is not None and anchor != old.anchor:
            msg = (
                f"{uri}: the change token belongs to another table (base version {old.base_version} "
                "holds another MemWAL index)"
            )
            raise InvalidArgumentError(msg)
    if restarted(snap.base, old.base_version, new.base_version, unknown=False, limit=_HISTORY_READ):
        msg = (
            f"{uri}: the table's MemWAL layer was set up anew since the change token (the base overwritten, or "
            "its MemWAL index dropped or created again): what changed is unknown; read the whole table"
        )
        raise ChangesUnavailableError(msg)
    for mark in old.regions:
        now = new.region(mark.region_id)
        if now is None:
            if mark.manifest_version == 0:
                continue
            msg = (
                f"{uri}: the change token is newer than this snapshot (it has region {mark.region_id}, "
                "this snapshot does not); refresh() the table"
            )
            raise InvalidArgumentError(msg)
        region = next(r for r in snap.regions if r.region_id == mark.region_id)  # `now` is its mark
        _check_generation_path(uri, mark, region)
        _check_nothing_left_out(uri, mark, region)
        # A lower merged generation alone is not refused: the base was restore()d to before a
        # merge, whose generations are then read again as unmerged ones, as they were before.
        if now.manifest_version < mark.manifest_version or now.wal_position < mark.wal_position:
            hint = (
                " (the token was taken by a strong snapshot: open this one with consistency='strong')"
                if old.consistency == "strong" and new.consistency == "eventual"
                else "; refresh() the table"
            )
            msg = f"{uri}: region {mark.region_id}: the change token is newer than this snapshot{hint}"
            raise InvalidArgumentError(msg)


def _check_generation_path(uri: str, mark: RegionMark, region: RegionSnapshot) -> None:
    """Refuse a token whose generation directory differs from the one this table lists.

    Region ids are derived from the region spec, so another table with the same spec has
    the same ones; generation directories have random names, and they outlive the base
    versions that ``cleanup_old_versions`` removes.
    """
    if not mark.generation_path:
        return
    path = generation_path(region, mark.flushed_through)
    if path != mark.generation_path:  # pylance keeps every flushed generation listed, same directory
        mine = f"to {path}" if path else "no such generation"
        msg = (
            f"{uri}: the change token belongs to another table (its region {mark.region_id} flushed "
            f"generation {mark.flushed_through} to {mark.generation_path}, this table {mine})"
        )
        raise InvalidArgumentError(msg)


def _check_nothing_left_out(uri: str, mark: RegionMark, region: RegionSnapshot) -> None:
    """Refuse when this snapshot left out (``on_missing_generation="skip"``) a generation the
    token had seen: its rows are missing here, and no level written since names their keys."""
    left_out = [s.generation for s in region.skipped if s.missing]
    seen = [g for g in left_out if g <= mark.flushed_through]
    if seen:
        msg = (
            f"{uri}: region {mark.region_id}: this snapshot left out generation {seen[0]} "
            "(on_missing_generation='skip'), which the change token had seen: the changes since the token "
            "are unknown; read the whole table instead"
        )
        raise ChangesUnavailableError(msg)


def _in_process_keys(snap: Snapshot) -> list[pa.Table]:
    """Keys of rows an older snapshot held in memory only (``live=``): they may be gone now."""
    out = []
    for r in snap.regions:
        if r.memtable is not None:
            m = r.memtable.table
            out.append(m.filter(pc.greater_equal(m.column(SEQ_COLUMN), pa.scalar(LIVE_SEQ, pa.uint64()))))
    return [t.select(list(snap.primary_key)) for t in out if t.num_rows]


def _candidate_keys(view: TableView, old: ChangeToken) -> list[pa.Table]:
    """Keys of every level written after the token (see the module docs)."""
    snap, storage = view.snapshot, view.storage
    pk = list(snap.primary_key)
    parts: list[pa.Table] = []
    for r in snap.regions:
        mark = old.region(r.region_id)
        through = mark.flushed_through if mark is not None else 0
        position = mark.wal_position if mark is not None else 0
        parts += _region_keys(view, r, through, position)
        gone = []
        for fg in _merged_since(r, through):
            got = _merged_generation_keys(storage, r.region_id, fg, pk)
            if got is None:
                gone.append(fg)
            else:
                parts.append(got)
        if gone:
            parts.append(_wal_keys(storage, snap.uri, r.region_id, gone, pk))
    return parts


def _wal_keys(storage: Storage, uri: str, region_id: str, gone: list[FlushedGeneration], pk: list[str]) -> pa.Table:
    """Keys the gone (merged, garbage-collected) generations took from the WAL: all of them,
    as a generation's directory is read whole (a token's WAL position can be past entries of
    a generation it left out, ``on_missing_generation="skip"``: those keys were dropped).

    Every entry of those generations must still be there (their rows add up to what the
    region manifest says each holds): a writer may reuse the positions of removed entries,
    so an entry found at a position proves nothing about the generation it replaced.
    """
    log.info(
        "%s: region %s: generations %s merged since the change token are gone; reading the WAL",
        uri,
        region_id,
        [g.generation for g in gone],
    )
    found = scan_generations(storage, region_id, {g.generation: g.physical_rows for g in gone})
    keys = []
    for g in gone:
        wal = found[g.generation]
        if not wal.complete:
            msg = (
                f"{uri}: region {region_id}: generation {g.generation}, merged since the change token, was "
                f"garbage-collected and so were its WAL entries ({wal.describe()}): the changes since the "
                "token are unknown; read the whole table instead"
            )
            raise ChangesUnavailableError(msg)
        keys += [e.table.select(pk) for e in wal.entries if e.num_rows]
    return pa.concat_tables(keys) if keys else pa.table({k: pa.array([], pa.null()) for k in pk})


def _region_keys(view: TableView, r: RegionSnapshot, through: int, position: int) -> list[pa.Table]:
    """Keys of the region's unmerged generations above ``through`` and WAL rows after ``position``."""
    pk = list(view.snapshot.primary_key)
    out = [_generation_key_columns(view, g, pk) for g in r.generations if g.generation > through]
    if r.memtable is not None:
        m = r.memtable.table
        seq = m.column(SEQ_COLUMN)
        after = pc.greater(pc.shift_right(seq, pa.scalar(32, pa.uint64())), pa.scalar(position, pa.uint64()))
        out.append(m.filter(after).select(pk))
    return out


def _generation_key_columns(view: TableView, g: GenerationSource, pk: list[str]) -> pa.Table:
    """A generation's key columns: those the snapshot's merge read, else read again (an error
    saying to refresh when it was merged and garbage-collected since the snapshot opened)."""
    with view.cache.lock:
        hit = view.cache.generation_keys.get(g.uri)
    if hit is not None:
        return hit.select(pk)
    try:
        return g.dataset.to_table(columns=pk)
    except (OSError, ValueError, RuntimeError) as err:
        raise read_failed(view, err, "changes") from err


def _merged_since(r: RegionSnapshot, through: int) -> list[FlushedGeneration]:
    """Generations above ``through`` that the snapshot's base already holds."""
    if r.manifest is None:
        return []
    return [g for g in r.manifest.flushed_generations if through < g.generation <= r.merged_generation]


def _merged_generation_keys(storage: Storage, region_id: str, fg: FlushedGeneration, pk: list[str]) -> pa.Table | None:
    """The keys of a merged generation; None when it was garbage-collected (or is being)."""
    rel = generation_rel(storage, region_id, fg.path, what=f"flushed generation {fg.generation}")
    if not storage.exists(f"{rel}/_versions"):
        return None
    try:
        ds = lance.dataset(storage.child_uri(rel), storage_options=dict(storage.storage_options) or None)
        return ds.to_table(columns=pk)
    except (OSError, ValueError, RuntimeError) as err:
        log.info("region %s: merged generation %d is unreadable: %s", region_id, fg.generation, err)
        return None


def _net(view: TableView, parts: list[pa.Table]) -> pa.Table:
    """One row per candidate key: its row now (``upsert``) or its key (``delete``)."""
    snap = view.snapshot
    pk = list(snap.primary_key)
    out_schema = change_schema(snap.schema, pk)
    key_schema = pa.schema([snap.schema.field(k) for k in pk])
    if not parts:
        return out_schema.empty_table()
    keys = pa.concat_tables([as_schema(p.select(pk), key_schema) for p in parts])
    keys = keys.group_by(pk, use_threads=False).aggregate([]).select(pk)
    if keys.num_rows == 0:
        return out_schema.empty_table()
    live = lookup(view, keys).rows
    if len(pk) == 1:
        gone = keys.filter(pc.invert(pc.is_in(keys.column(pk[0]), value_set=live.column(pk[0]).combine_chunks())))
    else:
        gone = keys.join(live.select(pk), keys=pk, join_type="left anti")
    n = gone.num_rows
    deletes = pa.table(
        {f.name: gone.column(f.name) if f.name in pk else pa.nulls(n, f.type) for f in snap.schema}
        | {CHANGE_COLUMN: pa.array([DELETE] * n, pa.string())}
    )
    upserts = live.select(snap.schema.names).append_column(
        CHANGE_COLUMN, pa.array([UPSERT] * live.num_rows, pa.string())
    )
    result = pa.concat_tables([as_schema(upserts, out_schema), as_schema(deletes, out_schema)])
    return result.take(pc.sort_indices(result, sort_keys=[(k, "ascending") for k in pk]))
