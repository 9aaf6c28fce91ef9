"""Spark writes / merges / region-parallel reads against a dict model (local Spark)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lance.mem_wal import evaluate_sharding_spec

import memwal_query as mq
import memwal_write
from memwal_query.errors import InvalidArgumentError, MemWalError, TableNotFoundError
from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
from memwal_query.planner.plan import REGION_NAMESPACE
from memwal_query.regionspec.spec import evaluate_spec
from memwal_write.dedupe import Dedup as _Dedup
from memwal_write.spark import bucket_column
from memwal_write.spark_routing import hashable as _hashable
from memwal_write.spark_tasks import WriteJob as _WriteJob
from memwal_write.spark_tasks import write_partition as _write_partition

from lsm_model import PK, sort_table

pytestmark = pytest.mark.spark

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)


class Model:
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}

    def put(self, t: pa.Table) -> None:
        for r in t.select(SCHEMA.names).to_pylist():
            self.rows[r["id"]] = r

    def delete(self, ids: list[int]) -> None:
        for i in ids:
            self.rows.pop(i, None)

    def table(self) -> pa.Table:
        return sort_table(pa.Table.from_pylist(list(self.rows.values()), schema=SCHEMA), ["id"])


def _rows(ids: Any, tag: float) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table(
        {"id": ids, "cat": [f"c{i % 5}" for i in ids], "amount": ids.astype(np.float64) + tag}, schema=SCHEMA
    )


def _table(path: Path, *, buckets: int = 4, base_rows: int = 1200) -> tuple[str, Model]:
    uri = str(path / "t")
    base = _rows(range(base_rows), 0.0)
    lance.write_dataset(base, uri, max_rows_per_file=300).initialize_mem_wal(
        bucket_column="id", num_buckets=buckets, max_memtable_rows=400
    )
    m = Model()
    m.put(base)
    return uri, m


def _read(uri: str) -> pa.Table:
    return sort_table(mq.open_table(uri).to_arrow(), ["id"])


def _spark_df(spark: Any, t: pa.Table) -> Any:
    return spark.createDataFrame(t)


# -- routing ---------------------------------------------------------------------------------------
HASH_CASES = {
    "int32": pa.array([0, 1, -1, 7, 2**31 - 1, -(2**31), None], pa.int32()),
    "int64": pa.array([0, 1, -1, 2**40 + 5, -(2**62), None], pa.int64()),
    "utf8": pa.array(["", "a", "ab", "abc", "abcd", "abcde", "zürich", "日本語テキスト", None], pa.string()),
    "float64": pa.array([0.0, -0.0, 1.5, -2.25, float("nan"), 1e300, None], pa.float64()),
    "date32": pa.array([dt.date(1970, 1, 1), dt.date(2024, 2, 29), dt.date(1900, 5, 1), None], pa.date32()),
    "ts_us": pa.array([0, 1_700_000_000_123_456, -5, None], pa.timestamp("us", tz="UTC")),
    "ts_ms": pa.array([0, 1_700_000_000_123, -5000, None], pa.timestamp("ms", tz="UTC")),
    "bool": pa.array([True, False, None], pa.bool_()),
}


@pytest.mark.parametrize("name", sorted(HASH_CASES))
def test_spark_bucket_equals_lance_bucket(spark: Any, tmp_path: Path, name: str) -> None:
    arr = HASH_CASES[name]
    n = 7
    schema = pa.schema([pa.field("i", pa.int32(), nullable=False, metadata=PK), pa.field("k", arr.type)])
    data = pa.table({"i": pa.array(range(len(arr)), pa.int32()), "k": arr}, schema=schema)
    ds = lance.write_dataset(data, str(tmp_path / name))
    ds.initialize_mem_wal(bucket_column="k", num_buckets=n)
    ds = lance.dataset(str(tmp_path / name))
    batch = data.to_batches()[0]
    lance_spec = ds.mem_wal_index_details()["sharding_specs"][0]
    oracle = evaluate_sharding_spec(batch, lance_spec, ds.lance_schema).column(0).to_pylist()
    f = ShardingFieldSpec("bucket", (1,), "bucket", None, "int32", {"num_buckets": str(n)})
    shared = evaluate_spec(RegionSpec(1, (f,)), batch, {1: "k"}).column(0).to_pylist()
    assert shared == oracle
    from pyspark.sql import functions as F

    df = spark.createDataFrame(data)
    value = _hashable(F.col("k"), df.schema["k"].dataType, arr.type)
    assert value is not None, f"{name} should be routed natively"
    got = df.select("i", bucket_column(value, n).alias("b")).orderBy("i").toArrow().column("b").to_pylist()
    assert got == oracle


def test_write_upsert_delete_matches_model(spark: Any, tmp_path: Path) -> None:
    uri, model = _table(tmp_path)
    rng = np.random.default_rng(3)
    ups = _rows(rng.choice(2000, 700, replace=False), 1.0)
    stats = memwal_write.write(_spark_df(spark, ups), uri, max_rows_per_put=120, via="tasks").toArrow()
    model.put(ups)
    assert sum(stats.column("rows_put").to_pylist()) == ups.num_rows
    # one task per bucket region, regions named by the shared convention
    expected_ids = {str(uuid.uuid5(REGION_NAMESPACE, f"bucket-{b}")) for b in range(4)}
    assert set(stats.column("region_id").to_pylist()) == expected_ids
    assert len(set(stats.column("task_partition").to_pylist())) == 4
    assert max(stats.column("puts").to_pylist()) >= 2  # batches were combined, row limit respected
    dels = [int(i) for i in rng.choice(2000, 150, replace=False)]
    batch_conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(batch_conf)
    dkeys = spark.createDataFrame([(i,) for i in dels + dels[:10]], "id long")
    dstats = memwal_write.delete(dkeys, uri, via="tasks").toArrow()
    model.delete(dels)
    assert sum(dstats.column("rows_deleted").to_pylist()) == len(dels)
    assert spark.conf.get(batch_conf) == before  # raised for the write job only
    assert _read(uri).equals(model.table())


def test_order_by_and_ambiguous_duplicates(spark: Any, tmp_path: Path) -> None:
    uri, model = _table(tmp_path, base_rows=100)
    rows = [(5, "old", 1.0, 1), (5, "new", 2.0, 3), (5, "mid", 3.0, 2), (6, "x", 1.0, 1), (6, "x", 1.0, 1)]
    df = spark.createDataFrame(rows, "id long, cat string, amount double, ts int")
    stats = memwal_write.write(df, uri, order_by="ts", num_partitions=2).toArrow()
    assert sum(stats.column("duplicates_dropped").to_pylist()) == 3
    model.put(pa.table({"id": [5, 6], "cat": ["new", "x"], "amount": [2.0, 1.0]}, schema=SCHEMA))
    assert _read(uri).equals(model.table())
    # identical duplicates are fine without order_by; differing ones name the key
    same = spark.createDataFrame([(7, "a", 1.0), (7, "a", 1.0)], "id long, cat string, amount double")
    memwal_write.write(same, uri, num_partitions=1)
    bad = spark.createDataFrame([(8, "a", 1.0), (8, "b", 1.0)], "id long, cat string, amount double")
    with pytest.raises(InvalidArgumentError, match=r"key \{'id': 8\}"):
        memwal_write.write(bad, uri, num_partitions=1)
    tie = spark.createDataFrame([(9, "a", 1.0, 1), (9, "b", 1.0, 1)], "id long, cat string, amount double, ts int")
    with pytest.raises(InvalidArgumentError, match="same 'ts' value"):
        memwal_write.write(tie, uri, order_by="ts", num_partitions=1)
    with pytest.raises(InvalidArgumentError, match="not in the table schema"):
        memwal_write.write(spark.createDataFrame([(1, 2)], "id long, nope int"), uri)
    with pytest.raises(InvalidArgumentError, match="cannot be stored|not nullable|required"):
        memwal_write.write(spark.createDataFrame([(None, "a")], "id long, cat string"), uri, num_partitions=1)


def test_retried_tasks_give_model_rows(spark: Any, tmp_path: Path) -> None:
    uri, model = _table(tmp_path)
    ups = _rows(range(500, 1700), 2.0)
    # every write task fails after its first put (its WAL holds rows), the retry re-writes
    stats = memwal_write.write(_spark_df(spark, ups), uri, max_rows_per_put=100, _fail_first_attempt_after_puts=1)
    model.put(ups)
    arrow = stats.toArrow()
    assert set(arrow.column("task_attempt").to_pylist()) == {1}
    assert _read(uri).equals(model.table())

    # an upstream stage failing on its first attempt
    def flaky(batches: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for b in batches:
            if ctx is not None and ctx.attemptNumber() == 0 and ctx.partitionId() == 0:
                raise RuntimeError("injected upstream failure")
            yield b

    ups2 = _rows(range(0, 300), 3.0)
    df = _spark_df(spark, ups2).repartition(3).mapInArrow(flaky, "id long, cat string, amount double")
    memwal_write.write(df, uri, via="tasks")
    model.put(ups2)
    assert _read(uri).equals(model.table())


def test_fenced_writer_raises_clearly(tmp_path: Path) -> None:
    uri, _ = _table(tmp_path, buckets=1, base_rows=10)
    region = str(uuid.uuid5(REGION_NAMESPACE, "bucket-0"))
    job = _WriteJob(uri, "put", tuple(SCHEMA.names), ("id",), None, None, None, 20, {}, False)
    claimed: list[Any] = []

    def batches() -> Any:
        yield _rows(range(100, 130), 1.0).to_batches()[0]
        claimed.append(lance.dataset(uri).mem_wal_writer(region))  # a concurrent writer claims the region
        yield _rows(range(200, 230), 1.0).to_batches()[0]

    with pytest.raises(MemWalError, match="fenced"):
        list(_write_partition(job, batches(), 0, 0))
    claimed[0].close()


def test_speculation_refused() -> None:
    from memwal_write.spark import _check_speculation

    class Conf:
        def get(self, key: str, default: str) -> str:
            return "true"

    class Ctx:
        def getConf(self) -> Conf:  # noqa: N802
            return Conf()

    class Spark:
        sparkContext = Ctx()

    with pytest.raises(InvalidArgumentError, match="speculation"):
        _check_speculation(Spark(), False)
    _check_speculation(Spark(), True)  # warns only


def test_merge_generations_rerun_and_concurrent(spark: Any, tmp_path: Path) -> None:
    uri, model = _table(tmp_path)
    for tag in (1.0, 2.0, 3.0):
        ups = _rows(range(int(tag) * 200, int(tag) * 200 + 700), tag)
        memwal_write.write(_spark_df(spark, ups), uri)
        model.put(ups)
    dels = list(range(0, 1500, 7))
    memwal_write.delete(spark.createDataFrame([(i,) for i in dels], "id long"), uri)
    model.delete(dels)
    expected = model.table()
    # two mergers at once, each merging one generation per region
    results: list[pa.Table] = []
    threads = [
        threading.Thread(target=lambda: results.append(memwal_write.merge_generations(uri, max_generations=1)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2
    assert _read(uri).equals(expected)
    first = memwal_write.merge_generations_spark(spark, uri).toArrow()
    assert set(first.column("status").to_pylist()) <= {"merged", "skipped"}
    assert memwal_write.merge_generations(uri).num_rows == 0  # nothing left: a rerun is a no-op
    assert sort_table(lance.dataset(uri).to_table(), ["id"]).equals(expected)
    assert _read(uri).equals(expected)


def test_read_spark_equals_single_process(spark: Any, tmp_path: Path) -> None:
    uri, model = _table(tmp_path)
    ups = _rows(range(900, 1600), 5.0)
    memwal_write.write(_spark_df(spark, ups), uri)
    model.put(ups)
    memwal_write.delete(spark.createDataFrame([(i,) for i in range(0, 400, 3)], "id long"), uri)
    model.delete(list(range(0, 400, 3)))
    single = _read(uri)
    assert single.equals(model.table())
    frozen = memwal_write.read_spark(spark, uri)
    got = sort_table(frozen.toArrow(), ["id"])
    assert got.cast(SCHEMA).equals(single)
    df = memwal_write.read_spark(spark, uri, columns=["id", "amount"], predicate="amount > 1000")
    want = single.filter(pc.greater(single.column("amount"), 1000.0)).select(["id", "amount"])
    assert sort_table(df.toArrow(), ["id"]).cast(want.schema).equals(want)
    # an expression pyarrow may answer otherwise than Lance: in-memory rows go through Lance in the tasks
    odd = pc.coalesce(pc.field("amount") > 1000, False)
    df = memwal_write.read_spark(spark, uri, columns=["id", "amount"], predicate=odd)
    assert sort_table(df.toArrow(), ["id"]).cast(want.schema).equals(want)
    # Spark's own SQL, which DataFusion cannot plan for pruning (it was refused: "Invalid function")
    spark_sql = "amount > double('1000') AND abs(amount) > 1000"
    df = memwal_write.read_spark(spark, uri, columns=["id", "amount"], predicate=spark_sql)
    assert sort_table(df.toArrow(), ["id"]).cast(want.schema).equals(want)
    expr = pc.field("id") == 1000
    one = memwal_write.read_spark(spark, uri, columns=["id", "amount"], predicate=expr).toArrow()
    assert one.to_pylist() == [{"id": 1000, "amount": 1005.0}]
    # the DataFrame reads the snapshot of the read_spark() call, however late it runs
    memwal_write.write_arrow(uri, _rows(range(5000, 5100), 1.0))
    assert sort_table(frozen.toArrow(), ["id"]).cast(SCHEMA).equals(single)
    assert _read(uri).num_rows == single.num_rows + 100


def test_read_spark_ships_generations_held_in_memory(spark: Any, tmp_path: Path) -> None:
    """Generations flushed before the base's columns changed are read into memory with the new
    columns (test_schema_evolution); Spark tasks get their rows shipped and read the model."""
    from test_schema_evolution import build_evolved

    t = build_evolved(str(tmp_path / "t"))
    try:
        snap = mq.open_table(t.uri).view.snapshot
        assert any(g.dataset.uri.startswith("memory://") for r in snap.regions for g in r.generations)
        want = sorted(t.model.values(), key=lambda r: r["id"])
        # every column: the vector (a fixed-size list, an array in Spark) and the struct too
        got = sort_table(memwal_write.read_spark(spark, t.uri).toArrow(), ["id"]).to_pylist()
        assert [{c: pytest.approx(r[c]) if c == "vec" else r[c] for c in r} for r in got] == want
        memwal_write.register_data_source(spark)
        rows = spark.read.format("memwal").load(t.uri).where("x2 >= 1.0").toArrow()
        got = sort_table(rows, ["id"]).to_pylist()
        assert [{c: pytest.approx(r[c]) if c == "vec" else r[c] for c in r} for r in got] == [
            r for r in want if r["x2"] >= 1.0
        ]
    finally:
        t.flush()


def test_unsigned_columns_read_as_spark_reads_parquet_unsigned(spark: Any, tmp_path: Path) -> None:
    """Spark has no unsigned integers: read_spark and the data source widen them (uint8 ->
    short, uint16 -> int, uint32 -> long, uint64 -> decimal(20, 0)), every value exact."""
    from decimal import Decimal

    from lsm_model import ModelTable

    schema = pa.schema(
        [
            pa.field("id", pa.uint64(), nullable=False, metadata=PK),
            pa.field("a", pa.uint8()),
            pa.field("b", pa.uint16()),
            pa.field("c", pa.uint32()),
        ]
    )
    ids = [0, 7, 2**53 + 1, 2**63 + 5, 2**64 - 1]

    def row(i: int, k: int) -> dict[str, Any]:
        return {"id": k, "a": 255 - i, "b": 65535 - i, "c": 2**32 - 1 - i}

    base = pa.Table.from_pylist([row(i, k) for i, k in enumerate(ids[:3])], schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, unsharded=True)
    t.put([row(10 + i, k) for i, k in enumerate(ids[2:])])  # one update, two new keys
    t.flush()
    want = [{**r, "id": Decimal(r["id"])} for r in sorted(t.model.values(), key=lambda r: r["id"])]
    got = memwal_write.read_spark(spark, t.uri).toArrow()
    assert [f.type for f in got.schema] == [pa.decimal128(20, 0), pa.int16(), pa.int32(), pa.int64()]
    assert sort_table(got, ["id"]).to_pylist() == want
    memwal_write.register_data_source(spark)
    read = spark.read.format("memwal").option("pushFilters", "true")
    rows = read.load(t.uri).where(f"c >= {2**32 - 11}").toArrow()  # pushed
    assert sort_table(rows, ["id"]).to_pylist() == [r for r in want if r["c"] >= 2**32 - 11]


def test_time_types_spark_holds_otherwise(spark: Any, tmp_path: Path) -> None:
    """Spark holds timestamps (with or without a time zone) and durations in microseconds,
    times in nanoseconds, dates as days, no float16: such columns failed to read (a Java
    Arrow error, an AssertionError for a zoned timestamp in the data source)."""
    import datetime as dt

    from lsm_model import ModelTable

    types = {
        "ts_s": pa.timestamp("s"),
        "ts_ms_utc": pa.timestamp("ms", "UTC"),
        "ts_us_utc": pa.timestamp("us", "UTC"),
        "ts_ns": pa.timestamp("ns"),
        "t64": pa.time64("us"),
        "d64": pa.date64(),
        "dur": pa.duration("ms"),
        "f16": pa.float16(),
    }
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), *(pa.field(n, t) for n, t in types.items())]
    )
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)

    def row(i: int) -> dict[str, Any]:
        at = when + dt.timedelta(days=i)
        utc = at.replace(tzinfo=dt.timezone.utc)
        return {
            "id": i,
            "ts_s": at.replace(microsecond=0),
            "ts_ms_utc": utc.replace(microsecond=123000),
            "ts_us_utc": utc,
            "ts_ns": at,
            "t64": at.time(),
            "d64": at.date(),
            "dur": dt.timedelta(milliseconds=1500 * i),
            "f16": 0.5 * i,
        }

    t = ModelTable(
        str(tmp_path / "t"), schema, pa.Table.from_pylist([row(i) for i in range(3)], schema=schema), unsharded=True
    )
    t.put([row(i) for i in range(2, 5)])
    t.flush()
    want = sorted(t.model.values(), key=lambda r: r["id"])
    memwal_write.register_data_source(spark)
    for got in (memwal_write.read_spark(spark, t.uri).toArrow(), spark.read.format("memwal").load(t.uri).toArrow()):
        rows = sort_table(got, ["id"]).to_pylist()
        for r in rows:  # Spark returns zoned timestamps in UTC, naive ones as they are
            for c in ("ts_ms_utc", "ts_us_utc"):
                r[c] = r[c].astimezone(dt.timezone.utc)
        assert rows == want


def test_timestamps_into_a_column_without_a_time_zone_keep_the_session_local_time(spark: Any, tmp_path: Path) -> None:
    """Spark's cast of a TIMESTAMP to TIMESTAMP_NTZ keeps the session-local time: so does a
    write into a Lance column without a time zone, on both write paths (UTC time before), in
    a struct or a list too (their UTC time until this stop)."""
    import datetime as dt

    naive = pa.timestamp("us")
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("at", naive),
            pa.field("s", pa.struct([("at", naive)])),
            pa.field("l", pa.list_(naive)),
        ]
    )
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        at = "timestamp'2024-01-01 00:00:00'"
        df = spark.sql(f"SELECT 1L AS id, {at} AS at, named_struct('at', {at}) AS s, array({at}, NULL) AS l")
        for via in ("driver", "tasks"):
            uri = str(tmp_path / via)
            empty = pa.table({"id": [0], "at": [None], "s": [None], "l": [None]}, schema=schema)
            lance.write_dataset(empty, uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
            memwal_write.write(df, uri, via=via)
            got = mq.open_table(uri).to_arrow().sort_by("id").to_pylist()[1]
            local = dt.datetime(2024, 1, 1)
            assert got == {"id": 1, "at": local, "s": {"at": local}, "l": [local, None]}, via
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)


def test_to_datafusion_joins_merged_table(spark: Any, tmp_path: Path) -> None:
    uri, model = _table(tmp_path, base_rows=300)
    ctx = datafusion.SessionContext()
    mq.open_table(uri).register(ctx, "events")
    memwal_write.to_datafusion(
        spark.createDataFrame([(5, "x"), (7, "y"), (9999, "z")], "id long, tag string"), ctx, "s"
    )
    out = ctx.sql("SELECT s.id, s.tag, e.amount FROM s JOIN events e USING (id) ORDER BY s.id").to_pydict()
    assert out == {"id": [5, 7], "tag": ["x", "y"], "amount": [5.0, 7.0]}


@pytest.mark.parametrize("via", ["tasks", "driver"])
def test_write_via_driver_or_tasks_same_rows_and_regions(spark: Any, tmp_path: Path, via: str) -> None:
    """Both write paths: model rows, bucket regions named by the shared convention,
    order_by (a NULL order value is the oldest), ambiguous duplicates refused, deletes."""
    uri, model = _table(tmp_path)
    rng = np.random.default_rng(11)
    ups = _rows(rng.choice(2000, 600, replace=False), 4.0)
    stats = memwal_write.write(_spark_df(spark, ups), uri, max_rows_per_put=150, via=via).toArrow()
    model.put(ups)
    assert sum(stats.column("rows_put").to_pylist()) == ups.num_rows
    expected_ids = {str(uuid.uuid5(REGION_NAMESPACE, f"bucket-{b}")) for b in range(4)}
    assert set(stats.column("region_id").to_pylist()) == expected_ids
    assert min(stats.column("puts").to_pylist()) >= 1
    rows = [(5, "old", 1.0, 1), (5, "new", 2.0, 3), (5, "nul", 9.0, None), (6, "n", 1.0, None), (6, "v", 2.0, 1)]
    df = spark.createDataFrame(rows, "id long, cat string, amount double, ts int")
    stats = memwal_write.write(df, uri, order_by="ts", via=via).toArrow()
    assert sum(stats.column("duplicates_dropped").to_pylist()) == 3
    model.put(pa.table({"id": [5, 6], "cat": ["new", "v"], "amount": [2.0, 2.0]}, schema=SCHEMA))
    bad = spark.createDataFrame([(8, "a", 1.0), (8, "b", 1.0)], "id long, cat string, amount double")
    with pytest.raises(InvalidArgumentError, match=r"key \{'id': 8\}"):
        memwal_write.write(bad, uri, via=via)
    tie = spark.createDataFrame([(9, "a", 1.0, 2), (9, "b", 1.0, 2)], "id long, cat string, amount double, ts int")
    with pytest.raises(InvalidArgumentError, match=r"key \{'id': 9\}.*same 'ts' value"):
        memwal_write.write(tie, uri, order_by="ts", via=via)
    narrow = spark.createDataFrame([(11, "i", 3.0)], "id int, cat string, amount double")  # int into a long key
    memwal_write.write(narrow, uri, via=via)
    model.put(pa.table({"id": [11], "cat": ["i"], "amount": [3.0]}, schema=SCHEMA))
    same = spark.createDataFrame([(10, "a", 1.0), (10, "a", 1.0)], "id long, cat string, amount double")
    stats = memwal_write.write(same, uri, via=via).toArrow()  # identical duplicates: one row
    assert sum(stats.column("duplicates_dropped").to_pylist()) == 1
    model.put(pa.table({"id": [10], "cat": ["a"], "amount": [1.0]}, schema=SCHEMA))
    dels = [int(i) for i in rng.choice(2000, 100, replace=False)]
    # an int key column into the long key (the tasks' routing check refused it as a mismatch)
    dstats = memwal_write.delete(spark.createDataFrame([(i,) for i in dels + dels[:5]], "id int"), uri, via=via)
    model.delete(dels)
    assert sum(dstats.toArrow().column("rows_deleted").to_pylist()) == len(dels)
    assert _read(uri).equals(model.table())
    with pytest.raises(InvalidArgumentError, match="via must be"):
        memwal_write.write(bad, uri, via="executors")


@pytest.mark.parametrize(
    "key_type", [pa.int64(), pa.int32(), pa.uint16(), pa.float64(), pa.timestamp("us"), pa.date32(), pa.string()]
)
def test_driver_dedupe_keeps_one_row_per_key_in_key_order(key_type: pa.DataType) -> None:
    """``_Dedup.newest_order`` (numpy's sort for one numeric key, Arrow's otherwise):
    every key once, in key order; equal duplicates collapse, different ones are refused."""
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 3000, 20_000)
    base = pa.array(raw)
    if pa.types.is_string(key_type):
        keys = base.cast(pa.string())
    else:
        keys = base.cast(pa.int32()).cast(key_type) if pa.types.is_date32(key_type) else base.cast(key_type)
    t = pa.table({"k": keys, "v": pa.array(raw * 3)})  # duplicates of a key are equal rows
    model = dict(zip(keys.to_pylist(), t.column("v").to_pylist(), strict=True))
    dedup = _Dedup(("k",), None, True, "mem://t")
    kept = t.take(dedup.newest_order(t))
    expected = sorted(model)
    assert kept.column("k").to_pylist() == expected
    assert kept.column("v").to_pylist() == [model[k] for k in expected]
    assert dedup.dropped == t.num_rows - len(expected)
    clash = pa.concat_tables([t, t.slice(7, 1).set_column(1, "v", pa.array([-1]))])
    with pytest.raises(InvalidArgumentError, match="appears more than once"):
        _Dedup(("k",), None, True, "mem://t").newest_order(clash)
    # exact duplicates holding NaN are duplicates (NaN != NaN refused them as ambiguous)
    nan = pa.table({"k": [1, 1, 2], "v": [float("nan"), float("nan"), 1.0], "l": [[float("nan")]] * 3})
    assert _Dedup(("k",), None, True, "mem://t").newest_order(nan).to_pylist() in ([1, 2], [0, 2])
    with pytest.raises(InvalidArgumentError, match="appears more than once"):
        _Dedup(("k",), None, True, "mem://t").newest_order(nan.set_column(1, "v", pa.array([float("nan"), 2.0, 1.0])))
    # two rows of a key whose order_by values are both NaN are tied, as Spark's sort sees them
    tied = pa.table({"k": [7, 7], "v": ["A", "B"], "ts": [float("nan"), float("nan")]})
    with pytest.raises(InvalidArgumentError, match="same 'ts' value"):
        _Dedup(("k",), "ts", True, "mem://t").newest_order(tied)
    streaming = _Dedup(("k",), "ts", True, "mem://t")  # the tasks' form: key-sorted batches
    streaming.push(tied)
    with pytest.raises(InvalidArgumentError, match="same 'ts' value"):
        streaming.finish()
    newest = pa.table({"k": [7, 7], "v": ["A", "B"], "ts": [1.0, float("nan")]})  # NaN sorts above numbers
    assert newest.take(_Dedup(("k",), "ts", True, "mem://t").newest_order(newest)).column("v").to_pylist() == ["B"]


def test_auto_writes_from_the_driver_on_a_local_master(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``via="auto"`` (the default): the driver path for a local master and a small size
    estimate, tasks otherwise; a collect over ``spark.driver.maxResultSize`` falls back
    to tasks (nothing was written), other collect errors are raised."""
    from memwal_write import spark as mws

    small = spark.range(0, 1000).selectExpr("id", "cast(id % 5 as string) as cat", "id * 1.0 as amount")
    assert mws._auto_via(small, num_partitions=None, fail_after_puts=None) == "driver"
    assert mws._auto_via(small, num_partitions=4, fail_after_puts=None) == "tasks"
    assert mws._auto_via(small, num_partitions=None, fail_after_puts=1) == "tasks"
    monkeypatch.setattr(mws, "AUTO_DRIVER_MAX_BYTES", 100)
    assert mws._auto_via(small, num_partitions=None, fail_after_puts=None) == "tasks"
    monkeypatch.undo()

    class TooBig:  # what Py4J raises (measured with spark.driver.maxResultSize=1m)
        def toArrow(self) -> pa.Table:  # noqa: N802
            raise RuntimeError(
                "An error occurred while calling o46.getResult.\n: org.apache.spark.SparkException: Job aborted "
                "due to stage failure: Total size of serialized results of 1 tasks (2.3 MiB) is bigger than "
                "spark.driver.maxResultSize (1024.0 KiB)\n\tat org.apache.spark..."
            )

    assert mws._collect(TooBig(), "u", "put", auto=True) is None
    with pytest.raises(MemWalError, match=r"could not collect the rows: org.apache.spark.SparkException: Job .*1024"):
        mws._collect(TooBig(), "u", "put", auto=False)

    # the default write on this local session goes through the driver: one stats row
    # per region, all from "task" 0; rows equal the model
    uri, model = _table(tmp_path)
    collected: list[int] = []
    real = mws._collect

    def spy(df: Any, uri: str, mode: str, *, auto: bool) -> pa.Table | None:
        out = real(df, uri, mode, auto=auto)
        collected.append(0 if out is None else out.num_rows)
        return out

    monkeypatch.setattr(mws, "_collect", spy)
    stats = memwal_write.write(small, uri).toArrow()
    assert collected == [1000]
    assert set(stats.column("task_partition").to_pylist()) == {0}
    model.put(small.toArrow().cast(SCHEMA))
    assert _read(uri).equals(model.table())


@pytest.mark.parametrize("via", ["tasks", "driver"])
def test_write_to_a_named_region_of_a_table_without_spec(spark: Any, tmp_path: Path, via: str) -> None:
    """Tables without a region spec: every row goes to the region the caller names (both
    paths), and a write that names none is refused before anything is written."""
    uri = str(tmp_path / "t")
    base = _rows(range(50), 0.0)
    lance.write_dataset(base, uri).initialize_mem_wal()
    model = Model()
    model.put(base)
    region = str(uuid.uuid4())
    ups = _rows(np.r_[np.arange(30, 90), np.arange(30, 40)], 1.0)  # keys 30-39 twice, equal rows
    with pytest.raises(InvalidArgumentError, match="no region spec"):
        memwal_write.write(_spark_df(spark, ups), uri, via=via)
    stats = memwal_write.write(_spark_df(spark, ups), uri, region_id=region, via=via).toArrow()
    model.put(ups)
    assert set(stats.column("region_id").to_pylist()) == {region}
    assert sum(stats.column("rows_put").to_pylist()) == 60
    memwal_write.delete(
        spark.createDataFrame([(i,) for i in range(0, 100, 7)], "id long"), uri, region_id=region, via=via
    )
    model.delete(list(range(0, 100, 7)))
    assert _read(uri).equals(model.table())


FALLBACK_SCRIPT = """
import sys, lance, pyarrow as pa
from pyspark.sql import SparkSession
import memwal_write
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.maxResultSize", "1m").getOrCreate())
spark.sparkContext.setLogLevel("OFF")
pk = {"lance-schema:unenforced-primary-key": "true"}
schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=pk), pa.field("v", pa.string())])
uri = sys.argv[1]
lance.write_dataset(schema.empty_table(), uri).initialize_mem_wal(bucket_column="id", num_buckets=4)
df = spark.range(0, 200_000, numPartitions=4).selectExpr("id", "repeat('x', 20) as v")
stats = memwal_write.write(df, uri).toArrow()  # auto: driver chosen, collect refused, tasks write
print("PARTITIONS", sorted(set(stats.column("task_partition").to_pylist())))
spark.stop()
"""


@pytest.mark.slow
def test_auto_falls_back_to_tasks_past_max_result_size(tmp_path: Path) -> None:
    """A real ``spark.driver.maxResultSize`` refusal (its own Spark session, in a
    subprocess): ``via="auto"`` picked the driver, the collect failed, the tasks wrote
    every row."""
    uri = str(tmp_path / "t")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, uri], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "PARTITIONS [0, 1, 2, 3]" in out.stdout
    got = mq.open_table(uri).to_arrow()
    assert got.num_rows == 200_000
    assert sorted(got.column("id").to_pylist()) == list(range(200_000))


@pytest.mark.parametrize("via", ["tasks", "driver"])
def test_spark_writes_to_a_missing_table_name_the_path(spark: Any, tmp_path: Path, via: str) -> None:
    missing = str(tmp_path / "no" / "table")
    df = spark.createDataFrame([(1, "a", 1.0)], "id long, cat string, amount double")
    for call in (
        lambda: memwal_write.write(df, missing, via=via),
        lambda: memwal_write.delete(df.select("id"), missing, via=via),
        lambda: memwal_write.merge_generations_spark(spark, missing),
    ):
        with pytest.raises(TableNotFoundError, match=f"no Lance table at {missing}") as err:
            call()
        assert "\n" not in str(err.value) and ".rs:" not in str(err.value)


@pytest.mark.parametrize("via", ["tasks", "driver"])
def test_a_spec_spark_cannot_hash_is_routed_in_python(spark: Any, tmp_path: Path, via: str) -> None:
    """A bucket over a uint32 key has no Spark expression: rows are routed by a Python pass
    (``mapInArrow``), whose output schema was added to ``df.schema`` in place (PySpark keeps
    it): ``via="tasks"`` then failed, ``UNRESOLVED_COLUMN __memwal_pkey``."""
    from lsm_model import ModelTable

    schema = pa.schema([pa.field("k", pa.uint32(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    base = pa.table({"k": pa.array([1, 2], pa.uint32()), "v": [0, 0]}, schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("k", 7))
    df = spark.createDataFrame([(i, i * 10) for i in range(1, 40)], "k long, v long")
    memwal_write.write(df, t.uri, via=via)
    table = mq.open_table(t.uri)
    assert sort_table(table.to_arrow(), ["k"]).to_pylist() == [{"k": i, "v": i * 10} for i in range(1, 40)]
    assert all(v is not None and not v.outside for v in table.region_values().values())  # routed by the spec
