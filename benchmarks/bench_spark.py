"""Spark <-> MemWAL throughput on local Spark.

Measures, for ``--rows`` rows routed to ``--regions`` bucket regions:

* ``memwal_write.write``: Spark -> pylance MemWAL writers with ``via="tasks"``
  (repartition by region, sort + dedupe, combined puts), with ``via="driver"``
  (collect with ``toArrow``, dedupe in Arrow, regions written in parallel from the
  driver), and the default ``via="auto"`` (the driver path on a local master);
* the task path's shuffle alone: repartition by region + sort + the Arrow hand-off
  to Python workers, nothing written (the floor under ``via="tasks"``);
* ``applyInArrow``: Spark ``groupBy(bucket).applyInArrow`` handing each region's
  rows to ``memwal_write.write_arrow`` (no dedupe, one Arrow table per region);
* ``memwal_write.write_arrow`` of the rows already in memory: pylance's MemWAL writers
  alone (with routing, without Spark), the floor under any Spark -> MemWAL path;
* ``lance.write_dataset`` of the same rows: from Spark (``toArrow`` then a plain
  write, the limit for a Spark job) and already in memory (no Spark, no WAL);
* reads: ``memwal_write.read_spark`` (one region per task) vs the single-process
  ``memwal_query.open_table(uri).to_arrow()``;
* the ``memwal`` data source under Structured Streaming (``benchmarks/spark_stream_bench.py``):
  sink throughput against a plain-Lance ``foreachBatch`` sink, and freshness (a micro-batch's
  commit until a strong reader sees it). ``--only-stream`` runs just these and adds them to an
  existing results file (key ``streaming``).

The write paths and their anchor (``toArrow`` + ``lance.write_dataset``) run in rounds,
one of each per round in a rotating order, with the files of earlier runs written back
first (untimed); the 50% targets use the median of the per-round ratios.

Usage: ``python benchmarks/bench_spark.py --rows 2000000`` (writes
``benchmarks/results/spark.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import memwal_query as mq  # noqa: E402
import memwal_write  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("qty", pa.int32()),
    ]
)


def _spark(cores: int, regions: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("memwal-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(regions))
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def _source(spark: Any, rows: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(rows).select(
        F.col("id"),
        F.concat(F.lit("c"), (F.col("id") % 13).cast("string")).alias("cat"),
        (F.col("id") * 0.5).alias("amount"),
        (F.col("id") % 50).cast("int").alias("qty"),
    )


def _new_table(root: str, name: str, regions: int) -> str:
    uri = f"{root}/{name}"
    lance.write_dataset(SCHEMA.empty_table(), uri).initialize_mem_wal(bucket_column="id", num_buckets=regions)
    return uri


def _apply_in_arrow_write(spark: Any, df: Any, uri: str, regions: int) -> None:
    from pyspark.sql import functions as F

    from memwal_write.spark import bucket_column

    def write_group(table: pa.Table) -> pa.Table:
        stats = memwal_write.write_arrow(uri, table.drop_columns(["__b"]))
        return pa.table({"rows": [sum(stats.column("rows_put").to_pylist())]})

    out = (
        df.withColumn("__b", bucket_column(F.col("id"), regions)).groupBy("__b").applyInArrow(write_group, "rows long")
    )
    out.toArrow()


def _shuffle_only(spark: Any, df: Any, uri: str) -> None:
    """The task path's Spark side with the same plan (routing column, repartition by
    region, sort by key), each task only counting its Arrow rows."""
    from memwal_write.arrow_writer import RoutedWriter
    from memwal_write.spark_routing import PKEY
    from memwal_write.spark_routing import spark_routing as _spark_routing

    probe = RoutedWriter.open(uri)
    routed, routing = _spark_routing(df, probe.spec, probe._field_names, probe.dataset.schema, None)
    prepared = routed.repartition(routing.num_partitions, PKEY).sortWithinPartitions(PKEY, "id").drop(PKEY)

    def count(batches: Any) -> Any:
        yield pa.record_batch({"n": [sum(b.num_rows for b in batches)]})

    conf_key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    spark.conf.set(conf_key, str(probe.max_rows_per_put))  # as the write job sets it
    try:
        prepared.mapInArrow(count, "n long").toArrow()
    finally:
        spark.conf.unset(conf_key)


def _warm_up(spark: Any, cores: int) -> None:
    """Start the Python workers and import lance/memwal in them (the first Python job pays seconds)."""

    def load(batches: Any) -> Any:
        import memwal_write.spark  # noqa: F401

        yield pa.record_batch({"n": [sum(b.num_rows for b in batches)]})

    for _ in range(2):
        spark.range(0, 1000, numPartitions=cores * 4).mapInArrow(load, "n long").toArrow()


def _settle() -> None:
    """Write back the files earlier runs left dirty (untimed): a MemWAL write leaves
    several times the bytes of a plain write, and their write-back would slow the run
    after it, whichever that is."""
    os.sync()


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _streaming(spark: Any, root: str, args: Any) -> dict[str, Any]:
    from spark_stream_bench import stream_benchmarks

    def new_table(name: str) -> str:
        return _new_table(root, f"stream-{name}", args.regions)

    print(f"streaming: {args.stream_files} micro-batches of {args.stream_rows:,} rows, {args.regions} regions")
    return stream_benchmarks(spark, root, new_table, args.stream_files, args.stream_rows, args.repeat)


def _only_stream(spark: Any, root: str, args: Any) -> int:
    """``--only-stream``: the streaming measures, added to the results file as ``streaming``."""
    _warm_up(spark, args.cores)
    streaming = _streaming(spark, root, args)
    spark.stop()
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"targets": []}
    report["streaming"] = {
        "master": f"local[{args.cores}]",
        "regions": args.regions,
        "repeat": args.repeat,
        **streaming,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--regions", type=int, default=8)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="runs per measurement (the median is reported)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "spark.json"))
    p.add_argument("--stream-files", type=int, default=20, help="micro-batches of the streaming measures")
    p.add_argument("--stream-rows", type=int, default=50_000, help="rows per micro-batch")
    p.add_argument("--only-stream", action="store_true", help="only the streaming measures, added to --out")
    args = p.parse_args(argv)
    spark = _spark(args.cores, args.regions)
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="memwal-bench-spark-") as root:
        return _measure(spark, root, args)


def _measure(spark: Any, root: str, args: argparse.Namespace) -> int:
    """Every measurement, tables under ``root``; writes ``--out``."""
    if args.only_stream:
        return _only_stream(spark, root, args)
    rows, results = args.rows, {}
    counter = iter(range(1_000_000))

    def record(name: str, runs: list[float], label: str | None = None) -> None:
        """Store the median of ``runs`` under ``name`` and print it."""
        s = _median(runs)
        results[name] = {"seconds": round(s, 3), "rows_per_s": round(rows / s), "runs_s": [round(r, 3) for r in runs]}
        print(f"  {label or name:<40} {s:8.2f} s  {rows / s:>12,.0f} rows/s", flush=True)

    def timed(name: str, fn: Any, setup: Any = None) -> Any:
        """Median of ``--repeat`` runs; ``setup()`` (untimed) gives each run its argument."""
        runs, out = [], None
        for _ in range(args.repeat):
            arg = setup() if setup is not None else None
            _settle()
            t0 = time.perf_counter()
            out = fn(arg) if setup is not None else fn()
            runs.append(time.perf_counter() - t0)
        record(name, runs)
        return out

    per_round: dict[str, list[float]] = {}

    def rounds(cases: list[tuple[str, Any, Any]]) -> dict[str, Any]:
        """``--repeat`` rounds of every case (name, fn, setup), the order rotated each
        round; the first case is the anchor: per-round ratios anchor time / case time go
        to ``per_round``. Returns each case's last ``setup()`` value."""
        runs: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        out: dict[str, Any] = {}
        for i in range(args.repeat):
            for name, fn, setup in cases[i % len(cases) :] + cases[: i % len(cases)]:
                arg = setup()
                _settle()
                t0 = time.perf_counter()
                fn(arg)
                runs[name].append(time.perf_counter() - t0)
                out[name] = arg
        anchor = runs[cases[0][0]]
        for name, _, _ in cases:
            record(name, runs[name])
            per_round[name] = [a / r for a, r in zip(anchor, runs[name], strict=True)]
        return out

    def fresh(kind: str) -> Any:
        return lambda: _new_table(root, f"{kind}{next(counter)}", args.regions)

    _warm_up(spark, args.cores)
    print(f"{rows:,} rows, {args.regions} bucket regions, local[{args.cores}], median of {args.repeat}")
    # JIT-warm the source plan once (the first Spark job over a new plan shape pays seconds)
    _source(spark, rows).toArrow()
    # The write paths and their anchor run in rounds, one of each per round in a rotating
    # order, so drift of this machine's speed hits all alike; the targets use the median
    # of the per-round ratios to the anchor.
    plain_name = "spark -> toArrow + lance.write_dataset"
    paired = rounds(
        [
            (
                plain_name,
                lambda d: lance.write_dataset(_source(spark, rows).toArrow().cast(SCHEMA), d),
                lambda: f"{root}/plain-spark{next(counter)}",
            ),
            (
                "spark -> memwal_write.write() (auto)",
                lambda u: memwal_write.write(_source(spark, rows), u),
                fresh("auto"),
            ),
            (
                "spark -> memwal_write.write(via='driver')",
                lambda u: memwal_write.write(_source(spark, rows), u, via="driver"),
                fresh("driver"),
            ),
            (
                "spark -> memwal_write.write(via='tasks')",
                lambda u: memwal_write.write(_source(spark, rows), u, via="tasks"),
                fresh("memwal"),
            ),
        ]
    )
    uri = paired["spark -> memwal_write.write(via='tasks')"]
    timed(
        "spark -> shuffle by region, no write",
        lambda u: _shuffle_only(spark, _source(spark, rows), u),
        fresh("shuffle"),
    )
    timed(
        "spark -> applyInArrow(write_arrow)",
        lambda u: _apply_in_arrow_write(spark, _source(spark, rows), u, args.regions),
        fresh("apply"),
    )
    data = timed("spark -> toArrow (collect only)", lambda: _source(spark, rows).toArrow())
    data = data.cast(SCHEMA)
    timed(
        "lance.write_dataset (in memory)",
        lambda d: lance.write_dataset(data, d),
        lambda: f"{root}/plain{next(counter)}",
    )
    # the writer alone: pylance's MemWAL writers fed from memory (routing included, no
    # Spark): what any Spark -> MemWAL path pays on top of collecting the rows
    timed("memwal_write.write_arrow (in memory)", lambda u: memwal_write.write_arrow(u, data), fresh("arrow"))
    single = timed("read: single process to_arrow", lambda: mq.open_table(uri).to_arrow())
    got = timed("read: read_spark (region tasks)", lambda: memwal_write.read_spark(spark, uri).toArrow())
    assert got.num_rows == single.num_rows == rows, (got.num_rows, single.num_rows)
    # one run: it merges everything, a second would find nothing left
    t0 = time.perf_counter()
    merged = memwal_write.merge_generations_spark(spark, uri).toArrow()
    s = time.perf_counter() - t0
    statuses = sorted(set(merged.column("status").to_pylist()))
    upserted = sum(merged.column("rows_upserted").to_pylist())
    print(f"  merge: {merged.num_rows} generations ({', '.join(statuses)}), {upserted:,} rows upserted", flush=True)
    assert upserted >= rows, (upserted, rows, statuses)
    record("merge_generations_spark", [s], "merge_generations_spark (one run)")
    single = timed("read merged: single process", lambda: mq.open_table(uri).to_arrow())
    got = timed("read merged: read_spark", lambda: memwal_write.read_spark(spark, uri).toArrow())
    assert got.num_rows == single.num_rows == rows, (got.num_rows, single.num_rows)
    streaming = _streaming(spark, root, args)
    spark.stop()
    r = results
    plain = r["spark -> toArrow + lance.write_dataset"]
    paths = {
        "write": "spark -> memwal_write.write() (auto)",
        "write_tasks": "spark -> memwal_write.write(via='tasks')",
        "write_driver": "spark -> memwal_write.write(via='driver')",
    }
    ratios: dict[str, Any] = {}
    for key, name in paths.items():
        ratios[f"{key}_rows_per_s"] = r[name]["rows_per_s"]
        # median of the per-round ratios (each round timed the anchor and this path together)
        ratios[f"{key}_vs_spark_plain_lance_write"] = round(_median(per_round[name]), 3)
    ratios.update(
        {
            "write_vs_in_memory_lance_write": round(
                ratios["write_rows_per_s"] / r["lance.write_dataset (in memory)"]["rows_per_s"], 3
            ),
            # the Spark side of the task path alone (no writer): its best possible ratio
            "shuffle_only_vs_spark_plain_lance_write": round(
                plain["seconds"] / r["spark -> shuffle by region, no write"]["seconds"], 3
            ),
            # best case for a collect-then-write path: collect + in-memory MemWAL write, no other work
            "collect_plus_memwal_write_vs_spark_plain_lance_write": round(
                plain["seconds"]
                / (
                    r["spark -> toArrow (collect only)"]["seconds"]
                    + r["memwal_write.write_arrow (in memory)"]["seconds"]
                ),
                3,
            ),
            "write_tasks_vs_applyInArrow": round(
                ratios["write_tasks_rows_per_s"] / r["spark -> applyInArrow(write_arrow)"]["rows_per_s"], 3
            ),
            "read_spark_vs_single_process": round(
                r["read: read_spark (region tasks)"]["seconds"] / r["read: single process to_arrow"]["seconds"], 3
            ),
        }
    )
    for k, v in ratios.items():
        print(f"  {k:<40} {v}")
    labels = {"write": "write (default: auto)", "write_tasks": "write via tasks", "write_driver": "write via driver"}
    targets = [
        {
            "target": f"{label}: >= 400,000 rows/s on local[{args.cores}]",
            "value": ratios[f"{key}_rows_per_s"],
            "limit": 400_000,
            "pass": ratios[f"{key}_rows_per_s"] >= 400_000,
        }
        for key, label in labels.items()
    ] + [
        {
            "target": f"{label}: >= 50% of Spark -> plain lance.write_dataset",
            "value": ratios[f"{key}_vs_spark_plain_lance_write"],
            "limit": 0.5,
            "pass": ratios[f"{key}_vs_spark_plain_lance_write"] >= 0.5,
        }
        for key, label in labels.items()
    ]
    for t in targets:
        print(f"  {'PASS' if t['pass'] else 'MISS'}  {t['target']}: {t['value']}")
    report = {
        "rows": rows,
        "regions": args.regions,
        "master": f"local[{args.cores}]",
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pylance": lance.__version__,
        "results": results,
        "ratios": ratios,
        "targets": targets,
        "streaming": streaming,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
