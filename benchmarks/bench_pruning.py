"""Region-pruning benchmark: point queries on a many-region bucket-sharded table.

Builds (or reuses, with ``--dir``) a table with ``--regions`` bucket regions on ``id``:
a base of ``--base-rows`` rows and ``--rounds`` rounds of upserts written with
``memwal_write.write_arrow`` (pylance's own writer; each round flushes one
generation per region). Then, in one run, median of ``--repeat``:

* ``WHERE id = X`` and ``WHERE id IN (5 keys)`` through DataFusion over the merged
  table, with region pruning (default) and without (``register(..., prune=False)``);
* the same keys through ``Table.lookup``;

and prints the flushed-generation fragments each query scanned ("sources opened")
and the times, with PASS/MISS for the targets: a point query on 64 regions opens at
most 1/32 of the flushed generations and runs at least 5x faster than without
pruning. Results go to ``--out`` (JSON).

Run: ``python benchmarks/bench_pruning.py`` (defaults: 1M base rows, 64 regions,
3 rounds of 100k upserts; about a minute to build). The base has a BTREE index on
``id`` (a point-query workload has one), so the base side of both variants is cheap
and the difference is the generations pruning skips.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import datafusion
import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_read import machine_info, measure, work_dir  # noqa: E402

import memwal_query as mq  # noqa: E402
from memwal_query.scan.lance_fragment import LanceFragment  # noqa: E402
from memwal_write import write_arrow  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("a", pa.int32()),
        pa.field("amount", pa.float64()),
    ]
)


def rows(rng: np.random.Generator, ids: np.ndarray, tag: int) -> pa.Table:
    n = len(ids)
    return pa.table(
        {"id": ids.astype(np.int64), "a": rng.integers(0, 100, n).astype(np.int32), "amount": rng.random(n) + tag},
        schema=SCHEMA,
    )


def build(uri: str, args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    ds = lance.write_dataset(rows(rng, np.arange(args.base_rows), 0), uri)
    # A point-query workload has a key index on the base: without one, both variants
    # spend their time scanning the base and pruning (which only skips generations)
    # could not show.
    ds.create_scalar_index("id", "BTREE")
    lance.dataset(uri).initialize_mem_wal(
        bucket_column="id", num_buckets=args.regions, max_memtable_rows=args.newer_rows
    )
    for r in range(1, args.rounds + 1):
        ids = rng.choice(args.base_rows * 2, args.newer_rows, replace=False)
        write_arrow(uri, rows(rng, np.sort(ids), r))


class ScanCounter:
    """Counts the Lance fragments a query scans, by kind (base / generation)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._orig = LanceFragment.batches

    def __enter__(self) -> ScanCounter:
        counter = self.counts
        orig = self._orig

        def counted(frag: Any, *a: Any, **k: Any) -> Any:
            counter["generation" if frag.gen else "base"] += 1
            return orig(frag, *a, **k)

        LanceFragment.batches = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        LanceFragment.batches = self._orig  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or reuse, with ``--dir``) the table and measure; a temp dir is removed afterwards."""
    with work_dir(args.dir, "memwal-bench-prune-") as root:
        return measure_pruning(args, root)


def measure_pruning(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Pruned, unpruned and lookup timings of the queries on the table under ``root``."""
    uri = str(root / f"t_{args.base_rows}_{args.regions}_{args.rounds}_{args.newer_rows}")
    if not Path(uri).exists():
        t0 = time.perf_counter()
        build(uri, args)
        print(f"built {uri} in {time.perf_counter() - t0:.1f} s")
    table = mq.open_table(uri)
    flushed = sum(len(r.generations) for r in table.snapshot.regions)
    gen_fragments = sum(len(g.dataset.get_fragments()) for r in table.snapshot.regions for g in r.generations)
    rng = np.random.default_rng(1)
    key = int(rng.integers(0, args.base_rows))
    keys5 = [int(k) for k in rng.choice(args.base_rows, 5, replace=False)]
    queries = {"id = X": f"id = {key}", "id IN (5 keys)": f"id IN ({', '.join(map(str, keys5))})"}
    ctx = datafusion.SessionContext()
    table.register(ctx, "pruned")
    table.register(ctx, "full", prune=False)
    results: dict[str, Any] = {}
    for label, pred in queries.items():
        entry: dict[str, Any] = {}
        for name in ("pruned", "full"):
            sql = f"SELECT * FROM {name} WHERE {pred}"
            with ScanCounter() as sc:
                answer = ctx.sql(sql).to_arrow_table()
            t = measure(lambda sql=sql: ctx.sql(sql).to_arrow_table().num_rows, args.repeat)
            entry[name] = {**t.__dict__, "scanned": dict(sc.counts), "rows": answer.num_rows}
        if entry["pruned"]["rows"] != entry["full"]["rows"]:
            raise AssertionError(f"pruning changed the answer of {pred}")
        lookup_keys = [key] if label == "id = X" else keys5
        entry["lookup"] = measure(lambda k=lookup_keys: table.lookup(k).num_rows, args.repeat).__dict__
        results[label] = entry
    plan = table.plan(queries["id = X"])
    return {
        "machine": machine_info(),
        "params": {k: v for k, v in vars(args).items() if k not in ("dir", "out")},
        "table": {
            "regions": len(table.region_ids),
            "flushed_generations": flushed,
            "generation_fragments": gen_fragments,
        },
        "plan_id_eq": {"regions": len(plan.regions), "pruned": len(plan.pruned_regions)},
        "results": results,
    }


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets for the point query, as measured."""
    e = res["results"]["id = X"]
    speedup = e["full"]["median_ms"] / e["pruned"]["median_ms"]
    opened = e["pruned"]["scanned"].get("generation", 0) / max(1, res["table"]["generation_fragments"])
    return [
        {
            "target": "point query opens <= 1/32 of flushed generations",
            "value": opened,
            "limit": 1 / 32,
            "unit": "of fragments",
            "pass": opened <= 1 / 32,
        },
        {
            "target": "point query >= 5x faster than without pruning",
            "value": speedup,
            "limit": 5,
            "unit": "x",
            "pass": speedup >= 5,
        },
    ]


def report(res: dict[str, Any]) -> list[tuple[str, bool]]:
    t = res["table"]
    print(
        f"\n{t['regions']} regions, {t['flushed_generations']} flushed generations "
        f"({t['generation_fragments']} fragments)"
    )
    print(f"{'query':18} {'variant':8} {'median ms':>10} {'gen fragments scanned':>22}")
    targets = []
    for label, e in res["results"].items():
        for name in ("pruned", "full", "lookup"):
            scanned = e[name].get("scanned", {}).get("generation", "-")
            print(f"{label:18} {name:8} {e[name]['median_ms']:10.1f} {scanned!s:>22}")
        speedup = e["full"]["median_ms"] / e["pruned"]["median_ms"]
        opened = e["pruned"]["scanned"].get("generation", 0) / max(1, t["generation_fragments"])
        print(f"{label:18} pruning speed-up {speedup:.1f}x, opened {opened:.3f} of generation fragments")
        if label == "id = X":
            targets += [
                ("point query opens <= 1/32 of generations", opened <= 1 / 32),
                ("point query >= 5x faster", speedup >= 5),
            ]
    for name, ok in targets:
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    return targets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--regions", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--newer-rows", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dir", help="keep (and reuse) the table here")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "pruning.json"))
    args = p.parse_args(argv)
    res = run(args)
    report(res)
    res["targets"] = targets(res)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=lambda o: o.__dict__))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
