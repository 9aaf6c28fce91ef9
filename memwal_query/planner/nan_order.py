"""Pushed-down filters compared the way DataFusion compares floating-point values.

DataFusion (and Lance, which evaluates filters with it) orders NaN above every other
number and equal to itself: ``f > 1`` holds for a NaN ``f``, ``f = 'NaN'`` finds it.
pyarrow's compute kernels follow IEEE 754, where every comparison with NaN is false. A
scan that filters rows in memory with pyarrow (decoded column caches, MemTables) would
then answer a query differently from the Lance scan of the same rows, and from DataFusion.
:func:`nan_ordered` rewrites a pushed filter's comparisons on floating-point columns so
that both engines give DataFusion's answer: ``f > c`` becomes ``NOT (f <= c)`` (true for a
NaN ``f``), ``f = NaN`` becomes ``is_nan(f)``, and so on (NULLs stay NULL, so ``NOT`` stays right).
Comparisons of two float columns follow the same order. ``IN`` lists answer as SQL's: NULL
(not FALSE) for a NULL value, and for a value not listed when the list holds a NULL
(pyarrow's ``is_in`` matches NULL to NULL), so ``NOT`` over them stays right too. A filter
this module cannot read whole is left as it is (DataFusion pushes only comparisons,
AND/OR/NOT, IS [NOT] NULL, BETWEEN and IN lists of literals); :func:`reads_whole` tells
such a filter (a user's pyarrow expression may be anything) from the others.

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
import weakref
from collections import OrderedDict
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.planner.arrow_expr import (
    COMPARISONS,
    Call,
    Field,
    Lit,
    Tree,
    expression_key,
    expression_tree,
    in_values,
    nan_is_null,
    numeric_kind,
    widened_in,
)

__all__ = ["as_given", "nan_ordered", "reads_whole"]

_CACHE_ENTRIES = 256
_cache: OrderedDict[tuple[bytes, tuple[str, ...], tuple[str, ...]], pc.Expression | None] = OrderedDict()
#: The filters :func:`nan_ordered` wrote, by identity (id -> (rewritten, given)), for as long as
#: the rewritten one lives (a scan may hold it while hundreds of other filters are written): a
#: user's own expression that spells the same as one (``is_nan(f)``, the rewrite of
#: ``f = NaN``) is not one.
_origin: dict[int, tuple[weakref.ref[pc.Expression], pc.Expression]] = {}
_lock = threading.Lock()


def nan_ordered(expr: pc.Expression, schema: pa.Schema) -> pc.Expression:
    """``expr`` with its comparisons on floating-point columns of ``schema`` ordered as
    DataFusion does, and its IN lists answering as SQL's."""
    if not isinstance(expr, pc.Expression):
        return expr
    # float columns; integer ones too (a float literal prints as an integer: ``n > 3.0`` is
    # "(n > 3)", and pyarrow's own comparison refused integers above 2**24 there)
    numeric = tuple(f.name for f in schema if pa.types.is_floating(f.type) or pa.types.is_integer(f.type))
    text = str(expr)
    if "is_in(" not in text and "nan" not in text and not any(name in text for name in numeric):
        return expr
    rebuilt = _rebuilt(expr, schema)
    return rebuilt if rebuilt is not None else expr


def as_given(filt: pc.Expression | None) -> pc.Expression | None:
    """The filter :func:`nan_ordered` rewrote into ``filt``, or ``filt`` itself: what Lance is
    handed (it evaluates with DataFusion's order itself, and to its scalar indexes a
    rewritten ``IN`` list is no lookup: a 1,000-key ``IN`` on an indexed key read every key)."""
    if filt is None:
        return None
    with _lock:
        found = _origin.get(id(filt))
    return found[1] if found is not None and found[0]() is filt else filt


def reads_whole(expr: pc.Expression, schema: pa.Schema) -> bool:
    """Whether :func:`nan_ordered` reads all of ``expr``: pyarrow then filters with it as
    DataFusion (and Lance) would; any other expression may answer differently there."""
    return _rebuilt(expr, schema) is not None


def _rebuilt(expr: pc.Expression, schema: pa.Schema) -> pc.Expression | None:
    floats = tuple(f.name for f in schema if pa.types.is_floating(f.type))
    key = (expression_key(expr), floats, tuple(str(f.type) + " " + f.name for f in schema))  # is_in reads types
    with _lock:
        written = _origin.get(id(expr))
        if written is not None and written[0]() is expr:
            return expr  # one this module wrote: given again, it stays as it is
        if key in _cache:
            return _cache[key]
    out = _rebuild(expression_tree(expr, schema.names), {f.name: f.type for f in schema})
    with _lock:
        _cache[key] = out
        if out is not None and not out.equals(expr) and id(out) not in _origin:
            _origin[id(out)] = (weakref.ref(out), expr)
            weakref.finalize(out, _forget, id(out))  # gone with it: its id may be reused then
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    return out


def _forget(key: int) -> None:
    # no lock: it runs when the last reference goes, which may be under ``_lock`` (a pop of ``_cache``)
    _origin.pop(key, None)


_SWAP = {"less": "greater", "less_equal": "greater_equal"}


def _rebuild(n: Tree, types: dict[str, pa.DataType]) -> pc.Expression | None:
    """``n`` as an Expression with DataFusion's float order (None: part of it is not understood)."""
    if isinstance(n, Field):
        return pc.field(n.name)
    if isinstance(n, Lit):
        return pc.scalar(n.value)
    if not isinstance(n, Call):
        return None
    args = [_rebuild(a, types) for a in n.args]
    if any(a is None for a in args):
        return None
    done = [a for a in args if a is not None]
    if n.name in COMPARISONS and len(n.args) == 2:
        return _compare(n.name, n.args[0], n.args[1], types)
    if n.name in ("and_kleene", "and") and done:
        return reduce(lambda a, b: a & b, done)
    if n.name in ("or_kleene", "or") and done:
        return reduce(lambda a, b: a | b, done)
    if n.name == "invert" and len(done) == 1:
        return ~done[0]
    if n.name == "is_valid" and len(done) == 1:
        return done[0].is_valid()
    if n.name == "is_null" and len(done) == 1:
        return done[0].is_null(nan_is_null=nan_is_null(n.options))
    if n.name == "is_in" and len(done) == 1:
        values = in_values(n, types)
        if values is not None:
            return _sql_in(done[0], values)
        # pyarrow casts the values to the column's type; DataFusion widens the column
        wide = widened_in(n, types)
        return None if wide is None else _sql_in(done[0].cast(wide.type, safe=False), wide)
    return None


def _sql_in(x: pc.Expression, values: pa.Array) -> pc.Expression:
    """``x IN (values)`` as SQL answers it: TRUE for a listed value; NULL for a NULL ``x`` and,
    when the list holds a NULL, for a value not listed; FALSE otherwise. A listed zero matches
    both zeros, as ``=`` does (``is_in`` hashes floats: -0.0 was not 0.0 in rows pyarrow
    filtered, while Lance's and DataFusion's said it was)."""
    unknown = pc.scalar(pa.scalar(None, pa.bool_()))
    listed = values.drop_null()
    if pa.types.is_floating(listed.type) and pc.any(pc.equal(listed.cast(pa.float64()), 0)).as_py():
        listed = pa.concat_arrays([listed, pa.array([0.0, -0.0], pa.float64()).cast(listed.type)])
    miss = unknown if values.null_count else pc.if_else(x.is_null(), unknown, pc.scalar(False))
    return pc.if_else(x.isin(listed), pc.scalar(True), miss)


def _type(n: Tree, types: dict[str, pa.DataType]) -> pa.DataType | None:
    return n.value.type if isinstance(n, Lit) else types.get(n.name) if isinstance(n, Field) else None


def _compare(name: str, left: Tree, right: Tree, types: dict[str, pa.DataType]) -> pc.Expression | None:
    """One comparison in DataFusion's order: NaN above every number, equal to itself. An
    integer column is compared with a float literal in the literal's type (``n < 'NaN'`` holds
    for every number), with a float column in that column's type, as DataFusion casts it
    (float16: not rewritten, pyarrow compares none)."""
    if isinstance(left, Lit) and isinstance(right, Field):  # the field first: c < f is f > c
        return _compare(_FLIP[name], right, left, types)
    a, b = _rebuild(left, types), _rebuild(right, types)
    if a is None or b is None:
        return None
    plain = _CMP[name](a, b)
    kinds = (numeric_kind(left, types), numeric_kind(right, types))
    if not isinstance(left, Field) or kinds[0] is None or "float" not in kinds:
        return plain
    nan_a = pc.is_nan(a if kinds[0] == "float" else a.cast(pa.float64(), safe=False))
    if isinstance(right, Lit):
        v = right.value.as_py()
        if kinds[0] == "number" and not (isinstance(v, float) and math.isnan(v)):
            return _against_integers(name, a, b, right.value.type)
        if not (isinstance(v, float) and math.isnan(v)):
            # NaN is above every number: f > c is NOT (f <= c), which IEEE makes true for NaN
            # (and NULL for NULL); one comparison and a bitmap flip, no is_nan pass
            if name in ("greater", "greater_equal"):
                return ~_CMP["less_equal" if name == "greater" else "less"](a, b)
            return plain
        if math.copysign(1.0, v) < 0:
            # a NaN with its sign bit set is below every number and every NaN without it,
            # equal to itself only; a column holding one is filtered by Lance instead
            # (:func:`memwal_query.scan.lance_eval.memory_filtered`), so here none is one
            below = name in ("equal", "less", "less_equal")
            return nan_a & ~nan_a if below else nan_a | ~nan_a
        # nothing is above NaN, NaN is only equal to itself (each NULL where the field is)
        return {
            "equal": nan_a,
            "not_equal": ~nan_a,
            "greater": nan_a & ~nan_a,
            "greater_equal": nan_a,
            "less": ~nan_a,
            "less_equal": nan_a | ~nan_a,
        }[name]
    if not isinstance(right, Field) or kinds[1] is None:
        return None
    if name in _SWAP:  # a < b is b > a
        return _compare(_SWAP[name], right, left, types)
    floated = [_type(n, types) for n, k in zip((left, right), kinds, strict=True) if k == "float"]
    if any(pa.types.is_float16(t) for t in floated if t is not None):
        return None
    wide = pa.float64() if any(t == pa.float64() for t in floated) else pa.float32()
    a, b = (x if k == "float" else x.cast(wide, safe=False) for x, k in zip((a, b), kinds, strict=True))
    plain = _CMP[name](a, b)
    nan_b = pc.is_nan(b)
    if name == "greater":
        return plain | (nan_a & ~nan_b)
    if name == "greater_equal":  # NaN >= anything but NULL (NaN >= NULL is NULL, not TRUE)
        return plain | (nan_a & b.is_valid())
    same = (a == b) | (nan_a & nan_b)
    return same if name == "equal" else ~same


def _against_integers(name: str, a: pc.Expression, b: pc.Expression, literal: pa.DataType) -> pc.Expression | None:
    """An integer column against a number: against a float in the float's type, as DataFusion
    casts it (a float16 one: not rewritten; pyarrow's own comparison cast to float32 whatever
    the float, and refused integers above 2**24)."""
    if not pa.types.is_floating(literal):
        return _CMP[name](a, b)
    if pa.types.is_float16(literal):
        return None
    return _CMP[name](a.cast(literal, safe=False), b)


_FLIP = {
    "equal": "equal",
    "not_equal": "not_equal",
    "less": "greater",
    "less_equal": "greater_equal",
    "greater": "less",
    "greater_equal": "less_equal",
}
_CMP = {
    "equal": lambda a, b: a == b,
    "not_equal": lambda a, b: a != b,
    "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b,
    "greater": lambda a, b: a > b,
    "greater_equal": lambda a, b: a >= b,
}
