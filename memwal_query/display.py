"""Human-readable views of a table snapshot: plain text tables, a JSON-ready
description, and the HTML that Jupyter shows for a :class:`~memwal_query.Table`.

Everything here reads what the snapshot already holds (metadata and row counts
from Lance manifests); nothing scans data columns.

Example:
    >>> import pyarrow as pa
    >>> print(format_text_table(pa.table({"id": [1, 22], "name": ["a", None]})))
    +----+------+
    | id | name |
    +----+------+
    |  1 | a    |
    | 22 | NULL |
    +----+------+
    2 rows
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from memwal_query.describe import describe_table, freshness
from memwal_query.explain import explain_table
from memwal_query.merge import MergeState
from memwal_query.snapshot.model import RegionSnapshot
from memwal_query.text import counted
from memwal_query.view.table_view import HasView, TableView, view_of

__all__ = [
    "format_text_table",
    "json_value",
    "describe_table",
    "freshness",
    "table_html",
    "explain_html",
    "ExplainText",
    "explanation",
]

_MAX_CELL = 40


# --------------------------------------------------------------------------- #
# Plain text
# --------------------------------------------------------------------------- #


def _cell_text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    text = str(value).replace("\n", "\\n")
    return text


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_text_table(
    table: pa.Table | Iterable[pa.RecordBatch],
    *,
    max_cell: int = _MAX_CELL,
    footer: str | None = None,
) -> str:
    """Render Arrow rows as a boxed text table (numbers right-aligned).

    Args:
        table: An Arrow table or record batches (all rows are rendered).
        max_cell: Longest cell text; longer values end in ``…``.
        footer: An extra line printed under the table.

    Returns:
        The table as text, without a trailing newline.
    """
    if not isinstance(table, pa.Table):
        table = pa.Table.from_batches(list(table))
    names = list(table.column_names)
    numeric = [
        pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type) for f in table.schema
    ]
    columns = [[_clip(_cell_text(v), max_cell) for v in table.column(i).to_pylist()] for i in range(len(names))]
    widths = [max([len(n)] + [len(c) for c in col]) for n, col in zip(names, columns, strict=True)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    head = "| " + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)) + " |"
    lines = [rule, head, rule]
    for r in range(table.num_rows):
        cells = [
            (col[r].rjust(w) if num else col[r].ljust(w)) for col, w, num in zip(columns, widths, numeric, strict=True)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if table.num_rows:
        lines.append(rule)
    lines.append(f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}" + (f"; {footer}" if footer else ""))
    return "\n".join(lines)


def json_value(value: Any) -> Any:
    """A JSON-serialisable form of a Python value taken from Arrow (``json.dumps`` ``default=``).

    Dates and times become ISO 8601 strings, decimals strings, bytes base64 strings.

    Example:
        >>> import datetime
        >>> json_value(datetime.date(2024, 1, 2)), json_value(b"\\x00\\x01")
        ('2024-01-02', 'AAE=')
    """
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, set | frozenset | tuple):
        return [json_value(v) for v in value]
    return str(value)


# --------------------------------------------------------------------------- #
# HTML (Jupyter)
# --------------------------------------------------------------------------- #

_STYLE = (
    "<style>"
    ".memwal table{border-collapse:collapse;margin:4px 0;font-size:12px}"
    ".memwal th,.memwal td{border:1px solid #ccc;padding:2px 6px;text-align:left}"
    ".memwal td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".memwal .dim{color:#888}"
    "</style>"
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _short(region_id: str) -> str:
    return f'<code title="{_e(region_id)}">{_e(region_id[:8])}</code>'


def _values_text(values: Mapping[str, Any] | None) -> str:
    if values is None:
        return '<span class="dim">unknown</span>'
    return _e(", ".join(f"{k}={v!r}" for k, v in values.items()) or "-")


def _rows_table(header: Sequence[str], rows: Sequence[Sequence[tuple[str, bool]]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if num else f"<td>{c}</td>" for c, num in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _freshness_text(table: TableView) -> str:
    fr = freshness(table)
    newest = fr["newest_region_manifest"]
    base = _e(f"base v{fr['base_version']}")
    if newest is None:
        return f"{base} · no region manifest"
    return f"{base} · newest region manifest v{_e(newest['version'])} (region {_short(newest['region_id'])})"


def table_html(source: HasView) -> str:
    """HTML for a snapshot (``Table._repr_html_``): sources per region, rows, freshness.

    Args:
        table: An opened snapshot.

    Returns:
        A self-contained HTML fragment (escaped; no scripts).
    """
    table = view_of(source)
    d = describe_table(table)
    summary = _rows_table(
        ["live rows", "primary key", "consistency", "freshness", "base"],
        [
            [
                (f"{d['live_rows']:,}", True),
                (_e(", ".join(d["primary_key"])), False),
                (_e(d["consistency"]), False),
                (_freshness_text(table), False),
                (
                    _e(
                        f"{counted(d['base_rows'], 'row')}, {counted(d['base_fragments'], 'fragment')}, "
                        f"{d['base_rows_masked']:,} masked"
                    ),
                    False,
                ),
            ]
        ],
    )
    rows = []
    for r in d["regions"]:
        unmerged = r["unmerged_generations"]
        gens = ", ".join(f"g{g['generation']}: {g['rows']:,}" for g in unmerged) or "-"
        wal = r["wal"]
        if wal["tail_read"]:
            tail = f"{counted(wal['tail_entries'], 'entry', 'entries')}, {counted(wal['tail_rows'], 'row')}"
        else:
            tail = "not read (eventual)"
        rows.append(
            [
                (_short(r["region_id"]), False),
                (_values_text(r["spec_values"]), False),
                (_e("-" if r["manifest_version"] is None else f"v{r['manifest_version']}"), True),
                (_e(r["merged_generation"]), True),
                (_e(gens), False),
                (_e(tail), False),
                (f"{r['memtable_live_rows']:,}", True),
            ]
        )
    regions = _rows_table(
        ["region", "spec values", "manifest", "merged gen", "unmerged generations (rows)", "WAL tail", "MemTable live"],
        rows,
    )
    return (
        f'<div class="memwal">{_STYLE}<strong>memwal table</strong> <code>{_e(d["uri"])}</code>{summary}{regions}</div>'
    )


def _plan_html(table: TableView, predicate: str) -> tuple[str, str]:
    plan = table.plan_sql(predicate)
    rows: list[list[tuple[str, bool]]] = []
    for rid in plan.regions:
        note = " (spec values unknown: never pruned)" if rid in plan.unknown_values else ""
        rows.append([(_short(rid), False), (_e("read" + note), False)])
    for p in plan.pruned:
        rows.append([(_short(p.region_id), False), (_e(f"pruned: {p.reason}"), False)])
    head = _e(f"predicate {predicate}: {counted(len(plan.regions), 'region')} read, {len(plan.pruned)} pruned")
    return f"<br><span>{head}</span>" + _rows_table(["region", "decision"], rows), plan.explain()


def _region_source_rows(r: RegionSnapshot, merge: MergeState, eventual: bool) -> list[list[tuple[str, bool]]]:
    """A region's rows of the :func:`explain_html` source table (generations, skipped, MemTable)."""
    rows: list[list[tuple[str, bool]]] = []
    for g in r.generations:
        drop = merge.generation_drop.get(g.uri)
        rows.append(
            [
                (_short(r.region_id), False),
                (_e(f"generation {g.generation}"), False),
                (f"{g.num_rows:,}", True),
                (f"{int(drop.size) if drop is not None else 0:,}", True),
                (_e(f"REBUILT from the WAL: {g.lost_uri} is lost" if g.rebuilt_from_wal else "read"), False),
            ]
        )
    for s in r.skipped:
        rows.append(
            [
                (_short(r.region_id), False),
                (_e(f"generation {s.generation}"), False),
                ('<span class="dim">-</span>', True),
                ('<span class="dim">-</span>', True),
                (_e(f"skipped: {s.reason}"), False),
            ]
        )
    if r.memtable is not None:
        mt = r.memtable
        kept = merge.memtables.get(r.region_id)
        live = kept.num_rows if kept is not None else 0
        rows.append(
            [
                (_short(r.region_id), False),
                (_e(f"memtable ({mt.origin})"), False),
                (f"{mt.table.num_rows:,}", True),
                (f"{mt.table.num_rows - live:,}", True),
                (_e("read"), False),
            ]
        )
    elif eventual:
        rows.append(
            [
                (_short(r.region_id), False),
                (_e("memtable"), False),
                ('<span class="dim">-</span>', True),
                ('<span class="dim">-</span>', True),
                (_e("not read (eventual consistency)"), False),
            ]
        )
    return rows


def explain_html(source: HasView, predicate: str | None = None) -> str:
    """HTML of :meth:`~memwal_query.Table.explain`: every source, kept or skipped, and why.

    Args:
        table: An opened snapshot.
        predicate: As ``Table.explain(predicate)``: also show which regions this
            SQL predicate reads and which it prunes.

    Returns:
        A self-contained HTML fragment: a source table (and the pruning decision)
        plus the full text explanation in a collapsible block.

    Raises:
        InvalidArgumentError: ``predicate`` is not valid SQL over the table.
    """
    table = view_of(source)
    snap = table.snapshot
    merge = table.merge
    base_rows = snap.base.count_rows()
    rows: list[list[tuple[str, bool]]] = [
        [
            (_e("base"), False),
            (_e(f"v{snap.base_version}"), False),
            (f"{base_rows:,}", True),
            (f"{merge.base_shadowed_rows:,}", True),
            (_e("read (masked by row address)"), False),
        ]
    ]
    for r in snap.regions:
        rows += _region_source_rows(r, merge, snap.consistency == "eventual")
    sources = _rows_table(["region", "source", "rows", "dropped (superseded/deleted/masked)", "status"], rows)
    head = _e(
        f"{counted(len(snap.regions), 'region')} · consistency {snap.consistency} · merge computed in "
        f"{merge.seconds * 1000:.1f} ms"
    )
    text = explain_table(table)
    pruning = ""
    if predicate is not None:
        pruning, plan_text = _plan_html(table, predicate)
        text += "\n" + "\n".join("  " + line for line in plan_text.splitlines())
    text = _e(text)
    return (
        f'<div class="memwal">{_STYLE}<strong>memwal explain</strong> <code>{_e(snap.uri)}</code> '
        f"<span>{_freshness_text(table)}</span><br><span>{head}</span>{sources}{pruning}"
        f"<details><summary>full text</summary><pre>{text}</pre></details></div>"
    )


class ExplainText(str):
    """The text of ``Table.explain()`` that Jupyter shows as HTML.

    A ``str`` (prints, compares and concatenates as the plain text) carrying the
    HTML rendering for ``_repr_html_``.

    Example:
        >>> e = ExplainText("plain", "<b>rich</b>")
        >>> e == "plain", e._repr_html_()
        (True, '<b>rich</b>')
    """

    _html: str

    def __new__(cls, text: str, html_text: str) -> ExplainText:
        """Create the text with its HTML rendering."""
        obj = super().__new__(cls, text)
        obj._html = html_text
        return obj

    def _repr_html_(self) -> str:
        return self._html


def explanation(source: HasView, predicate: str | None = None) -> ExplainText:
    """``Table.explain(predicate)``: the text (plus what ``predicate`` prunes) carrying its HTML."""
    table = view_of(source)
    text = explain_table(table)
    if predicate is not None:
        text += "\n" + "\n".join("  " + line for line in table.plan_sql(predicate).explain().splitlines())
    return ExplainText(text, explain_html(table, predicate))
