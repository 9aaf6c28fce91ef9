"""The ``memwal`` Spark data source under Structured Streaming (part of ``bench_spark.py``).

* **Sink throughput**: a file stream of ``files`` Parquet files (one micro-batch each,
  keys drawn with a Zipf skew so batches update earlier keys) into
  ``writeStream.format("memwal")``, against the same stream into a plain Lance table
  (``foreachBatch``: ``toArrow`` + ``lance.write_dataset(mode="append")``, the anchor),
  interleaved in rounds; rows/s from query start until ``processAllAvailable`` returns.
* **Freshness**: while the memwal sink runs (one file per trigger), a poller thread opens
  the table (``consistency="strong"``) and looks up each batch's marker key over and
  over; a batch's freshness is the end of the first poll that saw its key minus the
  time the sink recorded the batch as committed (``_memwal_spark/<sink>/<batch>.json``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import memwal_query as mq
import memwal_write
from memwal_write.spark_sink import COMMIT_DIR

__all__ = ["stream_benchmarks"]

MARKER_BASE = 1 << 40  # marker keys, one per batch, outside the data's key range


def _files(root: str, files: int, rows: int, seed: int) -> str:
    src = Path(root) / f"stream-src-{seed}"
    src.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(files):
        ids = (rng.zipf(1.3, rows) % (files * rows)).astype(np.int64)
        ids[0] = MARKER_BASE + i
        t = pa.table(
            {
                "id": ids,
                "cat": [f"c{k % 13}" for k in ids.tolist()],
                "amount": rng.normal(100, 30, rows),
                "qty": rng.integers(0, 50, rows).astype(np.int32),
                "ts": np.full(rows, i, np.int64) * rows + np.arange(rows),
            }
        )
        pq.write_table(t, str(src / f"part-{i:04d}.parquet"))
    return str(src)


def _stream(spark: Any, src: str) -> Any:
    schema = "id long, cat string, amount double, qty int, ts long"
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(src)


def _memwal_sink(spark: Any, src: str, uri: str, ckpt: str) -> float:
    t0 = time.perf_counter()
    q = (
        _stream(spark, src)
        .writeStream.format("memwal")
        .option("order_by", "ts")
        .option("checkpointLocation", ckpt)
        .start(uri)
    )
    q.processAllAvailable()
    s = time.perf_counter() - t0
    q.stop()
    return s


def _plain_sink(spark: Any, src: str, uri: str, ckpt: str) -> float:
    def append(df: Any, batch_id: int) -> None:
        lance.write_dataset(df.drop("ts").toArrow(), uri, mode="append")

    t0 = time.perf_counter()
    q = _stream(spark, src).writeStream.option("checkpointLocation", ckpt).foreachBatch(append).start()
    q.processAllAvailable()
    s = time.perf_counter() - t0
    q.stop()
    return s


def _freshness(spark: Any, src: str, uri: str, ckpt: str, files: int) -> list[float]:
    seen: dict[int, float] = {}
    done = threading.Event()

    def poll() -> None:
        keys = [MARKER_BASE + i for i in range(files)]
        while not done.is_set() and len(seen) < files:
            rows = mq.open_table(uri, consistency="strong").lookup(keys)
            now = time.time()
            for k in rows.column("id").to_pylist():
                seen.setdefault(int(k) - MARKER_BASE, now)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    _memwal_sink(spark, src, uri, ckpt)
    t.join(timeout=30)
    done.set()
    lags = []
    for rec in sorted((Path(uri) / COMMIT_DIR / "default").glob("*.json")):
        body = json.loads(rec.read_text())
        batch = int(body["batch_id"])
        if batch in seen:
            lags.append(seen[batch] - float(body["committed_at"]))
    return lags


def _med(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def stream_benchmarks(spark: Any, root: str, new_table: Any, files: int, rows: int, repeat: int) -> dict[str, Any]:
    """Sink throughput against the plain-Lance anchor and freshness; a JSON-ready dict."""
    memwal_write.register_data_source(spark)
    total = files * rows
    runs: dict[str, list[float]] = {"memwal": [], "plain": []}
    for i in range(repeat):
        order = ["memwal", "plain"] if i % 2 == 0 else ["plain", "memwal"]
        for kind in order:
            src = _files(root, files, rows, seed=100 * i + len(runs[kind]) + (kind == "plain"))
            ckpt = f"{root}/ckpt-{kind}-{i}"
            if kind == "memwal":
                runs[kind].append(_memwal_sink(spark, src, new_table(f"sink{i}"), ckpt))
            else:
                runs[kind].append(_plain_sink(spark, src, f"{root}/plain-sink{i}", ckpt))
    ratios = [p / m for p, m in zip(runs["plain"], runs["memwal"], strict=True)]
    src = _files(root, files, rows, seed=7)
    lags = _freshness(spark, src, new_table("fresh"), f"{root}/ckpt-fresh", files)
    out = {
        "micro_batches": files,
        "rows_per_batch": rows,
        "sink_memwal_rows_per_s": round(total / _med(runs["memwal"])),
        "sink_plain_lance_rows_per_s": round(total / _med(runs["plain"])),
        "sink_memwal_vs_plain_lance": round(_med(ratios), 3),
        "sink_runs_s": {k: [round(x, 3) for x in v] for k, v in runs.items()},
        "freshness_s_median": round(_med(lags), 3) if lags else None,
        "freshness_s_max": round(max(lags), 3) if lags else None,
        "freshness_s_min": round(min(lags), 3) if lags else None,
        "freshness_batches_measured": len(lags),
    }
    for k, v in out.items():
        if k != "sink_runs_s":
            print(f"  stream {k:<36} {v}", flush=True)
    return out
