"""Streaming benchmark: a full pass over the merged table against Lance over the base alone.

What it does
------------
1. Builds (or reuses, with ``--dir``) a MemWAL table with pylance's own writer: a base of
   ``--base-rows`` rows (``id``, ``category``, ``amount``; categories Zipf-skewed), bucket
   sharding on ``id`` over ``--regions`` regions, ``--rounds`` write rounds of
   ``--newer-rows`` upserts in all (skewed keys: most updates hit a hot range of ids, 30%
   are new ids) and deletes, each round flushed as one generation per region
   (``regions x rounds`` unmerged generations), and a live WAL tail of ``--tail-rows``
   rows (writers never closed). Building is not timed.
2. Runs every measurement in a fresh Python process (imports not timed), interleaved
   (``--repeat`` rounds, the order shuffled each round), and reports the median, the
   spread (min and max) and every run:

   * ``base``: ``lance.dataset(uri).to_batches()`` over the base alone (the limit);
   * ``reader``: ``memwal_query.open_table(uri).to_reader()``, every batch consumed;
   * ``sql``: ``Table.sql("SELECT * FROM t").execute_stream()``, every batch consumed;
   * ``spark``: ``memwal_write.read_spark(spark, uri)`` written to Spark's ``noop`` sink
     (at ``--spark-base-rows``, with its own ``base`` anchor at that size when it
     differs); Spark's session start is not timed, nor is its first batch (Spark hands
     no batch to the driver on a full pass).

   Each child reports the time to the first batch, the total time (both from before
   ``open_table`` / ``lance.dataset``), the rows and the sum of ``id`` (the merged
   paths must agree), and its peak RSS (``VmHWM`` of its own address space; Linux
   carries ``ru_maxrss`` over exec), its RSS after imports and, for the merged paths, the
   time ``open_table`` took (the snapshot and its merge).
3. A warm pass: in one process, after a first pass, the same path again (``to_reader``,
   ``SELECT *``) against ``to_batches()`` on the base in that process (median of
   ``--repeat``, interleaved).
4. Prints ratios and PASS/MISS against the targets and writes ``--out`` (JSON).

Run ``python benchmarks/bench_stream.py --base-rows 200000 --newer-rows 20000`` for a quick
run; the defaults (20M rows) build the table in about a minute and measure in a few.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PK = {"lance-schema:unenforced-primary-key": "true"}
TABLE_LAYOUT_VERSION = 1  # bump when build_table() changes what it writes
KINDS = ("base", "reader", "sql")
SPARK_KINDS = ("spark_base", "spark")
RATIO_LIMIT = 1.5  # a full pass within 1.5x of the base alone

# Writers of the live WAL tail: kept referenced and never closed (closing flushes).
_OPEN_WRITERS: list[Any] = []


# -- the table -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildParams:
    """Everything that determines the benchmark table."""

    base_rows: int
    regions: int
    rounds: int
    newer_rows: int
    tail_rows: int
    seed: int
    layout: int = TABLE_LAYOUT_VERSION

    @property
    def name(self) -> str:
        return (
            f"stream-b{self.base_rows}-r{self.regions}-g{self.rounds}-n{self.newer_rows}"
            f"-t{self.tail_rows}-s{self.seed}-v{self.layout}"
        )

    @property
    def max_memtable_rows(self) -> int:
        """Large enough that one write round is one generation per region."""
        per_region = self.newer_rows / self.rounds * 1.1 / self.regions
        return max(10_000, int(per_region * 1.5))


def table_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("category", pa.string()),
            pa.field("amount", pa.float64()),
        ]
    )


def make_rows(rng: Any, ids: Any) -> Any:
    """Rows for ``ids``: Zipf-skewed categories, log-normal amounts."""
    import numpy as np
    import pyarrow as pa

    n = len(ids)
    weights = 1.0 / np.arange(1, 41) ** 1.1
    cats = np.array([f"category-{i:02d}" for i in range(40)])
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "category": pa.array(cats[rng.choice(40, size=n, p=weights / weights.sum())]),
            "amount": pa.array(np.round(rng.lognormal(3.0, 1.2, n), 2)),
        },
        schema=table_schema(),
    )


def base_batches(p: BuildParams) -> Any:
    """The base rows as a reader (built chunk by chunk: 20M rows never sit in memory twice)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(p.seed)
    chunk = 1 << 20

    def gen() -> Any:
        for lo in range(0, p.base_rows, chunk):
            yield from make_rows(rng, np.arange(lo, min(lo + chunk, p.base_rows))).to_batches()

    return pa.RecordBatchReader.from_batches(table_schema(), gen())


def skewed_ids(rng: Any, n: int, high: int) -> Any:
    """``n`` distinct ids below ``high``, most of them in a hot range (power law on the id)."""
    import numpy as np

    got = np.empty(0, dtype=np.int64)
    while got.size < n:
        draw = (high * rng.random(2 * n) ** 3).astype(np.int64)
        got = np.unique(np.concatenate([got, draw]))
    return rng.permutation(got)[:n]


def write_round(ds: Any, p: BuildParams, upserts: Any, deletes: Any, *, close: bool) -> None:
    """Put ``upserts`` and delete ``deletes`` through one writer per region."""
    import numpy as np
    import pyarrow as pa
    from lance.mem_wal import evaluate_sharding_spec

    from memwal_query.demo import bucket_region_id

    spec = ds.mem_wal_index_details()["sharding_specs"][0]

    def route(t: Any) -> dict[int, Any]:
        batch = t.select(["id"]).combine_chunks().to_batches()[0]
        buckets = evaluate_sharding_spec(batch, spec, ds.lance_schema).column(0).to_numpy()
        return {int(b): t.filter(pa.array(buckets == b)) for b in np.unique(buckets)}

    writers = {
        b: ds.mem_wal_writer(bucket_region_id(b), max_memtable_rows=p.max_memtable_rows) for b in range(p.regions)
    }
    chunk = min(p.max_memtable_rows, 10_000)
    for b, part in route(upserts).items():
        for off in range(0, part.num_rows, chunk):
            writers[b].put(part.slice(off, chunk))
    if len(deletes):
        for b, part in route(pa.table({"id": pa.array(deletes, pa.int64())})).items():
            for off in range(0, part.num_rows, chunk):
                writers[b].delete(part.slice(off, chunk))
    if close:
        for w in writers.values():
            w.close()  # flush: one generation per region
    else:
        _OPEN_WRITERS.extend(writers.values())


def build_table(uri: str, p: BuildParams) -> dict[str, Any]:
    """Write the benchmark table at ``uri``."""
    import lance
    import numpy as np

    t0 = time.perf_counter()
    ds = lance.write_dataset(base_batches(p), uri)
    print(f"  base: {p.base_rows:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
    ds.initialize_mem_wal(bucket_column="id", num_buckets=p.regions, max_memtable_rows=p.max_memtable_rows)
    ds = lance.dataset(uri)
    rng = np.random.default_rng(p.seed + 1)
    next_id = p.base_rows
    per_round = max(1, p.newer_rows // p.rounds)
    for r in range(p.rounds):
        n_new = per_round * 3 // 10
        ids = np.concatenate([skewed_ids(rng, per_round - n_new, p.base_rows), np.arange(next_id, next_id + n_new)])
        next_id += n_new
        deletes = np.setdiff1d(skewed_ids(rng, max(1, per_round // 50), next_id), ids)
        write_round(ds, p, make_rows(rng, np.sort(ids)), deletes, close=True)
        print(f"  round {r + 1}: {len(ids):,} upserts, {deletes.size:,} deletes", flush=True)
    if p.tail_rows:
        ids = np.unique(np.concatenate([skewed_ids(rng, p.tail_rows, p.base_rows), [next_id]]))
        deletes = np.setdiff1d(skewed_ids(rng, max(1, p.tail_rows // 50), p.base_rows), ids)
        write_round(ds, p, make_rows(rng, ids), deletes, close=False)
        print(f"  WAL tail: {len(ids):,} upserts, {deletes.size:,} deletes (writers left open)", flush=True)
    return {"build_seconds": time.perf_counter() - t0}


def ensure_table(root: str, p: BuildParams) -> tuple[str, dict[str, Any], bool]:
    """The table for ``p`` under ``root``: reused when a complete build is there, else built."""
    folder = Path(root) / p.name
    uri = str(folder / "table")
    params_file = folder / "params.json"
    if params_file.exists():
        info = json.loads(params_file.read_text())
        if info.get("params") == dataclasses.asdict(p):
            return uri, info, True
    if folder.exists():
        shutil.rmtree(folder)  # an incomplete build of ours
    folder.mkdir(parents=True)
    print(f"building {uri} (not timed) ...", flush=True)
    # In a child process: the writers left open (the WAL tail) end with it, and this
    # process stays small.
    cmd = [sys.executable, __file__, "--build", uri, "--params", json.dumps(dataclasses.asdict(p))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(out, end="", flush=True)
    info = json.loads(out.strip().splitlines()[-1])
    info["params"] = dataclasses.asdict(p)
    params_file.write_text(json.dumps(info, indent=2))
    return uri, info, False


# -- one measurement (child process) ------------------------------------------------


def own_peak_rss_mb() -> float:
    """Peak RSS of this process image (``VmHWM``; ``ru_maxrss`` survives exec on Linux)."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 / 1024 if sys.platform == "darwin" else rss / 1024


def consume(batches: Any, t0: float) -> dict[str, Any]:
    """Read every batch; time to the first one and in all, rows and the sum of ``id``."""
    import pyarrow.compute as pc

    first = None
    rows = 0
    id_sum = 0
    for b in batches:
        if not hasattr(b, "num_rows"):
            b = b.to_pyarrow()  # DataFusion's RecordBatch wraps an Arrow one (zero-copy)
        if first is None:
            first = time.perf_counter() - t0
        rows += b.num_rows
        if b.num_rows:
            id_sum += pc.sum(b.column(0)).as_py()
    return {"first_batch_s": first, "total_s": time.perf_counter() - t0, "rows": rows, "id_sum": id_sum}


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return (
        SparkSession.builder.master("local[2]")
        .appName("memwal-bench-stream")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def spark_base(spark: Any, uri: str) -> Any:
    """The base alone through the same Spark path (one task per share of base fragments)."""
    import pickle

    import lance
    from pyspark.sql.pandas.types import from_arrow_schema

    ds = lance.dataset(uri)
    frags = ds.get_fragments()
    units = [frags[i::2] for i in range(2)]
    plans = [(i, bytearray(pickle.dumps([f.fragment_id for f in u]))) for i, u in enumerate(units) if u]

    def run(batches: Any) -> Any:
        for b in batches:
            for blob in b.column("plan").to_pylist():
                got = lance.dataset(uri)
                yield from got.scanner(fragments=[got.get_fragment(i) for i in pickle.loads(blob)]).to_batches()

    rdd = spark.sparkContext.parallelize(plans, len(plans))
    return spark.createDataFrame(rdd, "unit int, plan binary").mapInArrow(run, from_arrow_schema(ds.schema))


def child(kind: str, uri: str) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    import datafusion  # noqa: F401 - imported before timing
    import lance
    import pyarrow  # noqa: F401

    import memwal_query as mq
    from memwal_write import read_spark

    _ = mq.open_table  # memwal_query loads its modules on first use: not timed
    spark = spark_session() if kind in SPARK_KINDS else None
    if spark is not None:
        spark.range(10).count()  # the JVM and a Python worker up (not timed)
    after_imports = own_peak_rss_mb()
    t0 = time.perf_counter()
    if kind == "base":
        got = consume(lance.dataset(uri).to_batches(), t0)
    elif kind in ("reader", "sql"):
        table = mq.open_table(uri)
        opened = time.perf_counter() - t0
        stream = table.to_reader() if kind == "reader" else table.sql("SELECT * FROM t").execute_stream()
        got = {**consume(stream, t0), "open_s": opened}
    elif kind in SPARK_KINDS:
        df = read_spark(spark, uri) if kind == "spark" else spark_base(spark, uri)
        df.write.format("noop").mode("overwrite").save()
        got = {"first_batch_s": None, "total_s": time.perf_counter() - t0}
        got["rows"], got["id_sum"] = df.selectExpr("count(*)", "sum(id)").first()  # not timed
    else:
        raise SystemExit(f"unknown kind {kind}")
    got["peak_rss_mb"] = own_peak_rss_mb()  # before Spark's check, it ran in the JVM
    got["after_imports_mb"] = after_imports
    if spark is not None:
        spark.stop()
    return got


def warm_child(uri: str, repeat: int) -> dict[str, Any]:
    """Warm repeated passes in one process: each path after a first pass, interleaved."""
    import lance

    import memwal_query as mq

    table = mq.open_table(uri)
    base = lance.dataset(uri)
    fns = {
        "base": lambda: consume(base.to_batches(), time.perf_counter()),
        "reader": lambda: consume(table.to_reader(), time.perf_counter()),
        "sql": lambda: consume(table.sql("SELECT * FROM t").execute_stream(), time.perf_counter()),
    }
    for fn in fns.values():
        fn()  # warm-up
    runs: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    rng = random.Random(7)
    for _ in range(repeat):
        rng.shuffle(order)
        for k in order:
            runs[k].append(fns[k]()["total_s"])
    return {"runs_s": runs, "peak_rss_mb": own_peak_rss_mb()}


# -- the driver --------------------------------------------------------------------


def run_child(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for key in ("first_batch_s", "total_s", "open_s", "peak_rss_mb"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def measure(uris: dict[str, str], repeat: int) -> dict[str, dict[str, Any]]:
    """Every kind ``repeat`` times, each run a fresh process, in shuffled order per round."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in uris}
    order = list(uris)
    rng = random.Random(len(order))
    for i in range(repeat):
        rng.shuffle(order)
        for kind in order:
            got = run_child(["--child", kind, uris[kind]])
            print(
                f"  round {i + 1} {kind:>10}: total {got['total_s']:.2f} s, first batch "
                f"{got['first_batch_s'] if got['first_batch_s'] is None else round(got['first_batch_s'], 3)} s, "
                f"peak {got['peak_rss_mb']:,.0f} MB, {got['rows']:,} rows",
                flush=True,
            )
            runs[kind].append(got)
    return {k: summarize(v) for k, v in runs.items()}


def check_agree(results: dict[str, dict[str, Any]], kinds: tuple[str, ...]) -> None:
    """The merged paths return the same rows (count and sum of ids) in every run."""
    seen = {(r["rows"], r["id_sum"]) for k in kinds if k in results for r in results[k]["runs"]}
    if len(seen) > 1:
        raise AssertionError(f"merged paths disagree: {seen}")


def machine_info() -> dict[str, Any]:
    def version(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    return {
        "git_commit": commit,
        "cpu_count": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("pylance", "datafusion", "pyarrow", "pyspark")},
    }


def evaluate(
    results: dict[str, dict[str, Any]], warm: dict[str, Any] | None, cache_budget_mb: float, same_size: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    ratios: dict[str, Any] = {}
    targets: list[dict[str, Any]] = []

    def med(kind: str, key: str) -> float:
        return float(results[kind][key]["median"])

    pairs = [(k, "base") for k in ("reader", "sql") if k in results]
    pairs += [("spark", "spark_base")] if "spark" in results else []
    for kind, anchor in pairs:
        r = med(kind, "total_s") / med(anchor, "total_s")
        ratios[f"{kind}_total_vs_{anchor}"] = r
        targets.append({"target": f"{kind} full pass <= {RATIO_LIMIT}x {anchor}", "value": r, "limit": RATIO_LIMIT})
        limit_mb = med(anchor, "peak_rss_mb") + cache_budget_mb
        targets.append(
            {
                "target": f"{kind} peak RSS <= {anchor}'s + the column cache budget ({cache_budget_mb:.0f} MB)",
                "value": med(kind, "peak_rss_mb"),
                "limit": limit_mb,
            }
        )
        ratios[f"{kind}_peak_rss_vs_{anchor}"] = med(kind, "peak_rss_mb") / med(anchor, "peak_rss_mb")
        if results[kind].get("open_s"):  # where the time goes: the open (snapshot + merge) and the pass
            after = statistics.median(r["total_s"] - r["open_s"] for r in results[kind]["runs"])
            ratios[f"{kind}_after_open_vs_{anchor}"] = after / med(anchor, "total_s")
        if results[kind].get("first_batch_s"):
            ratios[f"{kind}_first_batch_s_minus_{anchor}"] = med(kind, "first_batch_s") - med(anchor, "first_batch_s")
    if warm is not None:
        base = statistics.median(warm["runs_s"]["base"])
        for kind in ("reader", "sql"):
            r = statistics.median(warm["runs_s"][kind]) / base
            ratios[f"warm_{kind}_vs_base"] = r
            targets.append(
                {"target": f"warm {kind} <= {RATIO_LIMIT}x base (same process)", "value": r, "limit": RATIO_LIMIT}
            )
    if same_size and "spark" in results:
        ratios["spark_total_vs_base"] = med("spark", "total_s") / med("base", "total_s")
    for t in targets:
        t["pass"] = t["value"] <= t["limit"]
    return ratios, targets


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-rows", type=int, default=20_000_000)
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="flushed generations per region")
    p.add_argument("--newer-rows", type=int, default=150_000, help="upserts over all flushed generations")
    p.add_argument("--tail-rows", type=int, default=5_000, help="rows in the live WAL tail")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--spark-base-rows", type=int, help="base rows of the Spark measurement (default: --base-rows)")
    p.add_argument("--skip-spark", action="store_true")
    p.add_argument("--skip-warm", action="store_true")
    p.add_argument("--dir", help="keep (and reuse) the tables here; default: a temp dir removed afterwards")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "stream.json"))
    p.add_argument("--child", nargs=2, metavar=("KIND", "URI"), help=argparse.SUPPRESS)
    p.add_argument("--warm-child", help=argparse.SUPPRESS)
    p.add_argument("--build", help=argparse.SUPPRESS)
    p.add_argument("--params", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run(args: argparse.Namespace, root: str) -> dict[str, Any]:
    from memwal_query.scan.column_cache import RESIDENT_MAX_BYTES

    params = BuildParams(args.base_rows, args.regions, args.rounds, args.newer_rows, args.tail_rows, args.seed)
    uri, info, reused = ensure_table(root, params)
    print(f"table {uri} ({'reused' if reused else 'built'})", flush=True)
    uris = {k: uri for k in KINDS}
    spark_params = None
    if not args.skip_spark:
        spark_rows = args.spark_base_rows or args.base_rows
        spark_params = dataclasses.replace(params, base_rows=spark_rows)
        spark_uri = uri if spark_rows == args.base_rows else ensure_table(root, spark_params)[0]
        uris.update({k: spark_uri for k in SPARK_KINDS})
    results = measure(uris, args.repeat)
    check_agree(results, ("reader", "sql") + (("spark",) if spark_params == params else ()))
    warm = None if args.skip_warm else run_child(["--warm-child", uri, "--repeat", str(args.repeat)])
    ratios, targets = evaluate(results, warm, RESIDENT_MAX_BYTES / 2**20, spark_params == params)
    for name, res in results.items():
        print(
            f"{name:>10}: total {res['total_s']['median']:.2f} s "
            f"[{res['total_s']['min']:.2f}-{res['total_s']['max']:.2f}], peak {res['peak_rss_mb']['median']:,.0f} MB"
            + (f", first batch {res['first_batch_s']['median'] * 1000:.0f} ms" if "first_batch_s" in res else "")
            + (f" (open_table {res['open_s']['median'] * 1000:.0f} ms)" if "open_s" in res else "")
        )
    if warm is not None:
        print(f"warm (one process): { {k: round(statistics.median(v), 3) for k, v in warm['runs_s'].items()} }")
    for t in targets:
        print(f"{'PASS' if t['pass'] else 'MISS'}  {t['target']}: {t['value']:.2f} (limit {t['limit']:.2f})")
    return {
        "machine": machine_info(),
        "params": dataclasses.asdict(params),
        "spark_params": None if spark_params is None else dataclasses.asdict(spark_params),
        "repeat": args.repeat,
        "table": {"uri_name": params.name, "build_seconds": info["build_seconds"], "reused": reused},
        "column_cache_budget_mb": RESIDENT_MAX_BYTES / 2**20,
        "results": results,
        "warm_one_process": warm,
        "ratios": ratios,
        "targets": targets,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.build:
        print(json.dumps(build_table(args.build, BuildParams(**json.loads(args.params)))), flush=True)
        return 0
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if args.warm_child:
        print(json.dumps(warm_child(args.warm_child, args.repeat)))
        return 0
    tmp = None if args.dir else tempfile.mkdtemp(prefix="memwal-bench-stream-")
    try:
        report = run(args, args.dir or tmp)  # type: ignore[arg-type]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
