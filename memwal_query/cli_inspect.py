"""What ``memwal inspect`` prints: the table's state in lines and one row per region.

Names, paths and spec values come from the table: they are shown escaped
(:func:`memwal_query.terminal_text.shown`), as in the text table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memwal_query.terminal_text import shown
from memwal_query.text import counted, skipped_runs

__all__ = ["inspect_text"]


def _spec_value(v: object) -> str:
    """A region's spec value in the text table: a string quoted, its characters as they are
    (the table escapes control characters once: ``repr`` escaped a line break twice)."""
    return f"'{v}'" if isinstance(v, str) else repr(v)


def _spec_line(s: dict[str, Any]) -> str:
    parts = []
    for f in s["fields"]:
        params = ", ".join(f"{k}={v}" for k, v in sorted(f["parameters"].items()))
        how = f["transform"] or f"expr({f['expression']})"
        cols = ", ".join(
            str(c) if c is not None else f"field {i}" for c, i in zip(f["source_columns"], f["source_ids"], strict=True)
        )
        parts.append(f"{f['field_id']} = {how}({cols}{', ' + params if params else ''}) -> {f['result_type'] or '?'}")
    return f"  region spec {s['spec_id']}: " + "; ".join(parts)


def inspect_text(d: dict[str, Any]) -> str:
    """``memwal inspect``'s text of a table description (:func:`~memwal_query.describe.describe_table`)."""
    import pyarrow as pa

    from memwal_query.display import format_text_table
    from memwal_query.explain import maintained_text

    fr = d["freshness"]["newest_region_manifest"]
    lines = [
        f"memwal table {d['uri']}",
        f"  base version {d['base_version']}: {counted(d['base_rows'], 'row')} in "
        f"{counted(d['base_fragments'], 'fragment')}, "
        f"{d['base_rows_masked']:,} masked by newer versions",
        f"  live rows (merged): {d['live_rows']:,}; primary key: {', '.join(d['primary_key'])}; "
        f"consistency: {d['consistency']}",
        "  highest region manifest version: "
        + (f"v{fr['version']} (region {fr['region_id']})" if fr is not None else "none"),
    ]
    lines += [_spec_line(s) for s in d["specs"]]
    lines.append(f"  maintained indexes: {maintained_text(d)}")
    if d["index_catchup"]:
        for c in d["index_catchup"]:
            lines.append(f"  index catch-up: {c['index']} at generation {c['generation']} of region {c['region_id']}")
    else:
        lines.append("  index catch-up progress: none recorded")
    # what each base index covers and how the rest is served (as explain() says)
    lines += [f"  {v['text']}" for v in d.get("vector_indexes", [])]
    lines += [f"  {s['text']} [{s['index_type']} on {s['column']}]" for s in d.get("scalar_index_catchup", [])]
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "region",
            "spec values",
            "manifest",
            "epoch",
            "state",
            "current gen",
            "flushed",
            "merged gen",
            "unmerged (rows)",
            "WAL tail",
            "MemTable live",
        )
    }
    for r in d["regions"]:
        vals = r["spec_values"]
        wal = r["wal"]
        rows["region"].append(r["region_id"])
        rows["spec values"].append(
            "unknown"
            if vals is None
            else (", ".join(f"{k}={_spec_value(v)}" for k, v in vals.items()) or "-")
            + (f" ({r['rows_outside_spec_values']} rows outside)" if r["rows_outside_spec_values"] else "")
        )
        rows["manifest"].append("-" if r["manifest_version"] is None else f"v{r['manifest_version']}")
        rows["epoch"].append(r["writer_epoch"])
        rows["state"].append(r["state"] or "-")
        rows["current gen"].append(r["current_generation"])
        rows["flushed"].append(_ranges(r["flushed_generations"]))
        rows["merged gen"].append(r["merged_generation"])
        rows["unmerged (rows)"].append(
            " ".join(f"g{g['generation']}:{g['rows']}" for g in r["unmerged_generations"]) or "-"
        )
        rows["WAL tail"].append(
            f"{counted(wal['tail_entries'], 'entry', 'entries')} / {counted(wal['tail_rows'], 'row')}"
            if wal["tail_read"]
            else "not read"
        )
        rows["MemTable live"].append(r["memtable_live_rows"])
    table = pa.table({k: pa.array([None if v is None else v for v in vs]) for k, vs in rows.items()})
    lines = [shown(line, backslash=False) for line in lines]  # names and values the table holds
    lines.append(format_text_table(table, max_cell=60).rsplit("\n", 1)[0])
    lines.append(counted(len(d["regions"]), "region"))
    return "\n".join(lines + [shown(line, backslash=False) for line in _damage_lines(d)])


def _damage_lines(d: dict[str, Any]) -> list[str]:
    """What ``explain()`` warns about: lost generations (rebuilt from the WAL or left out),
    skipped ones, WAL entries of fenced writers or torn (one line each)."""
    from memwal_query.explain import lost_text, rebuilt_text

    lost, hint = lost_text(d["lost_generations"]), d["lost_generations"]["repair_hint"]
    out = [f"WARNING: {lost}"] if lost else []
    for r in d["regions"]:
        rid = r["region_id"]
        for g in r["unmerged_generations"]:
            if g["rebuilt_from_wal"] is not None:
                out.append(f"  region {rid} generation {g['generation']}: {rebuilt_text(g, hint)}")
        for which, why in skipped_runs(r["skipped_generations"]):
            out.append(f"  region {rid} {which}: skipped: {why}")
        wal = r["wal"]
        if wal["fenced_positions"]:
            out.append(f"  region {rid}: WAL positions {wal['fenced_positions']} ignored: written by a fenced writer")
        if wal["torn_position"] is not None:
            out.append(f"  region {rid}: WAL position {wal['torn_position']} torn: treated as not committed")
    return out


def _ranges(values: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    out: list[str] = []
    for v in sorted(values):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == v - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        elif out and "-" not in out[-1] and int(out[-1]) == v - 1:
            out[-1] = f"{out[-1]}-{v}"
        else:
            out.append(str(v))
    return ",".join(out) or "-"
