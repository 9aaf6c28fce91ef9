"""The description of a snapshot: one JSON-ready value, rendered by many.

:func:`describe_table` is what ``memwal inspect`` prints (text or JSON), what
``Table.explain()`` prints (:func:`memwal_query.explain.render_explain`) and what the
Jupyter HTML (:mod:`memwal_query.display`) shows: the renderers take this value and read
nothing else. It reads what the view already holds (metadata and row counts from Lance
manifests); nothing scans data columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from memwal_query.format.wal import WalTail
from memwal_query.merge import MergeState
from memwal_query.planner.catchup import CatchupPlan
from memwal_query.planner.pruning import RegionValues
from memwal_query.regionspec.spec import lance_field_ids
from memwal_query.snapshot.model import GenerationSource, RegionSnapshot, Snapshot
from memwal_query.snapshot.recovery import REPAIR_HINT
from memwal_query.vector import index_coverage, knn_memory
from memwal_query.vector_base_rows import held_base_text
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = ["describe_table", "describe_predicate", "freshness"]


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


def _spec_text(table: TableView, spec_id: int) -> str:
    """A region spec in one phrase (``spec 1: bucket = bucket(id, 4)``)."""
    if spec_id == 0:
        return "manual region (no spec)"
    for spec in table.snapshot.index.specs:
        if spec.spec_id == spec_id:
            parts = []
            for f in spec.fields:
                names = table.field_names()
                args = [names.get(i, f"field {i}") for i in f.source_ids]
                args += [v for _, v in sorted(f.parameters.items())]
                how = f"{f.transform}({', '.join(args)})" if f.transform else f.expression
                parts.append(f"{f.field_id} = {how}")
            return f"spec {spec_id}: " + "; ".join(parts)
    return f"spec {spec_id} (not in the MemWAL index)"


def _cut_text(snap: Snapshot) -> str:
    if snap.consistent_cut:
        return "all regions as of one instant"
    if snap.consistency == "strong":
        return "writers kept moving: each region as of its own read"
    return "each region as of its own read"


def freshness(source: HasView) -> dict[str, Any]:
    """How current a snapshot is: base version and the highest region manifest version (each
    region numbers its own: the region that has written the most manifests).

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


def _positions(tail: WalTail | None) -> list[int] | None:
    """The first and last WAL position of a tail read; empty for a tail of no entry."""
    if tail is None:
        return None
    return [tail.first_position, tail.last_position] if tail.last_position >= tail.first_position else []


def _generation(g: GenerationSource, merge: MergeState, written: Mapping[int, int]) -> dict[str, Any]:
    """One unmerged generation of a region's description.

    ``rows``: the rows written to it, as its region manifest records them (as for a merged
    generation, and as a generation rebuilt from the WAL counts them); rows of one flush with
    the same key are written all and hidden but the last by the generation's deletion file,
    so they count among the dropped ones.
    """
    rows = max(written.get(g.generation, 0), g.num_rows)
    dropped = int(d.size) if (d := merge.generation_drop.get(g.uri)) is not None else 0
    return {
        "generation": g.generation,
        "rows": rows,
        "dropped": dropped + rows - g.num_rows,
        "rebuilt_from_wal": list(g.wal_positions or ()) if g.rebuilt_from_wal else None,
        "lost_uri": g.lost_uri or None,
        "conformed_from": g.conformed_from or None,
    }


def _memtable(r: RegionSnapshot, merge: MergeState) -> dict[str, Any] | None:
    """The region's MemTable (WAL tail and/or in-process rows), or None when none is read."""
    mt = r.memtable
    if mt is None:
        return None
    kept = merge.memtables.get(r.region_id)
    return {
        "origin": mt.origin,
        "wal_positions": list(mt.wal_positions) if mt.wal_positions else None,
        "generations": list(mt.generations),
        "rows": mt.table.num_rows,
        "live_rows": kept.num_rows if kept is not None else 0,
    }


def _dedup(r: RegionSnapshot, merge: MergeState) -> dict[str, int] | None:
    st = merge.region_stats.get(r.region_id)
    if st is None:
        return None
    return {
        "newer_rows": st.newer_rows,
        "live_keys": st.live_keys,
        "deleted_keys": st.deleted_keys,
        "superseded_rows": st.superseded_rows,
    }


def _region_description(
    table: TableView, r: RegionSnapshot, values: Mapping[str, RegionValues | None], catchup: Mapping[str, Any]
) -> dict[str, Any]:
    """One region of :func:`describe_table`."""
    merge = table.merge
    m = r.manifest
    rv = values.get(r.region_id)
    tail = r.wal_tail
    kept = merge.memtables.get(r.region_id)
    written = {g.generation: g.physical_rows for g in m.flushed_generations} if m is not None else {}
    return {
        "region_id": r.region_id,
        "spec_id": r.spec_id,
        "spec_text": _spec_text(table, r.spec_id),
        "spec_values": dict(rv.values) if rv is not None else None,
        "spec_values_source": rv.source if rv is not None else None,
        "rows_outside_spec_values": rv.outside if rv is not None else 0,
        "manifest_version": m.version if m is not None else None,
        "writer_epoch": m.writer_epoch if m is not None else None,
        "state": None if m is None else ("sealed" if m.sealed else "active"),
        "current_generation": m.current_generation if m is not None else None,
        "merged_generation": r.merged_generation,
        "flushed_generations": sorted(g.generation for g in m.flushed_generations) if m is not None else [],
        "unmerged_generations": [_generation(g, merge, written) for g in r.generations],
        "skipped_generations": [{"generation": s.generation, "reason": s.reason, "lost": s.missing} for s in r.skipped],
        "wal": {
            "replay_after_position": m.replay_after_wal_position if m is not None else None,
            "position_last_seen": m.wal_position_last_seen if m is not None else None,
            "tail_read": tail is not None,
            "tail_entries": len(tail.entries) if tail is not None else None,
            "tail_rows": tail.num_rows if tail is not None else None,
            "tail_positions": _positions(tail),
            "torn_position": tail.torn_position if tail is not None else None,
            "fenced_positions": list(tail.fenced_positions) if tail is not None else None,
        },
        "memtable_rows": r.memtable.table.num_rows if r.memtable is not None else 0,
        "memtable_live_rows": kept.num_rows if kept is not None else 0,
        "memtable": _memtable(r, merge),
        "dedup": _dedup(r, merge),
        "index_catchup": catchup.get(r.region_id, {}),
    }


def _lost_generations(snap: Snapshot) -> dict[str, Any]:
    """Unmerged generations whose directory is lost: rebuilt from the WAL, or left out."""
    return {
        "rebuilt_from_wal": [
            {"region_id": r.region_id, "generation": g.generation}
            for r in snap.regions
            for g in r.generations
            if g.rebuilt_from_wal
        ],
        "left_out": [
            {"region_id": r.region_id, "generation": s.generation} for r in snap.regions for s in r.skipped if s.missing
        ],
        "repair_hint": REPAIR_HINT,
    }


def _generations_of(plan: CatchupPlan) -> list[dict[str, Any]]:
    return [{"region_id": s.generation.region_id, "generation": s.generation.generation} for s in plan.sources]


def _vector_indexes(table: TableView) -> list[dict[str, Any]]:
    """How far each vector column's base index covers the base (``text``: the explain line)."""
    out = []
    for f in table.snapshot.schema:
        if not pa.types.is_fixed_size_list(f.type):
            continue
        cov = index_coverage(table, f.name)
        if cov is None:
            continue
        caught = cov.caught_up_generations
        out.append(
            {
                "column": cov.column,
                "index": cov.index_name,
                "index_type": cov.index_type,
                "indexed_fragments": list(cov.indexed_fragments),
                "unindexed_fragments": list(cov.unindexed_fragments),
                "unindexed_rows": cov.unindexed_rows,
                "caught_up_generations": None
                if caught is None
                else [{"region_id": rid, "generation": g} for rid, g in caught],
                "coverage_source": cov.source,
                "catchup_generations": _generations_of(cov.plan) if cov.plan is not None else [],
                "catchup_used": cov.plan is not None and cov.plan_used,
                "text": cov.describe(),
            }
        )
    return out


def _scalar_index_catchup(table: TableView) -> list[dict[str, Any]]:
    """The Indexed Read Plan of each scalar base index (``text``: the explain line)."""
    out = []
    for idx in table.scalar_indexes():
        plan = table.catchup_plan(idx.name)
        out.append(
            {
                "index": idx.name,
                "index_type": idx.index_type,
                "column": idx.columns[0],
                "unindexed_fragments": list(plan.uncovered_fragments),
                "unindexed_rows": plan.uncovered_rows,
                "catchup_generations": _generations_of(plan),
                "usable": plan.usable,
                "used": table.uses_catchup(plan),
                "reason": plan.reason,
                "text": plan.describe(table.flat_because(plan)),
            }
        )
    return out


def describe_predicate(source: HasView, predicate: str) -> dict[str, Any]:
    """Which regions a SQL predicate reads and which it prunes (``Table.explain(predicate)``).

    Raises:
        InvalidArgumentError: ``predicate`` is not valid SQL over the table.
    """
    plan = view_of(source).plan_sql(predicate)
    return {
        "sql": predicate,
        "regions_read": [{"region_id": rid, "spec_values_unknown": rid in plan.unknown_values} for rid in plan.regions],
        "pruned": [{"region_id": p.region_id, "reason": p.reason} for p in plan.pruned],
        "text": plan.explain(),
    }


def describe_table(source: HasView, *, predicate: str | None = None) -> dict[str, Any]:
    """Everything ``memwal inspect`` and ``Table.explain()`` show, as plain (JSON-ready) Python values.

    Args:
        source: An opened snapshot.
        predicate: Also describe which regions this SQL predicate reads and prunes
            (the ``predicate`` key; None without it).

    Returns:
        A dict: table facts (base version, rows, primary key, consistency and its cut,
        specs, merge time, indexes and their catch-up, lost generations, freshness,
        DataFusion partitions) and one entry per region (spec, manifest, generations
        flushed/merged/skipped, WAL tail, MemTable rows, dedup figures).

    Raises:
        InvalidArgumentError: ``predicate`` is not valid SQL over the table.
    """
    table = view_of(source)
    snap = table.snapshot
    merge = table.merge
    mask = merge.base_mask.status()  # before the live count below decides every fragment
    key_sources = dict(mask.key_sources)
    index = snap.index
    values = table.region_values()
    catchup: dict[str, dict[str, int]] = {}
    for c in index.index_catchup:
        for mg in c.caught_up:
            catchup.setdefault(mg.region_id, {})[c.index_name] = mg.generation
    regions = [_region_description(table, r, values, catchup) for r in snap.regions]
    return {
        "uri": table.uri,
        "base_version": table.snapshot.base_version,
        "base_rows": snap.base.count_rows(),
        "base_fragments": len(snap.base.get_fragments()),
        "base_rows_masked": merge.base_shadowed_rows,
        "base_mask": {
            "fragments": mask.fragments,
            "decided_by_queries": mask.decided,
            "key_sources": key_sources,
            "text": _mask_text(mask.fragments, mask.decided, key_sources),
        },
        "live_rows": table.dataset().count_rows(),
        "primary_key": list(table.snapshot.primary_key),
        "consistency": table.snapshot.consistency,
        "consistency_source": snap.consistency_source,
        "consistent_cut": snap.consistent_cut,
        "cut": _cut_text(snap),
        "merge_seconds": merge.seconds,
        "newer_keys": len(merge.newer),
        "newer_keys_bytes": merge.newer.nbytes + merge.base_mask.lookup_table_bytes,
        "lookup_rows_bytes": table.cache.generation_rows_bytes,
        "cross_region_keys": merge.cross_region_keys,
        "lost_generations": _lost_generations(snap),
        "specs": [{"spec_id": s.spec_id, "fields": _spec_fields(table, s.spec_id)} for s in index.specs],
        "maintained_indexes": list(index.maintained_indexes),
        "maintain_all_indexes": index.maintain_all_indexes,  # then ``maintained_indexes`` is empty
        "index_catchup": [
            {"index": c.index_name, "region_id": mg.region_id, "generation": mg.generation}
            for c in index.index_catchup
            for mg in c.caught_up
        ],
        "index_catchup_progress": [
            {
                "index": c.index_name,
                "caught_up": [{"region_id": mg.region_id, "generation": mg.generation} for mg in c.caught_up],
            }
            for c in index.index_catchup
        ],
        "vector_indexes": _vector_indexes(table),
        "knn_memory": [
            {"column": f.name, "text": _knn_memory_text(table, f.name)}
            for f in snap.schema
            if pa.types.is_fixed_size_list(f.type) and any(r.generations or r.memtable for r in snap.regions)
        ],
        "scalar_index_catchup": _scalar_index_catchup(table),
        "freshness": freshness(table),
        "regions": regions,
        "datafusion_partitions": len(table.dataset().get_fragments()),
        "predicate": describe_predicate(table, predicate) if predicate is not None else None,
    }


def _mask_text(fragments: int, decided: int, sources: dict[str, int]) -> str:
    """How the lazy base mask stood when the table was described (and where its keys came from)."""
    noun = "fragment" if fragments == 1 else "fragments"
    how = f" (keys from {', '.join(f'{k}: {v}' for k, v in sources.items())})" if sources else ""
    if decided == fragments:
        return f"base mask decided for all {fragments} {noun}{how}"
    return (
        f"base mask decided lazily: {decided} of {fragments} base {noun} read by queries so far{how} "
        "(the rest decided for this description's live count)"
    )


def _knn_memory_text(table: HasView, column: str) -> str:
    """What vector search on ``column`` keeps in memory (the plan, and the base's live rows if held)."""
    text = knn_memory(table, column).describe()
    base = held_base_text(view_of(table), column)
    return text if base is None else f"{text}; {base}"
