"""The table's state as Arrow tables: what ``memwal inspect`` shows, one row per thing.

The SQL table functions ``memwal_regions``, ``memwal_generations``, ``memwal_wal`` and
``memwal_history`` (:mod:`memwal_query.sql_functions`) return these, so the state of a
table can be joined, filtered and plotted like any table. The region and generation
tables are built from :func:`memwal_query.describe.describe_table`'s description (what
``memwal inspect --json`` prints: nothing is read again), plus the row counts the
region manifests record for merged generations; the WAL table lists the entries of the
snapshot's WAL tails; the history table the base table's Lance versions.

Example:
    >>> import memwal_query as mq, tempfile
    >>> from memwal_query.demo import write_demo_table
    >>> uri = write_demo_table(tempfile.mkdtemp() + "/t", base_rows=300, update_rows=60, memtable_rows=20, seed=5)
    >>> t = mq.open_table(uri)
    >>> t.sql("SELECT count(*) AS n FROM memwal_regions('t')").to_pydict()["n"][0] == len(t.region_ids)
    True
    >>> q = "SELECT DISTINCT status FROM memwal_generations('t') ORDER BY status"
    >>> t.sql(q).to_pydict()["status"]
    ['merged', 'unmerged']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import MemWalError, StorageError
from memwal_query.format.lance_open import REFRESH_AND_RETRY, lance_message
from memwal_query.format.wal import TOMBSTONE, WalTail
from memwal_query.planner.base_history import operations as base_operations
from memwal_query.snapshot.model import RegionSnapshot, Snapshot

__all__ = [
    "REGIONS_SCHEMA",
    "GENERATIONS_SCHEMA",
    "WAL_SCHEMA",
    "HISTORY_SCHEMA",
    "regions_table",
    "generations_table",
    "wal_table",
    "history_table",
]

REGIONS_SCHEMA = pa.schema(
    [
        ("region_id", pa.string()),
        ("spec_id", pa.int64()),
        ("spec_values", pa.string()),  # JSON object of field id -> value; NULL = unknown
        ("spec_values_source", pa.string()),
        ("state", pa.string()),
        ("manifest_version", pa.int64()),
        ("writer_epoch", pa.int64()),
        ("current_generation", pa.int64()),
        ("merged_generation", pa.int64()),
        ("flushed_generations", pa.int64()),
        ("unmerged_generations", pa.int64()),
        ("wal_replay_after", pa.int64()),
        ("wal_position_last_seen", pa.int64()),
        ("wal_tail_entries", pa.int64()),
        ("wal_tail_rows", pa.int64()),
        ("memtable_rows", pa.int64()),
        ("memtable_live_rows", pa.int64()),
        ("index_catchup", pa.string()),  # JSON object of index name -> caught-up generation
    ]
)
GENERATIONS_SCHEMA = pa.schema(
    [
        ("region_id", pa.string()),
        ("generation", pa.int64()),
        ("status", pa.string()),  # merged | unmerged | rebuilt | skipped | lost
        ("rows", pa.int64()),
        ("superseded_rows", pa.int64()),
        ("live_rows", pa.int64()),
        ("path", pa.string()),
        ("note", pa.string()),
    ]
)
WAL_SCHEMA = pa.schema(
    [
        ("region_id", pa.string()),
        ("position", pa.int64()),
        ("status", pa.string()),  # replayed | flushed-or-fence | fenced | torn
        ("generation", pa.int64()),
        ("writer_epoch", pa.int64()),
        ("rows", pa.int64()),
        ("deletes", pa.int64()),
    ]
)
HISTORY_SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),  # pylance gives local time: an instant here
        ("operation", pa.string()),
        ("rows", pa.int64()),
        ("fragments", pa.int64()),
        ("deleted_rows", pa.int64()),
        ("is_snapshot", pa.bool_()),
    ]
)


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(dict(value), sort_keys=True, default=str)


def regions_table(description: Mapping[str, Any]) -> pa.Table:
    """One row per region (:data:`REGIONS_SCHEMA`) from a ``describe_table`` description.

    Example:
        >>> regions_table({"regions": []}).num_rows
        0
    """
    rows = []
    for r in description["regions"]:
        wal = r["wal"]
        rows.append(
            {
                "region_id": r["region_id"],
                "spec_id": r["spec_id"],
                "spec_values": _json(r["spec_values"]),
                "spec_values_source": r["spec_values_source"],
                "state": r["state"],
                "manifest_version": r["manifest_version"],
                "writer_epoch": r["writer_epoch"],
                "current_generation": r["current_generation"],
                "merged_generation": r["merged_generation"],
                "flushed_generations": len(r["flushed_generations"]),
                "unmerged_generations": len(r["unmerged_generations"]),
                "wal_replay_after": wal["replay_after_position"],
                "wal_position_last_seen": wal["position_last_seen"],
                "wal_tail_entries": wal["tail_entries"],
                "wal_tail_rows": wal["tail_rows"],
                "memtable_rows": r["memtable_rows"],
                "memtable_live_rows": r["memtable_live_rows"],
                "index_catchup": _json(r["index_catchup"]),
            }
        )
    return pa.Table.from_pylist(rows, schema=REGIONS_SCHEMA)


def _region_generations(described: Mapping[str, Any], region: RegionSnapshot | None) -> list[dict[str, Any]]:
    flushed = {g.generation: g for g in region.manifest.flushed_generations} if region and region.manifest else {}
    unmerged = {g["generation"]: g for g in described["unmerged_generations"]}
    skipped = {s["generation"]: s for s in described["skipped_generations"]}
    out = []
    for gen in sorted(set(described["flushed_generations"]) | set(unmerged) | set(skipped)):
        fg = flushed.get(gen)
        row: dict[str, Any] = {
            "region_id": described["region_id"],
            "generation": gen,
            "rows": fg.physical_rows if fg is not None else None,
            "path": fg.path if fg is not None else None,
            "superseded_rows": None,
            "live_rows": None,
            "note": None,
        }
        if gen in unmerged:
            u = unmerged[gen]
            rebuilt = u["rebuilt_from_wal"]
            note = f"rebuilt from WAL positions {rebuilt[0]}..{rebuilt[1]}" if rebuilt else None
            row |= {"rows": u["rows"], "superseded_rows": u["dropped"], "live_rows": u["rows"] - u["dropped"]}
            row |= {"status": "rebuilt" if rebuilt else "unmerged", "note": note}
        elif gen in skipped:
            s = skipped[gen]
            merged = gen <= described["merged_generation"]
            row |= {"status": "merged" if merged else ("lost" if s["lost"] else "skipped"), "note": s["reason"]}
        else:
            row["status"] = "merged" if gen <= described["merged_generation"] else "unmerged"
        out.append(row)
    return out


def generations_table(description: Mapping[str, Any], snapshot: Snapshot) -> pa.Table:
    """One row per flushed generation of every region (:data:`GENERATIONS_SCHEMA`).

    ``rows`` of a merged generation is the count its region manifest records; for
    unmerged ones ``superseded_rows`` are rows a newer version or a tombstone hides in
    this snapshot and ``live_rows`` the rest.
    """
    by_id = {r.region_id: r for r in snapshot.regions}
    rows = [g for d in description["regions"] for g in _region_generations(d, by_id.get(d["region_id"]))]
    return pa.Table.from_pylist(rows, schema=GENERATIONS_SCHEMA)


def _tail_rows(region_id: str, tail: WalTail) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for e in tail.entries:
        deletes = 0
        if e.num_rows and TOMBSTONE in e.table.column_names:
            deletes = int(pc.sum(pc.fill_null(e.table.column(TOMBSTONE), False).cast(pa.int64())).as_py() or 0)
        rows.append(
            {
                "region_id": region_id,
                "position": e.position,
                "status": "replayed",
                "generation": e.generation,
                "writer_epoch": e.writer_epoch,
                "rows": e.num_rows,
                "deletes": deletes,
            }
        )
    for status, positions in (("flushed-or-fence", tail.skipped_positions), ("fenced", tail.fenced_positions)):
        rows += [{"region_id": region_id, "position": p, "status": status} for p in positions]
    if tail.torn_position is not None:
        rows.append({"region_id": region_id, "position": tail.torn_position, "status": "torn"})
    return sorted(rows, key=lambda r: r["position"])


def wal_table(snapshot: Snapshot) -> pa.Table:
    """One row per WAL entry a strong snapshot read past its region's flushed generations.

    ``status``: ``replayed`` (its rows are in the MemTable), ``flushed-or-fence`` (a
    fence entry, or rows a flushed generation already holds), ``fenced`` (written by a
    writer that had lost the region: ignored) or ``torn`` (an undecodable last entry,
    not committed). Eventual snapshots read no WAL: no rows.
    """
    rows = [row for r in snapshot.regions if r.wal_tail is not None for row in _tail_rows(r.region_id, r.wal_tail)]
    return pa.Table.from_pylist(rows, schema=WAL_SCHEMA)


def _metadata_int(meta: Mapping[str, str], key: str) -> int | None:
    value = meta.get(key)
    return int(value) if value is not None and value.isdigit() else None


def history_table(snapshot: Snapshot) -> pa.Table:
    """The base table's Lance versions up to the snapshot's (:data:`HISTORY_SCHEMA`).

    ``operation`` comes from each version's transaction file (``Update`` for a merge's
    upserts, ``Delete``, ``Append``, ``Rewrite`` for compaction ...; NULL when it was
    cleaned up).
    """
    base = snapshot.base
    try:
        listed = base.versions()
    except (OSError, ValueError, RuntimeError) as err:
        msg = f"memwal_history: cannot list the versions of {snapshot.uri}: {lance_message(err)}"
        raise StorageError(msg) from err
    versions: Sequence[Mapping[str, Any]] = [v for v in listed if v["version"] <= snapshot.base_version]
    if not versions:  # not even the snapshot's own: its files are gone
        msg = (
            f"memwal_history: {snapshot.uri} lists no version up to {snapshot.base_version}: the table was "
            f"deleted or moved, or its versions cleaned up, after this snapshot was opened; {REFRESH_AND_RETRY}"
        )
        raise MemWalError(msg)
    operations = {v: op.name for v, op in base_operations(base, snapshot.base_version, len(versions)).items()}
    rows = [
        {
            "version": v["version"],
            "timestamp": _instant(v["timestamp"]),
            "operation": operations.get(v["version"]),
            "rows": _metadata_int(v.get("metadata") or {}, "total_rows"),
            "fragments": _metadata_int(v.get("metadata") or {}, "total_fragments"),
            "deleted_rows": _metadata_int(v.get("metadata") or {}, "total_deletion_file_rows"),
            "is_snapshot": v["version"] == snapshot.base_version,
        }
        for v in versions
    ]
    return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)


def _instant(timestamp: object) -> datetime | None:
    """A version's commit time as an instant (UTC): pylance gives the reader's local time, naive.

    Example:
        >>> _instant(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)).isoformat()
        '2026-01-02T03:04:05+00:00'
    """
    if not isinstance(timestamp, datetime):
        return None
    return timestamp.astimezone(timezone.utc)  # a naive one is taken as local time
