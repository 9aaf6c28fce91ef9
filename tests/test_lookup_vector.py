"""Point lookups and vector search across LSM levels vs the dict model and pylance."""

from __future__ import annotations

import dataclasses
import glob
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.mem_wal import LsmPointLookupPlanner

import memwal_query as mq
from memwal_query.errors import InvalidArgumentError
from memwal_query.format.bloom import BloomFilter
from memwal_query.format.decode import IndexCatchup
from memwal_query.sql_functions import register_functions
from memwal_query.vector import index_coverage as vector_index_coverage

from builders import build_events
from lsm_model import PK, ModelTable

DIM = 16


def test_bloom_filters_written_by_lance_have_no_false_negatives(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=11, keep_open=False)
    gens = glob.glob(f"{t.uri}/_mem_wal/*/*_gen_*")
    assert gens
    absent_hits = 0
    for g in gens:
        bf = BloomFilter(Path(g, "bloom_filter.bin").read_bytes())
        keys = lance.dataset(g).to_table(columns=["id"], with_row_address=False).column("id").to_pylist()
        assert all(bf.might_contain_keys([(k,) for k in keys], ["int64"]))
        absent_hits += sum(bf.might_contain_keys([(k,) for k in range(10**6, 10**6 + 500)], ["int64"]))
    assert absent_hits < 0.05 * 500 * len(gens)  # a wrong hash would look random: half the bits set fail


def test_bloom_filter_string_composite_keys(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            pa.field("k", pa.string(), nullable=False, metadata=PK),
            pa.field("n", pa.int32(), nullable=False, metadata=PK),
        ]
    )
    base = pa.table({"k": ["x"], "n": pa.array([0], pa.int32())}, schema=schema)
    t = ModelTable(str(tmp_path / "c"), schema, base, unsharded=True, max_memtable_rows=500)
    rows = [{"k": s, "n": i} for i, s in enumerate(["", "ä", "hello world", "ß" * 9, "a\x00b"] * 40)]
    t.put(rows)
    t.flush()
    (g,) = glob.glob(f"{t.uri}/_mem_wal/*/*_gen_*")
    bf = BloomFilter(Path(g, "bloom_filter.bin").read_bytes())
    assert all(bf.might_contain_keys([(r["k"], r["n"]) for r in rows], ["string", "int32"]))
    assert sum(bf.might_contain_keys([("nope", i) for i in range(300)], ["string", "int32"])) < 15


def test_lookup_equals_model_and_pylance(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    rng = np.random.default_rng(0)
    keys = [int(k) for k in rng.choice(2700, 400, replace=False)] + [5, 6, 7, 11, 2100, 10**9]
    got = table.lookup(keys).to_pylist()  # in the order of the keys given (base, generations, MemTables mixed)
    assert got == [events.model[(k,)] for k in dict.fromkeys(keys) if (k,) in events.model]
    assert table.lookup([*keys[::-1], keys[-1]]).to_pylist() == got[::-1]  # a key given twice comes once
    stats = table.last_lookup_stats
    assert stats.keys == len(set(keys)) and stats.base_keys > 0  # type: ignore[attr-defined]
    # single keys, columns, and the same rows as pylance's planner on flushed data
    assert table.lookup(7, columns=["id", "amount"]).to_pylist() == [{"id": 7, "amount": events.model[(7,)]["amount"]}]
    assert table.lookup(pa.array([10**9], pa.int64())).num_rows == 0


def test_lookup_matches_lsm_point_lookup_planner(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=12, keep_open=False)
    table = mq.open_table(t.uri, consistency="eventual")
    planner = LsmPointLookupPlanner(lance.dataset(t.uri), table.pylance_shard_snapshots())
    for k in [1, 5, 6, 7, 11, 100, 2100, 2500, 10**9]:
        theirs = planner.plan_lookup(pa.array([k], pa.int64())).to_table()
        ours = table.lookup(k)
        assert ours.to_pylist() == theirs.select(ours.column_names).to_pylist(), k


def test_lookup_composite_keys_and_errors(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            pa.field("tenant", pa.string(), nullable=False, metadata=PK),
            pa.field("seq", pa.int32(), nullable=False, metadata=PK),
            pa.field("v", pa.float64()),
        ]
    )
    base = pa.Table.from_pylist([{"tenant": t, "seq": i, "v": 0.0} for t in "ab" for i in range(20)], schema=schema)
    t = ModelTable(str(tmp_path / "c"), schema, base, unsharded=True, max_memtable_rows=30)
    t.put([{"tenant": "a", "seq": 3, "v": 1.0}, {"tenant": "b", "seq": 3, "v": 2.0}])
    t.flush()
    t.delete([("a", 4)])
    t.put([{"tenant": "a", "seq": 3, "v": 9.0}])  # WAL tail, newest
    table = mq.open_table(t.uri)
    keys = pa.table({"tenant": ["a", "a", "b", "a", "z"], "seq": pa.array([3, 4, 3, 5, 3], pa.int32())})
    got = table.lookup(keys).to_pylist()
    assert got == [t.model[k] for k in [("a", 3), ("b", 3), ("a", 5)]]  # in the order given
    assert table.lookup(keys.take([3, 2, 0])).to_pylist() == got[::-1]
    # a b/3 lookup must not return a/3 (columns matched together, not separately)
    assert table.lookup({"tenant": ["b"], "seq": [3]}).to_pylist() == [t.model[("b", 3)]]
    # a key with a NULL part names no row
    nulls = {"tenant": ["b", None, "a"], "seq": pa.array([None, 3, 5], pa.int32())}
    assert table.lookup(nulls).to_pylist() == [t.model[("a", 5)]]
    with pytest.raises(mq.InvalidArgumentError, match="struct array, table, dict of columns or list of dicts"):
        table.lookup([1, 2])
    with pytest.raises(mq.InvalidArgumentError, match="lack key column"):
        table.lookup({"tenant": ["a"]})
    # one dict per key, also from SQL (a named_struct per key: memwal_lookup refused every form)
    assert table.lookup([{"tenant": "b", "seq": 3}, {"tenant": "a", "seq": 3}]).to_pylist() == got[1::-1]
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    keys_sql = "named_struct('tenant', 'b', 'seq', 3), named_struct('tenant', 'a', 'seq', 5)"
    sql = f"SELECT * FROM memwal_lookup('t', [{keys_sql}])"
    assert ctx.sql(sql).to_arrow_table().to_pylist() == [t.model[("b", 3)], t.model[("a", 5)]]
    t.flush()


@pytest.mark.parametrize(
    "key_types",
    [(pa.uint8(), pa.int32()), (pa.large_string(),), (pa.uint64(),), (pa.large_binary(), pa.int32())],
    ids=["uint8+int32", "large_string", "uint64", "large_binary+int32"],
)
def test_lookup_keys_lance_cannot_filter_by_expression(tmp_path: Path, key_types: tuple[pa.DataType, ...]) -> None:
    """Lance converts filter expressions through Substrait, which has no unsigned integers,
    large strings or large binaries: base reads for such keys go through SQL text."""
    names = [f"k{i}" for i in range(len(key_types))]
    make = {
        "uint": lambda i: i % 200 + 2**63 * (i % 2),
        "large_string": lambda i: f"key'{i}",
        "large_binary": lambda i: bytes([i % 251, 0]),
        "int": lambda i: i // 3,
    }

    def kind(t: pa.DataType) -> str:
        return "uint" if pa.types.is_unsigned_integer(t) else str(t) if not pa.types.is_integer(t) else "int"

    def value(t: pa.DataType, i: int) -> object:
        v = make[kind(t)](i)
        return v % 256 if t == pa.uint8() and isinstance(v, int) else v

    fields = [pa.field(n, t, nullable=False, metadata=PK) for n, t in zip(names, key_types, strict=True)]
    schema = pa.schema([*fields, pa.field("v", pa.float64())])

    def rows(ids: range | list[int], tag: float) -> pa.Table:
        cols = {n: pa.array([value(t, i) for i in ids], t) for n, t in zip(names, key_types, strict=True)}
        return pa.table({**cols, "v": [tag + i for i in ids]}, schema=schema)

    def key(i: int) -> tuple[object, ...]:
        return tuple(value(t, i) for t in key_types)

    t = ModelTable(str(tmp_path / "t"), schema, rows(range(150), 0.0), unsharded=True, max_memtable_rows=40)
    t.put(rows(range(0, 30), 1000.0))
    t.delete([key(i) for i in range(40, 45)])
    t.flush()
    t.put(rows(range(20, 35), 2000.0))  # WAL tail
    table = mq.open_table(t.uri)
    probe = [0, 25, 42, 60, 149]
    keys = pa.table({n: pa.array([value(tt, i) for i in probe], tt) for n, tt in zip(names, key_types, strict=True)})
    got = sorted(table.lookup(keys).column("v").to_pylist())
    assert got == sorted(t.model[key(i)]["v"] for i in probe if key(i) in t.model)
    t.flush()


@pytest.mark.parametrize("key_type", [pa.string(), pa.large_string(), pa.int64()], ids=str)
def test_lookup_of_keys_sql_text_cannot_carry(tmp_path: Path, key_type: pa.DataType) -> None:
    """Keys Lance's SQL cannot take as written (a backslash or a line break in a string, the
    int64 minimum, which SQL reads as minus 2**63: a float): a large_string key read every
    base row and returned them all; the int64 minimum failed with Lance's parse error."""
    if pa.types.is_integer(key_type):
        values: list[Any] = [-(2**63), 2**63 - 1, 0, 7, -5]
    else:
        values = ["x\\y", "line\nbreak", "tab\there", "plain", "quote'd"]
    schema = pa.schema([pa.field("k", key_type, nullable=False, metadata=PK), pa.field("v", pa.int64())])
    base = pa.table({"k": pa.array(values, key_type), "v": list(range(len(values)))}, schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("k", 2))
    t.put(pa.table({"k": pa.array(values[3:4], key_type), "v": [100]}, schema=schema))
    table = mq.open_table(t.uri)
    for v in [*values, "nope\\" if not pa.types.is_integer(key_type) else -(2**63) + 1]:
        want = [t.model[(v,)]] if (v,) in t.model else []
        assert table.lookup([v]).to_pylist() == want, repr(v)
    got = table.lookup(pa.array(values, key_type)).sort_by("v").to_pylist()
    assert got == sorted(t.model.values(), key=lambda r: r["v"])
    t.flush()


@pytest.mark.parametrize("key_type", [pa.int64(), pa.string()], ids=str)
def test_lookups_and_filters_over_columns_named_like_sql_words(tmp_path: Path, key_type: pa.DataType) -> None:
    """Filters written as SQL for Lance named columns bare: a key column ``null`` read as the
    NULL literal (lookups found nothing), ``true`` as a boolean (an error). A duration column
    anywhere (no Substrait type) made lookups of several keys fail."""
    import pyarrow.compute as pc

    schema = pa.schema(
        [
            pa.field("null", key_type, nullable=False, metadata=PK),
            pa.field("true", pa.uint32()),
            pa.field("d", pa.duration("s")),
        ]
    )
    ints = pa.types.is_integer(key_type)
    keys = [-(2**63), 0, 2, 3, 9] if ints else ["a", "b", "c", "d", "e"]

    def rows(picked: list[Any], tag: int) -> pa.Table:
        n = len(picked)
        true = pa.array([tag + i for i in range(n)], pa.uint32())
        return pa.table({"null": pa.array(picked, key_type), "true": true, "d": pa.array([tag] * n, pa.duration("s"))})

    t = ModelTable(str(tmp_path / "t"), schema, rows(keys, 0), bucket=("null", 2))
    t.put(rows(keys[3:], 10))
    table = mq.open_table(t.uri)
    for probe in (keys[2:3], keys[:3], keys):
        want = sorted((r for k, r in t.model.items() if k[0] in probe), key=lambda r: r["true"])
        assert table.lookup(probe).sort_by("true").to_pylist() == want, probe
    true = pc.field("true")
    for expr, keep in ((true == pa.scalar(2, pa.uint32()), lambda v: v == 2), (true >= 10, lambda v: v >= 10)):
        got = table.to_reader(columns=["true"], filter=expr).read_all().column("true").to_pylist()
        assert sorted(got) == sorted(r["true"] for r in t.model.values() if keep(r["true"])), str(expr)
    t.flush()


def test_lookup_wrong_key_type(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    # NULL keys name no row (a primary key holds no NULL): nothing, not an error
    assert table.lookup(None).num_rows == 0 and table.lookup([None]).num_rows == 0
    assert table.lookup([None, 7]).to_pylist() == table.lookup(7).to_pylist()
    with pytest.raises(mq.InvalidArgumentError, match="key column 'id'"):
        table.lookup(["not-a-number"])
    with pytest.raises(mq.InvalidArgumentError, match="unknown column"):
        table.lookup(1, columns=["nope"])
    with pytest.raises(mq.InvalidArgumentError, match="column\\(s\\) \\['id'\\] asked for more than once"):
        table.lookup(1, columns=["id", "amount", "id"])  # as to_arrow refuses it (it returned 'id' twice)
    # a fraction fits no integer key: Decimal("7.5") was cut to key 7 (a float 7.5 was refused)
    from decimal import Decimal

    for key in (7.5, Decimal("7.5")):
        with pytest.raises(mq.InvalidArgumentError, match="do not fit the key column 'id'"):
            table.lookup(key)
    assert table.lookup(Decimal("7")).to_pylist() == table.lookup(7).to_pylist()
    # a key of another kind is no key, whatever its shape (Arrow's cast made '07', True, a
    # timestamp of 7 s or Fraction(15, 2) key 7)
    from fractions import Fraction

    for key in (
        pa.array(["07"]),
        {"id": pa.array(["07"])},
        [{"id": "07"}],
        [{"id": True}],
        pa.array([7], pa.timestamp("s")),
        np.bool_(True),
        np.array([True]),
        Fraction(15, 2),
        pa.scalar("07"),
        pa.scalar(True),
        pa.scalar(7.5),
    ):
        with pytest.raises(mq.InvalidArgumentError, match="key column 'id'"):
            table.lookup(key)
    # a pyarrow scalar is its value (it was refused as "not an integer")
    seven = table.lookup(7).to_pylist()
    assert seven
    for key in (pa.scalar(7), pa.scalar(7, pa.uint8()), [pa.scalar(7)], {"id": pa.scalar(7)}, [{"id": pa.scalar(7)}]):
        assert table.lookup(key).to_pylist() == seven, key
    assert table.lookup(pa.scalar(None, pa.int64())).num_rows == 0
    with pytest.raises(mq.InvalidArgumentError, match="must all name the same columns"):
        table.lookup([{"id": 7}, {"ident": 8}])  # the second key was dropped as NULL
    assert table.lookup(np.array(7)).to_pylist() == table.lookup([{"id": 7}]).to_pylist() == table.lookup(7).to_pylist()


# -- vector search ---------------------------------------------------------------


def _vec_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("vec", pa.list_(pa.float32(), DIM)),
        ]
    )


def _vec_rows(ids: Any, rng: np.random.Generator) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    v = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    cats = np.array(["x", "y", "z"])[ids % 3]
    return pa.table(
        {"id": ids, "cat": cats, "vec": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), DIM)},
        schema=_vec_schema(),
    )


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> Any:
    rng = np.random.default_rng(5)
    uri = str(tmp_path_factory.mktemp("v") / "vec")
    base = _vec_rows(np.arange(6000), rng)
    lance.write_dataset(base, uri, max_rows_per_file=2000).create_index(
        "vec", index_type="IVF_PQ", num_partitions=16, num_sub_vectors=4
    )
    t = ModelTable.__new__(ModelTable)  # reuse the model's helpers on an existing dataset
    t.uri, t.schema, t.pk, t.max_rows, t.bucketed, t.writers = uri, _vec_schema(), ["id"], 500, True, {}
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=2, max_memtable_rows=500)
    t.ds = lance.dataset(uri)
    t.model = {(r["id"],): r for r in base.to_pylist()}
    # generation 1 (updates that move vectors + new rows + deletes), merged into the base
    t.put(_vec_rows(rng.choice(7000, 800, replace=False), rng))
    t.delete([(int(k),) for k in rng.choice(6000, 100, replace=False)])
    t.flush()
    for r in t.regions():
        t.merge(r, t.flushed(r)[0][0])  # merged but not re-indexed: new base fragments unindexed
    # generation 2: unmerged
    t.put(_vec_rows(rng.choice(7000, 600, replace=False), rng))
    t.delete([(int(k),) for k in rng.choice(7000, 50, replace=False)])
    t.flush()
    # WAL tail
    t.put(_vec_rows(rng.choice(7000, 100, replace=False), rng))
    yield t
    t.flush()


def _exact(model: dict[Any, Any], q: np.ndarray, k: int, cat: str | None = None) -> list[int]:
    rows = [r for r in model.values() if cat is None or r["cat"] == cat]
    ids = np.array([r["id"] for r in rows])
    m = np.array([r["vec"] for r in rows], dtype=np.float32)
    d = ((m - q) ** 2).sum(axis=1)
    return [int(i) for i in ids[np.argsort(d, kind="stable")[:k]]]


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_nearest_recall_and_no_stale_rows(vectors, mode: str) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(vectors.uri)
    table.index_catchup = mode
    cov = table.last_nearest_stats
    rng = np.random.default_rng(1)
    recalls = []
    for _ in range(20):
        q = rng.standard_normal(DIM).astype(np.float32)
        got = table.nearest("vec", q, k=10, nprobes=16, refine_factor=10)
        assert got.num_rows == 10
        for r in got.to_pylist():  # every returned row is the live version
            assert vectors.model.get((r["id"],)) == {k: r[k] for k in ("id", "cat", "vec")}
        recalls.append(len(set(got.column("id").to_pylist()) & set(_exact(vectors.model, q, 10))) / 10)
    assert np.mean(recalls) >= 0.95, recalls
    stats = table.last_nearest_stats
    assert cov is None and stats.coverage is not None  # type: ignore[attr-defined]
    assert stats.coverage.unindexed_fragments, "merged generation should sit in unindexed fragments"  # type: ignore[attr-defined]
    assert any("memtable" in s for s in stats.sources)  # type: ignore[attr-defined]
    plan = stats.coverage.plan  # type: ignore[attr-defined]
    assert plan.usable and "before the MemWAL index existed" in plan.reason, plan.reason
    catchup = [s for s in stats.sources if "catch-up generation 1" in s]  # type: ignore[attr-defined]
    if mode == "always":
        # the Indexed Read Plan: unindexed base rows come from the merged generations' own indexes
        assert len(catchup) == 2
        assert stats.sources[0] == "base (index vec_idx, indexed fragments only)"  # type: ignore[attr-defined]
    else:
        # 785 unindexed rows in 2 generations: a flat search is cheaper than two indexed ones
        assert plan.uncovered_rows < mq.catchup.CATCHUP_MIN_ROWS_PER_SOURCE * len(plan.sources)
        assert not catchup and "cheaper to read these rows flat" in stats.sources[0]  # type: ignore[attr-defined]


def test_nearest_filter_applies_to_live_rows(vectors) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(vectors.uri)
    q = np.full(DIM, 0.3, dtype=np.float32)
    got = table.nearest("vec", q, k=15, filter="cat = 'y'", nprobes=16, refine_factor=20)
    assert set(got.column("cat").to_pylist()) == {"y"} and got.num_rows == 15
    for r in got.to_pylist():  # every returned row is the live version (exact checks: test_levels_oracle.py)
        assert vectors.model.get((r["id"],)) == {k: r[k] for k in ("id", "cat", "vec")}
    exact = _exact(vectors.model, q, 15, "y")
    assert len(set(got.column("id").to_pylist()) & set(exact)) >= 14


def test_nearest_errors(vectors) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(vectors.uri)
    with pytest.raises(mq.InvalidArgumentError, match="dimension 3"):
        table.nearest("vec", [1.0, 2.0, 3.0])
    with pytest.raises(mq.InvalidArgumentError, match="not a fixed-size list"):
        table.nearest("cat", [1.0] * DIM)
    with pytest.raises(mq.InvalidArgumentError, match="distance"):
        table.nearest("vec", [1.0] * DIM, distance="manhattan")
    with pytest.raises(mq.InvalidArgumentError, match="positive"):
        table.nearest("vec", [1.0] * DIM, k=0)
    assert table.nearest("vec", [1.0] * DIM, k=np.int64(3), nprobes=np.int64(4)).num_rows == 3  # numpy ints
    with pytest.raises(mq.InvalidArgumentError, match="positive integer, got True"):
        table.nearest("vec", [1.0] * DIM, k=True)
    with pytest.raises(mq.InvalidArgumentError, match="NaN or infinite"):
        table.nearest("vec", [float("nan")] * DIM)
    for bad in ({"nprobes": 0}, {"refine_factor": 0}):
        with pytest.raises(mq.InvalidArgumentError, match=f"{next(iter(bad))} must be a positive integer"):
            table.nearest("vec", [1.0] * DIM, **bad)
    # a k beyond the table's rows returns every live row; Lance sizes its buffers by k, and
    # k=10**9 used to abort the process (a failed 30 GB allocation): run in a child process
    script = (
        "import sys, memwal_query as mq; t = mq.open_table(sys.argv[1]); "
        "print(t.nearest('vec', [1.0] * int(sys.argv[2]), k=10**9).num_rows)"
    )
    cmd = [sys.executable, "-c", script, vectors.uri, str(DIM)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert int(proc.stdout.split()[-1]) == len(vectors.model)


def test_sql_table_functions(vectors) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(vectors.uri)
    ctx = datafusion.SessionContext()
    register_functions(ctx, {"vec": table})
    q = np.full(DIM, -0.2, dtype=np.float32)
    qsql = "[" + ", ".join(f"{x:.1f}" for x in q) + "]"
    q = np.asarray([float(f"{x:.1f}") for x in q], dtype=np.float32)  # the query as the SQL literal spells it
    sql = f"SELECT k.* FROM memwal_knn('vec', 'vec', {qsql}, 5, NULL, 16) k ORDER BY k._distance"
    got = ctx.sql(sql).to_arrow_table().to_pylist()
    # against the model (an IVF_PQ base and HNSW generations: approximate, so recall, not order)
    assert len(got) == 5 and len({r["id"] for r in got}) == 5
    for r in got:  # each row is the live version
        assert vectors.model.get((r["id"],)) == {c: r[c] for c in ("id", "cat", "vec")}
    # IVF_PQ's codebooks are trained at random: 4 of 5 exact neighbours failed ~1 run in 16;
    # every row must still be a near neighbour, and most of the exact top 5 found
    assert {r["id"] for r in got} <= set(_exact(vectors.model, q, 20))
    assert len({r["id"] for r in got} & set(_exact(vectors.model, q, 5))) >= 3
    ctx.register_record_batches(
        "labels", [[pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()), "l": ["a", "b", "c"]})]]
    )
    joined = ctx.sql(
        "SELECT l.l, m.cat FROM memwal_lookup('vec', [1, 2, 3, 99999]) m JOIN labels l ON l.id = m.id ORDER BY l.l"
    ).to_pylist()
    assert joined == [
        {"l": {1: "a", 2: "b", 3: "c"}[k], "cat": vectors.model[(k,)]["cat"]}
        for k in (1, 2, 3)
        if (k,) in vectors.model
    ]
    with pytest.raises(Exception, match="no memwal table named"):
        ctx.sql("SELECT * FROM memwal_lookup('nope', [1])").collect()


def test_explain_shows_index_coverage_and_pruning(vectors) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(vectors.uri)
    text = table.explain("id = 42")
    assert "index vec_idx (IVF_PQ on vec)" in text and "searched flat (catch-up generations usable" in text
    table.index_catchup = "never"  # it said "cheaper to search these rows flat: index_catchup='auto'"
    assert "vec_idx (IVF_PQ on vec): fragments" in table.explain()
    assert "searched flat (catch-up generations usable, but index_catchup='never')" in table.explain()
    table.index_catchup = "always"
    assert "served by catch-up generations [4a388480:1, 8e131bde:1]" in table.explain()
    with pytest.raises(InvalidArgumentError, match="index_catchup must be"):
        table.index_catchup = "sometimes"
    assert "regions read: 1, pruned: 1" in text


def test_nearest_prefilter_prunes_regions(vectors) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(vectors.uri)
    live = sorted(k for (k,) in vectors.model)
    key = live[len(live) // 2]
    q = np.asarray(vectors.model[(key,)]["vec"], dtype=np.float32)
    got = table.nearest("vec", q, k=3, filter=f"id = {key}")
    assert got.column("id").to_pylist() == [key]
    stats = table.last_nearest_stats
    assert len(stats.pruned_regions) == 1  # type: ignore[attr-defined]
    assert not any(r in s for r in stats.pruned_regions for s in stats.sources)  # type: ignore[attr-defined]
    import pyarrow.compute as pc

    got2 = table.nearest("vec", q, k=3, filter=pc.field("id") == key)
    assert got2.column("id").to_pylist() == [key] and len(table.last_nearest_stats.pruned_regions) == 1  # type: ignore[attr-defined]


def _recall(table: mq.Table, model: dict[Any, Any], queries: int = 10) -> float:
    rng = np.random.default_rng(3)
    recalls = []
    for _ in range(queries):
        q = rng.standard_normal(DIM).astype(np.float32)
        got = table.nearest("vec", q, k=10, nprobes=16, refine_factor=10)
        for r in got.to_pylist():  # every returned row is the live version
            assert model.get((r["id"],)) == {k: r[k] for k in ("id", "cat", "vec")}
        recalls.append(len(set(got.column("id").to_pylist()) & set(_exact(model, q, 10))) / 10)
    return float(np.mean(recalls))


def test_catchup_falls_back_to_flat_when_a_generation_is_gone(vectors, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "copy")
    shutil.copytree(vectors.uri, uri)
    region = vectors.regions()[0]
    gen1 = dict(vectors.flushed(region))[1]
    shutil.rmtree(f"{uri}/_mem_wal/{region}/{gen1}")  # merged, then garbage-collected
    table = mq.open_table(uri)
    cov = vector_index_coverage(table, "vec")
    assert cov is not None and cov.plan is not None and not cov.plan.usable
    assert "garbage-collected" in cov.plan.reason and "searched flat" in cov.describe()
    assert _recall(table, vectors.model) >= 0.95
    assert not any("catch-up" in s for s in table.last_nearest_stats.sources)  # type: ignore[attr-defined]


def test_catchup_generation_collected_between_searches(vectors, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "copy")
    shutil.copytree(vectors.uri, uri)
    table = mq.open_table(uri)
    table.index_catchup = "always"
    assert _recall(table, vectors.model, queries=3) >= 0.9
    assert any("catch-up" in s for s in table.last_nearest_stats.sources)  # type: ignore[attr-defined]
    shutil.rmtree(f"{uri}/{table.catchup_plan('vec_idx').sources[0].path}")  # merged, then collected
    assert _recall(table, vectors.model) >= 0.95
    stats = table.last_nearest_stats
    assert not any("catch-up" in s for s in stats.sources)  # type: ignore[attr-defined]
    assert "garbage-collected after the plan" in stats.coverage.describe()  # type: ignore[attr-defined]


def test_catchup_plan_after_index_built_on_a_memwal_table(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    uri = str(tmp_path / "v")
    t = ModelTable(uri, _vec_schema(), _vec_rows(np.arange(3000), rng), bucket=("id", 2), max_memtable_rows=400)
    t.put(_vec_rows(rng.choice(3600, 500, replace=False), rng))
    t.delete([(int(k),) for k in rng.choice(3000, 40, replace=False)])
    t.flush()
    for r in t.regions():
        t.merge(r, 1)
    lance.dataset(uri).create_index("vec", index_type="IVF_PQ", num_partitions=8, num_sub_vectors=4)
    t.put(_vec_rows(rng.choice(3600, 300, replace=False), rng))  # generation 2: merged after the index build
    t.delete([(int(k),) for k in rng.choice(3600, 30, replace=False)])
    t.flush()
    for r in t.regions():
        t.merge(r, 2)
    t.put(_vec_rows(rng.choice(3600, 200, replace=False), rng))  # generation 3: unmerged
    t.flush()
    table = mq.open_table(uri)
    plan = table.catchup_plan("vec_idx")
    assert plan.usable, plan.reason
    # pylance's create_index records the merged generations it covers as catch-up progress
    (entry,) = table.snapshot.index.index_catchup
    assert entry.index_name == "vec_idx" and {m.generation for m in entry.caught_up} == {1}
    assert "catch-up progress" in plan.reason
    assert sorted(s.generation.generation for s in plan.sources) == [2, 2]  # generation 1 is indexed already
    table.index_catchup = "always"
    # without that entry, the same progress is inferred from the base manifest the index was built at
    blind = mq.open_table(uri)
    snap = blind.snapshot
    blind._snapshot = dataclasses.replace(snap, index=dataclasses.replace(snap.index, index_catchup=()))  # type: ignore[misc]
    inferred = blind.catchup_plan("vec_idx")
    assert inferred.usable and "where the index was built" in inferred.reason, inferred.reason
    assert [(s.generation.uri, s.drop.tolist()) for s in inferred.sources] == [
        (s.generation.uri, s.drop.tolist()) for s in plan.sources
    ]
    # an index missing from a non-empty progress list (another index recorded progress):
    # inferred from where it was built, as with an empty list
    other = mq.open_table(uri)
    other.index_catchup = "always"
    progress = (IndexCatchup("some_other_idx", ()),)
    other._snapshot = dataclasses.replace(snap, index=dataclasses.replace(snap.index, index_catchup=progress))  # type: ignore[misc]
    missing = other.catchup_plan("vec_idx")
    assert missing.usable and "where the index was built" in missing.reason, missing.reason
    assert [s.drop.tolist() for s in missing.sources] == [s.drop.tolist() for s in plan.sources]
    assert _recall(other, t.model, queries=3) >= 0.9
    assert _recall(table, t.model) >= 0.95
    # rows appended to the base outside the MemWAL: not accounted for by generations -> flat, still found
    extra = _vec_rows(np.arange(90_000, 90_050), rng)
    lance.write_dataset(extra, uri, mode="append")
    for r in extra.to_pylist():
        t.model[(r["id"],)] = r
    table = table.refresh()
    assert table.index_catchup == "always"  # kept by refresh()
    plan = table.catchup_plan("vec_idx")
    assert not plan.usable and "live rows" in plan.reason
    q = np.asarray(extra.column("vec")[7].as_py(), dtype=np.float32)
    assert table.nearest("vec", q, k=1).column("id").to_pylist() == [90_007]
    assert _recall(table, t.model) >= 0.95
    with pytest.raises(InvalidArgumentError, match="no index 'nope'"):
        table.catchup_plan("nope")


def test_lookup_keeps_the_type_of_its_own_errors(events, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Lance's read errors become one MemWalError; memwal's own (an InvalidArgumentError is a
    ValueError too, a StorageError an OSError) keep their type."""
    import memwal_query.lookup as lookup_module

    table = mq.open_table(events.uri)
    for err in (InvalidArgumentError("bad"), mq.StorageError("cannot read")):

        def fail(self: object, err: Exception = err) -> None:
            raise err

        monkeypatch.setattr(lookup_module._Search, "run", fail)
        with pytest.raises(type(err)):
            table.lookup([5, 6])


def test_composite_key_lookup_on_a_table_with_a_vector_column(tmp_path: Path) -> None:
    """Composite keys are matched by a join, which carried every column of the rows: Acero
    refuses a vector (fixed-size list) column that is not a join key, so a lookup whose key
    lived in the base or a MemTable failed, and the change feed with it."""
    schema = pa.schema(
        [
            pa.field("s", pa.string(), nullable=False, metadata=PK),
            pa.field("n", pa.int32(), nullable=False, metadata=PK),
            pa.field("vec", pa.list_(pa.float32(), 4)),
        ]
    )

    def rows(ids: list[int], v: float) -> pa.Table:
        vec = pa.FixedSizeListArray.from_arrays(pa.array(np.full(4 * len(ids), v, np.float32)), 4)
        return pa.table(
            {"s": [f"s{i}" for i in ids], "n": pa.array([i % 3 for i in ids], pa.int32()), "vec": vec}, schema=schema
        )

    t = ModelTable(str(tmp_path / "t"), schema, rows(list(range(100)), 0.0), bucket=("n", 2))
    t.put(rows([1, 2, 150], 1.0))
    t.flush()  # a generation
    t.put(rows([2, 5, 200], 2.0))  # the WAL tail
    t.delete([("s7", 1)])
    table = mq.open_table(t.uri)
    asked = [1, 2, 5, 7, 9, 150, 200, 300]
    keys = pa.table({"s": [f"s{i}" for i in asked], "n": pa.array([i % 3 for i in asked], pa.int32())})
    got = table.lookup(keys)
    want = [t.model[(f"s{i}", i % 3)] for i in asked if (f"s{i}", i % 3) in t.model]
    assert got.to_pylist() == want
    t.put(rows([9], 3.0))
    changed = table.refresh().changes(table)
    assert changed.select(["s", "n", "_change"]).to_pylist() == [{"s": "s9", "n": 0, "_change": "upsert"}]
    t.flush()


def test_catchup_plan_of_an_index_built_before_the_memwal_after_another_index_recorded_progress(
    tmp_path: Path,
) -> None:
    # the usual order: index the base, then initialise the MemWAL; an index created later
    # records catch-up progress for itself only, and the first index stays missing from it
    rng = np.random.default_rng(5)
    uri = str(tmp_path / "v")

    def index_vectors(ds: lance.LanceDataset) -> None:
        ds.create_index("vec", index_type="IVF_PQ", num_partitions=8, num_sub_vectors=4)

    base = _vec_rows(np.arange(3000), rng)
    t = ModelTable(uri, _vec_schema(), base, bucket=("id", 2), max_memtable_rows=400, prepare=index_vectors)
    t.put(_vec_rows(rng.choice(3600, 500, replace=False), rng))
    t.delete([(int(k),) for k in rng.choice(3000, 40, replace=False)])
    t.flush()
    for r in t.regions():
        t.merge(r, 1)
    lance.dataset(uri).create_scalar_index("id", "BTREE")
    t.put(_vec_rows(rng.choice(3600, 300, replace=False), rng))
    t.flush()
    for r in t.regions():
        t.merge(r, 2)
    t.put(_vec_rows(rng.choice(3600, 200, replace=False), rng))  # unmerged
    t.flush()
    table = mq.open_table(uri)
    assert [c.index_name for c in table.snapshot.index.index_catchup] == ["id_idx"]
    plan = table.catchup_plan("vec_idx")
    assert plan.usable, plan.reason
    assert sorted(s.generation.generation for s in plan.sources) == [1, 1, 2, 2]
    table.index_catchup = "always"
    assert _recall(table, t.model) >= 0.95
    assert any("catch-up" in s for s in table.last_nearest_stats.sources)  # type: ignore[attr-defined]
    got = table.sql("SELECT id, cat FROM t WHERE id BETWEEN 100 AND 900").to_arrow_table().to_pylist()
    want = [{"id": k[0], "cat": r["cat"]} for k, r in t.model.items() if 100 <= k[0] <= 900]
    assert sorted(got, key=lambda r: r["id"]) == sorted(want, key=lambda r: r["id"])


@pytest.mark.parametrize("name", ["_row", "_i", "_i_min", "_at", "_krow", "_nrow", "_idx"])
@pytest.mark.parametrize("composite", [False, True])
def test_key_columns_named_like_the_readers_scratch_columns(tmp_path: Path, name: str, composite: bool) -> None:
    """Lookups number the keys beside the key columns (``_row``, ``_i``, ``_at`` ...): a key
    column of that name raised a KeyError or "Multiple matches for FieldRef.Name(_i)"."""
    from memwal_write import write_arrow

    pk = [name, "part"] if composite else [name]
    fields = [pa.field(k, pa.string() if k == "part" else pa.int64(), nullable=False, metadata=PK) for k in pk]
    schema = pa.schema([*fields, pa.field("v", pa.int64())])

    def rows(ids: range, scale: int) -> pa.Table:
        cols: dict[str, list[Any]] = {name: list(ids), "v": [i * scale for i in ids]}
        if composite:
            cols["part"] = [f"p{i % 3}" for i in ids]
        return pa.table(cols, schema=schema)

    uri = str(tmp_path / "t")
    lance.write_dataset(rows(range(300), 1), uri).initialize_mem_wal(unsharded=True)
    write_arrow(uri, rows(range(100, 5200), 10), deletes=rows(range(5, 10), 1).select(pk))
    model = {r[name]: r for r in rows(range(300), 1).to_pylist()}
    model.update({r[name]: r for r in rows(range(100, 5200), 10).to_pylist()})
    for i in range(5, 10):
        del model[i]
    table = mq.open_table(uri)
    assert table.count_rows() == len(model)
    asked = rows(range(5300), 1).select(pk)  # more keys than a region's key map serves: a join
    got = table.lookup(asked if composite else asked.column(name))
    assert got.to_pylist() == [model[i] for i in range(5300) if i in model]
    few = table.lookup(asked.slice(0, 20) if composite else list(range(20)))
    assert few.to_pylist() == [model[i] for i in range(20) if i in model]


def test_spark_dedup_with_a_key_named_like_its_scratch_columns() -> None:
    from memwal_write.dedupe import Dedup

    t = pa.table({"__order": [1, 1, 2], "__valid": [7, 7, 7], "ts": [5, 9, 1], "v": ["old", "new", "x"]})
    order = Dedup(["__order", "__valid"], "ts", True, "t").newest_order(t)
    assert t.take(order).column("v").to_pylist() == ["new", "x"]
