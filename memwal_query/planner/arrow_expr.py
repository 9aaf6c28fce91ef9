"""``pyarrow.compute.Expression`` -> the predicate IR.

DataFusion hands a dataset its pushed-down filters as ``pyarrow.compute.Expression``
(in ``get_fragments(filter)``), and pyarrow offers no public way to walk one. Its
pickle form, however, is Arrow's own expression serialization: an Arrow IPC file
whose schema metadata lists the tree in order (``call: equal``, ``field_ref: id``,
``literal: 0``, ``end: equal`` ...) and whose columns hold the literal and option
values. We read that token stream. Any token sequence we do not recognise, a field
name not in the schema, or a decoding failure yields :class:`Unknown` (might
match), so a misread can cost pruning but never rows.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from memwal_query.planner.predicates import And, Compare, InSet, IsNull, Not, Or, Predicate, Unknown, needed_columns

__all__ = [
    "COMPARISONS",
    "Call",
    "Field",
    "Lit",
    "Tree",
    "expression_key",
    "expression_tree",
    "from_arrow_expression",
    "in_values",
    "nan_is_null",
    "value_set",
]

_LINE = re.compile(r"^(call|field_ref|literal|options|end): '(.*)'$")
#: pyarrow comparison functions and their SQL operators.
COMPARISONS = {
    "equal": "=",
    "not_equal": "!=",
    "less": "<",
    "less_equal": "<=",
    "greater": ">",
    "greater_equal": ">=",
}
_FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


class _Tokens:
    def __init__(self, items: list[tuple[str, str]], batch: pa.RecordBatch, columns: Collection[str]) -> None:
        self.items = items
        self.i = 0
        self.batch = batch
        self.columns = columns

    def next(self) -> tuple[str, str]:
        tok = self.items[self.i]
        self.i += 1
        return tok

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.i] if self.i < len(self.items) else None


class Field:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Lit:
    __slots__ = ("value",)

    def __init__(self, value: pa.Scalar) -> None:
        self.value = value


class Call:
    """A function call of an expression tree (see :func:`expression_tree`)."""

    __slots__ = ("name", "args", "options")

    def __init__(self, name: str, args: list[Tree], options: pa.Scalar | None) -> None:
        self.name = name
        self.args = args
        self.options = options


Tree = Call | Field | Lit | Unknown
_Node = Predicate | Field | Lit


def _parse(t: _Tokens) -> Tree:
    kind, value = t.next()
    if kind == "field_ref":
        return Field(value) if value in t.columns else Unknown(f"field {value}")
    if kind == "literal":
        return Lit(t.batch.column(int(value))[0])
    if kind != "call":
        raise ValueError(f"unexpected token {kind}")
    name = value
    args: list[Tree] = []
    options: pa.Scalar | None = None
    while True:
        nxt = t.peek()
        if nxt is None:
            raise ValueError("unterminated call")
        if nxt[0] == "end":
            t.next()
            break
        if nxt[0] == "options":
            t.next()
            options = t.batch.column(int(nxt[1]))[0]
            continue
        args.append(_parse(t))
    return Call(name, args, options)


def _ir(n: Tree) -> _Node:
    if isinstance(n, Call):
        return _build(n.name, [_ir(a) for a in n.args], n.options)
    return n


def _build(name: str, args: list[_Node], options: pa.Scalar | None) -> Predicate:
    if name in ("and_kleene", "and"):
        return And(tuple(_pred(a) for a in args))
    if name in ("or_kleene", "or"):
        return Or(tuple(_pred(a) for a in args))
    if name == "invert" and len(args) == 1:
        return Not(_pred(args[0]))
    if name in ("is_null", "is_valid") and len(args) == 1 and isinstance(args[0], Field):
        if name == "is_null" and nan_is_null(options):
            return Unknown("is_null(nan_is_null)")
        return IsNull(args[0].name, name == "is_valid")
    if name in COMPARISONS and len(args) == 2:
        a, b = args
        if isinstance(a, Field) and isinstance(b, Lit):
            return Compare(a.name, COMPARISONS[name], b.value)  # type: ignore[arg-type]
        if isinstance(a, Lit) and isinstance(b, Field):
            return Compare(b.name, _FLIP[COMPARISONS[name]], a.value)  # type: ignore[arg-type]
    if name == "is_in" and len(args) == 1 and isinstance(args[0], Field):
        found = value_set(options)
        values = tuple(found) if found is not None else ()
        if values and all(v.is_valid for v in values):
            # pyarrow's is_in is two-valued: FALSE (not NULL) for a NULL input, so
            # its negation keeps NULL rows. Spell that out for negation to stay right.
            col = args[0].name
            return And((InSet(col, tuple(values)), IsNull(col, negated=True)))
    return Unknown(name, _reads(args))


def value_set(options: pa.Scalar | None) -> pa.Array | None:
    """The values of an ``is_in`` call's options (None: none readable)."""
    if not isinstance(options, pa.StructScalar):
        return None
    found = options.get("value_set") if hasattr(options, "get") else options["value_set"]
    return found.values if isinstance(found, pa.ListScalar) and found.is_valid else None


def nan_is_null(options: pa.Scalar | None) -> bool:
    """Whether an ``is_null`` call's options count NaN as NULL."""
    return isinstance(options, pa.StructScalar) and bool(options.as_py().get("nan_is_null"))


def _reads(args: list[_Node]) -> frozenset[str] | None:
    """The columns a call over ``args`` reads (None: not known)."""
    out: set[str] = set()
    for a in args:
        got = frozenset((a.name,)) if isinstance(a, Field) else frozenset() if isinstance(a, Lit) else needed_columns(a)
        if got is None:
            return None
        out |= got
    return frozenset(out)


def _pred(n: _Node) -> Predicate:
    if isinstance(n, (Field, Lit)):
        return Unknown("bare value")
    return n


def expression_key(expr: object) -> bytes:
    """A key telling any two different expressions apart, for caches: a digest of their
    serialized form. (``str()`` prints at most 20 values of an ``IN`` list, eliding the middle:
    two lists differing there printed alike, and a cache keyed on the text answered the second
    query with the first one's filter.) Not an expression (a constant): its ``repr``."""
    if not isinstance(expr, pc.Expression):
        return repr(expr).encode()
    return hashlib.blake2b(expr.__reduce__()[1][0], digest_size=20).digest()


def expression_tree(expr: pc.Expression, columns: Collection[str]) -> Tree:
    """The call tree of ``expr``: :class:`Call` nodes over fields (``.name``) and literals
    (``.value``); :class:`Unknown` when it cannot be read (or names a field not in ``columns``)."""
    if not isinstance(expr, pc.Expression):  # e.g. a constant DataFusion folded the filter to
        return Unknown(str(expr))
    try:
        buf = expr.__reduce__()[1][0]
        table = ipc.open_file(buf).read_all()
        text = table.schema.to_string(show_schema_metadata=True, truncate_metadata=False, show_field_metadata=False)
        meta = text.split("-- schema metadata --", 1)[1].strip().splitlines()
        items = []
        for line in meta:
            m = _LINE.match(line.strip())
            if m is None:
                return Unknown(str(expr))
            items.append((m.group(1), m.group(2)))
        batch = table.combine_chunks().to_batches()[0] if table.num_rows else None
        if batch is None:
            batch = pa.RecordBatch.from_pylist([], schema=table.schema)
        tokens = _Tokens(items, batch, set(columns))
        node = _parse(tokens)
        return node if tokens.peek() is None else Unknown(str(expr))
    except (IndexError, ValueError, KeyError, TypeError, pa.ArrowException):
        return Unknown(str(expr))


def from_arrow_expression(expr: pc.Expression | None, columns: Collection[str]) -> Predicate:
    """Translate a pushed-down pyarrow filter into the IR.

    Args:
        expr: The expression (``None`` = no filter).
        columns: Column names of the table (any other field reference -> Unknown).

    Example:
        >>> import pyarrow.compute as pc
        >>> from_arrow_expression((pc.field("id") == 5) & pc.field("s").is_valid(), ["id", "s"])
        And(children=(Compare(column='id', op='=', value=<pyarrow.Int64Scalar: 5>), IsNull(column='s', negated=True)))
    """
    if expr is None:
        return Unknown("no filter")
    try:
        return _pred(_ir(expression_tree(expr, columns)))
    except (IndexError, ValueError, KeyError, TypeError, pa.ArrowException):
        return Unknown(str(expr))


def in_values(call: Call, types: dict[str, pa.DataType]) -> pa.Array | None:
    """The values of an ``is_in`` ``call`` over a column, in the type it compares them in,
    when pyarrow's answer (it casts the values to the column's type) is DataFusion's and
    Lance's (they compare in the wider type); None otherwise.

    The same type, both integers (values that do not fit fail the cast), both strings or both
    binaries qualify; a float32 column and float64 values (0.1) do not, nor a date column and
    timestamps. A float16 column takes any float or integer values cast to float16, as pyarrow
    would cast them (it has no float16 kernel to do it: Lance compares them, as float16's
    exact values). An untyped empty or all-NULL list takes the column's type.

    Example:
        >>> call = expression_tree(pc.field("h").isin([0.5, 2]), ["h"])
        >>> in_values(call, {"h": pa.float16()}).type
        DataType(halffloat)
        >>> in_values(call, {"h": pa.float32()}) is None
        True
    """
    values = value_set(call.options)
    arg = call.args[0] if len(call.args) == 1 else None
    column = types.get(arg.name) if isinstance(arg, Field) else None
    if values is None or column is None:
        return None
    if pa.types.is_dictionary(column):
        column = column.value_type
    if pa.types.is_null(values.type):  # an untyped empty or all-NULL list: no value to convert
        try:
            return values.cast(column)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    if pa.types.is_float16(column) and (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        return values.cast(pa.float16(), safe=False)
    kinds = (pa.types.is_integer, _is_text, _is_binary)
    return values if column == values.type or any(kind(column) and kind(values.type) for kind in kinds) else None


def numeric_kind(n: Tree, types: dict[str, pa.DataType]) -> str | None:
    """``"float"`` for a float column or literal, ``"number"`` for an integer one, None for
    anything else (a decimal too: DataFusion compares one with a float as decimals).

    Example:
        >>> numeric_kind(Field("g"), {"g": pa.float32()}), numeric_kind(Field("n"), {"n": pa.int8()})
        ('float', 'number')
    """
    t = n.value.type if isinstance(n, Lit) else types.get(n.name) if isinstance(n, Field) else None
    if t is None:
        return None
    if pa.types.is_floating(t):
        return "float"
    return "number" if pa.types.is_integer(t) else None


def widened_in(call: Call, types: dict[str, pa.DataType]) -> pa.Array | None:
    """The float values of an ``is_in`` ``call`` over a float32 or integer column, in the type
    DataFusion compares them in, the column cast to it: float64 for float64 values, else float32
    (pyarrow would cast the values to the column's type: float32(0.1) matched 0.1, and 0.5 an
    integer 0); None for any other ``is_in``.

    Example:
        >>> call = expression_tree(pc.field("g").isin([0.1]), ["g"])
        >>> widened_in(call, {"g": pa.float32()}).type
        DataType(double)
    """
    listed = value_set(call.options)
    arg = call.args[0] if len(call.args) == 1 else None
    column = types.get(arg.name) if isinstance(arg, Field) else None
    if listed is None or column is None or not pa.types.is_floating(listed.type):
        return None
    if not (pa.types.is_float32(column) or pa.types.is_integer(column)):
        return None
    return listed.cast(pa.float64() if pa.types.is_float64(listed.type) else pa.float32())


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t))
