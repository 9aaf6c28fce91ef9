"""Readable text for :meth:`memwal_query.Table.explain`."""

from __future__ import annotations

import pyarrow as pa

from memwal_query.snapshot.model import GenerationSource, Snapshot
from memwal_query.snapshot.recovery import REPAIR_HINT
from memwal_query.text import counted
from memwal_query.vector import index_coverage
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = ["explain_table"]


def _spec_text(table: TableView, spec_id: int) -> str:
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


def explain_table(source: HasView) -> str:
    """Describe a snapshot: base, regions, sources kept and skipped, dedup figures."""
    table = view_of(source)
    snap = table.snapshot
    merge = table.merge
    ds = table.dataset()
    base_rows = snap.base.count_rows()
    lines = [
        f"memwal table {snap.uri}",
        f"  base version {snap.base_version}: {counted(base_rows, 'row')} in "
        f"{counted(len(snap.base.get_fragments()), 'fragment')}; "
        f"{counted(merge.base_shadowed_rows, 'row')} masked by newer versions",
        f"  primary key: {', '.join(snap.primary_key)}",
        f"  consistency: {snap.consistency} ({snap.consistency_source}; {_cut_text(snap)})",
        f"  regions: {len(snap.regions)}; merge computed in {merge.seconds * 1000:.1f} ms",
    ]
    lost = _lost_text(snap)
    if lost:
        lines.append(f"  WARNING: {lost}")
    if merge.cross_region_keys:
        lines.append(f"  WARNING: {merge.cross_region_keys} keys have rows in more than one region")
    if snap.index.maintained_indexes:
        lines.append(f"  maintained indexes: {', '.join(snap.index.maintained_indexes)}")
    for c in snap.index.index_catchup:
        caught = ", ".join(f"{m.region_id[:8]}:{m.generation}" for m in c.caught_up) or "none"
        lines.append(f"  index catch-up {c.index_name}: caught up with generations {caught}")
    for f in snap.schema:
        if pa.types.is_fixed_size_list(f.type):
            cov = index_coverage(table, f.name)
            if cov is not None:
                lines.append(f"  {cov.describe()}")
    for idx in table.scalar_indexes():
        lines.append(f"  {table.catchup_plan(idx.name).describe()} [{idx.index_type} on {idx.columns[0]}]")
    for r in snap.regions:
        m = r.manifest
        head = f"  region {r.region_id}"
        if m is None:
            lines.append(f"{head}: no region manifest (in-process rows only)")
        else:
            state = "sealed" if m.sealed else "active"
            lines.append(
                f"{head} [{_spec_text(table, m.spec_id)}] manifest v{m.version}, epoch {m.writer_epoch}, "
                f"{state}, current generation {m.current_generation}, merged generation {r.merged_generation}"
            )
        for g in r.generations:
            drop = merge.generation_drop.get(g.uri)
            dropped = int(drop.size) if drop is not None else 0
            lines.append(
                f"    generation {g.generation}: {counted(g.num_rows, 'row')}, {dropped:,} superseded/deleted dropped"
            )
            if g.rebuilt_from_wal:
                lines.append(f"      {_rebuilt_text(g)}")
        for s in r.skipped:
            lines.append(f"    generation {s.generation}: skipped: {s.reason}")
        if r.memtable is not None:
            mt = r.memtable
            kept = merge.memtables.get(r.region_id)
            pos = f", WAL positions {mt.wal_positions[0]}..{mt.wal_positions[1]}" if mt.wal_positions else ""
            lines.append(
                f"    memtable ({mt.origin}{pos}): {counted(mt.table.num_rows, 'row')}, "
                f"{kept.num_rows if kept is not None else 0:,} live after dedup"
            )
        elif snap.consistency == "eventual":
            lines.append("    memtable: not read (eventual consistency)")
        if r.wal_tail is not None and r.wal_tail.fenced_positions:
            lines.append(f"    WAL positions {list(r.wal_tail.fenced_positions)} ignored: written by a fenced writer")
        if r.wal_tail is not None and r.wal_tail.torn_position is not None:
            lines.append(f"    WAL position {r.wal_tail.torn_position} torn: treated as not committed")
        st = merge.region_stats.get(r.region_id)
        if st is not None:
            lines.append(
                f"    dedup: {counted(st.newer_rows, 'newer row')} -> {counted(st.live_keys, 'live key')}, "
                f"{counted(st.deleted_keys, 'deleted key')}, {counted(st.superseded_rows, 'superseded row')}"
            )
    lines.append(f"  DataFusion partitions: {len(ds.get_fragments())}")
    return "\n".join(lines)


def _lost_text(snap: Snapshot) -> str:
    """Lost generations (unmerged, unreadable) in one clause; empty when there is none."""
    rebuilt = [f"{r.region_id[:8]}:{g.generation}" for r in snap.regions for g in r.generations if g.rebuilt_from_wal]
    left_out = [f"{r.region_id[:8]}:{s.generation}" for r in snap.regions for s in r.skipped if s.missing]
    parts = []
    if rebuilt:
        parts.append(f"lost generation(s) {', '.join(rebuilt)} rebuilt from the WAL")
    if left_out:
        parts.append(f"lost generation(s) {', '.join(left_out)} LEFT OUT: their rows are missing")
    return "; ".join(parts) + " (details below)" if parts else ""


def _rebuilt_text(g: GenerationSource) -> str:
    span = f"WAL positions {g.wal_positions[0]}..{g.wal_positions[1]}" if g.wal_positions else "the WAL (no entry)"
    return f"REBUILT from {span}: its directory {g.lost_uri} is lost and it is not merged; {REPAIR_HINT}"


def _cut_text(snap: Snapshot) -> str:
    if snap.consistent_cut:
        return "all regions as of one instant"
    if snap.consistency == "strong":
        return "writers kept moving: each region as of its own read"
    return "each region as of its own read"
