"""The description of a snapshot: one JSON-ready value, rendered by many.

:func:`describe_table` is what ``memwal inspect`` prints (text or JSON) and what the
Jupyter HTML (:func:`memwal_query.display.table_html`) shows. It reads what the view
already holds (metadata and row counts from Lance manifests); nothing scans data columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memwal_query.merge import MergeState
from memwal_query.planner.pruning import RegionValues
from memwal_query.regionspec.spec import lance_field_ids
from memwal_query.snapshot.model import RegionSnapshot
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = ["describe_table", "freshness"]


def _spec_fields(table: TableView, spec_id: int) -> list[dict[str, Any]]:
    spec = table.snapshot.index.spec(spec_id)
    if spec is None:
        return []
    names = lance_field_ids(table.snapshot.base)
    return [
        {
            "field_id": f.field_id,
            "transform": f.transform,
            "expression": f.expression,
            "source_ids": list(f.source_ids),
            "source_columns": [names.get(i) for i in f.source_ids],
            "result_type": f.result_type,
            "parameters": dict(f.parameters),
        }
        for f in spec.fields
    ]


def freshness(source: HasView) -> dict[str, Any]:
    """How current a snapshot is: base version and the newest region manifest.

    Returns:
        ``{"base_version": int, "newest_region_manifest": {"region_id", "version"} | None}``.
    """
    table = view_of(source)
    newest: dict[str, Any] | None = None
    for r in table.snapshot.regions:
        m = r.manifest
        if m is not None and (newest is None or m.version > newest["version"]):
            newest = {"region_id": r.region_id, "version": m.version}
    return {"base_version": table.snapshot.base_version, "newest_region_manifest": newest}


def _region_description(
    r: RegionSnapshot, merge: MergeState, values: Mapping[str, RegionValues | None], catchup: Mapping[str, Any]
) -> dict[str, Any]:
    """One region of :func:`describe_table`."""
    m = r.manifest
    rv = values.get(r.region_id)
    tail = r.wal_tail
    kept = merge.memtables.get(r.region_id)
    return {
        "region_id": r.region_id,
        "spec_id": r.spec_id,
        "spec_values": dict(rv.values) if rv is not None else None,
        "spec_values_source": rv.source if rv is not None else None,
        "manifest_version": m.version if m is not None else None,
        "writer_epoch": m.writer_epoch if m is not None else None,
        "state": None if m is None else ("sealed" if m.sealed else "active"),
        "current_generation": m.current_generation if m is not None else None,
        "merged_generation": r.merged_generation,
        "flushed_generations": sorted(g.generation for g in m.flushed_generations) if m is not None else [],
        "unmerged_generations": [
            {
                "generation": g.generation,
                "rows": g.num_rows,
                "dropped": int(d.size) if (d := merge.generation_drop.get(g.uri)) is not None else 0,
                "rebuilt_from_wal": list(g.wal_positions or ()) if g.rebuilt_from_wal else None,
            }
            for g in r.generations
        ],
        "skipped_generations": [{"generation": s.generation, "reason": s.reason, "lost": s.missing} for s in r.skipped],
        "wal": {
            "replay_after_position": m.replay_after_wal_position if m is not None else None,
            "position_last_seen": m.wal_position_last_seen if m is not None else None,
            "tail_read": tail is not None,
            "tail_entries": len(tail.entries) if tail is not None else None,
            "tail_rows": tail.num_rows if tail is not None else None,
            "tail_positions": [tail.first_position, tail.last_position] if tail is not None else None,
            "torn_position": tail.torn_position if tail is not None else None,
        },
        "memtable_rows": r.memtable.table.num_rows if r.memtable is not None else 0,
        "memtable_live_rows": kept.num_rows if kept is not None else 0,
        "index_catchup": catchup.get(r.region_id, {}),
    }


def describe_table(source: HasView) -> dict[str, Any]:
    """Everything ``memwal inspect`` shows, as plain (JSON-ready) Python values.

    Args:
        table: An opened snapshot.

    Returns:
        A dict: table facts (base version, rows, primary key, specs, index
        catch-up, freshness) and one entry per region (spec values, manifest,
        generations flushed/merged, WAL tail, MemTable rows).
    """
    table = view_of(source)
    snap = table.snapshot
    merge = table.merge
    index = snap.index
    values = table.region_values()
    catchup: dict[str, dict[str, int]] = {}
    for c in index.index_catchup:
        for mg in c.caught_up:
            catchup.setdefault(mg.region_id, {})[c.index_name] = mg.generation
    regions = [_region_description(r, merge, values, catchup) for r in snap.regions]
    return {
        "uri": table.uri,
        "base_version": table.snapshot.base_version,
        "base_rows": snap.base.count_rows(),
        "base_fragments": len(snap.base.get_fragments()),
        "base_rows_masked": merge.base_shadowed_rows,
        "live_rows": table.dataset().count_rows(),
        "primary_key": list(table.snapshot.primary_key),
        "consistency": table.snapshot.consistency,
        "specs": [{"spec_id": s.spec_id, "fields": _spec_fields(table, s.spec_id)} for s in index.specs],
        "maintained_indexes": list(index.maintained_indexes),
        "index_catchup": [
            {"index": c.index_name, "region_id": mg.region_id, "generation": mg.generation}
            for c in index.index_catchup
            for mg in c.caught_up
        ],
        "freshness": freshness(table),
        "regions": regions,
    }
