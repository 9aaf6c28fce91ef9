"""Human-readable views of a table snapshot: plain text tables, a JSON-ready
description, and the HTML that Jupyter shows for a :class:`~memwal_query.Table`.

The HTML is rendered from one :func:`~memwal_query.describe.describe_table` value
(``render_table_html``, ``render_explain_html``); the renderers read nothing else, and
the description reads what the snapshot already holds (metadata and row counts from
Lance manifests); nothing scans data columns.

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
import pyarrow.compute as pc

from memwal_query.describe import describe_table, freshness
from memwal_query.errors import InvalidArgumentError
from memwal_query.exact_text import exact_values, needs_text
from memwal_query.explain import render_explain
from memwal_query.terminal_text import clip, pad, shown, width
from memwal_query.text import counted, skipped_runs
from memwal_query.view.table_view import HasView

__all__ = [
    "python_values",
    "format_text_table",
    "json_value",
    "describe_table",
    "freshness",
    "table_html",
    "render_table_html",
    "explain_html",
    "render_explain_html",
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
    return shown(str(value))


def python_values(column: pa.Array | pa.ChunkedArray, name: str) -> list[Any]:
    """The Python values of a column; dates and timestamps Python cannot hold (a year after
    9999: valid Arrow) as Arrow writes them (``10183-09-21``); durations and times of day in
    nanoseconds as exact text at any depth (:mod:`memwal_query.exact_text`).

    Raises:
        InvalidArgumentError: Such a value nested in a list or struct (names the column).

    Example:
        >>> import pyarrow as pa
        >>> python_values(pa.array([3_000_000], pa.date32()), "d")
        ['10183-09-21']
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if chunks and needs_text(column.type):  # durations, nanosecond times of day: exact text
        column = pa.chunked_array([exact_values(c) for c in chunks])
    try:
        return list(column.to_pylist())
    except (OverflowError, ValueError) as err:
        if pa.types.is_temporal(column.type):
            return list(pc.cast(column, pa.string()).to_pylist())
        msg = f"column {name!r} ({column.type}) holds a value Python cannot represent ({err}): read it as Arrow"
        raise InvalidArgumentError(msg) from err


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
    names = [shown(n) for n in table.column_names]
    numeric = [
        pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type) for f in table.schema
    ]
    columns = [
        [clip(_cell_text(v), max_cell) for v in python_values(table.column(i), table.column_names[i])]
        for i in range(len(names))
    ]
    widths = [max([width(n)] + [width(c) for c in col]) for n, col in zip(names, columns, strict=True)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    head = "| " + " | ".join(pad(n, w) for n, w in zip(names, widths, strict=True)) + " |"
    lines = [rule, head, rule]
    for r in range(table.num_rows):
        cells = [pad(col[r], w, right=num) for col, w, num in zip(columns, widths, numeric, strict=True)]
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


def _freshness_text(fr: Mapping[str, Any]) -> str:
    newest = fr["newest_region_manifest"]
    base = _e(f"base v{fr['base_version']}")
    if newest is None:
        return f"{base} · no region manifest"
    return f"{base} · highest region manifest version v{_e(newest['version'])} (region {_short(newest['region_id'])})"


def table_html(source: HasView) -> str:
    """HTML for a snapshot (``Table._repr_html_``): sources per region, rows, freshness.

    Args:
        source: An opened snapshot.

    Returns:
        A self-contained HTML fragment (escaped; no scripts).
    """
    return render_table_html(describe_table(source))


def render_table_html(d: Mapping[str, Any]) -> str:
    """:func:`table_html` from a :func:`describe_table` value."""
    summary = _rows_table(
        ["live rows", "primary key", "consistency", "freshness", "base"],
        [
            [
                (f"{d['live_rows']:,}", True),
                (_e(", ".join(d["primary_key"])), False),
                (_e(d["consistency"]), False),
                (_freshness_text(d["freshness"]), False),
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


def _plan_html(p: Mapping[str, Any]) -> str:
    """The pruning decision of a :func:`describe_predicate` value."""
    rows: list[list[tuple[str, bool]]] = []
    for r in p["regions_read"]:
        note = " (spec values unknown: never pruned)" if r["spec_values_unknown"] else ""
        rows.append([(_short(r["region_id"]), False), (_e("read" + note), False)])
    for pr in p["pruned"]:
        rows.append([(_short(pr["region_id"]), False), (_e(f"pruned: {pr['reason']}"), False)])
    head = _e(f"predicate {p['sql']}: {counted(len(p['regions_read']), 'region')} read, {len(p['pruned'])} pruned")
    return f"<br><span>{head}</span>" + _rows_table(["region", "decision"], rows)


_DIM = '<span class="dim">-</span>'


def _region_source_rows(r: Mapping[str, Any], eventual: bool) -> list[list[tuple[str, bool]]]:
    """A region's rows of the :func:`explain_html` source table (generations, skipped, MemTable)."""
    rid = _short(r["region_id"])
    rows: list[list[tuple[str, bool]]] = []
    for g in r["unmerged_generations"]:
        rebuilt = g["rebuilt_from_wal"] is not None
        rows.append(
            [
                (rid, False),
                (_e(f"generation {g['generation']}"), False),
                (f"{g['rows']:,}", True),
                (f"{g['dropped']:,}", True),
                (_e(f"REBUILT from the WAL: {g['lost_uri']} is lost" if rebuilt else "read"), False),
            ]
        )
    for which, why in skipped_runs(r["skipped_generations"]):
        rows.append([(rid, False), (_e(which), False), (_DIM, True), (_DIM, True), (_e(f"skipped: {why}"), False)])
    mt = r["memtable"]
    if mt is not None:
        rows.append(
            [
                (rid, False),
                (_e(f"memtable ({mt['origin']})"), False),
                (f"{mt['rows']:,}", True),
                (f"{mt['rows'] - mt['live_rows']:,}", True),
                (_e("read"), False),
            ]
        )
    elif eventual:
        rows.append(
            [(rid, False), (_e("memtable"), False), (_DIM, True), (_DIM, True)]
            + [(_e("not read (eventual consistency)"), False)]
        )
    return rows


def explain_html(source: HasView, predicate: str | None = None) -> str:
    """HTML of :meth:`~memwal_query.Table.explain`: every source, kept or skipped, and why.

    Args:
        source: An opened snapshot.
        predicate: As ``Table.explain(predicate)``: also show which regions this
            SQL predicate reads and which it prunes.

    Returns:
        A self-contained HTML fragment: a source table (and the pruning decision)
        plus the full text explanation in a collapsible block.

    Raises:
        InvalidArgumentError: ``predicate`` is not valid SQL over the table.
    """
    return render_explain_html(describe_table(source, predicate=predicate))


def render_explain_html(d: Mapping[str, Any]) -> str:
    """:func:`explain_html` from a :func:`describe_table` value (with its ``predicate``, if any)."""
    rows: list[list[tuple[str, bool]]] = [
        [
            (_e("base"), False),
            (_e(f"v{d['base_version']}"), False),
            (f"{d['base_rows']:,}", True),
            (f"{d['base_rows_masked']:,}", True),
            (_e("read (masked by row address)"), False),
        ]
    ]
    for r in d["regions"]:
        rows += _region_source_rows(r, d["consistency"] == "eventual")
    sources = _rows_table(["region", "source", "rows", "dropped (superseded/deleted/masked)", "status"], rows)
    head = _e(
        f"{counted(len(d['regions']), 'region')} · consistency {d['consistency']} · merge computed in "
        f"{d['merge_seconds'] * 1000:.1f} ms"
    )
    pruning = _plan_html(d["predicate"]) if d.get("predicate") is not None else ""
    text = _e(render_explain(d))
    return (
        f'<div class="memwal">{_STYLE}<strong>memwal explain</strong> <code>{_e(d["uri"])}</code> '
        f"<span>{_freshness_text(d['freshness'])}</span><br><span>{head}</span>{sources}{pruning}"
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
    """``Table.explain(predicate)``: the text (plus what ``predicate`` prunes) carrying its HTML.

    The snapshot is described once; the text and the HTML are both rendered from that value.
    """
    d = describe_table(source, predicate=predicate)
    text = "\n".join(shown(line, backslash=False) for line in render_explain(d).split("\n"))  # names as shown
    return ExplainText(text, render_explain_html(d))
