"""Readable text for :meth:`memwal_query.Table.explain`, rendered from :func:`describe_table`.

:func:`render_explain` reads only the description (a JSON-ready dict); it never walks
the snapshot or the merge state itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memwal_query.describe import describe_table
from memwal_query.text import counted, skipped_runs
from memwal_query.view.table_view import HasView

__all__ = ["explain_table", "lost_text", "maintained_text", "rebuilt_text", "render_explain"]


def explain_table(source: HasView) -> str:
    """Describe a snapshot: base, regions, sources kept and skipped, dedup figures."""
    return render_explain(describe_table(source))


def render_explain(d: Mapping[str, Any]) -> str:
    """The text of ``Table.explain()`` from a :func:`describe_table` value.

    With a ``predicate`` description, the regions it reads and prunes follow, indented.
    """
    lines = _table_lines(d)
    for r in d["regions"]:
        lines += _region_lines(r, eventual=d["consistency"] == "eventual", hint=d["lost_generations"]["repair_hint"])
    lines.append(f"  DataFusion partitions: {d['datafusion_partitions']}")
    text = "\n".join(lines)
    predicate = d.get("predicate")
    if predicate is not None:
        text += "\n" + "\n".join("  " + line for line in predicate["text"].splitlines())
    return text


def _short(items: list[dict[str, Any]]) -> str:
    """``region-prefix:generation``, comma-separated."""
    return ", ".join(f"{m['region_id'][:8]}:{m['generation']}" for m in items)


def _table_lines(d: Mapping[str, Any]) -> list[str]:
    """The lines about the whole table (base, consistency, warnings, indexes)."""
    lines = [
        f"memwal table {d['uri']}",
        f"  base version {d['base_version']}: {counted(d['base_rows'], 'row')} in "
        f"{counted(d['base_fragments'], 'fragment')}; "
        f"{counted(d['base_rows_masked'], 'row')} masked by newer versions",
        f"  {d['base_mask']['text']}",
        f"  primary key: {', '.join(d['primary_key'])}",
        f"  consistency: {d['consistency']} ({d['consistency_source']}; {d['cut']})",
        f"  regions: {len(d['regions'])}; merge computed in {d['merge_seconds'] * 1000:.1f} ms; "
        f"key index of newer levels: {counted(d['newer_keys'], 'key')}, {d['newer_keys_bytes'] / 2**20:.1f} MB; "
        f"generation rows held for lookups: {d['lookup_rows_bytes'] / 2**20:.1f} MB",
    ]
    lost = lost_text(d["lost_generations"])
    if lost:
        lines.append(f"  WARNING: {lost}")
    if d["cross_region_keys"]:
        lines.append(f"  WARNING: {d['cross_region_keys']} keys have rows in more than one region")
    for r in d["regions"]:
        if r["rows_outside_spec_values"]:
            lines.append(
                f"  WARNING: region {r['region_id']} holds {counted(r['rows_outside_spec_values'], 'unmerged row')} "
                "outside its spec values: never pruned"
            )
    if d["maintained_indexes"] or d["maintain_all_indexes"]:
        lines.append(f"  maintained indexes: {maintained_text(d)}")
    for c in d["index_catchup_progress"]:
        lines.append(f"  index catch-up {c['index']}: caught up with generations {_short(c['caught_up']) or 'none'}")
    lines += [f"  {v['text']}" for v in d["vector_indexes"]]
    lines += [f"  {v['text']}" for v in d.get("knn_memory", [])]
    lines += [f"  {s['text']} [{s['index_type']} on {s['column']}]" for s in d["scalar_index_catchup"]]
    return lines


def _region_lines(r: Mapping[str, Any], *, eventual: bool, hint: str) -> list[str]:
    """The lines of one region: manifest, generations, MemTable, WAL anomalies, dedup."""
    head = f"  region {r['region_id']}"
    if r["manifest_version"] is None:
        lines = [f"{head}: no region manifest (in-process rows only)"]
    else:
        lines = [
            f"{head} [{r['spec_text']}] manifest v{r['manifest_version']}, epoch {r['writer_epoch']}, "
            f"{r['state']}, current generation {r['current_generation']}, merged generation {r['merged_generation']}"
        ]
    for g in r["unmerged_generations"]:
        lines.append(
            f"    generation {g['generation']}: {counted(g['rows'], 'row')}, "
            f"{g['dropped']:,} superseded/deleted dropped"
        )
        if g["rebuilt_from_wal"] is not None:
            lines.append(f"      {rebuilt_text(g, hint)}")
        if g.get("conformed_from"):
            lines.append(
                "      written before the base's columns changed: read into memory with the current columns "
                "(searched without its own indexes until merged)"
            )
    for which, why in skipped_runs(r["skipped_generations"]):
        lines.append(f"    {which}: skipped: {why}")
    mt = r["memtable"]
    if mt is not None:
        pos = mt["wal_positions"]
        where = f", WAL positions {pos[0]}..{pos[1]}" if pos else ""
        lines.append(
            f"    memtable ({mt['origin']}{where}): {counted(mt['rows'], 'row')}, {mt['live_rows']:,} live after dedup"
        )
    elif eventual:
        lines.append("    memtable: not read (eventual consistency)")
    wal = r["wal"]
    if wal["fenced_positions"]:
        lines.append(f"    WAL positions {wal['fenced_positions']} ignored: written by a fenced writer")
    if wal["torn_position"] is not None:
        lines.append(f"    WAL position {wal['torn_position']} torn: treated as not committed")
    st = r["dedup"]
    if st is not None:
        lines.append(
            f"    dedup: {counted(st['newer_rows'], 'newer row')} -> {counted(st['live_keys'], 'live key')}, "
            f"{counted(st['deleted_keys'], 'deleted key')}, {counted(st['superseded_rows'], 'superseded row')}"
        )
    return lines


def maintained_text(d: Mapping[str, Any]) -> str:
    """The base indexes the writers maintain in every flushed generation, as one phrase."""
    if d["maintain_all_indexes"]:
        return "all (every index of the base)"
    return ", ".join(d["maintained_indexes"]) or "none"


def lost_text(lost: Mapping[str, Any]) -> str:
    """Lost generations (unmerged, unreadable) in one clause; empty when there is none."""
    parts = []
    if lost["rebuilt_from_wal"]:
        parts.append(f"lost generation(s) {_short(lost['rebuilt_from_wal'])} rebuilt from the WAL")
    if lost["left_out"]:
        parts.append(f"lost generation(s) {_short(lost['left_out'])} LEFT OUT: their rows are missing")
    return "; ".join(parts) + " (details below)" if parts else ""


def rebuilt_text(g: Mapping[str, Any], repair_hint: str) -> str:
    """How a lost unmerged generation is served (from the WAL), and how to repair it."""
    pos = g["rebuilt_from_wal"]
    span = f"WAL positions {pos[0]}..{pos[1]}" if pos else "the WAL (no entry)"
    return f"REBUILT from {span}: its directory {g['lost_uri']} is lost and it is not merged; {repair_hint}"
