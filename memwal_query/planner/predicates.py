"""A small typed predicate IR that pruning understands.

Front-ends translate engine expressions into it (:mod:`.datafusion_expr` for
DataFusion ``Expr`` trees, :mod:`.arrow_expr` for the ``pyarrow.compute.Expression``
filters DataFusion pushes into a dataset). Anything a front-end does not
understand becomes :class:`Unknown`, which pruning treats as "might match".

Example:
    >>> import pyarrow as pa
    >>> p = And((Compare("id", "=", pa.scalar(5)), Not(IsNull("id"))))
    >>> to_nnf(p)
    And(children=(Compare(column='id', op='=', value=<pyarrow.Int64Scalar: 5>), IsNull(column='id', negated=True)))
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

__all__ = [
    "Predicate",
    "Compare",
    "InSet",
    "IsNull",
    "And",
    "Or",
    "Not",
    "Unknown",
    "to_nnf",
    "columns_of",
    "needed_columns",
    "to_sql",
    "sql_name",
]

Op = Literal["=", "!=", "<", "<=", ">", ">="]
_NEGATE: dict[str, Op] = {"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_FLIP: dict[str, Op] = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True)
class Compare:
    """``column <op> value``."""

    column: str
    op: Op
    value: pa.Scalar

    def flipped(self) -> Compare:
        """The same comparison written with the operands swapped (``5 < x`` -> ``x > 5``)."""
        return Compare(self.column, _FLIP[self.op], self.value)


@dataclass(frozen=True)
class InSet:
    """``column IN (values)`` or ``NOT IN``."""

    column: str
    values: tuple[pa.Scalar, ...]
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    """``column IS NULL`` (or ``IS NOT NULL`` when negated)."""

    column: str
    negated: bool = False


@dataclass(frozen=True)
class And:
    """All children hold."""

    children: tuple[Predicate, ...]


@dataclass(frozen=True)
class Or:
    """At least one child holds."""

    children: tuple[Predicate, ...]


@dataclass(frozen=True)
class Not:
    """The child does not hold (SQL: the row is kept only when the child is FALSE)."""

    child: Predicate


@dataclass(frozen=True)
class Unknown:
    """A shape pruning does not understand: might match anything."""

    text: str = ""
    #: The columns it reads, when known (a function of known columns, e.g. ``is_nan(f)``).
    reads: frozenset[str] | None = None


Predicate = Compare | InSet | IsNull | And | Or | Not | Unknown


def to_nnf(p: Predicate, negate: bool = False) -> Predicate:
    """Push ``Not`` down to the leaves (negation normal form).

    Under SQL's three-valued logic a filter keeps a row only when the predicate is
    TRUE, so ``NOT (c < x)`` keeps exactly the rows with ``c >= x`` (a NULL ``c``
    is dropped by both), and ``NOT (c IN s)`` is ``c NOT IN s``.
    """
    if isinstance(p, Not):
        return to_nnf(p.child, not negate)
    if isinstance(p, And):
        kids = tuple(to_nnf(c, negate) for c in p.children)
        return Or(kids) if negate else And(kids)
    if isinstance(p, Or):
        kids = tuple(to_nnf(c, negate) for c in p.children)
        return And(kids) if negate else Or(kids)
    if not negate:
        return p
    if isinstance(p, Compare):
        return Compare(p.column, _NEGATE[p.op], p.value)
    if isinstance(p, InSet):
        return InSet(p.column, p.values, not p.negated)
    if isinstance(p, IsNull):
        return IsNull(p.column, not p.negated)
    return p  # Unknown stays unknown


def columns_of(p: Predicate) -> set[str]:
    """Columns a predicate mentions."""
    if isinstance(p, (Compare, InSet, IsNull)):
        return {p.column}
    if isinstance(p, (And, Or)):
        out: set[str] = set()
        for c in p.children:
            out |= columns_of(c)
        return out
    if isinstance(p, Not):
        return columns_of(p.child)
    return set()


def needed_columns(p: Predicate) -> frozenset[str] | None:
    """Every column evaluating ``p`` reads, or ``None`` when part of it is :class:`Unknown`.

    Unlike :func:`columns_of` (enough for pruning, which ignores what it cannot read),
    an unknown part may read any column.

    Example:
        >>> import pyarrow as pa
        >>> sorted(needed_columns(And((Compare("a", ">", pa.scalar(1)), IsNull("b")))))
        ['a', 'b']
        >>> needed_columns(Or((Compare("a", "=", pa.scalar(1)), Unknown("f(b)")))) is None
        True
        >>> sorted(needed_columns(Or((Compare("a", "=", pa.scalar(1)), Unknown("f(b)", frozenset("b"))))))
        ['a', 'b']
    """
    if isinstance(p, Unknown):
        return p.reads
    if isinstance(p, (And, Or)):
        out: set[str] = set()
        for c in p.children:
            got = needed_columns(c)
            if got is None:
                return None
            out |= got
        return frozenset(out)
    if isinstance(p, Not):
        return needed_columns(p.child)
    return frozenset(columns_of(p))


_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def sql_name(name: str) -> str:
    """``name`` as DataFusion's SQL reads it back: as it is when it is a plain lower-case
    name, else double-quoted (``events.lance`` -> ``"events.lance"``)."""
    return name if _PLAIN_NAME.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def _literal(value: pa.Scalar) -> str:
    v = value.as_py() if isinstance(value, pa.Scalar) else value
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, bytes):
        return f"X'{v.hex()}'"
    if isinstance(v, dt.datetime):
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
    if isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'"
    return "'" + str(v).replace("'", "''") + "'"


def to_sql(p: Predicate) -> str:
    """The predicate as SQL text (for explanations).

    Example:
        >>> import pyarrow as pa
        >>> to_sql(Or((Compare("id", "=", pa.scalar(1)), And((InSet("c", (pa.scalar("a"),)), IsNull("x", True))))))
        "id = 1 OR c IN ('a') AND x IS NOT NULL"
        >>> either = Or((Compare("a", "<", pa.scalar(2)), Unknown("f(a)")))
        >>> to_sql(And((either, Not(Compare("b", ">=", pa.scalar(1.5))))))
        '(a < 2 OR <not understood: f(a)>) AND NOT b >= 1.5'
    """
    if isinstance(p, Compare):
        return f"{sql_name(p.column)} {p.op} {_literal(p.value)}"
    if isinstance(p, InSet):
        return f"{sql_name(p.column)} {'NOT IN' if p.negated else 'IN'} ({', '.join(_literal(v) for v in p.values)})"
    if isinstance(p, IsNull):
        return f"{sql_name(p.column)} IS {'NOT NULL' if p.negated else 'NULL'}"
    if isinstance(p, And):
        return " AND ".join(f"({to_sql(c)})" if isinstance(c, Or) else to_sql(c) for c in p.children) or "TRUE"
    if isinstance(p, Or):
        return " OR ".join(to_sql(c) for c in p.children) or "FALSE"
    if isinstance(p, Not):
        inner = to_sql(p.child)
        return f"NOT ({inner})" if isinstance(p.child, And | Or) else f"NOT {inner}"
    return f"<not understood: {p.text}>" if p.text else "<not understood>"
