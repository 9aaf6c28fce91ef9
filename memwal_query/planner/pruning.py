"""Region pruning: can a region hold a row that matches a predicate?

A pure function of (region spec, the region's spec values, predicate), in the
manner of pyiceberg's inclusive-projection evaluators: a region created for spec
value ``v`` of field ``f = t(c)`` holds only rows with ``t(c) == v``, so a leaf on
column ``c`` is checked by applying ``t`` to the predicate's literals (cast to the
column's type, as the writer hashed them). Missing information always means
:data:`ROWS_MIGHT_MATCH`; pruning can cost speed when unsure, never rows.

* ``=`` / ``IN``: any transform (bucket, identity, truncate, temporal, single-source
  expressions): cannot match when no literal maps to ``v``.
* ``<``, ``<=``, ``>``, ``>=``: order-preserving transforms only (identity,
  truncate, year/month/day/hour).
* ``!=`` / ``NOT IN``: identity only (the region holds exactly one value).
* ``IS NULL``: cannot match when ``t(NULL) != v`` (bucket: NULL is bucket 0).
* ``IS NOT NULL``: order-preserving transforms with ``v`` NULL cannot match.
* ``AND``: cannot if any child cannot; ``OR``: cannot if every child cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
from memwal_query.planner.predicates import And, Compare, InSet, IsNull, Or, Predicate, Unknown, to_nnf

__all__ = [
    "ROWS_MIGHT_MATCH",
    "ROWS_CANNOT_MATCH",
    "RegionValues",
    "Transform",
    "region_might_match",
]

ROWS_MIGHT_MATCH = True
ROWS_CANNOT_MATCH = False

ORDER_PRESERVING = {"identity", "truncate", "year", "month", "day", "hour"}

# (field spec, source column array) -> transformed values
Transform = Callable[[ShardingFieldSpec, pa.Array], pa.Array]


@dataclass(frozen=True)
class RegionValues:
    """The spec value of each field of one region (``None`` = the NULL value).

    ``source`` says where they were learned (field entries, naming convention);
    ``outside``: how many of the region's unmerged keys the values exclude (a writer
    that did not route by the spec put them there): such a region is never pruned.
    """

    values: Mapping[str, Any]
    source: str
    outside: int = 0


def _lossless_cast(value: pa.Scalar, to: pa.DataType) -> pa.Scalar | None:
    if not value.is_valid:
        return None
    if value.type == to:
        return value
    try:
        cast = value.cast(to)
        if cast.cast(value.type).as_py() != value.as_py():
            return None
        return cast
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError):
        return None


class _Field:
    """One spec field bound to its (single) source column."""

    __slots__ = ("spec", "column", "col_type", "value", "kind", "transform")

    def __init__(
        self, spec: ShardingFieldSpec, column: str, col_type: pa.DataType, value: Any, transform: Transform
    ) -> None:
        self.spec = spec
        self.column = column
        self.col_type = col_type
        self.value = value
        self.kind = spec.transform if spec.transform else ("expression" if spec.expression else "?")
        self.transform = transform

    def apply(self, values: list[pa.Scalar | None]) -> list[Any] | None:
        """Transform literal values (already of the column type); None when impossible."""
        try:
            arr = pa.array([v.as_py() if v is not None else None for v in values], type=self.col_type)
            return list(self.transform(self.spec, arr).to_pylist())
        except Exception:  # noqa: BLE001 - an evaluation failure means "unknown"
            return None

    def cannot_match(self, leaf: Predicate) -> bool:
        v = self.value
        if isinstance(leaf, IsNull):
            if not leaf.negated:
                t_null = self.apply([None])
                return t_null is not None and t_null[0] != v
            return self.kind in ORDER_PRESERVING and v is None
        if isinstance(leaf, InSet):
            lits = [_lossless_cast(x, self.col_type) for x in leaf.values]
            if any(x is None for x in lits):
                return False  # a NULL or a value not of the column's type: unsure
            if leaf.negated:
                if self.kind != "identity":
                    return False
                return v is None or v in [x.as_py() for x in lits if x is not None]
            mapped = self.apply(list(lits))
            return mapped is not None and all(m != v for m in mapped)
        if isinstance(leaf, Compare):
            lit = _lossless_cast(leaf.value, self.col_type)
            if lit is None:
                return False
            if leaf.op == "=":
                mapped = self.apply([lit])
                return mapped is not None and mapped[0] != v
            if leaf.op == "!=":
                return self.kind == "identity" and (v is None or v == lit.as_py())
            if self.kind not in ORDER_PRESERVING:
                return False
            if v is None:
                return True  # every row has a NULL column: comparisons are never TRUE
            mapped = self.apply([lit])
            if mapped is None or mapped[0] is None:
                return False
            tx = mapped[0]
            # t is monotone: c < x implies t(c) <= t(x). Identity is also injective,
            # so strict comparisons exclude t(x) itself.
            strict = self.kind == "identity" and leaf.op in ("<", ">")
            try:
                if leaf.op in ("<", "<="):
                    return bool(v >= tx) if strict else bool(v > tx)
                return bool(v <= tx) if strict else bool(v < tx)
            except TypeError:
                return False
        return False


def _evaluate(p: Predicate, fields: Mapping[str, list[_Field]]) -> bool:
    if isinstance(p, And):
        return all(_evaluate(c, fields) for c in p.children)
    if isinstance(p, Or):
        return any(_evaluate(c, fields) for c in p.children)
    if isinstance(p, (Compare, InSet, IsNull)):
        return not any(f.cannot_match(p) for f in fields.get(p.column, ()))
    return ROWS_MIGHT_MATCH  # Unknown (and Not around an unknown shape)


def region_might_match(
    spec: RegionSpec | None,
    values: RegionValues | None,
    predicate: Predicate,
    field_names: Mapping[int, str],
    schema: pa.Schema,
    transform: Transform,
    *,
    allow_expressions: bool = True,
) -> bool:
    """Whether a region can hold a row matching ``predicate``.

    Args:
        spec: The region's spec (``None``: a manual region, never pruned).
        values: The region's spec values (``None``: unknown, never pruned).
        predicate: The query predicate (IR).
        field_names: Lance field id -> column name.
        schema: The table schema (column types for literal casts).
        transform: Applies a spec field's transform to an array of its source column.
        allow_expressions: Evaluate custom SQL-expression fields (they run DataFusion,
            which must not be called from inside a running query: pass False there).

    Returns:
        :data:`ROWS_MIGHT_MATCH` or :data:`ROWS_CANNOT_MATCH`.
    """
    if spec is None or values is None or isinstance(predicate, Unknown):
        return ROWS_MIGHT_MATCH
    bound: dict[str, list[_Field]] = {}
    for f in spec.fields:
        if len(f.source_ids) != 1 or f.field_id not in values.values:
            continue  # multi-source fields (multi_bucket, expressions) and unknown values: unsure
        is_expression = bool(f.expression) and not f.transform
        if f.transform not in ORDER_PRESERVING | {"bucket"} and not (is_expression and allow_expressions):
            continue
        col = field_names.get(int(f.source_ids[0]))
        if col is None or col not in schema.names:
            continue
        bound.setdefault(col, []).append(_Field(f, col, schema.field(col).type, values.values[f.field_id], transform))
    if not bound:
        return ROWS_MIGHT_MATCH
    return _evaluate(to_nnf(predicate), bound)
