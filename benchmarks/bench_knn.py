"""Vector search (KNN) across LSM levels against the base table's own index search.

Builds (or reuses, with ``--dir``) two tables written with pylance's writer over one
base of ``--base-rows`` clustered vectors (a Gaussian mixture of ``--clusters``
skewed clusters on a ``--latent``-dimensional subspace of ``--dim`` dimensions) with an
IVF_PQ index (``dim / --dims-per-code`` sub-vectors):

* **levels**: ``--rounds`` rounds of upserts over ``--regions`` regions (skewed keys:
  hot keys updated again, vectors moved to another cluster; new keys; deletes), each
  round flushed as one generation per region, plus a WAL tail (an open writer);
* **lagging**: a merger that fell behind: one large generation per region (each with
  its own vector index, as pylance's writer builds them) and ``--lag-small`` small
  ones, ``--lag-rows`` rows unmerged in all.

Measured in one run, queries drawn from the mixture: ``Table.nearest`` vs the base index
search with the same k / nprobes / refine_factor (``lance.dataset(uri).to_table(nearest=...)``:
the base alone), interleaved query by query, then pylance's ``LsmVectorSearchPlanner`` (which
cannot see the WAL tail) in a pass of its own (its ~100x longer searches leave background work
that would land on the next timing);
p50/p95 of warm queries, recall@10 against exact search over the live rows (and the
base index's recall against exact search over the base rows), with and without
``refine_factor``; and fresh processes' first query. Results go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import LsmVectorSearchPlanner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_read import machine_info, work_dir  # noqa: E402

import memwal_query as mq  # noqa: E402
from memwal_query.vector import wait_warm  # noqa: E402
from memwal_write import RoutedWriter, write_arrow  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}
REPO = Path(__file__).resolve().parents[1]


class Mixture:
    """A Gaussian mixture with skewed cluster weights (Zipf-like) on a low-dimensional subspace.

    Embeddings have a low intrinsic dimension: clusters and the spread inside them live in a
    ``latent``-dimensional subspace (a random orthonormal projection into ``dim`` dimensions),
    plus a little isotropic ``noise``. Isotropic noise in all ``dim`` dimensions would make the
    neighbours inside a cluster indistinguishable to product quantization, which is not what
    real embeddings look like.
    """

    def __init__(
        self, dim: int, clusters: int, latent: int = 24, spread: float = 0.25, noise: float = 0.02, seed: int = 0
    ) -> None:
        rng = np.random.default_rng(seed)
        self.dim = dim
        self.latent = min(latent, dim)
        self.centers = rng.standard_normal((clusters, self.latent)).astype(np.float32)
        q, _ = np.linalg.qr(rng.standard_normal((dim, self.latent)))
        self.projection = q.T.astype(np.float32)  # latent x dim, orthonormal rows
        w = 1.0 / np.arange(1, clusters + 1) ** 0.7
        self.weights = w / w.sum()
        self.spread = spread
        self.noise = noise

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        c = rng.choice(len(self.centers), n, p=self.weights)
        z = self.centers[c] + rng.standard_normal((n, self.latent)).astype(np.float32) * self.spread
        return z @ self.projection + rng.standard_normal((n, self.dim)).astype(np.float32) * self.noise


def schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("vec", pa.list_(pa.float32(), dim)),
        ]
    )


def rows(mix: Mixture, rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    v = mix.sample(rng, len(ids))
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "cat": np.array(["a", "b", "c", "d"])[ids % 4],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), mix.dim),
        },
        schema=schema(mix.dim),
    )


def skewed_keys(rng: np.random.Generator, n: int, key_space: int) -> np.ndarray:
    """``n`` distinct keys, most of them from a hot head of the key space (Zipf-like)."""
    hot = np.unique(np.minimum(rng.zipf(1.3, 3 * n), key_space) - 1)
    pick = hot[: n // 2] if hot.size > n // 2 else hot
    rest = rng.choice(key_space, n, replace=False)
    return np.unique(np.concatenate([pick, rest]))[:n]


def build_base(uri: str, a: argparse.Namespace, mix: Mixture) -> None:
    rng = np.random.default_rng(1)
    n = a.base_rows
    chunk = 250_000

    def batches() -> Any:
        for off in range(0, n, chunk):
            yield from rows(mix, rng, np.arange(off, min(n, off + chunk))).to_batches()

    ds = lance.write_dataset(pa.RecordBatchReader.from_batches(schema(a.dim), batches()), uri)
    ds.create_index("vec", index_type="IVF_PQ", num_partitions=a.partitions, num_sub_vectors=a.dim // a.dims_per_code)


def build_levels(uri: str, a: argparse.Namespace, mix: Mixture) -> RoutedWriter:
    """Generations from ``--rounds`` flushed rounds, then a WAL tail (the open writer returned)."""
    rng = np.random.default_rng(2)
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=a.regions, max_memtable_rows=1_000_000)
    for _ in range(a.rounds):
        ids = skewed_keys(rng, a.round_rows, int(a.base_rows * 1.05))
        dels = rng.choice(a.base_rows, a.round_rows // 20, replace=False)
        write_arrow(uri, rows(mix, rng, ids), deletes=pa.table({"id": dels.astype(np.int64)}))
    w = RoutedWriter.open(uri, max_memtable_rows=1_000_000)
    w.put(rows(mix, rng, skewed_keys(rng, a.tail_rows, int(a.base_rows * 1.05))))
    return w


def build_lagging(uri: str, a: argparse.Namespace, mix: Mixture) -> None:
    """A merger far behind over ``--lag-regions`` regions: one large write (one large generation
    per region), then small writes (one small generation per region each) holding
    ``--lag-small-share`` of the unmerged rows."""
    rng = np.random.default_rng(3)
    regions = a.lag_regions
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=regions, max_memtable_rows=4_000_000)
    small_rounds = -(-a.lag_small // regions)
    small_total = int(a.lag_rows * a.lag_small_share)
    small_rows = small_total // small_rounds
    key_space = int(a.base_rows * 1.2)
    large = rows(mix, rng, skewed_keys(rng, a.lag_rows - small_total, key_space))
    write_arrow(uri, large, max_memtable_rows=large.num_rows + 1)
    for _ in range(small_rounds):
        ids = skewed_keys(rng, small_rows, key_space)
        dels = rng.choice(a.base_rows, max(1, small_rows // 50), replace=False)
        write_arrow(uri, rows(mix, rng, ids), deletes=pa.table({"id": dels.astype(np.int64)}))


def build(root: Path, a: argparse.Namespace) -> tuple[str, str, RoutedWriter]:
    mix = Mixture(a.dim, a.clusters, a.latent, a.spread, a.noise)
    data = f"{a.base_rows}_{a.dim}_{a.latent}_{a.spread}_{a.noise}_{a.clusters}"
    base = root / f"base_{data}_{a.partitions}_{a.dims_per_code}"
    levels = root / f"levels_{base.name}_{a.regions}_{a.rounds}_{a.round_rows}_{a.tail_rows}"
    lagging = root / f"lagging_{base.name}_{a.lag_regions}_{a.lag_small}_{a.lag_rows}_{a.lag_small_share}"
    t0 = time.perf_counter()
    if not base.exists():
        build_base(str(base), a, mix)
        print(f"base built in {time.perf_counter() - t0:.1f} s", flush=True)
    if levels.exists():
        shutil.rmtree(levels)  # the WAL tail needs a writer of this process
    shutil.copytree(base, levels)
    writer = build_levels(str(levels), a, mix)
    if not lagging.exists():
        tmp = lagging.with_name(lagging.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(base, tmp)
        build_lagging(str(tmp), a, mix)
        tmp.rename(lagging)
    print(f"tables ready in {time.perf_counter() - t0:.1f} s", flush=True)
    return str(levels), str(lagging), writer


def exact_ids(mat: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int = 10) -> set[int]:
    d = (mat * mat).sum(axis=1) - 2 * (mat @ q)
    return set(ids[np.argpartition(d, k)[:k]].tolist())


def columns_of(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    ids = t.column("id").to_numpy()
    mat = t.column("vec").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)
    return ids, np.ascontiguousarray(mat, dtype=np.float32)


def stats_of(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {
        "p50_ms": statistics.median(s),
        "p95_ms": s[int(0.95 * (len(s) - 1))],
        "min_ms": s[0],
        "max_ms": s[-1],
        "n": len(s),
    }


def compare(
    uri: str, a: argparse.Namespace, queries: np.ndarray, refine: int | None, with_pylance: bool
) -> dict[str, Any]:
    """Ours vs the base index (vs pylance's LSM planner), interleaved query by query."""
    table = mq.open_table(uri)
    base = lance.dataset(uri)
    live_ids, live = columns_of(table.to_arrow(columns=["id", "vec"]))
    base_ids, base_mat = columns_of(base.to_table(columns=["id", "vec"]))
    kw: dict[str, Any] = {"nprobes": a.nprobes}
    if refine:
        kw["refine_factor"] = refine
    planner = LsmVectorSearchPlanner(base, table.pylance_shard_snapshots(), "vec") if with_pylance else None

    def ours(q: np.ndarray) -> pa.Table:
        return table.nearest("vec", q, k=10, columns=["id"], **kw)

    def base_index(q: np.ndarray) -> pa.Table:
        return base.to_table(
            nearest={"column": "vec", "q": q, "k": 10, **kw}, columns=["id"], disable_scoring_autoprojection=True
        )

    def pylance(q: np.ndarray) -> pa.Table:
        assert planner is not None
        # the planner takes no refine_factor: it searches with nprobes only
        return planner.plan_search(pa.array(q), k=10, columns=["id"], nprobes=a.nprobes).to_table()

    runs: dict[str, Callable[[np.ndarray], pa.Table]] = {"ours": ours, "base_index": base_index}
    if planner is not None:
        runs["pylance_lsm_planner"] = pylance
    for fn in runs.values():  # warm-up (the first query of the snapshot builds what it keeps)
        fn(queries[0])
    wait_warm()  # and what it reads in the background for later queries
    times: dict[str, list[float]] = {n: [] for n in runs}
    recall: dict[str, list[float]] = {n: [] for n in runs}
    base_recall: list[float] = []
    # exact answers before any timing: numpy's BLAS threads keep spinning after a large product
    # and would slow whatever is timed next
    wants = [exact_ids(live, live_ids, q) for q in queries]
    base_wants = [exact_ids(base_mat, base_ids, q) for q in queries]
    del live, base_mat
    # ours and the base index interleaved query by query; pylance's planner (100x slower, its
    # background work would land on the next timing) in a pass of its own
    for names in (["ours", "base_index"], [n for n in runs if n not in ("ours", "base_index")]):
        for i, (q, want, base_want) in enumerate(zip(queries, wants, base_wants, strict=True)):
            for name in names if i % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                got = runs[name](q)
                times[name].append((time.perf_counter() - t0) * 1000)
                ids = set(got.column("id").to_pylist())
                recall[name].append(len(ids & want) / 10)
                if name == "base_index":
                    base_recall.append(len(ids & base_want) / 10)
    out: dict[str, Any] = {}
    for name in runs:
        out[name] = {**stats_of(times[name]), "recall@10_live": statistics.mean(recall[name])}
    out["base_index"]["recall@10_own_rows"] = statistics.mean(base_recall)
    out["ratio_p50_ours_vs_base"] = out["ours"]["p50_ms"] / out["base_index"]["p50_ms"]
    out["explain_knn"] = [ln for ln in table.explain().splitlines() if "KNN" in ln or "vector" in ln.lower()]
    return out


FRESH = """
import sys, time, json, numpy as np
t0 = time.perf_counter()
q = np.array(json.loads(sys.argv[3]), dtype=np.float32)
kw = json.loads(sys.argv[4])
if sys.argv[1] == "ours":
    import memwal_query as mq
    t = mq.open_table(sys.argv[2])
    t.nearest("vec", q, k=10, columns=["id"], **kw)
else:
    import lance
    lance.dataset(sys.argv[2]).to_table(
        nearest={"column": "vec", "q": q, "k": 10, **kw}, columns=["id"], disable_scoring_autoprojection=True)
print((time.perf_counter() - t0) * 1000)
"""


def fresh(uri: str, a: argparse.Namespace, queries: np.ndarray) -> dict[str, Any]:
    """Fresh processes: import + open + first query, ours and the base index's, interleaved."""
    times: dict[str, list[float]] = {"ours": [], "base_index": []}
    kw = json.dumps({"nprobes": a.nprobes})
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    for i in range(a.fresh):
        q = json.dumps(queries[i % len(queries)].tolist())
        for name in ("ours", "base_index") if i % 2 == 0 else ("base_index", "ours"):
            out = subprocess.run(
                [sys.executable, "-c", FRESH, name, uri, q, kw], capture_output=True, text=True, check=True, env=env
            )
            times[name].append(float(out.stdout.strip().splitlines()[-1]))
    res: dict[str, Any] = {n: stats_of(t) for n, t in times.items()}
    res["ratio_p50_ours_vs_base"] = res["ours"]["p50_ms"] / res["base_index"]["p50_ms"]
    return res


def run(a: argparse.Namespace) -> dict[str, Any]:
    """Build (or reuse, with ``--dir``) the tables and measure; a temp dir is removed afterwards."""
    with work_dir(a.dir, "memwal-bench-knn-") as root:
        return measure(a, root)


def measure(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """KNN timings and recall on the levels and lagging tables under ``root``."""
    levels, lagging, writer = build(root, a)
    if a.build_only:
        writer.close()
        return {}
    mix = Mixture(a.dim, a.clusters, a.latent, a.spread, a.noise)
    queries = mix.sample(np.random.default_rng(9), a.queries)
    params = {k: v for k, v in vars(a).items() if k not in ("dir", "out")}
    res: dict[str, Any] = {"machine": machine_info(), "params": params}
    for name, uri in (("levels", levels), ("lagging", lagging)):
        t = mq.open_table(uri)
        res[name] = {
            "generations": sum(len(r.generations) for r in t.view.snapshot.regions),
            "unmerged_rows": sum(g.num_rows for r in t.view.snapshot.regions for g in r.generations),
            "memtable_rows": sum(m.num_rows for m in t.view.merge.memtables.values()),
            "live_rows": t.count_rows() if hasattr(t, "count_rows") else None,
        }
        for label, refine in (("no_refine", None), ("refine", a.refine)):
            res[name][label] = compare(uri, a, queries, refine, with_pylance=not a.skip_pylance)
        res[name]["fresh_process"] = fresh(uri, a, queries)
    writer.close()
    return res


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, limit in (("levels", 1.5), ("lagging", 2.0)):
        for label in ("no_refine", "refine"):
            r = res[name][label]
            v = r["ratio_p50_ours_vs_base"]
            out.append(
                {"target": f"{name} {label}: KNN p50 <= {limit}x base index", "value": v, "limit": limit, "unit": "x"}
            )
            out[-1]["pass"] = v <= limit
            d = r["ours"]["recall@10_live"] - r["base_index"]["recall@10_own_rows"]
            out.append({"target": f"{name} {label}: recall@10 >= base index's (difference)", "value": d, "limit": 0})
            out[-1]["pass"] = d >= 0
        rr = res[name]["refine"]["ours"]["recall@10_live"]
        out.append({"target": f"{name}: recall@10 with refine_factor >= 0.95", "value": rr, "limit": 0.95})
        out[-1]["pass"] = rr >= 0.95
    return out


def report(res: dict[str, Any]) -> None:
    for name in ("levels", "lagging"):
        r = res[name]
        print(f"{name}: {r['generations']} generations, {r['unmerged_rows']} unmerged rows, {r['memtable_rows']} WAL")
        for label in ("no_refine", "refine"):
            for who, v in r[label].items():
                if isinstance(v, dict):
                    rec = f"recall@10 {v['recall@10_live']:.3f}"
                    if "recall@10_own_rows" in v:
                        rec += f" (own rows {v['recall@10_own_rows']:.3f})"
                    print(f"  {label:9s} {who:20s} p50 {v['p50_ms']:7.2f} p95 {v['p95_ms']:7.2f} ms {rec}")
            print(f"  {label:9s} ours / base p50 = {r[label]['ratio_p50_ours_vs_base']:.2f}x")
        f = r["fresh_process"]
        print(
            f"  fresh process: ours {f['ours']['p50_ms']:.0f} ms, base {f['base_index']['p50_ms']:.0f} ms "
            f"({f['ratio_p50_ours_vs_base']:.2f}x)"
        )
    for t in res["targets"]:
        print(f"  {'PASS' if t['pass'] else 'MISS'}  {t['target']}: {t['value']:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--clusters", type=int, default=256)
    p.add_argument("--latent", type=int, default=24, help="intrinsic dimension of the vectors")
    p.add_argument("--spread", type=float, default=0.25, help="cluster spread in the latent space")
    p.add_argument("--noise", type=float, default=0.02, help="isotropic noise in all dimensions")
    p.add_argument("--partitions", type=int, default=256)
    p.add_argument("--dims-per-code", type=int, default=4, help="dimensions per PQ sub-vector (dim / this of them)")
    p.add_argument("--regions", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="flushed rounds: one generation per region each")
    p.add_argument("--round-rows", type=int, default=16_000)
    p.add_argument("--tail-rows", type=int, default=4_000)
    p.add_argument("--lag-regions", type=int, default=2, help="lagging table regions (one large generation each)")
    p.add_argument("--lag-small", type=int, default=104, help="small generations")
    p.add_argument("--lag-small-share", type=float, default=0.4, help="share of the unmerged rows in small generations")
    p.add_argument("--lag-rows", type=int, default=1_000_000, help="unmerged rows in the lagging table")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--nprobes", type=int, default=20)
    p.add_argument("--refine", type=int, default=10)
    p.add_argument("--fresh", type=int, default=6, help="fresh processes per side")
    p.add_argument("--build-only", action="store_true", help="build the tables (into --dir), measure nothing")
    p.add_argument("--skip-pylance", action="store_true", help="leave out pylance's LSM planner")
    p.add_argument("--dir", help="keep (and reuse) the tables here")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "knn.json"))
    a = p.parse_args(argv)
    res = run(a)
    if a.build_only:
        return 0
    res["targets"] = targets(res)
    report(res)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
