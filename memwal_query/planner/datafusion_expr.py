"""DataFusion ``Expr`` trees -> the predicate IR, and filters of a logical plan.

DataFusion's optimizer already normalises what matters for pruning: literals are
cast to the column type (``CAST(id AS BIGINT) = 5`` on an int32 column becomes
``id = Int32(5)``), ``5 = id`` is flipped, ``BETWEEN`` and ``NOT IN`` are expanded.
A comparison whose column side is wrapped in a cast the optimizer kept
(``CAST(id AS DOUBLE) = 5.5``) is :class:`Unknown`: the literal is not a value of
the column's type, so it cannot be hashed as the writer hashed it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import datafusion
import pyarrow as pa

from memwal_query.planner.predicates import And, Compare, InSet, IsNull, Not, Or, Predicate, Unknown

__all__ = ["from_datafusion_expr", "scan_filters", "predicate_for_table"]

_OPS = {"=": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _kind(e: Any) -> tuple[str, Any]:
    try:
        v = e.to_variant()
    except Exception:  # noqa: BLE001 - variants the bindings cannot expose
        return "?", None
    return type(v).__name__, v


def _column(e: Any) -> str | None:
    kind, v = _kind(e)
    return str(v.name()) if kind == "Column" else None


def _literal(e: Any) -> pa.Scalar | None:
    kind, _ = _kind(e)
    if kind != "Literal":
        return None
    try:
        value = e.python_value()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(value, pa.Scalar):
        return value
    try:
        return pa.scalar(value)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def from_datafusion_expr(e: Any) -> Predicate:
    """Translate a DataFusion ``Expr`` into the predicate IR (unknown shapes -> Unknown).

    Example:
        >>> import datafusion
        >>> from datafusion import col, lit
        >>> from_datafusion_expr((col("id") == lit(5)) & col("s").is_null())
        And(children=(Compare(column='id', op='=', value=<pyarrow.Int64Scalar: 5>), IsNull(column='s', negated=False)))
    """
    kind, v = _kind(e)
    if kind == "BinaryExpr":
        op = str(v.op()).upper()
        if op in ("AND", "OR"):
            kids = (from_datafusion_expr(v.left()), from_datafusion_expr(v.right()))
            flat: list[Predicate] = []
            node = And if op == "AND" else Or
            for k in kids:
                flat.extend(k.children if isinstance(k, node) else (k,))
            return node(tuple(flat))
        if op in _OPS:
            sym = _OPS[op]
            col, lit = _column(v.left()), _literal(v.right())
            if col is not None and lit is not None:
                return Compare(col, sym, lit)  # type: ignore[arg-type]
            col, lit = _column(v.right()), _literal(v.left())
            if col is not None and lit is not None:
                return Compare(col, _FLIP[sym], lit)  # type: ignore[arg-type]
        return Unknown(str(e))
    if kind == "InList":
        col = _column(v.expr())
        lits = [_literal(x) for x in v.list()]
        if col is not None and lits and all(x is not None for x in lits):
            return InSet(col, tuple(x for x in lits if x is not None), bool(v.negated()))
        return Unknown(str(e))
    if kind == "Between":
        col = _column(v.expr())
        lo, hi = _literal(v.low()), _literal(v.high())
        if col is None or lo is None or hi is None:
            return Unknown(str(e))
        inner = And((Compare(col, ">=", lo), Compare(col, "<=", hi)))
        return Not(inner) if v.negated() else inner
    if kind == "Not":
        return Not(from_datafusion_expr(v.expr()))
    if kind in ("IsNull", "IsNotNull"):
        col = _column(v.expr())
        return IsNull(col, kind == "IsNotNull") if col is not None else Unknown(str(e))
    if kind == "Alias":
        return from_datafusion_expr(v.expr())
    return Unknown(str(e))


def _walk(plan: Any) -> Iterator[Any]:
    yield plan
    for child in plan.inputs():
        yield from _walk(child)


def scan_filters(plan: Any, table_name: str) -> list[Predicate] | None:
    """Predicates that constrain every row read from ``table_name`` in ``plan``.

    Collects the scan's pushed filters and the ``Filter`` nodes directly above it.
    Returns ``None`` when the table is scanned more than once (each scan may see
    different rows: a self-join) or not at all: no single predicate is safe then.
    """
    scans = []
    for node in _walk(plan):
        kind, v = _kind(node)
        if kind == "TableScan" and str(v.table_name()).split(".")[-1] == table_name:
            scans.append(node)
    if len(scans) != 1:
        return None
    preds = [from_datafusion_expr(f) for f in _kind(scans[0])[1].filters()]
    # Filters right above the scan (through projections) also bind its rows.
    for node in _walk(plan):
        kind, v = _kind(node)
        if kind != "Filter":
            continue
        below = node.inputs()[0]
        while _kind(below)[0] in ("Projection", "SubqueryAlias"):
            below = below.inputs()[0]
        if below is scans[0] or str(below) == str(scans[0]):
            preds.append(from_datafusion_expr(v.predicate()))
    return preds


_LINE_1_COLUMN = re.compile(r"(Line: 1, Column: )(\d+)")


def predicate_for_table(schema: pa.Schema, predicate_sql: str, *, name: str = "t", lance: bool = False) -> Predicate:
    """Parse a SQL predicate over ``schema`` into the IR (via DataFusion's optimizer).

    With ``lance``, the predicate is read as Lance reads a filter: unquoted names keep their
    case (DataFusion lower-cases them), and a double-quoted word, a string literal to Lance and
    a name to DataFusion, leaves the predicate unknown (nothing pruned by it), as does one
    DataFusion cannot plan (Lance also finds a name in another case, ``city`` for ``City``,
    and runs its own functions): Lance, which runs it, says what is wrong with it.
    """
    if lance and '"' in predicate_sql:
        return Unknown(predicate_sql)
    config = datafusion.SessionConfig()
    if lance:
        config = config.set("datafusion.sql_parser.enable_ident_normalization", "false")
    ctx = datafusion.SessionContext(config)
    ctx.register_record_batches(name, [[pa.RecordBatch.from_pylist([], schema=schema)]])
    wrapper = f"SELECT * FROM {name} WHERE "
    try:
        plan = ctx.sql(wrapper + predicate_sql).optimized_logical_plan()
    except Exception as err:
        if lance:
            return Unknown(predicate_sql)
        # a parser's position counts from the start of the wrapper: make it the predicate's
        text = _LINE_1_COLUMN.sub(lambda m: f"{m.group(1)}{int(m.group(2)) - len(wrapper)}", str(err))
        if text == str(err):
            raise
        raise ValueError(text) from err
    preds = scan_filters(plan, name) or []
    if not preds:
        return Unknown(predicate_sql)
    return preds[0] if len(preds) == 1 else And(tuple(preds))
