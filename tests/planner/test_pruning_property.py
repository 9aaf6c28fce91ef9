"""Property: pruning never drops a region that holds a matching row.

Random data is split into regions by a spec field (every transform), a random
predicate is evaluated exactly by DataFusion, and every region holding a matching
row must be "might match" — through both front-ends (DataFusion Expr trees and the
pyarrow expressions DataFusion pushes into a dataset).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lance.mem_wal import evaluate_sharding_spec
from lance.schema import LanceSchema

from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
from memwal_query.planner.arrow_expr import from_arrow_expression
from memwal_query.planner.datafusion_expr import predicate_for_table
from memwal_query.planner.pruning import RegionValues, region_might_match
from memwal_query.regionspec.spec import evaluate_field

EPOCH = dt.datetime(1970, 1, 1)

TYPES: dict[str, tuple[pa.DataType, Any]] = {
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "string": (pa.string(), st.text(max_size=6)),
    "date32": (pa.date32(), st.dates(dt.date(1900, 1, 1), dt.date(2100, 1, 1))),
    "timestamp": (pa.timestamp("us"), st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2100, 1, 1))),
}
TRANSFORMS: dict[str, list[tuple[str, dict[str, str]]]] = {
    "int32": [("identity", {}), ("bucket", {"num_buckets": "5"}), ("truncate", {"width": "10"})],
    "int64": [("identity", {}), ("bucket", {"num_buckets": "7"}), ("truncate", {"width": "1000"})],
    "string": [("identity", {}), ("bucket", {"num_buckets": "3"}), ("truncate", {"width": "1"})],
    "date32": [("identity", {}), ("bucket", {"num_buckets": "4"}), ("year", {}), ("month", {}), ("day", {})],
    "timestamp": [("bucket", {"num_buckets": "4"}), ("year", {}), ("month", {}), ("day", {}), ("hour", {})],
}


def _sql_lit(v: Any, typ: pa.DataType) -> str:
    if v is None:
        return "NULL"
    if pa.types.is_string(typ):
        return "'" + v.replace("'", "''") + "'"
    if pa.types.is_date(typ):
        return f"DATE '{v.isoformat()}'"
    if pa.types.is_timestamp(typ):
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
    return str(v)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, ...]:
    tname = draw(st.sampled_from(sorted(TYPES)))
    typ, values = TYPES[tname]
    transform, params = draw(st.sampled_from(TRANSFORMS[tname]))
    data = draw(st.lists(st.one_of(st.none(), values), min_size=1, max_size=40))
    pool = [v for v in data if v is not None] or [draw(values)]
    lit = st.one_of(st.sampled_from(pool), values)

    def leaf() -> st.SearchStrategy[tuple[str, Any]]:
        cmp = st.tuples(st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), lit).map(
            lambda t: (f"c {t[0]} {_sql_lit(t[1], typ)}", ("cmp", t[0], t[1]))
        )
        inl = st.tuples(st.booleans(), st.lists(lit, min_size=1, max_size=4)).map(
            lambda t: (
                f"c {'NOT ' if t[0] else ''}IN ({', '.join(_sql_lit(x, typ) for x in t[1])})",
                ("in", t[0], t[1]),
            )
        )
        nul = st.booleans().map(lambda n: (f"c IS {'NOT ' if n else ''}NULL", ("null", n)))
        return st.one_of(cmp, inl, nul)

    tree = st.recursive(
        leaf(),
        lambda kids: st.one_of(
            st.tuples(kids, kids).map(lambda t: (f"({t[0][0]} AND {t[1][0]})", ("and", t[0][1], t[1][1]))),
            st.tuples(kids, kids).map(lambda t: (f"({t[0][0]} OR {t[1][0]})", ("or", t[0][1], t[1][1]))),
            kids.map(lambda t: (f"(NOT {t[0]})", ("not", t[1]))),
        ),
        max_leaves=4,
    )
    sql, shape = draw(tree)
    return typ, transform, params, data, sql, shape


def _arrow_expr(shape: Any, typ: pa.DataType) -> pc.Expression:
    c = pc.field("c")
    kind = shape[0]
    if kind == "cmp":
        v = pa.scalar(shape[2], typ)
        return {"=": c == v, "!=": c != v, "<": c < v, "<=": c <= v, ">": c > v, ">=": c >= v}[shape[1]]
    if kind == "in":
        e = c.isin(pa.array(shape[2], typ))
        return ~e if shape[1] else e
    if kind == "null":
        return c.is_valid() if shape[1] else c.is_null()
    if kind == "and":
        return _arrow_expr(shape[1], typ) & _arrow_expr(shape[2], typ)
    if kind == "or":
        return _arrow_expr(shape[1], typ) | _arrow_expr(shape[2], typ)
    return ~_arrow_expr(shape[1], typ)


def _transform(field: ShardingFieldSpec, arr: pa.Array) -> pa.Array:
    """The pruner's transform (the code under test)."""
    return evaluate_field(field, [arr], len(arr))


class _Unroutable(Exception):
    """A value the spec cannot route (the result does not fit its type)."""


def _lance_spec(field: ShardingFieldSpec, typ: pa.DataType) -> dict[str, Any]:
    return {
        "spec_id": 1,
        "fields": [
            {
                "field_id": field.field_id,
                "source_ids": [0],
                "transform": field.transform,
                "expression": None,
                "result_type": "int32" if field.transform == "bucket" else str(typ),
                "parameters": dict(field.parameters),
            }
        ],
    }


def _temporal(transform: str, v: dt.date | dt.datetime) -> int:
    """Iceberg's year / month / day / hour: whole units since 1970-01-01T00:00, floored."""
    d = v.date() if isinstance(v, dt.datetime) else v
    if transform == "year":
        return d.year - 1970
    if transform == "month":
        return (d.year - 1970) * 12 + d.month - 1
    if transform == "day":
        return (d - EPOCH.date()).days  # timedelta days are floored
    assert isinstance(v, dt.datetime)
    return (v - EPOCH) // dt.timedelta(hours=1)


def region_oracle(field: ShardingFieldSpec, col: pa.Array) -> pa.Array:
    """Each row's region value, computed without the code under test: pylance's own
    ``evaluate_sharding_spec`` for the transforms it implements (bucket, identity), plain
    Python (Iceberg's definitions) for the others.

    Raises:
        _Unroutable: A value whose transform does not fit the result type.
    """
    typ = col.type
    if field.transform in ("bucket", "identity"):
        schema = pa.schema([("c", typ)])
        batch = pa.record_batch([col], schema=schema)
        return evaluate_sharding_spec(batch, _lance_spec(field, typ), LanceSchema.from_pyarrow(schema)).column(0)
    out: list[Any] = []
    for v in col.to_pylist():
        if v is None:
            out.append(None)
        elif field.transform == "truncate":
            w = int(field.parameters["width"])
            if isinstance(v, str):
                out.append(v[:w])  # code points
            else:
                r = v - v % w  # Python's % floors: the remainder is never negative
                bits = typ.bit_width
                if r < -(2 ** (bits - 1)):
                    raise _Unroutable(f"truncate({w}) of {v} overflows {typ}")
                out.append(r)
        else:
            out.append(_temporal(field.transform, v))
    return pa.array(out, typ if field.transform == "truncate" else pa.int32())


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_pruning_never_drops_matching_rows(case: tuple[Any, ...]) -> None:
    typ, transform, params, data, sql, shape = case
    field = ShardingFieldSpec("f", (0,), transform, None, "", params)
    spec = RegionSpec(1, (field,))
    col = pa.array(data, typ)
    try:
        region_of = region_oracle(field, col)
    except _Unroutable:
        assume(False)  # values the spec cannot route (e.g. truncate overflowing int64) never reach a region
    table = pa.table({"c": col, "r": region_of})
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("t", [table.to_batches()])
    schema = pa.schema([("c", typ)])
    # Each front-end is checked against the engine that evaluates that expression:
    # DataFusion for SQL (its optimizer may simplify, e.g. `a AND NOT a` -> false even
    # for NULL a), pyarrow for the expression DataFusion would push into a dataset.
    expr = _arrow_expr(shape, typ)
    by_sql = ctx.sql(f"SELECT DISTINCT r FROM t WHERE {sql}").to_arrow_table().column("r").to_pylist()
    by_arrow = pc.unique(table.filter(expr).column("r")).to_pylist()
    for pred, matching in [(predicate_for_table(schema, sql), by_sql), (from_arrow_expression(expr, ["c"]), by_arrow)]:
        for value in matching:
            ok = region_might_match(spec, RegionValues({"f": value}, "test"), pred, {0: "c"}, schema, _transform)
            assert ok, f"{transform}{params}: region {value!r} holds rows matching {sql} but was pruned ({pred})"


def test_pruning_prunes_something() -> None:
    """The property above would pass with a pruner that never prunes: check it does."""
    field = ShardingFieldSpec("f", (0,), "bucket", None, "", {"num_buckets": "8"})
    spec = RegionSpec(1, (field,))
    schema = pa.schema([("c", pa.int64())])
    pred = predicate_for_table(schema, "c IN (1, 2, 3)")
    target = set(region_oracle(field, pa.array([1, 2, 3], pa.int64())).to_pylist())
    kept = {
        b for b in range(8) if region_might_match(spec, RegionValues({"f": b}, "t"), pred, {0: "c"}, schema, _transform)
    }
    assert kept == target
    ident = RegionSpec(1, (ShardingFieldSpec("f", (0,), "identity", None, "", {}),))
    for sql, value, expect in [
        ("c < 5", 7, False),
        ("c < 5", 4, True),
        ("c != 7", 7, False),
        ("c IS NULL", 7, False),
        ("NOT (c >= 5)", 5, False),
        ("c = 5 OR c = 9", 9, True),
        ("c = 5 AND c > 100", 5, False),
        ("c + 1 = 5", 4, True),  # not understood: might match
    ]:
        got = region_might_match(
            ident, RegionValues({"f": value}, "t"), predicate_for_table(schema, sql), {0: "c"}, schema, _transform
        )
        assert got is expect, sql
    month = RegionSpec(1, (ShardingFieldSpec("f", (0,), "month", None, "", {}),))
    ts = pa.schema([("c", pa.timestamp("us"))])
    pred = predicate_for_table(ts, "c >= TIMESTAMP '2024-03-01 00:00:00'")
    months = {
        m: region_might_match(month, RegionValues({"f": m}, "t"), pred, {0: "c"}, ts, _transform)
        for m in (649, 650, 651)
    }
    assert months == {649: False, 650: True, 651: True}  # 650 = 2024-03 (months since 1970-01)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_pruning_never_drops_matching_rows_many(case: tuple[Any, ...]) -> None:
    test_pruning_never_drops_matching_rows.hypothesis.inner_test(case)  # type: ignore[attr-defined]
