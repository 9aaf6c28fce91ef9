"""Benchmark report: benchmarks/results/*.json -> REPORT.md + a PNG chart per result file.

Run ``python benchmarks/report.py`` after a benchmark (``bench_read.py`` writes
``results/read.json``). Every ``*.json`` in the results folder is read; what a file
has is reported, what it lacks is skipped, and a file that does not parse is named
in the report instead of stopping it. With no result at all the report says so.

For each result file the report has: machine and parameters, median timings
(query x engine), ratios against the anchors, targets (PASS/MISS), and a bar chart
``<name>_ratios.png``:

* left: merged time / anchor time (raw base through the same provider, raw base
  through Lance's scanner); 1.0 = as fast as the anchor, lower is better, dashed
  line = the target;
* right: alternative time / merged time (LsmScanner, window dedup in DataFusion and
  DuckDB), log scale; higher is better (how many times faster memwal is).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

# ratio group -> (label, which panel). Groups not listed here are charted by their
# name: "*_over_merged" on the speed-up panel, anything else on the anchor panel.
RATIO_LABELS = {
    "merged_over_raw_base_df": "merged / raw base (DataFusion, same provider)",
    "merged_over_raw_base_df_nocache": "merged / raw base, both cache=False",
    "merged_over_raw_base_lance": "merged / raw base (Lance scanner)",
    "lsm_scanner_over_merged": "LsmScanner / merged",
    "window_df_over_merged": "window dedup (DataFusion) / merged",
    "window_duckdb_over_merged": "window dedup (DuckDB) / merged",
    "window_duckdb_over_merged_nocache": "window dedup (DuckDB) / merged cache=False",
}
QUERY_LABELS = {
    "count": "count(*)",
    "filtered_agg": "filtered sum",
    "pk_lookup": "WHERE id = X",
    "join_group_by": "join + group by",
    "full_scan": "full scan",
}
# result group (bench_read.py's descriptions) -> short column name
GROUP_SHORT = {
    "merged table (memwal_query provider) in DataFusion": "merged",
    "raw base (DataFusion, same provider, no newer levels, no merge)": "raw base DF",
    "merged table (memwal_query provider) in DataFusion, decoded columns kept": "merged",
    "raw base (DataFusion, same provider, no newer levels, no merge), decoded columns kept": "raw base DF",
    "merged table, cache=False (every query decodes Lance pages)": "merged cold",
    "raw base (same provider), no column cache": "raw base DF cold",
    "raw base (Lance scanner, no merge)": "raw base Lance",
    "pylance LsmScanner: base + unmerged flushed generations (no WAL tail)": "LsmScanner",
    "window dedup (row_number() = 1) over the union of all levels, DataFusion": "window DF",
    "window dedup (row_number() = 1) over the union of all levels, DuckDB": "window DuckDB",
}
ANCHOR_TARGET = 1.25  # merged <= 1.25x the raw base (bench_read.py's target)


def _is_speedup(group: str) -> bool:
    return "_over_merged" in group


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _fmt_ms(v: Any) -> str:
    m = _num(v)
    if m is None:
        return "-"
    return f"{m:,.3f}" if m < 1 else f"{m:,.2f}" if m < 10 else f"{m:,.1f}" if m < 100 else f"{m:,.0f}"


def _fmt_ratio(v: Any) -> str:
    r = _num(v)
    if r is None:
        return "-"
    return f"{r:,.2f}" if r < 100 else f"{r:,.0f}"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def esc(cell: str) -> str:
        return str(cell).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return out


def _has_median_ms(results: Mapping[str, Any]) -> bool:
    """True for the ``{group: {query: {"median_ms": ...}}}`` shape of bench_read and bench_pruning."""
    return any(
        isinstance(t, Mapping) and "median_ms" in t
        for g in results.values()
        if isinstance(g, Mapping)
        for t in g.values()
    )


def _stat_leaves(node: Mapping[str, Any], path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """Every ``{median, min, max}`` mapping and every ``*_ratio`` number under ``node``, with its path."""
    found: list[tuple[tuple[str, ...], Any]] = []
    for key, value in node.items():
        here = (*path, str(key))
        if isinstance(value, Mapping) and _num(value.get("median")) is not None:
            found.append((here, value))
        elif isinstance(value, Mapping):
            found += _stat_leaves(value, here)
        elif str(key).endswith("_ratio") and _num(value) is not None:
            found.append((here, value))
    return found


def _fmt_stat(stat: Any, key: str) -> str:
    """One cell of a timings row: a number as it reads best (ms with its unit in the path), a ratio as x."""
    if not isinstance(stat, Mapping):
        return f"{_fmt_ratio(stat)} x" if key == "median" else ""
    return _fmt_ms(stat.get(key))


def _label(q: str) -> str:
    return QUERY_LABELS.get(q, q)


def load_results(folder: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every ``*.json`` in ``folder``: ``({name: data}, [problems])``; missing folder = nothing."""
    found: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    if not folder.is_dir():
        return found, problems
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            problems.append(f"`{path.name}`: not readable as JSON ({err})")
            continue
        if not isinstance(data, dict):
            problems.append(f"`{path.name}`: not a JSON object; skipped")
            continue
        found[path.stem] = data
    return found, problems


def chart(name: str, ratios: Mapping[str, Mapping[str, Any]], out: Path) -> bool:
    """Draw the ratio bar chart of one result file; False when there is nothing to draw."""
    panels = {
        "anchor": {g: v for g, v in ratios.items() if isinstance(v, Mapping) and not _is_speedup(g)},
        "speedup": {g: v for g, v in ratios.items() if isinstance(v, Mapping) and _is_speedup(g)},
    }
    panels = {k: v for k, v in panels.items() if any(_num(x) is not None for g in v.values() for x in g.values())}
    if not panels:
        return False
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    for ax, (kind, groups) in zip(axes[0], panels.items(), strict=True):
        queries: list[str] = []
        for per_q in groups.values():
            queries += [q for q, v in per_q.items() if _num(v) is not None and q not in queries]
        width = 0.8 / max(1, len(groups))
        for i, (group, per_q) in enumerate(groups.items()):
            xs = [j + (i - (len(groups) - 1) / 2) * width for j in range(len(queries))]
            ys = [_num(per_q.get(q)) for q in queries]
            bars = ax.bar(
                [x for x, y in zip(xs, ys, strict=True) if y is not None],
                [y for y in ys if y is not None],
                width=width,
                label=RATIO_LABELS.get(group, group),
            )
            ax.bar_label(bars, labels=[_fmt_ratio(y) for y in ys if y is not None], fontsize=6, padding=1)
        ax.set_xticks(range(len(queries)), [_label(q) for q in queries], rotation=20, ha="right")
        values = [v for per_q in groups.values() for x in per_q.values() if (v := _num(x)) is not None and v > 0]
        if kind == "anchor":
            if values and max(values) / min(values) > 20:
                ax.set_yscale("log")  # e.g. count(*) against Lance's metadata-only count
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.axhline(ANCHOR_TARGET, color="red", linestyle="--", linewidth=1, label=f"target {ANCHOR_TARGET}x")
            ax.set_title("time vs anchors (lower is better)")
            ax.set_ylabel("merged time / anchor time")
        else:
            ax.set_yscale("log")
            ax.axhline(1.0, color="black", linewidth=0.8)
            for limit in (10, 20):
                ax.axhline(limit, color="red", linestyle=":", linewidth=1)
            ax.set_title("memwal speed-up over alternatives (higher is better)")
            ax.set_ylabel("alternative time / merged time (log)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{name}: ratios")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return True


def section(name: str, data: Mapping[str, Any], folder: Path) -> list[str]:
    """Markdown for one result file (writes its chart next to the report)."""
    lines = [f"## {name} (`{name}.json`)", ""]
    machine = data.get("machine")
    if isinstance(machine, Mapping):
        versions = machine.get("versions")
        vtext = ", ".join(f"{k} {v}" for k, v in versions.items()) if isinstance(versions, Mapping) else ""
        lines.append(
            f"Machine: {machine.get('cpu_count', '?')} CPUs, {machine.get('memory_gib', '?')} GiB, "
            f"{machine.get('platform', '?')}, Python {machine.get('python', '?')}" + (f"; {vtext}" if vtext else "")
        )
    params = data.get("params")
    if isinstance(params, Mapping):
        lines.append("Parameters: " + ", ".join(f"`{k}={v}`" for k, v in params.items()))
    table = data.get("table")
    if isinstance(table, Mapping):
        keys = (
            "base_rows",
            "regions",
            "unmerged_generations",
            "generation_rows",
            "memtable_rows",
            "base_shadowed_rows",
        )
        facts = ", ".join(f"{k} {table[k]:,}" for k in keys if isinstance(table.get(k), int))
        if facts:
            lines.append(f"Table: {facts}")
    if data.get("repeat") is not None:
        lines.append(f"Median of {data['repeat']} runs after a warm-up.")
    lines.append("")

    results = data.get("results")
    if (
        isinstance(results, Mapping)
        and results
        and all(isinstance(v, Mapping) and "seconds" in v for v in results.values())
    ):
        # one measurement per entry (bench_spark): median seconds, rows/s, every run
        rows = [
            [
                name,
                f"{v['seconds']:,.3f}",
                f"{v['rows_per_s']:,.0f}" if _num(v.get("rows_per_s")) is not None else "-",
                ", ".join(f"{r:g}" for r in v.get("runs_s", [])),
            ]
            for name, v in results.items()
        ]
        lines += ["### Measurements", ""]
        lines += _md_table(["measurement", "median s", "rows/s", "runs (s)"], rows)
        lines.append("")
        results = None
    if isinstance(results, Mapping) and results and not _has_median_ms(results):
        # nested timings (bench_first_query, bench_open_large, bench_stream): one row per
        # {median, min, max} leaf, named by its path, plus the ratios recorded beside them
        rows = [
            [" / ".join(path), *(_fmt_stat(stat, k) for k in ("median", "min", "max"))]
            for path, stat in _stat_leaves(results, ())
        ]
        lines += ["### Timings (median, min, max over the runs)", ""]
        lines += _md_table(["measurement", "median", "min", "max"], rows)
        lines.append("")
        results = None
    if isinstance(results, Mapping) and results:
        groups = [g for g, v in results.items() if isinstance(v, Mapping)]
        queries: list[str] = []
        for g in groups:
            queries += [q for q in results[g] if q not in queries]
        rows = []
        for q in queries:
            row = [_label(q)]
            for g in groups:
                t = results[g].get(q)
                row.append(_fmt_ms(t.get("median_ms")) if isinstance(t, Mapping) else "-")
            rows.append(row)
        lines += ["### Median time (ms)", ""]
        lines += _md_table(["query", *[GROUP_SHORT.get(g, g) for g in groups]], rows)
        lines.append("")
        lines += [f"* {GROUP_SHORT[g]}: {g}" for g in groups if g in GROUP_SHORT] + [""]

    extras = []
    so = data.get("snapshot_open")
    if isinstance(so, Mapping) and _num(so.get("median_ms")) is not None:
        extras.append(f"snapshot open (cold `open_table`): {_fmt_ms(so['median_ms'])} ms")
    rss = data.get("peak_rss_mb")
    if isinstance(rss, Mapping):
        fresh = rss.get("fresh_process_merged_path")
        if isinstance(fresh, Mapping) and _num(fresh.get("after_queries_mb")) is not None:
            extras.append(f"peak RSS, fresh process (open + merged queries): {fresh['after_queries_mb']:,.0f} MB")
        if _num(rss.get("benchmark_process")) is not None:
            extras.append(f"peak RSS, whole benchmark process: {rss['benchmark_process']:,.0f} MB")
    if data.get("ffi_provider"):
        extras.append(f"pylance FFI DataFusion provider: {data['ffi_provider']}")
    if _num(data.get("total_seconds")) is not None:
        extras.append(f"benchmark run time: {data['total_seconds']:,.0f} s")
    if extras:
        lines += [f"* {e}" for e in extras] + [""]

    ratios = data.get("ratios")
    if isinstance(ratios, Mapping) and ratios and all(_num(v) is not None for v in ratios.values()):
        lines += ["### Ratios", ""]
        lines += _md_table(["ratio", "value"], [[k, _fmt_ratio(v)] for k, v in ratios.items()])
        lines.append("")
        ratios = None
    if isinstance(ratios, Mapping) and ratios:
        groups = [g for g, v in ratios.items() if isinstance(v, Mapping)]
        queries = []
        for g in groups:
            queries += [q for q in ratios[g] if q not in queries]
        rows = [[RATIO_LABELS.get(g, g)] + [_fmt_ratio(ratios[g].get(q)) for q in queries] for g in groups]
        lines += ["### Ratios (time / time)", ""]
        lines += _md_table(["ratio", *[_label(q) for q in queries]], rows)
        lines.append("")
        png = folder / f"{name}_ratios.png"
        if chart(name, ratios, png):
            lines += [f"![{name} ratios]({png.name})", ""]
        else:
            lines += ["(no chart: no numeric ratios, or matplotlib is not installed)", ""]

    targets = data.get("targets")
    if isinstance(targets, list) and targets:
        rows = []
        passed = 0
        for t in targets:
            if not isinstance(t, Mapping):
                continue
            verdict = {True: "PASS", False: "MISS"}.get(t.get("pass"), "n/a")  # type: ignore[arg-type]
            passed += verdict == "PASS"
            value = _num(t.get("value"))
            unit = t.get("unit", "")
            rows.append(
                [
                    verdict,
                    str(t.get("target", "?")),
                    "-" if value is None else f"{_fmt_ratio(value)} {unit}".strip(),
                    f"{t.get('limit', '?')} {unit}".strip(),
                ]
            )
        lines += [f"### Targets: {passed} of {len(rows)} pass", ""]
        lines += _md_table(["", "target", "measured", "limit"], rows)
        lines.append("")
    if len(lines) <= 3:
        lines += ["(this file has none of the fields the report knows: machine, params, results, ratios, targets)", ""]
    return lines


def build_report(folder: Path = RESULTS, out: Path | None = None) -> Path:
    """Write ``REPORT.md`` (and charts) for every result in ``folder``; return the report path."""
    out = out or folder / "REPORT.md"
    found, problems = load_results(folder)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmark report",
        "",
        f"Generated {now} by `benchmarks/report.py` from `benchmarks/results/*.json`.",
        "",
    ]
    if not found:
        lines += [
            "No benchmark results yet: run `python benchmarks/bench_read.py` (it writes `results/read.json`).",
            "",
        ]
    for name, data in found.items():
        lines += section(name, data, out.parent)
    if problems:
        lines += ["## Files that could not be read", ""] + [f"* {p}" for p in problems] + [""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip() + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--results", default=str(RESULTS), help="folder with the *.json results (default: %(default)s)")
    p.add_argument("--out", help="report path (default: RESULTS/REPORT.md; charts are written next to it)")
    args = p.parse_args(argv)
    path = build_report(Path(args.results), Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
