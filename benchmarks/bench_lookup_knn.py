"""Point-lookup and vector-search benchmark against pylance's LSM planners.

Builds (or reuses, with ``--dir``) a table written with pylance's writer: a base of
``--base-rows`` rows with an IVF_PQ index on a ``--dim``-dimensional vector column,
``--regions`` bucket regions, two rounds of upserts (updates that move vectors, new
keys, deletes): the first merged into the base without re-indexing, the second left
as unmerged generations. No WAL tail, so pylance's planners (which cannot see other
writers' MemTables) and we read the same rows.

Measures, in one run:

* single-key lookups, p50/p95 over ``--lookups`` random keys: ``Table.lookup`` vs
  ``LsmPointLookupPlanner``;
* a 1,000-key batch: one ``Table.lookup`` call vs 1,000 single calls (ours and pylance's);
* KNN (k=10, same nprobes), p50/p95 over ``--queries`` queries: ``Table.nearest``
  vs ``LsmVectorSearchPlanner`` vs DataFusion brute force (``array_distance`` over
  the merged table), with recall@10 against exact search over the merged rows.

Lookups against the base table's own BTREE index (``lookup_levels.py``): a table with
``--level-rounds`` x ``--regions`` generations and a WAL tail, and a lagging-merger table
(``--lag-rounds`` x ``--lag-regions`` generations, ``--lag-rows`` unmerged rows; 0: skip):
single-key p50/p95, 1,000 keys in one call vs one base ``id IN (...)`` query, and a fresh
process's open + first lookup.

Prints PASS/MISS for the targets: single lookup p50 <= 1.5x the base BTREE lookup (levels
table), 1,000 keys <= 3x one base ``IN`` query, both <= 2x on the lagging-merger table;
single lookup p50 <= pylance's planner; a 1,000-key batch >= 10x faster than 1,000
single lookups; KNN p50 <= 1.5x pylance with recall >= pylance's. Results go to
``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datafusion
import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import LsmPointLookupPlanner, LsmVectorSearchPlanner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_read import machine_info, work_dir  # noqa: E402
from lookup_levels import run_table  # noqa: E402

import memwal_query as mq  # noqa: E402
from memwal_write import write_arrow  # noqa: E402
from memwal_write.merger import merge_generations  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}


def schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("vec", pa.list_(pa.float32(), dim)),
        ]
    )


def rows(rng: np.random.Generator, ids: np.ndarray, dim: int) -> pa.Table:
    v = rng.standard_normal((len(ids), dim)).astype(np.float32)
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "cat": np.array(["a", "b", "c", "d"])[ids % 4],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), dim),
        },
        schema=schema(dim),
    )


def build(uri: str, a: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    ds = lance.write_dataset(rows(rng, np.arange(a.base_rows), a.dim), uri)
    ds.create_index("vec", index_type="IVF_PQ", num_partitions=a.partitions, num_sub_vectors=a.dim // 8)
    ds.create_scalar_index("id", "BTREE")
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=a.regions, max_memtable_rows=100_000)
    for r in range(2):
        ids = np.sort(rng.choice(int(a.base_rows * 1.1), a.newer_rows, replace=False))
        dels = rng.choice(a.base_rows, a.newer_rows // 20, replace=False)
        write_arrow(uri, rows(rng, ids, a.dim), deletes=pa.table({"id": dels.astype(np.int64)}))
        if r == 0:
            merge_generations(uri)  # merged, the vector index not rebuilt


def percentiles(fn: Callable[[Any], Any], args: list[Any]) -> dict[str, float]:
    fn(args[0])  # warm-up
    ts = []
    for x in args:
        t0 = time.perf_counter()
        fn(x)
        ts.append((time.perf_counter() - t0) * 1000)
    ts.sort()
    return {"p50_ms": statistics.median(ts), "p95_ms": ts[int(0.95 * (len(ts) - 1))], "n": len(ts)}


def run(a: argparse.Namespace) -> dict[str, Any]:
    """Build (or reuse, with ``--dir``) the tables and measure; a temp dir is removed afterwards."""
    with work_dir(a.dir, "memwal-bench-lookup-") as root:
        return measure(a, root)


def measure(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Lookup and KNN timings against pylance's planners and the base indexes, tables under ``root``."""
    uri = str(root / f"t_{a.base_rows}_{a.dim}_{a.regions}_{a.newer_rows}")
    if not Path(uri).exists():
        t0 = time.perf_counter()
        build(uri, a)
        print(f"built {uri} in {time.perf_counter() - t0:.1f} s")
    table = mq.open_table(uri)
    ds = lance.dataset(uri)
    snaps = table.pylance_shard_snapshots()
    point = LsmPointLookupPlanner(ds, snaps)
    rng = np.random.default_rng(1)
    keys = [int(k) for k in rng.choice(int(a.base_rows * 1.1), a.lookups, replace=False)]
    for k in keys[:50]:  # same answers before timing
        ours = table.lookup(k).to_pylist()
        theirs = point.plan_lookup(pa.array([k], pa.int64())).to_table().select(table.schema.names).to_pylist()
        if ours != theirs:
            raise AssertionError(f"lookup {k}: ours {ours} != pylance {theirs}")
    params = {k: v for k, v in vars(a).items() if k not in ("dir", "out")}
    res: dict[str, Any] = {"machine": machine_info(), "params": params}
    res["lookup_single"] = {
        "ours": percentiles(lambda k: table.lookup(k), keys),
        "pylance": percentiles(lambda k: point.plan_lookup(pa.array([k], pa.int64())).to_table(), keys),
    }
    n = a.batch_keys
    batch = keys[:n] if len(keys) >= n else [int(k) for k in rng.choice(a.base_rows, n, replace=False)]
    t0 = time.perf_counter()
    got = table.lookup(batch)
    one_call = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    singles = sum(table.lookup(k).num_rows for k in batch)
    many_ours = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    for k in batch:
        point.plan_lookup(pa.array([k], pa.int64())).to_table()
    many_theirs = (time.perf_counter() - t0) * 1000
    if got.num_rows != singles:
        raise AssertionError("batch lookup and single lookups disagree")
    res["lookup_batch_1000"] = {
        "one_call_ms": one_call,
        "singles_ours_ms": many_ours,
        "singles_pylance_ms": many_theirs,
    }

    merged = table.to_arrow(columns=["id", "vec"])
    ids = merged.column("id").to_numpy()
    mat = merged.column("vec").combine_chunks().flatten().to_numpy().reshape(-1, a.dim)
    queries = [rng.standard_normal(a.dim).astype(np.float32) for _ in range(a.queries)]
    exact = {i: set(ids[np.argsort(((mat - q) ** 2).sum(axis=1))[:10]].tolist()) for i, q in enumerate(queries)}
    vec = LsmVectorSearchPlanner(ds, snaps, "vec")
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")

    def ours_knn(i: int) -> set[int]:
        return set(table.nearest("vec", queries[i], k=10, nprobes=a.nprobes, columns=["id"]).column("id").to_pylist())

    # "ours" runs with index_catchup="auto"; the same search with the Indexed Read Plan
    # forced (unindexed base rows served by the catch-up generations' own indexes):
    forced = mq.open_table(uri)
    forced.index_catchup = "always"
    plan = forced.catchup_plan("vec_idx")
    res["catchup_plan"] = plan.describe()
    res["catchup_auto_uses_plan"] = table.uses_catchup(plan)

    def ours_forced_knn(i: int) -> set[int]:
        got = forced.nearest("vec", queries[i], k=10, nprobes=a.nprobes, columns=["id"])
        return set(got.column("id").to_pylist())

    def theirs_knn(i: int) -> set[int]:
        plan = vec.plan_search(pa.array(queries[i]), k=10, nprobes=a.nprobes, columns=["id"])
        return set(plan.to_table().column("id").to_pylist())

    def brute(i: int) -> set[int]:
        lit = "make_array(" + ", ".join(f"{x:.7f}" for x in queries[i]) + ")"
        sql = f"SELECT id FROM t ORDER BY array_distance(vec, {lit}) LIMIT 10"
        return set(ctx.sql(sql).to_arrow_table().column("id").to_pylist())

    idx = list(range(a.queries))
    knn: dict[str, Any] = {}
    runs = [
        ("ours", ours_knn),
        ("ours_index_catchup_always", ours_forced_knn),
        ("pylance", theirs_knn),
        ("datafusion_brute_force", brute),
    ]
    for name, fn in runs:
        knn[name] = percentiles(fn, idx)
        knn[name]["recall@10"] = statistics.mean(len(fn(i) & exact[i]) / 10 for i in idx)
    res["knn"] = knn
    if a.catchup_rows:
        res["catchup"] = catchup_regime(root, a)
    res["lookup_levels"] = run_table(
        root,
        "levels",
        {
            "base_rows": a.base_rows,
            "regions": a.regions,
            "rounds": a.level_rounds,
            "round_rows": a.newer_rows,
            "tail_rows": a.tail_rows,
        },
        a.lookups,
        a.batch_repeat,
        a.batch_keys,
        a.fresh_runs,
    )
    if a.lag_rows:
        lag = {
            "base_rows": a.lag_base_rows,
            "regions": a.lag_regions,
            "rounds": a.lag_rounds,
            "round_rows": a.lag_rows // a.lag_rounds,
            "tail_rows": a.tail_rows,
        }
        res["lookup_lagging_merger"] = run_table(
            root, "lagging", lag, a.lookups, a.batch_repeat, a.batch_keys, a.fresh_runs
        )
    return res


def catchup_regime(root: Path, a: argparse.Namespace) -> dict[str, Any]:
    """KNN where many base rows are not indexed yet: the Indexed Read Plan vs a flat search.

    Base of ``--base-rows`` with the vector index, then ``--catchup-rows`` newer rows
    merged (the index not rebuilt): the merged rows sit in unindexed base fragments and in
    the merged generations, which carry their own indexes.
    """
    uri = str(root / f"catchup_{a.base_rows}_{a.dim}_{a.regions}_{a.catchup_rows}")
    if not Path(uri).exists():
        rng = np.random.default_rng(7)
        ds = lance.write_dataset(rows(rng, np.arange(a.base_rows), a.dim), uri)
        ds.create_index("vec", index_type="IVF_PQ", num_partitions=a.partitions, num_sub_vectors=a.dim // 8)
        lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=a.regions, max_memtable_rows=500_000)
        ids = np.sort(rng.choice(a.base_rows * 2, a.catchup_rows, replace=False))
        write_arrow(uri, rows(rng, ids, a.dim))
        merge_generations(uri)
    auto = mq.open_table(uri)
    never = mq.open_table(uri)
    never.index_catchup = "never"
    plan = auto.catchup_plan("vec_idx")
    merged = auto.to_arrow(columns=["id", "vec"])
    ids_ = merged.column("id").to_numpy()
    mat = merged.column("vec").combine_chunks().flatten().to_numpy().reshape(-1, a.dim)
    rng = np.random.default_rng(2)
    queries = [rng.standard_normal(a.dim).astype(np.float32) for _ in range(a.queries)]
    exact = [set(ids_[np.argsort(((mat - q) ** 2).sum(axis=1))[:10]].tolist()) for q in queries]
    vec = LsmVectorSearchPlanner(lance.dataset(uri), auto.pylance_shard_snapshots(), "vec")

    def search(t: mq.Table) -> Callable[[int], set[int]]:
        return lambda i: set(
            t.nearest("vec", queries[i], k=10, nprobes=a.nprobes, columns=["id"]).column("id").to_pylist()
        )

    def theirs(i: int) -> set[int]:
        got = vec.plan_search(pa.array(queries[i]), k=10, nprobes=a.nprobes, columns=["id"]).to_table()
        return set(got.column("id").to_pylist())

    out: dict[str, Any] = {"plan": plan.describe(), "auto_uses_plan": auto.uses_catchup(plan)}
    idx = list(range(a.queries))
    for name, fn in [("ours_auto", search(auto)), ("ours_never", search(never)), ("pylance", theirs)]:
        out[name] = percentiles(fn, idx)
        out[name]["recall@10"] = statistics.mean(len(fn(i) & exact[i]) / 10 for i in idx)
    return out


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, as measured."""
    ls, lb, knn = res["lookup_single"], res["lookup_batch_1000"], res["knn"]
    single = ls["ours"]["p50_ms"] / ls["pylance"]["p50_ms"]
    batch = lb["singles_ours_ms"] / lb["one_call_ms"]
    speed = knn["ours"]["p50_ms"] / knn["pylance"]["p50_ms"]
    recall = knn["ours"]["recall@10"] - knn["pylance"]["recall@10"]
    return [
        *lookup_targets(res),
        {"target": "single lookup p50 <= pylance's", "value": single, "limit": 1, "unit": "x", "pass": single <= 1},
        {
            "target": "1000-key batch >= 10x faster than 1000 single lookups",
            "value": batch,
            "limit": 10,
            "unit": "x",
            "pass": batch >= 10,
        },
        {"target": "KNN p50 <= 1.5x pylance", "value": speed, "limit": 1.5, "unit": "x", "pass": speed <= 1.5},
        {
            "target": "KNN recall@10 >= pylance's (difference)",
            "value": recall,
            "limit": 0,
            "unit": "",
            "pass": recall >= 0,
        },
    ]


def lookup_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Lookups against the base table's BTREE index (issue 16, items 3 and 5)."""
    out = []
    for name, label, single_max, batch_max in [
        ("lookup_levels", "24+ generations + WAL tail", 1.5, 3.0),
        ("lookup_lagging_merger", "lagging merger", 2.0, 2.0),
    ]:
        if name not in res:
            continue
        r = res[name]
        for what, key, limit in [
            ("single lookup p50 vs base BTREE", "single_ratio_p50", single_max),
            ("1000 keys vs one base IN query", "batch_ratio_p50", batch_max),
        ]:
            v = r[key]
            out.append({"target": f"{label}: {what}", "value": v, "limit": limit, "unit": "x", "pass": v <= limit})
    return out


def report_levels(res: dict[str, Any]) -> None:
    for name in ("lookup_levels", "lookup_lagging_merger"):
        if name not in res:
            continue
        r = res[name]
        s, b, f = r["single"], r["batch_1000"], r["fresh_process"]
        print(
            f"{name}: {r['generations']} generations, {r['unmerged_rows']:,} unmerged rows, "
            f"{r['wal_tail_rows']:,} WAL tail rows, key index {r['newer_keys_index_mb']:.1f} MB, "
            f"open {r['open_s']:.2f} s"
        )
        print(
            f"  single  ours p50 {s['ours']['p50_ms']:.2f} p95 {s['ours']['p95_ms']:.2f} ms | base BTREE p50 "
            f"{s['base_btree']['p50_ms']:.2f} p95 {s['base_btree']['p95_ms']:.2f} ms | {r['single_ratio_p50']:.2f}x"
        )
        print(
            f"  1000    ours p50 {b['ours']['p50_ms']:.1f} ms | base IN p50 {b['base_btree_in']['p50_ms']:.1f} ms"
            f" | {r['batch_ratio_p50']:.2f}x"
        )
        print(
            f"  fresh process: ours open {f['ours']['open_ms']:.0f} + first {f['ours']['first_ms']:.1f} ms | "
            f"base open {f['base_btree']['open_ms']:.0f} + first {f['base_btree']['first_ms']:.1f} ms"
        )


def report(res: dict[str, Any]) -> list[tuple[str, bool]]:
    ls, lb, knn = res["lookup_single"], res["lookup_batch_1000"], res["knn"]
    print(
        f"single lookup  ours p50 {ls['ours']['p50_ms']:.2f} p95 {ls['ours']['p95_ms']:.2f} ms | "
        f"pylance p50 {ls['pylance']['p50_ms']:.2f} p95 {ls['pylance']['p95_ms']:.2f} ms"
    )
    print(
        f"1000-key batch one call {lb['one_call_ms']:.1f} ms | 1000 single ours {lb['singles_ours_ms']:.0f} ms | "
        f"1000 single pylance {lb['singles_pylance_ms']:.0f} ms"
    )
    if "catchup_plan" in res:
        print(f"catch-up plan: {res['catchup_plan']} (auto uses it: {res['catchup_auto_uses_plan']})")
    for name, v in knn.items():
        print(f"knn {name:24s} p50 {v['p50_ms']:8.2f} p95 {v['p95_ms']:8.2f} ms recall@10 {v['recall@10']:.3f}")
    targets = [
        ("single lookup p50 <= pylance's", ls["ours"]["p50_ms"] <= ls["pylance"]["p50_ms"]),
        ("1000-key batch >= 10x faster than 1000 single lookups", lb["singles_ours_ms"] >= 10 * lb["one_call_ms"]),
        ("KNN p50 <= 1.5x pylance", knn["ours"]["p50_ms"] <= 1.5 * knn["pylance"]["p50_ms"]),
        ("KNN recall >= pylance's", knn["ours"]["recall@10"] >= knn["pylance"]["recall@10"]),
    ]
    if "catchup" in res:
        c = res["catchup"]
        print(f"catch-up regime: {c['plan']} (auto uses it: {c['auto_uses_plan']})")
        for name in ("ours_auto", "ours_never", "pylance"):
            v = c[name]
            print(f"  knn {name:22s} p50 {v['p50_ms']:8.2f} p95 {v['p95_ms']:8.2f} ms recall@10 {v['recall@10']:.3f}")
    report_levels(res)
    targets = [(t["target"], t["pass"]) for t in lookup_targets(res)] + targets
    for name, ok in targets:
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    return targets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base-rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--regions", type=int, default=8)
    p.add_argument("--newer-rows", type=int, default=20_000)
    p.add_argument("--lookups", type=int, default=1000)
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--nprobes", type=int, default=20)
    p.add_argument("--catchup-rows", type=int, default=400_000, help="rows merged after the index build (0: skip)")
    p.add_argument("--level-rounds", type=int, default=3, help="flushed generations per region (levels table)")
    p.add_argument("--tail-rows", type=int, default=5_000, help="WAL tail rows (writers left open)")
    p.add_argument("--batch-repeat", type=int, default=15, help="timed 1,000-key lookups")
    p.add_argument("--batch-keys", type=int, default=1000, help="keys of the one-call lookups (tests: fewer)")
    p.add_argument("--fresh-runs", type=int, default=6, help="fresh processes per table and reader")
    p.add_argument("--lag-base-rows", type=int, default=200_000)
    p.add_argument("--lag-regions", type=int, default=4)
    p.add_argument("--lag-rounds", type=int, default=25, help="generations per region (lagging merger)")
    p.add_argument("--lag-rows", type=int, default=1_000_000, help="unmerged rows (lagging merger; 0: skip)")
    p.add_argument("--dir", help="keep (and reuse) the table here")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "lookup_knn.json"))
    a = p.parse_args(argv)
    res = run(a)
    report(res)
    res["targets"] = targets(res)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
