"""The ``memwal`` Spark data source: batch read / write and Structured Streaming, against a dict model."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq
import memwal_write
from memwal_query.errors import InvalidArgumentError
from memwal_write import write_arrow

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
    cats = [None if i % 11 == 0 else f"c{i % 5}" for i in ids]
    return pa.table({"id": ids, "cat": cats, "amount": ids.astype(np.float64) + tag}, schema=SCHEMA)


def _table(path: Path, base_rows: int = 900) -> tuple[str, Model]:
    uri = str(path / "t")
    base = _rows(range(base_rows), 0.0)
    lance.write_dataset(base, uri, max_rows_per_file=300).initialize_mem_wal(
        bucket_column="id", num_buckets=4, max_memtable_rows=300
    )
    m = Model()
    m.put(base)
    return uri, m


def _levels_of(uri: str, keys: list[int]) -> list[str]:
    """Every stored version of ``keys`` in the newer levels (to diagnose a wrong merge)."""
    t = mq.open_table(uri)
    out = []
    for r in t.snapshot.regions:
        for g in r.generations:
            rows = g.dataset.to_table(filter=pc.field("id").isin(keys), with_row_address=True).to_pylist()
            out += [f"region {r.region_id[:8]} generation {g.generation}: {row}" for row in rows]
        if r.memtable is not None:
            m = r.memtable.table
            rows = m.filter(pc.is_in(m.column("id"), pa.array(keys, pa.int64()))).to_pylist()
            out += [f"region {r.region_id[:8]} memtable ({r.memtable.origin}): {row}" for row in rows]
    return out


def _assert_equals_model(uri: str, model: Any) -> None:
    got, want = _sorted(mq.open_table(uri).to_arrow()), model.table()
    if got.equals(want):
        return
    g = dict(zip(got.column("id").to_pylist(), got.to_pylist(), strict=True))
    w = dict(zip(want.column("id").to_pylist(), want.to_pylist(), strict=True))
    wrong = sorted(k for k in g.keys() | w.keys() if g.get(k) != w.get(k))[:5]
    detail = [f"{k}: memwal {g.get(k)} model {w.get(k)}" for k in wrong] + _levels_of(uri, wrong)
    pytest.fail("merged table differs from the model:\n" + "\n".join(detail))


def _sorted(t: pa.Table) -> pa.Table:
    return sort_table(t.select(SCHEMA.names).cast(SCHEMA), ["id"])


@pytest.fixture(scope="module")
def registered(spark: Any) -> Any:
    memwal_write.register_data_source(spark)
    return spark


def _layered(tmp_path: Path) -> tuple[str, Model]:
    """A table with a base, flushed generations and an unflushed WAL tail (updates and deletes)."""
    uri, model = _table(tmp_path)
    rng = np.random.default_rng(5)
    for step in range(3):
        ups = _rows(rng.choice(1400, 250, replace=False), float(step + 1))
        dels = [int(i) for i in rng.choice(1400, 40, replace=False)]
        write_arrow(uri, ups, deletes=pa.table({"id": pa.array(dels, pa.int64())}))
        model.put(ups)
        model.delete(dels)
    return uri, model


def test_batch_read_equals_model_with_filters(registered: Any, tmp_path: Path) -> None:
    spark = registered
    uri, model = _layered(tmp_path)
    df = spark.read.format("memwal").load(uri)
    assert df.rdd.getNumPartitions() >= 4  # one per region (the base shared out among them)
    assert _sorted(df.toArrow()).equals(model.table())
    assert _sorted(mq.open_table(uri).to_arrow()).equals(model.table())
    want = model.table()
    cases = {
        "id < 300 AND amount >= 100": pc.and_(pc.less(want["id"], 300), pc.greater_equal(want["amount"], 100)),
        "id = 17 OR id = 1203": pc.is_in(want["id"], pa.array([17, 1203], pa.int64())),
        "id IN (3, 5, 700, 1399)": pc.is_in(want["id"], pa.array([3, 5, 700, 1399], pa.int64())),
        "cat IS NULL": pc.is_null(want["cat"]),
        "NOT (cat = 'c1') AND cat IS NOT NULL": pc.and_(pc.is_valid(want["cat"]), pc.not_equal(want["cat"], "c1")),
        "cat LIKE 'c2%' AND id > 1000": pc.and_(pc.equal(want["cat"], "c2"), pc.greater(want["id"], 1000)),
    }
    for where, mask in cases.items():
        for push in ("true", "false"):
            read = spark.read.format("memwal").option("consistency", "strong").option("pushFilters", push)
            got = _sorted(read.load(uri).where(where).toArrow())
            assert got.equals(want.filter(mask)), (where, push)
    # One DataFrame, several queries: Spark 4.3 reused a query's pushed filters in the next
    # query that pushed none (pushing is opt-in for that reason).
    reused = spark.read.format("memwal").load(uri)
    assert reused.where("id = 17").count() == int(pc.sum(pc.equal(want["id"], 17)).as_py() or 0)
    assert reused.count() == want.num_rows and reused.toArrow().num_rows == want.num_rows
    # eventual: flushed generations only, the same rows pylance's flushed data gives
    eventual = spark.read.format("memwal").option("consistency", "eventual").load(uri).toArrow()
    assert _sorted(eventual).equals(_sorted(mq.open_table(uri, consistency="eventual").to_arrow()))


def test_pushed_filters_prune_regions(registered: Any, tmp_path: Path) -> None:
    from memwal_write.spark_source import MemwalReader

    uri, _ = _layered(tmp_path)
    from pyspark.sql.datasource import EqualTo, StringStartsWith

    schema = registered.read.format("memwal").load(uri).schema
    kept = MemwalReader({"path": uri}, schema).pushFilters([EqualTo(("id",), 17)])
    assert [type(f).__name__ for f in kept] == ["EqualTo"]  # not pushed unless asked
    reader = MemwalReader({"path": uri, "pushFilters": "true"}, schema)
    left = list(reader.pushFilters([EqualTo(("id",), 17), StringStartsWith(("cat",), "c")]))
    assert [type(f).__name__ for f in left] == ["StringStartsWith"]  # Spark keeps the one not pushed
    one = reader.partitions()
    everything = MemwalReader({"path": uri}, schema).partitions()
    assert len(one) < len(everything)
    rows = [r for p in one for b in reader.read(p) for r in b.to_pylist()]
    assert [r["id"] for r in rows] == [17]


def test_batch_write_upsert_dedupe_delete(registered: Any, tmp_path: Path) -> None:
    spark = registered
    uri, model = _table(tmp_path)
    rng = np.random.default_rng(9)
    ids = rng.choice(1500, 400, replace=False)
    first = _rows(ids, 1.0).append_column("ts", pa.array(np.full(400, 1), pa.int64()))
    newer = _rows(ids[:150], 2.0).append_column("ts", pa.array(np.full(150, 2), pa.int64()))
    both = pa.concat_tables([newer, first])  # the older version comes later: order_by decides
    spark.createDataFrame(both).repartition(3).write.format("memwal").mode("append").option("order_by", "ts").save(uri)
    model.put(first)
    model.put(newer)
    assert _sorted(mq.open_table(uri).to_arrow()).equals(model.table())
    dels = [int(i) for i in rng.choice(1500, 120, replace=False)]
    keys = spark.createDataFrame(pa.table({"id": pa.array(dels + dels[:10], pa.int64())})).repartition(2)
    keys.write.format("memwal").mode("append").option("operation", "delete").save(uri)
    model.delete(dels)
    assert _sorted(mq.open_table(uri).to_arrow()).equals(model.table())
    with pytest.raises(Exception, match="overwrite"):
        spark.createDataFrame(first.drop(["ts"])).write.format("memwal").mode("overwrite").save(uri)
    ambiguous = pa.concat_tables([_rows([5], 1.0), _rows([5], 2.0)])
    with pytest.raises(Exception, match="(?i)ambiguous|duplicate"):
        spark.createDataFrame(ambiguous).write.format("memwal").mode("append").save(uri)
    assert _sorted(mq.open_table(uri).to_arrow()).equals(model.table())  # nothing of it written


def _changes_file(path: Path, i: int, ups: pa.Table, dels: list[int]) -> None:
    change = pa.array(["upsert"] * ups.num_rows + ["delete"] * len(dels))
    keys = pa.table({"id": pa.array(dels, pa.int64()), "cat": pa.nulls(len(dels), pa.string())})
    keys = keys.append_column("amount", pa.nulls(len(dels), pa.float64()))
    t = pa.concat_tables([ups, keys.cast(SCHEMA)]).append_column("_change", change)
    import pyarrow.parquet as pq

    name = str(path / f"part-{i:03d}.parquet")
    pq.write_table(t, name)
    # Spark's file source takes files in modification-time order, ties in directory-listing
    # order (not by name): files written within one clock tick could be applied out of order
    os.utime(name, (1_700_000_000 + i, 1_700_000_000 + i))


def _run_sink(spark: Any, src: Path, uri: str, ckpt: Path, **opts: str) -> None:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("cat", StringType()),
            StructField("amount", DoubleType()),
            StructField("_change", StringType()),
        ]
    )
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    w = stream.writeStream.format("memwal").option("checkpointLocation", str(ckpt)).option("sink_id", "s1")
    for k, v in opts.items():
        w = w.option(k, v)
    q = w.start(uri)
    try:
        q.processAllAvailable()
    finally:
        q.stop()


@pytest.mark.slow
def test_stream_sink_restart_after_failure_equals_model(registered: Any, tmp_path: Path) -> None:
    spark = registered
    uri, model = _table(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    ckpt = tmp_path / "ckpt"
    rng = np.random.default_rng(13)
    for i in range(3):
        ups = _rows(rng.choice(1500, 200, replace=False), float(i + 1))
        dels = [int(k) for k in rng.choice(1500, 30, replace=False) if int(k) not in set(ups["id"].to_pylist())]
        _changes_file(src, i, ups, dels)
        model.put(ups)
        model.delete(dels)
    marker = tmp_path / "failed-once"
    with pytest.raises(Exception, match="injected failure"):
        _run_sink(spark, src, uri, ckpt, _fail_batch="1", _fail_marker=str(marker))
    assert marker.exists()
    assert memwal_write.committed_batches(uri, "s1") == [0]
    _run_sink(spark, src, uri, ckpt)  # restart from the checkpoint: batch 1 replayed whole
    assert memwal_write.committed_batches(uri, "s1") == [0, 1, 2]
    _assert_equals_model(uri, model)
    ups = _rows(rng.choice(1500, 100, replace=False), 9.0)
    _changes_file(src, 3, ups, [1, 2, 3])
    model.put(ups)
    model.delete([1, 2, 3])
    _run_sink(spark, src, uri, ckpt)
    assert memwal_write.committed_batches(uri, "s1") == [0, 1, 2, 3]
    _assert_equals_model(uri, model)


def _run_source(spark: Any, uri: str, ckpt: Path, seen: list[pa.Table], start: str | None = None) -> None:
    def collect(df: Any, batch_id: int) -> None:
        seen.append(df.toArrow())

    r = spark.readStream.format("memwal").option("readChangeFeed", "true")
    if start is not None:
        r = r.option("startingToken", start)
    q = r.load(uri).writeStream.option("checkpointLocation", str(ckpt)).foreachBatch(collect).start()
    try:
        q.processAllAvailable()
    finally:
        q.stop()


def _apply(state: dict[int, dict[str, Any]], changes: pa.Table) -> None:
    for r in changes.to_pylist():
        if r.pop("_change") == "delete":
            state.pop(r["id"], None)
        else:
            state[r["id"]] = r


@pytest.mark.slow
def test_stream_source_delivers_each_change_once(registered: Any, tmp_path: Path) -> None:
    spark = registered
    uri, model = _table(tmp_path)
    start = mq.open_table(uri)
    ckpt = tmp_path / "ckpt"
    seen: list[pa.Table] = []
    rng = np.random.default_rng(21)
    written: list[set[int]] = []
    for run in range(2):
        keys: set[int] = set()
        for step in range(2):
            ups = _rows(rng.choice(1500, 120, replace=False), float(10 * run + step))
            dels = [int(i) for i in rng.choice(1500, 25, replace=False)]
            write_arrow(uri, ups, deletes=pa.table({"id": pa.array(dels, pa.int64())}))
            model.put(ups)
            model.delete(dels)
            keys |= set(ups["id"].to_pylist()) | set(dels)
        written.append(keys)
        before = len(seen)
        _run_source(spark, uri, ckpt, seen, start=start.change_token)  # the option only counts the first time
        got = [k for t in seen[before:] for k in t["id"].to_pylist()]
        assert len(got) == len(set(got))  # each key once in this run
        assert set(got) == keys  # exactly the keys written since the last run (none again)
    state = {r["id"]: r for r in start.to_arrow().select(SCHEMA.names).to_pylist()}
    for t in seen:
        _apply(state, t)
    assert _sorted(pa.Table.from_pylist(list(state.values()), schema=SCHEMA)).equals(model.table())
    time.sleep(0)


def test_options_refused(registered: Any, tmp_path: Path) -> None:
    uri, _ = _table(tmp_path, base_rows=50)
    with pytest.raises(Exception, match="consistency"):
        registered.read.format("memwal").option("consistency", "sometimes").load(uri).collect()
    with pytest.raises(InvalidArgumentError, match="operation"):
        from memwal_write.spark_sink import SinkOptions

        SinkOptions.from_options({"path": uri, "operation": "merge"})


def test_stream_writer_skips_a_recorded_batch(tmp_path: Path) -> None:
    from memwal_write.spark_sink import to_ipc
    from memwal_write.spark_stream import MemwalStreamWriter, StagedRows

    uri, model = _table(tmp_path, base_rows=100)
    w = MemwalStreamWriter({"path": uri, "sink_id": "q"})
    first = _rows([1, 2, 500], 1.0)
    w.commit([StagedRows(to_ipc(first.to_batches())), StagedRows(None)], 0)
    model.put(first)
    # Spark replays batch 0 (it failed before its own commit log): already applied, skipped,
    # even if the replay's rows differed
    w.commit([StagedRows(to_ipc(_rows([1, 3], 7.0).to_batches()))], 0)
    assert memwal_write.committed_batches(uri, "q") == [0]
    assert memwal_write.committed_batches(uri, "other") == []
    assert _sorted(mq.open_table(uri).to_arrow()).equals(model.table())

    # Without sink_id each checkpoint location has its own record; one sink_id shared by two
    # checkpoints (two queries, or a restart on a new checkpoint) is an error, not a skip.
    a = MemwalStreamWriter({"path": uri, "checkpointLocation": "ckpt/a"})
    b = MemwalStreamWriter({"path": uri, "checkpointLocation": "ckpt/b"})
    a.commit([StagedRows(to_ipc(_rows([600], 2.0).to_batches()))], 0)
    b.commit([StagedRows(to_ipc(_rows([601], 3.0).to_batches()))], 0)
    model.put(_rows([600], 2.0))
    model.put(_rows([601], 3.0))
    assert _sorted(mq.open_table(uri).to_arrow()).equals(model.table())
    assert memwal_write.committed_batches(uri, memwal_write.sink_id_for("ckpt/b")) == [0]
    first = MemwalStreamWriter({"path": uri, "checkpointLocation": "ckpt/c", "sink_id": "s"})
    first.commit([StagedRows(to_ipc(_rows([602], 4.0).to_batches()))], 0)
    first.commit([StagedRows(to_ipc(_rows([602], 4.0).to_batches()))], 0)  # its own replay: skipped
    again = MemwalStreamWriter({"path": uri, "checkpointLocation": "ckpt/d", "sink_id": "s"})
    with pytest.raises(InvalidArgumentError, match="sink 's' applied batch 0 for the query checkpointed at 'ckpt/c'"):
        again.commit([StagedRows(to_ipc(_rows([603], 5.0).to_batches()))], 0)
    # Neither option (the checkpoint set for the session): two such queries shared the record
    # "default", and the second one's batch 0 was skipped as applied, its rows lost.
    refused = f"stream into {uri}: give the writer .option\\('checkpointLocation'"
    with pytest.raises(InvalidArgumentError, match=refused):
        MemwalStreamWriter({"path": uri})


def test_stream_source_batch_planned_before_a_merge_and_cleanup(tmp_path: Path) -> None:
    """``latestOffset`` opened a snapshot, a merger merged and garbage-collected its generations,
    then ``partitions`` read the changes from that snapshot: pyarrow's "Not found" stopped the
    query. The batch is computed from the table as it is now (as a replayed batch is)."""
    import shutil

    from memwal_write import merge_generations
    from memwal_write.spark_source import MemwalDataSource
    from memwal_write.spark_stream import MemwalStreamReader

    uri, model = _table(tmp_path, base_rows=100)
    options = {"path": uri, "readChangeFeed": "true", "startingToken": mq.open_table(uri).change_token}
    reader = MemwalStreamReader(options, MemwalDataSource(options).schema())
    start = reader.initialOffset()
    ups = _rows(range(50, 3000), 1.0)
    write_arrow(uri, ups, deletes=pa.table({"id": pa.array([0, 1], pa.int64())}))
    model.put(ups)
    model.delete([0, 1])
    end = reader.latestOffset(start)
    merge_generations(uri)
    for r in mq.open_table(uri).snapshot.regions:
        for _, path in latest_generations(uri, r.region_id):
            shutil.rmtree(Path(uri, "_mem_wal", r.region_id, path))
    rows = [row for p in reader.partitions(start, end) for b in reader.read(p) for row in b.to_pylist()]
    state = {r["id"]: r for r in _rows(range(100), 0.0).to_pylist()}
    _apply(state, pa.Table.from_pylist(rows))
    assert _sorted(pa.Table.from_pylist(list(state.values()), schema=SCHEMA)).equals(model.table())


def test_stream_source_without_a_starting_token_skips_nothing_across_a_restart(tmp_path: Path) -> None:
    """Spark records end offsets only and asks for the start offset again when it runs (or
    re-runs after a crash) the first batch: a "now" token taken then skipped what was written
    between the first ask and the first batch's end. The first batch starts the feed, empty."""
    from memwal_write.spark_source import MemwalDataSource
    from memwal_write.spark_stream import MemwalStreamReader

    uri, model = _table(tmp_path, base_rows=20)
    options = {"path": uri, "readChangeFeed": "true"}
    schema = MemwalDataSource(options).schema()
    first = MemwalStreamReader(options, schema)
    start = first.initialOffset()
    end0 = first.latestOffset(start)  # Spark writes offsets/0, then the driver dies
    at_end0 = {r["id"]: r for r in mq.open_table(uri).to_arrow().to_pylist()}
    ups = _rows(range(10, 40), 2.0)
    write_arrow(uri, ups, deletes=pa.table({"id": pa.array([0, 1], pa.int64())}))
    model.put(ups)
    model.delete([0, 1])
    again = MemwalStreamReader(options, schema)  # the restart re-runs batch 0 from the start asked again
    assert again.initialOffset() == start
    batch0 = [
        row for p in again.partitions(again.initialOffset(), end0) for b in again.read(p) for row in b.to_pylist()
    ]
    end1 = again.latestOffset(end0)
    batch1 = [row for p in again.partitions(end0, end1) for b in again.read(p) for row in b.to_pylist()]
    assert batch0 == [] and batch1
    _apply(at_end0, pa.Table.from_pylist(batch1))
    assert _sorted(pa.Table.from_pylist(list(at_end0.values()), schema=SCHEMA)).equals(model.table())


def latest_generations(uri: str, region_id: str) -> list[tuple[int, str]]:
    from memwal_query.format.storage import Storage
    from memwal_query.snapshot import latest_region_manifest

    m = latest_region_manifest(Storage.open(uri), region_id)
    return sorted((g.generation, g.path) for g in m.flushed_generations) if m else []


def test_a_long_pushed_in_list_is_one_is_in(tmp_path: Path) -> None:
    """Spark pushes ``IN`` at any length; it became a chain of ORs, which Lance serialises
    for every fragment scan in time and memory growing 4x per value (20 values: 5 s, 200 MB;
    25 held two workers at 3.7 GB each). One ``is_in`` now, with SQL's NULL answer under NOT."""
    from pyspark.sql.datasource import In, IsNotNull, Not

    from memwal_write.spark_source import MemwalDataSource, MemwalReader

    uri, model = _layered(tmp_path)
    write_arrow(uri, pa.table({"id": [5000, 5001], "cat": [None, "z"], "amount": [1.0, None]}, schema=SCHEMA))
    model.put(pa.table({"id": [5000, 5001], "cat": [None, "z"], "amount": [1.0, None]}, schema=SCHEMA))
    want = model.table()
    options = {"path": uri, "pushFilters": "true"}
    schema = MemwalDataSource(options).schema()
    ids = list(range(0, 1400, 7))  # 200 values
    cats = ["c1", "c3", "z"]
    cases = [
        (In(("id",), tuple(ids)), lambda r: r["id"] in ids),
        (Not(In(("id",), tuple(ids))), lambda r: r["id"] not in ids),
        (In(("cat",), tuple(cats)), lambda r: r["cat"] is not None and r["cat"] in cats),
        (Not(In(("cat",), tuple(cats))), lambda r: r["cat"] is not None and r["cat"] not in cats),  # NULL: dropped
    ]
    for pushed, keep in cases:
        reader = MemwalReader(options, schema)
        assert list(reader.pushFilters([pushed, IsNotNull(("amount",))])) == []  # both pushed
        assert "is_in" in str(reader._filter())
        got = [r["id"] for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
        expected = [r["id"] for r in want.to_pylist() if keep(r) and r["amount"] is not None]
        assert sorted(got) == sorted(expected) and expected, pushed


def test_a_batch_read_after_cleanup_tells_a_spark_user_to_load_again(tmp_path: Path) -> None:
    """A DataFrame's partitions were planned, then a merger merged and removed the generations
    they read: the error says to load the DataFrame again (a Spark user has no Table)."""
    import shutil

    from memwal_write import merge_generations
    from memwal_write.spark_source import MemwalDataSource, MemwalReader

    uri, _ = _layered(tmp_path)
    options = {"path": uri}
    reader = MemwalReader(options, MemwalDataSource(options).schema())
    parts = reader.partitions()
    regions = mq.open_table(uri).snapshot.regions
    merge_generations(uri)
    for r in regions:
        for _, path in latest_generations(uri, r.region_id):
            shutil.rmtree(Path(uri, "_mem_wal", r.region_id, path), ignore_errors=True)
    with pytest.raises(mq.MemWalError) as err:
        for p in parts:
            for _ in reader.read(p):
                pass
    assert "load the DataFrame again" in str(err.value) and "refresh()" not in str(err.value), err.value


def test_read_spark_after_cleanup_tells_a_spark_user_to_load_again(tmp_path: Path) -> None:
    """``read_spark``'s tasks scan the fragments the driver planned: the same words as the data source."""
    import shutil

    from memwal_query.spark_read import spark_scan
    from memwal_write import merge_generations

    uri, _ = _layered(tmp_path)
    table = mq.open_table(uri)
    frags = table.dataset().source_fragments()
    merge_generations(uri)
    for r in table.snapshot.regions:
        for _, path in latest_generations(uri, r.region_id):
            shutil.rmtree(Path(uri, "_mem_wal", r.region_id, path), ignore_errors=True)
    schema = pa.schema([table.snapshot.schema.field(c) for c in ("id", "amount")])
    with pytest.raises(mq.MemWalError) as err:
        list(spark_scan(frags, ["id", "amount"], None, schema))
    assert "load the DataFrame again" in str(err.value) and "refresh()" not in str(err.value), err.value


_NESTED = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("s", pa.struct([("a", pa.int64()), ("b", pa.string())])),
        pa.field("lst", pa.list_(pa.struct([("p", pa.int64())]))),
    ]
)


def _nested_table(tmp_path: Path) -> str:
    uri = str(tmp_path / "n")
    rows = [{"id": i, "s": {"a": i, "b": "x"}, "lst": [{"p": 10 * i}]} for i in range(6)]
    lance.write_dataset(pa.Table.from_pylist(rows, _NESTED), uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
    return uri


def _rename_children_and_write(uri: str) -> None:
    ds = lance.dataset(uri)
    ds.alter_columns({"path": "s.a", "name": "a2"}, {"path": "lst.item.p", "name": "p2"})
    rows = [
        {"id": 1, "s": {"a2": 100, "b": "y"}, "lst": [{"p2": 12}]},
        {"id": 7, "s": {"a2": 700, "b": "z"}, "lst": []},
    ]
    write_arrow(uri, pa.Table.from_pylist(rows, lance.dataset(uri).schema))


def _planned_stream(options: dict[str, str]) -> Any:
    """The stream reader Spark makes of a loaded stream (the source asked for its schema first)."""
    from memwal_write.spark_source import MemwalDataSource

    source = MemwalDataSource(options)
    return source.streamReader(source.schema())


def _planned_read(options: dict[str, str], schema: Any = None) -> Any:
    """The batch reader Spark makes of a loaded DataFrame (``schema``: one the user gave)."""
    from memwal_write.spark_source import MemwalDataSource

    source = MemwalDataSource(options)
    return source.reader(source.schema() if schema is None else schema)


def test_a_stream_across_a_nested_rename_fails_the_batch_and_a_restart_delivers_it(tmp_path: Path) -> None:
    """A struct child and a list item's child renamed under a running change-feed stream:
    the batch was cast by name to the schema the stream started with and delivered their
    values as NULL (Spark then committed it: the values were lost for the stream)."""

    uri = _nested_table(tmp_path)
    options = {"path": uri, "readChangeFeed": "true", "startingToken": mq.open_table(uri).change_token}
    running = _planned_stream(options)
    start = running.initialOffset()
    _rename_children_and_write(uri)
    end = running.latestOffset(start)
    with pytest.raises(mq.SchemaChangedError, match=r"column 's' is struct<a2:bigint,b:string> now.*restart the query"):
        running.partitions(start, end)
    restarted = _planned_stream(options)  # the same offsets, replanned
    rows = [r for p in restarted.partitions(start, end) for b in restarted.read(p) for r in b.to_pylist()]
    assert sorted((r["id"], r["s"]["a2"], [x["p2"] for x in r["lst"]]) for r in rows) == [(1, 100, [12]), (7, 700, [])]
    lance.dataset(uri).add_columns(pa.field("extra", pa.int64()))  # a column added under the stream: refused too
    later = restarted.latestOffset(end)
    with pytest.raises(mq.SchemaChangedError, match="column 'extra' was added"):
        restarted.partitions(end, later)


def test_a_dataframe_loaded_before_a_nested_rename_says_to_load_it_again(tmp_path: Path) -> None:
    """Spark plans a read again for a new query of a DataFrame (a filter), with the schema it
    was loaded with: the renamed children read as NULL, in every row."""

    uri = _nested_table(tmp_path)
    options = {"path": uri}
    loaded = _planned_read(options)
    _rename_children_and_write(uri)
    with pytest.raises(mq.SchemaChangedError, match=r"since the DataFrame was loaded \(column 's' is struct<a2"):
        loaded.partitions()
    again = _planned_read(options)
    rows = [r for p in again.partitions() for b in again.read(p) for r in b.to_pylist()]
    assert sorted((r["id"], r["s"]["a2"]) for r in rows) == [(i, 100 if i == 1 else i) for i in range(6)] + [(7, 700)]
    # a column added since: a DataFrame loaded before reads the columns it was loaded with
    lance.dataset(uri).add_columns(pa.field("extra", pa.int64()))
    before = _planned_read(options)
    lance.dataset(uri).add_columns(pa.field("more", pa.string()))
    assert sum(b.num_rows for p in before.partitions() for b in before.read(p)) == 7


def test_a_spark_query_of_a_dataframe_loaded_before_a_rename_fails_clearly(registered: Any, tmp_path: Path) -> None:
    uri = _nested_table(tmp_path)
    df = registered.read.format("memwal").load(uri)
    assert df.count() == 6
    _rename_children_and_write(uri)
    with pytest.raises(Exception, match=r"SchemaChangedError.*columns changed since the DataFrame was loaded"):
        df.where("id >= 0").collect()
    again = registered.read.format("memwal").load(uri).where("id = 1").collect()
    assert again[0]["s"]["a2"] == 100


def test_a_users_schema_is_cast_not_checked(tmp_path: Path) -> None:
    """A schema the user gives (``.schema("id long, x long")`` over an int column, ``timestamp``
    over a zoneless one) is Spark's to cast: the check of planned columns refused it as changed."""
    from pyspark.sql.types import LongType, StructField, StructType, TimestampType

    uri = str(tmp_path / "u")
    schema = pa.schema(
        [pa.field("id", pa.int64(), False, metadata=PK), pa.field("x", pa.int32()), pa.field("ts", pa.timestamp("us"))]
    )
    rows = pa.table({"id": [1, 2], "x": [10, 20], "ts": [0, 1_000_000]}, schema=schema)
    lance.write_dataset(rows, uri).initialize_mem_wal(unsharded=True)
    mine = StructType([StructField("id", LongType()), StructField("x", LongType()), StructField("ts", TimestampType())])
    reader = _planned_read({"path": uri}, mine)
    got = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    assert sorted((r["id"], r["x"]) for r in got) == [(1, 10), (2, 20)]


def test_pushed_filters_leave_float_comparisons_to_spark(registered: Any, tmp_path: Path) -> None:
    """Spark takes every NaN for one value above every number; memwal's filters put a NaN with
    its sign bit set (``0/0`` on x86) below every number: with pushFilters=true, ``f > 5`` lost
    it and ``f < 0`` found it. Comparisons of float columns are not pushed."""
    import struct

    spark = registered
    negative_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
    schema = pa.schema([pa.field("id", pa.int64(), False, metadata=PK), pa.field("f", pa.float64())])
    uri = str(tmp_path / "t")
    rows = {"id": [1, 2, 3, 4], "f": [float("nan"), negative_nan, 10.0, None]}
    lance.write_dataset(pa.table(rows, schema=schema), uri).initialize_mem_wal(unsharded=True)
    plain = spark.createDataFrame(list(zip(rows["id"], rows["f"], strict=True)), "id long, f double")
    for where in ("f > 5", "f = 'NaN'", "f < 0", "NOT (f <= 5)", "f IN (10.0, 'NaN')", "f IS NULL AND id > 2"):
        want = sorted(r.id for r in plain.where(where).collect())
        for push in ("true", "false"):
            got = spark.read.format("memwal").option("pushFilters", push).load(uri).where(where).collect()
            assert sorted(r.id for r in got) == want, (where, push)
