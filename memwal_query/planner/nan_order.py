"""Pushed-down filters compared the way DataFusion compares floating-point values.

DataFusion (and Lance, which evaluates filters with it) orders NaN above every other
number and equal to itself: ``f > 1`` holds for a NaN ``f``, ``f = 'NaN'`` finds it.
pyarrow's compute kernels follow IEEE 754, where every comparison with NaN is false. A
scan that filters rows in memory with pyarrow (decoded column caches, MemTables) would
then answer a query differently from the Lance scan of the same rows, and from DataFusion.
:func:`nan_ordered` rewrites a pushed filter's comparisons on floating-point columns so
that both engines give DataFusion's answer: ``f > c`` becomes ``f > c OR is_nan(f)``,
``f = NaN`` becomes ``is_nan(f)``, and so on (NULLs stay NULL, so ``NOT`` stays right).
A filter this module cannot read whole (a comparison of two columns, a function) is
left as it is.

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> t = pa.table({"f": [float("nan"), 0.5, 2.0, None]})
    >>> t.filter(pc.field("f") > 1).column("f").to_pylist()
    [2.0]
    >>> t.filter(nan_ordered(pc.field("f") > 1, t.schema)).column("f").to_pylist()
    [nan, 2.0]
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.planner.arrow_expr import from_arrow_expression
from memwal_query.planner.predicates import And, Compare, InSet, IsNull, Not, Or, Predicate

__all__ = ["nan_ordered"]

_CACHE_ENTRIES = 256
_cache: OrderedDict[tuple[str, tuple[str, ...]], pc.Expression] = OrderedDict()
_lock = threading.Lock()


def nan_ordered(expr: pc.Expression, schema: pa.Schema) -> pc.Expression:
    """``expr`` with its comparisons on floating-point columns of ``schema`` ordered as DataFusion does."""
    floats = tuple(f.name for f in schema if pa.types.is_floating(f.type))
    if not floats or not isinstance(expr, pc.Expression):
        return expr
    text = str(expr)
    if not any(name in text for name in floats):
        return expr
    key = (text, floats)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    rebuilt = _rebuild(from_arrow_expression(expr, schema.names), set(floats))
    out = rebuilt if rebuilt is not None else expr
    with _lock:
        _cache[key] = out
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    return out


def _rebuild(p: Predicate, floats: set[str]) -> pc.Expression | None:
    """``p`` as an Expression with DataFusion's float order (None: part of it is not understood)."""
    if isinstance(p, (And, Or)):
        parts = [x for x in (_rebuild(c, floats) for c in p.children) if x is not None]
        if len(parts) != len(p.children) or not parts:
            return None
        both = (lambda a, b: a & b) if isinstance(p, And) else (lambda a, b: a | b)
        return reduce(both, parts)
    if isinstance(p, Not):
        inner = _rebuild(p.child, floats)
        return None if inner is None else ~inner
    if isinstance(p, IsNull):
        return pc.field(p.column).is_valid() if p.negated else pc.field(p.column).is_null()
    if isinstance(p, InSet):
        found = pc.field(p.column).isin(pa.array([v.as_py() for v in p.values], p.values[0].type))
        return ~found if p.negated else found
    if isinstance(p, Compare):
        return _compare(p, p.column in floats)
    return None


def _compare(p: Compare, floating: bool) -> pc.Expression:
    f = pc.field(p.column)
    value = p.value.as_py()
    if not floating or not isinstance(value, float | int):
        return _CMP[p.op](f, pc.scalar(p.value))
    nan = pc.is_nan(f)
    if isinstance(value, float) and math.isnan(value):
        # nothing is above NaN, NaN is only equal to itself (each NULL where f is)
        return {
            "=": nan,
            "!=": ~nan,
            ">": nan & ~nan,
            ">=": nan,
            "<": ~nan,
            "<=": nan | ~nan,
        }[p.op]
    plain = _CMP[p.op](f, pc.scalar(p.value))
    return plain | nan if p.op in (">", ">=") else plain  # NaN is above every number


_CMP = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
