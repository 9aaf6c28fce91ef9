"""A user's pyarrow filter in a form Lance can run over every column type.

Lance turns a ``pyarrow.compute.Expression`` filter into its plan through Substrait, which
has no unsigned integers, large strings or large binaries: a filter over such a column
fails there ("not yet supported by Substrait conversion"), while the same condition as SQL
text runs. A large list, decimal256, duration or time column anywhere in the table fails every
expression filter (the whole schema is converted). :func:`for_lance` writes such an
expression as SQL when it can read all of it (comparisons, AND/OR/NOT, IS [NOT] NULL, IN
lists of literals) and leaves every other filter as it was. The SQL answers as DataFusion and
the rows memwal filters in memory do (:func:`_compared`; ``IN`` as SQL's); an ``is_in`` of an
untyped empty or all-NULL list is written so too, since Lance answers it as pyarrow, and so is a
comparison of two numeric columns, a float one among them (Lance orders -0.0 below 0.0 there).

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> schema = pa.schema([("u", pa.uint32()), ("s", pa.string())])
    >>> for_lance((pc.field("u") > pa.scalar(5, pa.uint32())) & pc.field("s").is_valid(), schema)
    '((`u` > 5) AND (`s` IS NOT NULL))'
    >>> for_lance(pc.field("s") == "x", schema)  # Lance runs it as it is
    <pyarrow.compute.Expression (s == "x")>
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.planner.arrow_expr import (
    COMPARISONS,
    Call,
    Field,
    Lit,
    Tree,
    expression_tree,
    from_arrow_expression,
    in_values,
    nan_is_null,
    numeric_kind,
    widened_in,
)
from memwal_query.planner.predicates import needed_columns

__all__ = ["expression_runs", "for_lance", "needs_sql", "quote_name", "lance_scanner"]

#: How an ``is_in`` of an untyped empty or all-NULL list prints: Lance answers it as pyarrow
#: (``~n.isin([])`` kept NULL rows), not as the SQL ``IN`` it gives a typed list.
_UNTYPED_SET = "value_set=null:"


def for_lance(filt: str | pc.Expression | None, schema: pa.Schema) -> str | pc.Expression | None:
    """``filt`` as SQL text when it is an expression over a column Substrait cannot carry
    and can be written as SQL; otherwise ``filt`` itself."""
    if not isinstance(filt, pc.Expression):
        return filt
    text = str(filt)
    if expression_runs(filt, schema) and _UNTYPED_SET not in text and not _compares_float_columns(filt, text, schema):
        return filt
    sql = _as_sql(filt, schema)
    return sql if sql is not None else filt


def lance_scanner(ds: lance.LanceDataset, filt: str | pc.Expression | None, **kwargs: Any) -> lance.LanceScanner:
    """``ds.scanner(filter=..., **kwargs)`` filtered by ``filt``: :func:`for_lance`, and an
    expression pyarrow cannot hand Lance (its Substrait has no safe cast: an integer column
    against a float, a dictionary column) as SQL text where it can be written (a search has no
    other way; rows filtered in memory would otherwise be filtered by pyarrow, which cannot
    tell a NaN with its sign bit set)."""
    given = for_lance(filt, ds.schema)
    if given is not None:
        kwargs["filter"] = given
    try:
        return ds.scanner(**kwargs)
    except pa.ArrowInvalid as err:
        if not isinstance(given, pc.Expression) or "Substrait" not in str(err):
            raise
        sql = _as_sql(given, ds.schema)
        if sql is None:
            raise
        kwargs["filter"] = sql
        return ds.scanner(**kwargs)


def expression_runs(filt: pc.Expression, schema: pa.Schema) -> bool:
    """Whether Lance can run ``filt`` as an expression over a dataset of ``schema``: it
    names no column Substrait cannot carry, and no column of the schema fails every one."""
    odd = {f.name for f in schema if needs_sql(f.type)}
    named = needed_columns(from_arrow_expression(filt, schema.names)) if odd else frozenset()
    if named is None:  # not read: by its text (a column named `u` is in any `is_in` text)
        named = frozenset(name for name in odd if name in str(filt))
    if named & odd:
        return False
    return not any(_unconvertible(f.type) for f in schema)


def quote_name(name: str) -> str | None:
    """A column name as Lance's SQL reads it back whatever it spells (``null``, ``true``,
    spaces, capitals): backtick-quoted; None for a name with a backtick of its own.

    Example:
        >>> quote_name("null")
        '`null`'
    """
    return None if "`" in name else f"`{name}`"


def needs_sql(t: pa.DataType) -> bool:
    """Whether Lance cannot filter a column of type ``t`` by expression (Substrait has no such
    type, or Lance leaves it out of the schema it converts: vector columns)."""
    return bool(
        pa.types.is_unsigned_integer(t)
        or pa.types.is_large_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_float16(t)
        or pa.types.is_date64(t)  # "not yet supported by Substrait conversion"
    )


def _unconvertible(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` anywhere in the schema fails every expression filter:
    Lance converts the whole schema to Substrait, which has no such type."""
    if pa.types.is_large_list(t) or pa.types.is_decimal256(t) or pa.types.is_duration(t) or pa.types.is_time(t):
        return True
    if pa.types.is_struct(t):
        return any(_unconvertible(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
        return _unconvertible(t.value_type)
    if pa.types.is_map(t):
        return _unconvertible(t.key_type) or _unconvertible(t.item_type)
    return False


def _as_sql(filt: pc.Expression, schema: pa.Schema) -> str | None:
    """``filt`` as Lance SQL over a dataset of ``schema``, or None where it cannot be written."""
    return _sql(expression_tree(filt, schema.names), {f.name: f.type for f in schema})


def _sql(n: Tree, types: dict[str, pa.DataType]) -> str | None:
    if isinstance(n, Field):
        return quote_name(n.name)
    if isinstance(n, Lit):
        return _literal(n.value.as_py())
    if not isinstance(n, Call):
        return None
    args = [_sql(a, types) for a in n.args]
    if any(a is None for a in args) or not args:
        return None
    if n.name in COMPARISONS and len(args) == 2:
        left, right = _compared(n.args, [str(a) for a in args], types)
        cmp = f"({left} {COMPARISONS[n.name]} {right})"
        if not _float_columns(n.args, types):
            return cmp
        # Lance compares two columns in IEEE 754's total order (-0.0 < 0.0); DataFusion and
        # the rows memwal filters in memory take the zeros for one value
        zeros = f"({left} = 0 AND {right} = 0)"
        return f"({cmp} OR {zeros})" if n.name in _HOLD_AT_ZEROS else f"({cmp} AND NOT {zeros})"
    if n.name in ("and_kleene", "and", "or_kleene", "or"):
        return "(" + f" {'AND' if n.name.startswith('and') else 'OR'} ".join(str(a) for a in args) + ")"
    if n.name == "invert" and len(args) == 1:
        return f"(NOT {args[0]})"
    if n.name in ("is_null", "is_valid") and len(args) == 1:
        if n.name == "is_null" and nan_is_null(n.options):
            return None  # SQL's IS NULL does not count NaN
        return f"({args[0]} IS {'NOT ' if n.name == 'is_valid' else ''}NULL)"
    if n.name == "is_in" and len(args) == 1:
        found, subject = in_values(n, types), args[0]
        column = types.get(n.args[0].name) if isinstance(n.args[0], Field) else None
        if found is None:  # Lance would read the literals in the column's type, as pyarrow does
            found = widened_in(n, types)
            if found is None:
                return None
            subject, column = f"CAST({args[0]} AS {_SQL_FLOAT[str(found.type)]})", found.type
        listed = found.to_pylist()
        if column is not None and pa.types.is_integer(column):
            low, high = _limits(column)
            listed = [v for v in listed if v is None or low <= v <= high]  # Lance refuses 300 for an int8
        values = ["NULL" if v is None else _literal(v) for v in listed]
        if any(v is None for v in values):
            return None
        # SQL's IN, as every other filter of memwal answers (nan_order): NULL for a NULL input,
        # and for an unlisted value when NULL is listed; an empty list is FALSE (NULL for NULL)
        return f"({subject} IN ({', '.join(str(v) for v in values)}))" if values else f"({subject} IS NULL AND NULL)"
    return None


_SQL_FLOAT = {"double": "DOUBLE", "float": "FLOAT"}
_HOLD_AT_ZEROS = ("equal", "less_equal", "greater_equal")


def _float_columns(pair: list[Tree], types: dict[str, pa.DataType]) -> bool:
    """Whether ``pair`` is two numeric columns, a float one among them."""
    kinds = [numeric_kind(a, types) if isinstance(a, Field) else None for a in pair]
    return None not in kinds and "float" in kinds


def _compares_float_columns(filt: pc.Expression, text: str, schema: pa.Schema) -> bool:
    """Whether ``filt`` (printed as ``text``) compares two numeric columns, a float one among
    them (read only when its text names a float column and another column)."""
    named = [f for f in schema if f.name in text]
    if len(named) < 2 or not any(pa.types.is_floating(f.type) for f in named):
        return False
    types = {f.name: f.type for f in schema}

    def walk(n: Tree) -> bool:
        if not isinstance(n, Call):
            return False
        here = n.name in COMPARISONS and len(n.args) == 2 and _float_columns(n.args, types)
        return here or any(walk(a) for a in n.args)

    return walk(expression_tree(filt, schema.names))


def _compared(pair: list[Tree], sql: list[str], types: dict[str, pa.DataType]) -> list[str]:
    """The two sides of a comparison as DataFusion compares them (memwal's rule on every level).

    Lance reads a number in the type of the column it is compared with: ``g > 0.1`` over a
    float32 column compared float32(0.1), where the rows filtered in memory (and DataFusion)
    compare in float64: such a column is widened (``CAST(g AS DOUBLE)``) unless the number is one
    of its type (0.5: then both agree, and Lance can still search the column's index). An integer compared
    with a float16 column is the float16 it casts to (as DataFusion casts it), on the rows held
    in memory too (float32 there: ``h = 2049`` matched 2048 in Lance's files only).
    """
    out = list(sql)
    for i, (a, b) in enumerate([(pair[0], pair[1]), (pair[1], pair[0])]):
        column = types.get(a.name) if isinstance(a, Field) else None
        v = b.value.as_py() if isinstance(b, Lit) else None
        if column is None or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if isinstance(v, float) and (pa.types.is_float16(column) or pa.types.is_float32(column)):
            if not _holds(column, v):  # only then: a cast column is no index lookup
                out[i] = f"CAST({out[i]} AS DOUBLE)"
        elif isinstance(v, float) and pa.types.is_integer(column):
            # in the float's type, as DataFusion compares them (Lance refuses the float)
            out[i] = f"CAST({out[i]} AS {_SQL_FLOAT.get(str(b.value.type), 'DOUBLE')})"  # type: ignore[union-attr]
        elif isinstance(v, int) and pa.types.is_float16(column):
            out[1 - i] = _literal(_as_half(v)) or out[1 - i]
        elif isinstance(v, int) and pa.types.is_integer(column) and -(2**63) <= v < 2**63:
            low, high = _limits(column)
            if not low <= v <= high:  # Lance refuses -129 for an int8; DataFusion widens the column
                out[i] = f"CAST({out[i]} AS BIGINT)"
    return out


def _holds(column: pa.DataType, v: float) -> bool:
    """Whether float ``v`` is a value of float column type ``column`` (NaN and infinities are)."""
    narrow = np.float16 if pa.types.is_float16(column) else np.float32
    with np.errstate(over="ignore"):
        return math.isnan(v) or float(narrow(v)) == v


def _as_half(v: int) -> float:
    """The float16 value integer ``v`` casts to (beyond its range: an infinity)."""
    try:
        with np.errstate(over="ignore"):
            return float(np.float16(float(v)))
    except OverflowError:  # beyond a double too
        return math.inf if v > 0 else -math.inf


def _limits(t: pa.DataType) -> tuple[int, int]:
    """The least and greatest value of integer type ``t``."""
    limits = np.iinfo(t.to_pandas_dtype())
    return int(limits.min), int(limits.max)


def _literal(v: object) -> str | None:
    """``v`` as a SQL literal Lance reads back as the same value (None: not written here)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        if v == -(2**63):  # its digits read as minus 2**63, a float to Lance's parser
            return f"({-(2**63) + 1} - 1)"
        return str(v) if -(2**63) < v < 2**64 else None
    if isinstance(v, float):
        if math.isnan(v):  # the positive NaN; a NaN with its sign bit set has no text
            return None if math.copysign(1.0, v) < 0 else "CAST('NaN' AS DOUBLE)"
        return repr(v) if math.isfinite(v) else f"CAST('{'' if v > 0 else '-'}Infinity' AS DOUBLE)"
    if isinstance(v, str) and v.isprintable() and "\\" not in v:
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, bytes):
        return f"X'{v.hex()}'"
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return f"DATE '{v.isoformat()}'"
    return None
