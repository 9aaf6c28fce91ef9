"""Filters pushed into the merged table answer as DataFusion does over the live rows.

DataFusion pushes filters into the table as pyarrow expressions; memwal evaluates them
with Lance (base and generation fragments read from storage) or with pyarrow (decoded
columns kept for later queries, MemTables). The oracle is DataFusion itself over a plain
in-memory table of the live rows (the dict model): NaN above every number and equal to
itself, a NaN with its sign bit set below every number, ``-0.0 = 0.0``, NULLs in
comparisons, ``IN`` lists with NULL, ``LIKE`` escapes, dates and timestamps. Every query
runs on a table that keeps no columns (Lance evaluates the filter on storage reads), then
twice on one that keeps them (pyarrow, in memory), and through ``to_reader``.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import datafusion
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq

from lsm_model import PK, ModelTable

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("f", pa.float64()),
        pa.field("g", pa.float32()),
        pa.field("s", pa.string()),
        pa.field("n", pa.int32()),
        pa.field("b", pa.bool_()),
        pa.field("ts", pa.timestamp("us")),
        pa.field("d", pa.date32()),
        pa.field("u", pa.uint64()),  # Substrait has none: Lance gets such filters as SQL text
    ]
)
# the second NaN has its sign bit set (0/0 on x86): below every number to DataFusion and Lance
FLOATS = [float("nan"), -0.0, 0.0, 1.5, -2.5, float("inf"), float("-inf"), 10.0, None]
FLOATS += [math.copysign(math.nan, -1.0), 0.1]
STRINGS = ["a", "A", "b", "ab", "a_b", "a%b", "Ünï", "", "zz", None, "abc", "ABC"]


def _rows(ids: Any, rng: np.random.Generator) -> pa.Table:
    n = len(ids)
    pick = lambda values: [values[i] for i in rng.integers(0, len(values), n)]  # noqa: E731
    start = dt.datetime(2024, 1, 1)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "f": pick(FLOATS),
            "g": pa.array(pick(FLOATS), pa.float32()),
            "s": pick(STRINGS),
            "n": [None if i % 7 == 0 else int(v) for i, v in enumerate(rng.integers(-5, 5, n))],
            "b": [None if i % 5 == 0 else bool(v) for i, v in enumerate(rng.integers(0, 2, n))],
            "ts": [
                None if i % 9 == 0 else start + dt.timedelta(hours=int(h))
                for i, h in enumerate(rng.integers(0, 999, n))
            ],
            "d": [
                None if i % 8 == 0 else start.date() + dt.timedelta(days=int(h))
                for i, h in enumerate(rng.integers(0, 99, n))
            ],
            "u": [None if i % 6 == 0 else int(v) << 60 for i, v in enumerate(rng.integers(0, 16, n))],
        },
        schema=SCHEMA,
    )


PREDICATES = [
    "f > 1", "f < 1", "f >= 0", "f <= 0", "f = 0", "f = -0.0", "f != 1.5", "NOT (f > 1)", "f = 'NaN'",
    "f != 'NaN'", "f > 'NaN'", "f >= 'NaN'", "f < 'NaN'", "f <= 'Infinity'", "f > '-Infinity'",
    "f < '-Infinity'", "f <= '-Infinity'", "g < 0", "g >= 'NaN'",
    "f BETWEEN -3 AND 2", "f NOT BETWEEN -3 AND 2", "f IN (0.0, 1.5)", "f NOT IN (0.0, 1.5)", "f IS NULL",
    "isnan(f)", "f IN (1.5, 'NaN')", "NOT (f = 0 OR f > 5)", "(f > 1 AND s = 'a') OR n IS NULL", "f > g",
    "f = g", "f <= g", "f >= g", "NOT (f < g)", "g <= f", "NOT (n IN (1, 2) OR f > g)",
    "f >= f", "f = f", "f > f", "NOT (f >= f)", "f != f", "g > 1", "g = 'NaN'",
    "NOT (g <= 1.5)", "f > 1 OR n > 2", "id > 100 AND f >= 0", "s = 'a'", "s != 'a'", "s > 'a'", "s LIKE 'a%'",
    "s LIKE 'a\\_b'", "s LIKE 'a_b'", "s ILIKE 'a%'", "s NOT LIKE '%b'", "s IN ('a', 'b', NULL)",
    "s NOT IN ('a', 'b')", "s NOT IN ('a', NULL)", "s = ''", "s IS DISTINCT FROM 'a'", "n > 0", "n IN (1, 2)",
    "n NOT IN (1, 2)", "NOT (n > 0 AND n < 3)", "n IS NULL OR n > 3", "b", "NOT b", "b IS NOT TRUE",
    "ts > '2024-01-20'", "ts IS NULL", "d > '2024-02-01'", "d = DATE '2024-01-10'", "id IN (1, 5, 305, 999)",
    "id = 15 OR s = 'zz'", "f > 1 OR u IS NULL", "f > 1 AND u > 0", "NOT (f <= 1) AND u > 0", "u > 9223372036854775808",
    "g < 0 OR u = 0",
    # a bare boolean column leaves the filter unread: rows filtered by Lance kept a sign-bit NaN
    "f >= -1 AND b", "g > -1 AND b", "f >= 0 OR NOT b", "f < -5 AND b",
]  # fmt: skip


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The merged table (base, a merged and an unmerged generation per region, a WAL tail) and the oracle."""
    rng = np.random.default_rng(0)
    t = ModelTable(str(tmp_path_factory.mktemp("sem") / "t"), SCHEMA, _rows(np.arange(300), rng), bucket=("id", 2))
    t.put(_rows(np.r_[0:40, 300:330], rng))
    t.flush()
    t.merge(t.regions()[0], t.flushed(t.regions()[0])[0][0])
    t.put(_rows(np.r_[10:20, 250:260, 320:340], rng))
    t.flush()
    t.put(_rows(np.r_[30:35, 335:345], rng))  # the WAL tail
    merged = datafusion.SessionContext()
    table = mq.open_table(t.uri)
    table.register(merged, "t")
    merged.register_dataset("uncached", table.dataset(cache=False))  # every query reads through Lance
    oracle = datafusion.SessionContext()
    oracle.register_record_batches("t", [t.expected().to_batches()])
    yield merged, oracle, table
    t.flush()


@pytest.mark.parametrize("predicate", PREDICATES)
def test_pushed_filter_answers_as_datafusion(tables: Any, predicate: str) -> None:
    merged, oracle, table = tables
    sql = f"SELECT id FROM t WHERE {predicate} ORDER BY id"
    want = oracle.sql(sql).to_pydict()["id"]
    assert merged.sql(sql.replace("FROM t", "FROM uncached")).to_pydict()["id"] == want, f"{predicate} (Lance)"
    for run in ("first", "kept columns"):
        assert merged.sql(sql).to_pydict()["id"] == want, f"{predicate} ({run})"
    # a SQL function's rows are filtered the same way (pyarrow's NaN comparisons answered 15
    # of these differently; a filter DataFusion folded to NULL failed under ORDER BY)
    keys = "[" + ", ".join(str(i) for i in range(0, 400, 3)) + "]"
    looked = sql.replace("FROM t", f"FROM memwal_lookup('t', {keys})")
    assert merged.sql(looked).to_pydict()["id"] == [i for i in want if i % 3 == 0], f"{predicate} (memwal_lookup)"
    streamed = table.to_reader(columns=["id"], filter=predicate).read_all()
    assert sorted(streamed.column("id").to_pylist()) == want, f"{predicate} (to_reader)"


@pytest.mark.parametrize("where", ["s IN (NULL)", "NULL", "s NOT IN ('a', NULL)", "1 = 1", "n > 0 AND NULL"])
def test_where_clauses_folded_to_a_constant(tables: Any, where: str) -> None:
    """DataFusion hands a scan a constant for these (a NULL one failed with an AttributeError)."""
    merged, oracle, _ = tables
    sources = {
        "t": "t",
        "uncached": "t",
        "memwal_lookup('t', [1, 2, 3, 400])": "(SELECT * FROM t WHERE id IN (1, 2, 3, 400))",
    }
    for source, same in sources.items():
        for query in ("SELECT id FROM {} WHERE {} ORDER BY id", "SELECT count(*) AS n FROM {} WHERE {}"):
            want = oracle.sql(query.format(same, where)).to_pydict()
            assert merged.sql(query.format(source, where)).to_pydict() == want, (source, query)


def test_pyarrow_filters_over_columns_lance_cannot_take_as_expressions(tmp_path: Path) -> None:
    """Lance plans expression filters through Substrait, which has no unsigned integers or
    large strings: vector and text search filters over them are handed to Lance as SQL."""
    import pyarrow.compute as pc

    from memwal_query.planner.lance_filter import for_lance

    dim = 4
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("u", pa.uint64()),
            pa.field("ls", pa.large_string()),
            pa.field("vec", pa.list_(pa.float32(), dim)),
        ]
    )
    rng = np.random.default_rng(3)

    def rows(ids: Any) -> pa.Table:
        n = len(ids)
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "u": pa.array([2**63 + int(i) % 10 if i % 4 else None for i in ids], pa.uint64()),
                "ls": pa.array([f"s'{i % 3}" for i in ids], pa.large_string()),
                "vec": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.standard_normal(n * dim).astype(np.float32)), dim
                ),
            },
            schema=schema,
        )

    t = ModelTable(str(tmp_path / "t"), schema, rows(np.arange(200)), bucket=("id", 2), max_memtable_rows=50)
    t.put(rows(np.r_[0:30]))
    t.flush()
    t.put(rows(np.r_[20:40]))
    table = mq.open_table(t.uri)
    u = pc.field("u")
    filters = [
        (u > pa.scalar(2**63 + 5, pa.uint64()), lambda r: r["u"] is not None and r["u"] > 2**63 + 5),
        # SQL's NOT IN, as over every other column type: a NULL is not kept (it was, here)
        (~u.isin(pa.array([2**63 + 1], pa.uint64())), lambda r: r["u"] is not None and r["u"] != 2**63 + 1),
        (pc.field("ls") == pa.scalar("s'1", pa.large_string()), lambda r: r["ls"] == "s'1"),
    ]
    q = np.zeros(dim, np.float32)
    for expr, keep in filters:
        assert isinstance(for_lance(expr, schema), str)
        got = table.nearest("vec", q, k=500, filter=expr).column("id").to_pylist()
        assert sorted(got) == sorted(r["id"] for r in t.model.values() if keep(r)), str(expr)
    t.flush()


@pytest.mark.parametrize(
    "odd",
    [pa.large_list(pa.string()), pa.decimal256(50, 10), pa.duration("ms"), pa.struct([("d", pa.duration("s"))])],
    ids=str,
)
def test_pyarrow_filters_on_tables_with_a_column_substrait_cannot_carry(tmp_path: Path, odd: pa.DataType) -> None:
    """Lance converts the whole schema to Substrait for an expression filter: one such column
    anywhere made every expression filter fail (to_reader, vector search), whatever it named."""
    import pyarrow.compute as pc

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("v", pa.int32()),
            pa.field("odd", odd),
            pa.field("vec", pa.list_(pa.float32(), 2)),
        ]
    )

    def rows(ids: range, tag: int) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "v": pa.array([i * tag for i in ids], pa.int32()),
                "odd": pa.nulls(len(ids), odd),
                "vec": pa.array([[float(i), float(tag)] for i in ids], pa.list_(pa.float32(), 2)),
            },
            schema=schema,
        )

    t = ModelTable(str(tmp_path / "t"), schema, rows(range(100), 1), bucket=("id", 2), max_memtable_rows=50)
    t.put(rows(range(40, 60), 3))
    t.flush()
    t.put(rows(range(50, 120), 2))
    table = mq.open_table(t.uri)
    want = sorted(r["id"] for r in t.model.values() if r["v"] > 90)
    expr = pc.field("v") > 90
    assert sorted(table.to_reader(columns=["id"], filter=expr).read_all().column("id").to_pylist()) == want
    assert sorted(table.nearest("vec", [0.0, 0.0], k=500, filter=expr).column("id").to_pylist()) == want
    t.flush()


def test_float16_filters_answer_as_datafusion_on_every_level(tmp_path: Path) -> None:
    """pyarrow has no float16 comparison: ``f < 0`` (the literal cast to float16) failed in a
    scan, and ``f = 'NaN'`` matched a NaN with its sign bit set too (Lance refused the filter,
    the NaN rewrite cannot tell the NaNs apart). Rows in memory holding a float16 the filter
    names are filtered by Lance (as float32, the same values), like a sign-bit NaN's."""
    import struct

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("f", pa.float16())])
    negative_nan = np.frombuffer(struct.pack("<H", 0xFE00), "<f2")[0]

    def rows(ids: range, odd: Any) -> pa.Table:
        pick = [np.float16("nan"), odd, np.float16(1), np.float16(-0.0), np.float16("inf"), np.float16(-0.5), None]
        pick += [np.float16(0.1), np.float16(2048)]  # values no float32 or float64 literal spells
        vals = [pick[i % len(pick)] for i in ids]
        data = np.array([0 if v is None else v for v in vals], np.float16)
        mask = np.array([v is None for v in vals])
        return pa.table({"id": pa.array(ids, pa.int64()), "f": pa.array(data, mask=mask)}, schema=schema)

    conditions = ["f < 0", "f = 0", "f >= 1", "f BETWEEN -1 AND 1", "f = 'NaN'", "f != 'NaN'", "f < '-Infinity'"]
    for n, odd in enumerate((np.float16(-2), negative_nan)):  # without, then with a sign-bit NaN
        t = ModelTable(str(tmp_path / f"t{n}"), schema, rows(range(40), odd), bucket=("id", 2))
        t.put(rows(range(30, 50), odd))
        t.flush()
        t.put(rows(range(45, 60), odd))
        oracle = datafusion.SessionContext()
        oracle.register_record_batches("t", [t.expected().to_batches()])
        table = mq.open_table(t.uri)
        for cond in conditions:
            query = f"SELECT id FROM t WHERE {cond} ORDER BY id"
            want = oracle.sql(query).to_pydict()["id"]
            for _ in ("cold", "warm"):
                assert table.sql(query).to_pydict()["id"] == want, (odd, cond)
            got = table.to_reader(columns=["id"], filter=cond).read_all().column("id").to_pylist()
            assert sorted(got) == want, (odd, cond)
        want = oracle.sql("SELECT id FROM t WHERE f < 0 ORDER BY id").to_pydict()["id"]
        expr = pc.field("f") < 0  # a pyarrow expression: was refused as not binding (no float16 kernel)
        assert sorted(table.to_reader(columns=["id"], filter=expr).read_all().column("id").to_pylist()) == want
        # is_in over a float16 column failed everywhere (no pyarrow kernel; Lance's Substrait has
        # none either): the values are cast to float16, as pyarrow casts them to a column's type
        # SQL's IN / NOT IN, as over every column type: a NULL input is not kept, nor an unlisted
        # value when NULL is listed (a NULL in the list or an empty one failed; NOT IN kept NULLs);
        # a float compared with a float16 in float64 and an integer as the float16 it casts to, as
        # DataFusion does, on every level (Lance's files answered `f == 0.1`, `f == 2049` otherwise)
        live = list(zip(*(t.expected()[c].to_pylist() for c in ("id", "f")), strict=True))

        def halves(values: Any) -> list[Any]:
            return (
                (values if isinstance(values, pa.Array) else pa.array(values, pa.float64()))
                .cast(pa.float16())
                .to_pylist()
            )

        cases: list[tuple[Any, Any]] = []
        for listed in ([1.0, -0.5], pa.array([1.0, -0.5], pa.float16()), [1, 2], [-0.4999], [None, 1.0], [], [None]):
            known = {v for v in halves(listed) if v is not None}
            has_null = len(listed) > len(known) and None in halves(listed)
            cases.append((pc.field("f").isin(listed), lambda f, known=known: f in known))
            cases.append((~pc.field("f").isin(listed), lambda f, known=known, n=has_null: not n and f not in known))
        for v in (0.1, 2049, -0.5, 0.0999755859375, 70000):  # a float compared in float64, an integer as a float16
            h = v if isinstance(v, float) else halves([v])[0]
            cases.append((pc.field("f") == v, lambda f, h=h: f == h))
            # a NaN is above every number, one with its sign bit set below (IEEE 754's total order)
            cases.append((pc.field("f") < v, lambda f, h=h: math.copysign(1, f) < 0 if math.isnan(f) else f < h))
        for expr, keep in cases:
            want = sorted(i for i, f in live if f is not None and keep(f))
            got = table.to_reader(columns=["id"], filter=expr).read_all().column("id").to_pylist()
            assert sorted(got) == want, (odd, str(expr))
            assert sorted(table.dataset().to_table(columns=["id"], filter=expr)["id"].to_pylist()) == want, str(expr)
        t.flush()


def test_filters_written_as_sql_for_lance_answer_as_on_every_other_level(tmp_path: Path) -> None:
    """A filter naming an unsigned column goes to Lance as SQL text, which reads a number in the
    type of the column it meets: ``(g > 0.1) & (u > 0)`` over a float32 ``g`` holding
    float32(0.1) kept the WAL tail's rows only (DataFusion and the rows in memory compare in
    float64). An untyped empty or all-NULL ``is_in`` answered as pyarrow (``~n.isin([])`` kept
    NULL rows, ``u.isin([None])`` matched them), not as SQL's IN like a typed one."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("u", pa.uint16()),
            pa.field("n", pa.int32()),
            pa.field("g", pa.float32()),
            pa.field("vec", pa.list_(pa.float32(), 2)),
        ]
    )

    def rows(ids: range) -> pa.Table:
        return pa.table(
            {
                "id": list(ids),
                "u": [None if i % 5 == 0 else i % 7 for i in ids],
                "n": [None if i % 4 == 0 else i % 3 for i in ids],
                "g": pa.array([0.1 if i % 2 else 0.25 for i in ids], pa.float32()),
                "vec": [[float(i), 1.0] for i in ids],
            },
            schema=schema,
        )

    t = ModelTable(str(tmp_path / "t"), schema, rows(range(40)), bucket=("id", 2), max_memtable_rows=50)
    t.put(rows(range(30, 60)))
    t.flush()
    t.put(rows(range(55, 70)))  # a WAL tail
    table = mq.open_table(t.uri)
    u, n, g = pc.field("u"), pc.field("n"), pc.field("g")
    tenth = float(np.float32(0.1))
    cases = [
        ((g > 0.1) & (u > 0), lambda r: r["u"] is not None and r["u"] > 0 and r["g"] > 0.1),
        ((g == 0.1) & u.is_valid(), lambda r: False),
        ((g == tenth) | (u > 5), lambda r: r["g"] == tenth or (r["u"] is not None and r["u"] > 5)),
        (~n.isin([]), lambda r: r["n"] is not None),
        (n.isin([None]), lambda r: False),
        (~n.isin([None]), lambda r: False),
        (u.isin([None]), lambda r: False),
        (~u.isin([None]), lambda r: False),
        (~u.isin([]) & (g < 1), lambda r: r["u"] is not None),
    ]
    live = list(t.model.values())
    for expr, keep in cases:
        want = sorted(r["id"] for r in live if keep(r))
        got = table.to_reader(columns=["id"], filter=expr).read_all().column("id").to_pylist()
        assert sorted(got) == want, f"to_reader {expr}"
        assert sorted(table.dataset().to_table(columns=["id"], filter=expr)["id"].to_pylist()) == want, str(expr)
        found = table.nearest("vec", [0.0, 1.0], k=500, filter=expr).column("id").to_pylist()
        assert sorted(found) == want, f"nearest {expr}"
    t.flush()


def test_filters_beside_date64_and_time_columns_keep_datafusions_nan_order(tmp_path: Path) -> None:
    """Substrait has no date64 (a filter naming one) and no time type (a table holding one: every
    filter): Lance refused, and pyarrow filtered the rows, a NaN with its sign bit set above every
    number (``f <= 0.5 AND d64 > '1970-01-01'`` lost it). Such filters go to Lance as SQL."""
    import datetime as dt

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("f", pa.float32()),
            pa.field("d64", pa.date64()),
            pa.field("t64", pa.time64("us")),
        ]
    )
    nan = math.copysign(math.nan, -1.0)

    def rows(ids: range) -> pa.Table:
        return pa.table(
            {
                "id": list(ids),
                "f": pa.array([[nan, math.nan, 0.5, -2.0, None][i % 5] for i in ids], pa.float32()),
                "d64": pa.array([dt.date(2024, 1, 1 + i % 28) for i in ids], pa.date64()),
                "t64": pa.array([dt.time(i % 24, 0) for i in ids], pa.time64("us")),
            },
            schema=schema,
        )

    t = ModelTable(str(tmp_path / "t"), schema, rows(range(40)), bucket=("id", 2))
    t.put(rows(range(30, 60)))
    t.flush()
    t.put(rows(range(55, 70)))
    oracle = datafusion.SessionContext()
    oracle.register_record_batches("t", [t.expected().to_batches()])
    table = mq.open_table(t.uri)
    for where in ("f <= 0.5 AND d64 > '2024-01-03'", "f <= 0.5", "f > -3 OR d64 = DATE '2024-01-02'"):
        query = f"SELECT id FROM t WHERE {where} ORDER BY id"
        want = oracle.sql(query).to_pydict()["id"]
        for run in ("cold", "warm"):
            assert table.sql(query).to_pydict()["id"] == want, (where, run)
    expr = (pc.field("f") <= 0.5) & (pc.field("d64") > pa.scalar(dt.date(2024, 1, 3), pa.date64()))
    want = oracle.sql("SELECT id FROM t WHERE f <= 0.5 AND d64 > DATE '2024-01-03' ORDER BY id").to_pydict()["id"]
    assert sorted(table.to_reader(columns=["id"], filter=expr).read_all().column("id").to_pylist()) == want
    t.flush()


def test_float_literals_lance_reads_back_exactly_leave_the_column_bare() -> None:
    """A float32 / float16 column compared with a float it cannot hold is widened for Lance
    (``CAST(g AS DOUBLE) > 0.1``); one it holds (0.5, a float32-typed literal, infinity) leaves
    the column bare: the same answer, and a cast column is no scalar index lookup (4x slower
    on a 2M-row base with a BTREE on ``g``)."""
    from memwal_query.planner.lance_filter import for_lance

    schema = pa.schema([("g", pa.float32()), ("u", pa.uint32()), ("h", pa.float16())])
    u = pc.field("u") > 0
    assert for_lance((pc.field("g") == 0.5) & u, schema) == "((`g` = 0.5) AND (`u` > 0))"
    assert for_lance((pc.field("g") > 0.1) & u, schema) == "((CAST(`g` AS DOUBLE) > 0.1) AND (`u` > 0))"
    typed = pc.field("g") == pa.scalar(0.1, pa.float32())
    assert for_lance(typed & u, schema) == "((`g` = 0.10000000149011612) AND (`u` > 0))"
    assert for_lance(pc.field("h") < 0.1, schema) == "(CAST(`h` AS DOUBLE) < 0.1)"
    assert for_lance(pc.field("h") < float("inf"), schema) == "(`h` < CAST('Infinity' AS DOUBLE))"


def test_is_null_counting_nan_stays_an_expression() -> None:
    """``is_null(nan_is_null=True)`` keeps NaN rows; SQL's IS NULL would drop them: not written as SQL."""
    import pyarrow.compute as pc

    from memwal_query.planner.lance_filter import for_lance

    schema = pa.schema([("u", pa.uint32()), ("f", pa.float64())])
    expr = (pc.field("u") > pa.scalar(5, pa.uint32())) | pc.field("f").is_null(nan_is_null=True)
    assert for_lance(expr, schema) is expr
    assert for_lance((pc.field("u") > pa.scalar(5, pa.uint32())) | pc.field("f").is_null(), schema) == (
        "((`u` > 5) OR (`f` IS NULL))"
    )
    # Lance reads SQL literals in the column's type: float64 values against a float32 column
    # are compared with the column widened, as DataFusion does
    wide = pa.schema([("u", pa.uint32()), ("g", pa.float32())])
    over_u = pc.field("u") > pa.scalar(5, pa.uint32())
    assert for_lance(over_u & pc.field("g").isin([0.1]), wide) == "((`u` > 5) AND (CAST(`g` AS DOUBLE) IN (0.1)))"
    in_float32 = pc.field("g").isin(pa.array([0.5], pa.float32()))
    assert for_lance(over_u & in_float32, wide) == "((`u` > 5) AND (`g` IN (0.5)))"
    # an integer no int8 holds matches nothing (Lance refused the whole filter for it)
    small = pa.schema([("u", pa.uint32()), ("i", pa.int8())])
    assert for_lance(over_u & pc.field("i").isin([1, 300]), small) == "((`u` > 5) AND (`i` IN (1)))"
    assert for_lance(over_u & pc.field("i").isin([-129, 128]), small) == "((`u` > 5) AND (`i` IS NULL AND NULL))"
    # a filter that does not name the unsigned column runs as it is (`u` is in any is_in's text)
    strings = pa.schema([("u", pa.uint64()), ("s", pa.string())])
    assert isinstance(for_lance(~pc.field("s").isin(["a"]), strings), pc.Expression)


def test_pyarrow_expressions_answer_alike_in_every_source(tmp_path: Path) -> None:
    """A user's pyarrow expression (``to_reader``) is evaluated by Lance for the base and by
    pyarrow for MemTable rows: ``is_in`` with NULLs, ``if_else`` and arithmetic over NaN
    answered otherwise there, and ``is_in`` took -0.0 for another value than 0.0. Oracle: Lance
    over a plain table of the live rows."""
    import lance
    import pyarrow.compute as pc

    rng = np.random.default_rng(5)
    t = ModelTable(str(tmp_path / "t"), SCHEMA, _rows(np.arange(200), rng), bucket=("id", 2))
    t.put(_rows(np.r_[0:30, 200:230], rng))
    t.flush()
    t.put(_rows(np.r_[20:50, 220:260], rng))  # the WAL tail: MemTable rows
    plain = lance.write_dataset(t.expected(), str(tmp_path / "plain"))
    table = mq.open_table(t.uri)
    f, n, s = pc.field("f"), pc.field("n"), pc.field("s")
    exprs = [
        s.isin(["a", None]),
        ~s.isin(["a", "b"]),
        ~n.isin([1, None]),
        ~n.isin([1, 2]),
        pc.if_else(f > 1, True, False),
        pc.if_else(n > 0, False, True),
        (f + 0) > 1,
        pc.coalesce(pc.field("g") > 1, False),
        pc.starts_with(s, "a") & (f >= 0),
        f.isin([0.0]),  # is_in hashes floats: -0.0 was not 0.0 in MemTable rows
        f.isin([-0.0, 1.5]),
        ~f.isin([0.0]),
        f.isin([0.0, float("nan")]),
        pc.field("g").isin(pa.array([-0.0], pa.float32())),
        # values of another type: pyarrow casts them to the column's (0.1 to float32, a time of
        # day dropped), Lance and DataFusion widen the column (float32 0.1 is not 0.1)
        pc.field("g").isin([0.1, 1.5]),
        pc.field("d").isin(pa.array([dt.datetime(2024, 1, 10, 12), dt.datetime(2024, 1, 11)], pa.timestamp("s"))),
        pc.field("n").isin(pa.array([1, 2], pa.int64())),  # integers: the same answer either way
    ]
    exprs += [
        # the user's own is_nan after a pushed ``f = NaN`` (rewritten as is_nan for pyarrow)
        # was handed to Lance as ``f = NaN``: the NaNs with their sign bit set left out
        f == pa.scalar(float("nan")),
        pc.is_nan(f),
        f != pa.scalar(float("nan")),
        ~pc.is_nan(f),
    ]
    for expr in exprs:
        want = sorted(plain.to_table(columns=["id"], filter=expr).column("id").to_pylist())
        got = table.to_reader(columns=["id"], filter=expr).read_all().column("id").to_pylist()
        assert sorted(got) == want, str(expr)
        assert table.to_reader(columns=[], filter=expr).read_all().num_rows == len(want)
        for _ in ("first read", "from the column cache"):  # the dataset DataFusion scans
            got = table.dataset().to_table(columns=["id"], filter=expr).column("id").to_pylist()
            assert sorted(got) == want, str(expr)
        got = table.dataset(cache=False).to_table(columns=["id"], filter=expr).column("id").to_pylist()
        assert sorted(got) == want, f"{expr} (cache=False)"
    t.flush()


def test_long_in_lists_differing_in_the_middle(tables: Any) -> None:
    """pyarrow prints at most 20 values of an IN list (the middle elided): filters cached by
    their text answered a list with another list's rows (the first query's)."""
    merged, oracle, _ = tables
    first = list(range(0, 50, 2))  # 25 values
    for where in ("id IN ({})", "id NOT IN ({})", "n IN ({}) OR f > 1"):
        for middle in (None, 301, 7, 333):
            values = first if middle is None else [*first[:12], middle, *first[13:]]
            query = "SELECT id FROM {} WHERE " + where.format(", ".join(map(str, values))) + " ORDER BY id"
            want = oracle.sql(query.format("t")).to_pydict()
            for source in ("t", "uncached", "t"):
                assert merged.sql(query.format(source)).to_pydict() == want, (where, middle, source)


def test_nan_against_null_across_two_float_columns(tmp_path: Path) -> None:
    """NaN >= NULL is NULL in DataFusion (the row is dropped); the rewrite for pyarrow made it
    TRUE (``f >= g`` became ``(f >= g) OR isnan(f)``) for rows held in memory."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("f", pa.float64()),
                        pa.field("g", pa.float64())])  # fmt: skip
    nan = float("nan")
    pairs = [(nan, None), (None, nan), (nan, nan), (nan, 1.0), (1.0, nan), (2.0, 1.0), (None, None), (1.0, 1.0)]

    def rows(start: int) -> pa.Table:
        ids = list(range(start, start + len(pairs)))
        return pa.table({"id": ids, "f": [p[0] for p in pairs], "g": [p[1] for p in pairs]}, schema=schema)

    t = ModelTable(str(tmp_path / "t"), schema, rows(0), unsharded=True)
    t.put(rows(100))  # the same pairs in a MemTable
    table = mq.open_table(t.uri)
    oracle = datafusion.SessionContext()
    oracle.register_record_batches("t", [t.expected().to_batches()])
    for where in ("f >= g", "NOT (f < g)", "g <= f", "f > g", "f = g", "f != g", "NOT (id < 0 OR f > g)"):
        query = f"SELECT id FROM t WHERE {where} ORDER BY id"
        want = oracle.sql(query).to_pydict()
        for _ in ("cold", "warm"):
            assert table.sql(query).to_pydict() == want, where
    t.flush()


def test_a_nan_literal_with_its_sign_bit_set_in_rows_held_in_memory(tmp_path: Path) -> None:
    """``f < '-NaN'`` is false for every row but none (DataFusion orders a NaN with its sign bit
    set below every number): the rewrite for rows pyarrow filters read the literal as a NaN
    above every number, so a WAL tail holding none kept all its numbers (``cache=False``, and
    ``to_reader`` / ``dataset()`` with a pyarrow literal)."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("f", pa.float32())])
    nan = math.copysign(math.nan, -1.0)
    base = pa.table({"id": range(6), "f": pa.array([nan, math.nan, -1.0, 0.0, None, 2.0], pa.float32())}, schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, unsharded=True)
    t.put(pa.table({"id": [10, 11, 12, 13], "f": pa.array([1.0, math.nan, None, -0.0], pa.float32())}, schema=schema))
    table = mq.open_table(t.uri)
    oracle = datafusion.SessionContext()
    oracle.register_record_batches("t", [t.expected().to_batches()])
    for op in ("<", "<=", "=", "<>", ">", ">="):
        query = f"SELECT id FROM t WHERE f {op} '-NaN' ORDER BY id"
        want = oracle.sql(query).to_pydict()["id"]
        for cache in (False, True, True):
            ctx = datafusion.SessionContext()
            table.register(ctx, "t", cache=cache)
            assert ctx.sql(query).to_pydict()["id"] == want, (query, cache)
        literal = pc.scalar(pa.scalar(nan, pa.float32()))
        f = pc.field("f")
        expr = {"<": f < literal, "<=": f <= literal, "=": f == literal, "<>": f != literal, ">": f > literal}.get(
            op, f >= literal
        )
        assert sorted(table.to_reader(columns=["id"], filter=expr).read_all()["id"].to_pylist()) == want, str(expr)
        assert sorted(table.dataset(cache=False).to_table(columns=["id"], filter=expr)["id"].to_pylist()) == want
    t.flush()


def _on_three_levels(tmp_path: Path, schema: pa.Schema, rows: Any) -> tuple[ModelTable, mq.Table, Any]:
    """``rows(start)`` in the base, a flushed generation and a WAL tail (ids from 0, 10, 20);
    the table, its snapshot and DataFusion over its live rows (the oracle)."""
    t = ModelTable(str(tmp_path / "t"), schema, rows(0), unsharded=True)
    t.put(rows(10))
    t.flush()
    t.put(rows(20))  # a WAL tail
    oracle = datafusion.SessionContext()
    oracle.register_record_batches("t", [t.expected().to_batches()])
    return t, mq.open_table(t.uri), oracle


def _answers_alike(table: mq.Table, oracle: Any, expr: pc.Expression, where: str, *, sql: bool = True) -> None:
    """The rows ``where`` keeps in the oracle, from SQL (cache off, then on twice), ``to_reader``
    and ``dataset()`` (cache off, then on twice) with ``expr``, its pyarrow spelling."""
    query = f"SELECT id FROM t WHERE {where} ORDER BY id"
    want = oracle.sql(query).to_pydict()["id"]
    for cache in (False, True, True) if sql else ():
        ctx = datafusion.SessionContext()
        table.register(ctx, "t", cache=cache)
        assert ctx.sql(query).to_pydict()["id"] == want, (where, cache)
    assert sorted(table.to_reader(columns=["id"], filter=expr).read_all()["id"].to_pylist()) == want, where
    for cache in (False, True, True):
        got = table.dataset(cache=cache).to_table(columns=["id"], filter=expr)["id"].to_pylist()
        assert sorted(got) == want, (where, cache)


def test_integer_columns_against_a_nan_answer_as_datafusion_on_every_path(tmp_path: Path) -> None:
    """DataFusion compares an integer column with a float in float64, where NaN is above every
    number: ``n < NaN`` holds for every number, ``u < f`` for a NaN ``f``. The rewrite for rows
    pyarrow filters handled float columns only (IEEE: false), while Lance answered as DataFusion:
    over an unsigned column the answer depended on where a row lived and which path read it."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("n", pa.int16()),
            pa.field("u", pa.uint8()),
            pa.field("f", pa.float32()),
        ]
    )

    def rows(start: int) -> pa.Table:
        ids = range(start, start + 15)
        return pa.table(
            {
                "id": list(ids),
                "n": pa.array([None if i % 5 == 0 else i % 7 - 3 for i in ids], pa.int16()),
                "u": pa.array([i % 4 for i in ids], pa.uint8()),
                "f": pa.array([[math.nan, 1.0, -1.0, None][i % 4] for i in ids], pa.float32()),
            },
            schema=schema,
        )

    t, table, oracle = _on_three_levels(tmp_path, schema, rows)
    n, u, f, nan = pc.field("n"), pc.field("u"), pc.field("f"), pc.scalar(math.nan)
    cases = [
        (n < nan, "n < CAST('NaN' AS DOUBLE)"),
        (~(n >= nan), "NOT (n >= CAST('NaN' AS DOUBLE))"),
        (u < nan, "u < CAST('NaN' AS DOUBLE)"),
        (n != nan, "n <> CAST('NaN' AS DOUBLE)"),
        (n < f, "n < f"),
        (~(n >= f), "NOT (n >= f)"),
        (u < f, "u < f"),
        (f > u, "f > u"),
        (u == f, "u = f"),
        ((n < 2.5) & (u > 0), "n < 2.5 AND u > 0"),
    ]
    for expr, where in cases:
        _answers_alike(table, oracle, expr, where)
    t.flush()


def test_integer_columns_against_float_columns_compare_in_the_float_columns_type(tmp_path: Path) -> None:
    """DataFusion casts an integer column compared with a float32 / float16 column to that type
    (16777217 = float32 16777216, 2049 = float16 2048, 70000 = float16 inf), not to float64."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("n", pa.int64()),
            pa.field("g", pa.float32()),
            pa.field("h", pa.float16()),
        ]
    )
    pairs = [(16777217, 16777216.0, 2048.0), (2049, 2049.0, 2048.0), (70000, 70000.0, math.inf), (3, math.nan, 3.0)]

    def rows(start: int) -> pa.Table:
        cols = list(zip(*pairs, strict=True))
        return pa.table(
            {
                "id": range(start, start + len(pairs)),
                "n": cols[0],
                "g": pa.array(cols[1], pa.float32()),
                "h": pa.array(np.array(cols[2], dtype=np.float16), pa.float16()),
            },
            schema=schema,
        )

    t, table, oracle = _on_three_levels(tmp_path, schema, rows)
    n, g, h = pc.field("n"), pc.field("g"), pc.field("h")
    for expr, where in ((n == g, "n = g"), (g != n, "g <> n"), (n < g, "n < g"), (h != n, "h <> n"), (n == h, "n = h")):
        _answers_alike(table, oracle, expr, where, sql=False)
    t.flush()


def test_integer_columns_above_a_float32s_range_against_a_float_literal(tmp_path: Path) -> None:
    """pyarrow compares an int64 column with a float literal by casting it to float32, and refused
    any value above 2**24: ``pc.field("n") > 3.0`` failed wherever rows were filtered in memory
    (to_reader and dataset(): "cannot be applied"). DataFusion compares in
    float64 (``n = 2.0**53`` holds for 2**53 + 1)."""
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("n", pa.int64()), pa.field("u", pa.uint64())]
    )
    values = [2**53 + 1, 2**53, 20_000_000, 3, -(2**53) - 1, None, 2**63 - 1, 2**24 + 1, 2**24]

    def rows(start: int) -> pa.Table:
        ids = list(range(start, start + len(values)))
        unsigned = pa.array([None if v is None else abs(v) for v in values], pa.uint64())
        return pa.table({"id": ids, "n": values, "u": unsigned}, schema=schema)

    t, table, oracle = _on_three_levels(tmp_path, schema, rows)
    n, u = pc.field("n"), pc.field("u")
    f32, f32s = pa.scalar(2.0**24, pa.float32()), pa.array([2.0**24], pa.float32())
    for expr, where in ((n > 3.0, "n > 3.0"), (n == 2.0**53, f"n = {2.0**53!r}"), (n > 2.5, "n > 2.5"),
                        (n != 0.5, "n <> 0.5"), (u > 1e19, "u > 1e19"), (u <= 2.0e7, "u <= 2.0e7"),
                        # a float32 literal or list: compared in float32 (2**24 + 1 is 2**24 there)
                        (n == f32, "n = CAST(16777216.0 AS FLOAT)"), (n.isin(f32s), "n IN (CAST(16777216.0 AS FLOAT))"),
                        (u.isin([2.0**24, 3.0]), "u IN (16777216.0, 3.0)")):  # fmt: skip
        _answers_alike(table, oracle, expr, where)
    t.flush()


def test_a_sign_bit_nan_beside_a_filter_substrait_cannot_carry(tmp_path: Path) -> None:
    """Rows whose float column holds a NaN with its sign bit set are filtered by Lance; a filter
    pyarrow cannot hand it through Substrait (``n < 0.5``: an integer column against a float)
    was refused there and filtered by pyarrow, which put that NaN above every number
    (``(d >= -129.0) & (n < 0.5)`` kept it, on every level). Lance gets such a filter as SQL."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("d", pa.float64()),
                        pa.field("n", pa.int32()), pa.field("k", pa.int8())])  # fmt: skip
    values = [math.copysign(math.nan, -1.0), math.nan, -200.0, 1.0, None]

    def rows(start: int) -> pa.Table:
        ids = list(range(start, start + len(values)))
        return pa.table({"id": ids, "d": values, "n": [0] * 5, "k": pa.array([0] * 5, pa.int8())}, schema=schema)

    t, table, oracle = _on_three_levels(tmp_path, schema, rows)
    d, n, k = pc.field("d"), pc.field("n"), pc.field("k")
    cases = (((d >= -129.0) & (n < 0.5), "d >= -129.0 AND n < 0.5"), ((d < 0) | (n > 2.5), "d < 0 OR n > 2.5"),
             # an integer an int8 cannot hold: Lance's SQL refused it too (written with the column widened)
             ((d > 0) | (k <= -129), "d > 0 OR k <= -129"), ((d < 0) | (k >= 128), "d < 0 OR k >= 128"))  # fmt: skip
    for expr, where in cases:
        _answers_alike(table, oracle, expr, where)
    t.flush()


def test_two_columns_holding_zeros_of_both_signs_compare_equal_on_every_path(tmp_path: Path) -> None:
    """DataFusion takes -0.0 and 0.0 for one value; Lance compares two columns in IEEE 754's total
    order (-0.0 < 0.0): ``f == g`` kept only the WAL tail's rows through ``to_reader`` and none
    through ``nearest``. Such comparisons go to Lance with the zeros made equal."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("f", pa.float64()),
            pa.field("g", pa.float32()),
            pa.field("u", pa.uint8()),
            pa.field("vec", pa.list_(pa.float32(), 2)),
        ]
    )
    pairs = [(-0.0, 0.0, 0), (0.0, -0.0, 0), (-0.0, -0.0, 1), (1.0, 1.0, 1), (math.nan, math.nan, 2), (None, 0.0, 0)]
    pairs += [(math.nan, 1.0, 1), (0.1, 0.1, 3)]

    def rows(start: int) -> pa.Table:
        cols = list(zip(*pairs, strict=True))
        ids = list(range(start, start + len(pairs)))
        return pa.table(
            {"id": ids, "f": cols[0], "g": pa.array(cols[1], pa.float32()), "u": pa.array(cols[2], pa.uint8()),
             "vec": [[float(i), 1.0] for i in ids]},
            schema=schema,
        )  # fmt: skip

    t, table, oracle = _on_three_levels(tmp_path, schema, rows)
    f, g, u = pc.field("f"), pc.field("g"), pc.field("u")
    cases = [(f == g, "f = g"), (f != g, "f <> g"), (f < g, "f < g"), (g >= f, "g >= f"), (f == u, "f = u"),
             (f > u, "f > u"), (~(f <= g), "NOT (f <= g)"), ((f == g) & (u < 1), "f = g AND u < 1"),
             # floats listed against a float32 / integer column: compared in float64, as DataFusion
             # widens the column (pyarrow casts the values down; such a filter was not rewritten, and
             # the NaN rows of `f > g` beside it were lost)
             ((f > g) | g.isin([5.0]), "f > g OR g IN (5.0)"), (g.isin([0.1, 1.0]), "g IN (0.1, 1.0)"),
             (~u.isin([1.0, 2.5]), "u NOT IN (1.0, 2.5)")]  # fmt: skip
    for expr, where in cases:
        _answers_alike(table, oracle, expr, where)
        want = oracle.sql(f"SELECT id FROM t WHERE {where} ORDER BY id").to_pydict()["id"]
        assert sorted(table.nearest("vec", [0.0, 1.0], k=50, filter=expr)["id"].to_pylist()) == want, where
    t.flush()


def test_table_level_schema_metadata_on_the_base(tmp_path: Path) -> None:
    """Table-level schema metadata on the base (``update_schema_metadata``): the merged table's schema carried it, a
    scan's batches did not, and DataFusion refused every aggregate ("Physical input schema
    should be the same as the one converted from logical input schema")."""
    import lance

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [1, 2, 3], "v": [10, 20, 30]}, schema=schema))
    lance.dataset(t.uri).update_schema_metadata({"owner": "team-a"}, replace=True)
    t.put(pa.table({"id": [3, 4], "v": [31, 40]}, schema=schema))
    t.flush()
    t.put(pa.table({"id": [5], "v": [50]}, schema=schema))  # WAL tail
    table = mq.open_table(t.uri)
    want = sorted((r["id"], r["v"]) for r in t.model.values())
    assert table.sql("SELECT count(*) AS n, sum(v) AS s FROM t").to_pylist() == [
        {"n": len(want), "s": sum(v for _, v in want)}
    ]
    got = table.sql("SELECT v % 2 AS odd, count(*) AS n FROM t GROUP BY v % 2 ORDER BY odd").to_pylist()
    assert got == [{"odd": o, "n": sum(1 for _, v in want if v % 2 == o)} for o in (0, 1)]
    assert sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist()) == want
    assert sorted((r["id"], r["v"]) for r in table.to_reader().read_all().to_pylist()) == want
    assert table.count_rows() == len(want)


def test_a_scan_keeps_its_filter_as_given_while_hundreds_of_others_are_written(tmp_path: Path) -> None:
    """A scan rewrites its filter when DataFusion asks for it and hands Lance the filter as
    given when its batches are read; the rewrite's origin was forgotten after 256 others (a
    NaN with its sign bit set then passed ``f = NaN``, rewritten ``is_nan(f)``)."""
    import pyarrow.compute as pc

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("f", pa.float64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [0, 1], "f": [0.0, 1.0]}, schema=schema))
    t.put(pa.table({"id": [10, 11, 12], "f": [math.copysign(math.nan, -1.0), math.nan, 2.0]}, schema=schema))
    ds = mq.open_table(t.uri).dataset()
    scans = [part.scanner(filter=pc.field("f") == pc.scalar(math.nan)) for part in ds.get_fragments()]
    for i in range(300):  # other queries meanwhile
        ds.to_table(filter=pc.field("f") > float(i))
    got = sorted(i for scan in scans for b in scan.to_batches() for i in b.column("id").to_pylist())
    assert got == [11]
    t.flush()


def test_a_filter_pyarrow_cannot_apply_is_one_error_on_every_read(tmp_path: Path) -> None:
    """A literal out of an integer column's range: ``dataset().to_table`` and ``count_rows``
    raised a raw ``ArrowInvalid``; like ``to_reader``, they name the filter and the table."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [1, 2], "v": [3, 4]}, schema=schema))
    t.put([{"id": 3, "v": 5}])
    table = mq.open_table(t.uri)
    beyond = pc.field("id") > pa.scalar(2**64 - 1, pa.uint64())
    reads = {
        "dataset().to_table": lambda: table.dataset().to_table(filter=beyond),
        "dataset().count_rows": lambda: table.dataset().count_rows(filter=beyond),
        "to_reader": lambda: table.to_reader(filter=beyond).read_all(),
    }
    for what, read in reads.items():
        with pytest.raises(mq.InvalidArgumentError, match="18446744073709551615") as err:
            read()
        assert t.uri in str(err.value) and "\n" not in str(err.value), what
    assert table.dataset().to_table(filter=pc.field("id") > 1).num_rows == 2  # a filter it can apply
    t.flush()
