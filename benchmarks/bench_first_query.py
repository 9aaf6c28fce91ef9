"""First query in a fresh process: open + one query against pylance on the base alone.

What it does
------------
1. Builds (or reuses, with ``--dir``) one MemWAL table per ``--sizes`` base size with
   ``bench_read.build_table``: a base with a BTREE index on ``id``, bucket sharding over
   ``--regions`` regions, ``--newer-rows`` upserts/deletes over ``--generations`` flushed
   generations per region (the first merged into the base) and a live WAL tail. Every
   size has the same unmerged data.
2. For each size and query, runs ``--repeat`` rounds; each round starts one new Python
   process for memwal (``open_table`` + ``Table.sql``) and one for the anchor
   (``lance.dataset(uri)`` + ``to_table(columns=..., filter=...)`` / ``count_rows()``) in a
   shuffled order. Imports are not timed: each child imports everything, then times open +
   first query, then the same query ``--warm`` more times (warm, median). Queries:

   * ``open``: ``open_table(uri)`` alone (anchor: ``lance.dataset(uri)``);
   * ``filtered_agg``: ``SELECT sum(amount) FROM t WHERE amount < 10``
     (anchor: ``to_table(columns=["amount"], filter="amount < 10")``);
   * ``two_columns``: ``SELECT id, amount FROM t`` (anchor: ``to_table(columns=["id", "amount"])``);
   * ``count``: ``SELECT count(*) FROM t`` (anchor: ``count_rows()``), with what an earlier
     process that read the table kept on this machine: the base fragments' key runs
     (``memwal_query.key_runs``), each region's generations ranked
     (``memwal_query.snapshot.kept_ranks``) and the snapshot's whole base mask (``memwal_query.kept_masks``;
     one untimed process counts the table first; every child but ``count_runs``' and
     ``count_cold``'s shares that cache directory): a table nobody wrote to since;
   * ``count_written``: the same, starting from what a process that counted an eventual snapshot
     (no WAL tail) kept (a copy per process): a table written to since (the WAL tail), whose
     mask kept is brought up to the new keys;
   * ``count_runs``: the same with the key runs kept but no mask and no ranking (a copy of the
     key runs alone per process): a base changed since (a merge), whose unchanged data files'
     runs are kept (the generations left unmerged are another set: their ranking is not);
   * ``count_cold``: the same in a process with nothing kept (an empty cache directory: the
     first process to read the base fragments since they were written);
   * ``pk_lookup``: ``SELECT * FROM t WHERE id = X`` (anchor: ``to_table(filter="id = X")``,
     which uses the BTREE index).
3. Checks every memwal answer against an independent oracle (numpy over the levels'
   rows: newest version per key, tombstones dropped), prints medians, spreads and
   ratios, and writes them with PASS/MISS against the targets to ``--out``.

``python benchmarks/bench_first_query.py --sizes 200000 --repeat 3`` takes about a minute.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
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
BENCH = Path(__file__).resolve().parent
for p in (str(REPO), str(BENCH)):
    if p not in sys.path:
        sys.path.insert(0, p)

QUERIES: dict[str, tuple[str, str]] = {  # name -> (our SQL, description of the anchor)
    "open": ("", "lance.dataset(uri)"),
    "filtered_agg": (
        "SELECT sum(amount) FROM t WHERE amount < 10",
        'to_table(columns=["amount"], filter="amount < 10")',
    ),
    "two_columns": ("SELECT id, amount FROM t", 'to_table(columns=["id", "amount"])'),
    "count": ("SELECT count(*) FROM t", "count_rows()"),
    "count_written": ("SELECT count(*) FROM t", "count_rows()"),
    "count_runs": ("SELECT count(*) FROM t", "count_rows()"),
    "count_cold": ("SELECT count(*) FROM t", "count_rows()"),
    "pk_lookup": ("SELECT * FROM t WHERE id = {x}", 'to_table(filter="id = X") (BTREE index)'),
}


# -- the child: one process, one system, one query --------------------------------------


def _child(system: str, uri: str, query: str, lookup_id: int, warm: int) -> dict[str, Any]:
    import datafusion  # noqa: F401 - imported before the clock starts, as lance is
    import lance
    import pyarrow.compute as pc

    import memwal_query as mq

    _ = mq.open_table  # memwal_query loads its modules (and Lance, DataFusion) on first use: not timed

    def run_memwal() -> tuple[Any, Any]:
        t = mq.open_table(uri, consistency="eventual" if query == WARM_WRITTEN else "strong")
        if query == "open":
            return t, None
        out = t.sql(QUERIES[query][0].format(x=lookup_id)).to_arrow_table()
        return t, out

    def run_lance() -> tuple[Any, Any]:
        ds = lance.dataset(uri)
        if query == "open":
            return ds, None
        if query == "filtered_agg":
            return ds, pc.sum(ds.to_table(columns=["amount"], filter="amount < 10").column(0))
        if query == "two_columns":
            return ds, ds.to_table(columns=["id", "amount"])
        if query in _COUNTS:
            return ds, ds.count_rows()
        return ds, ds.to_table(filter=f"id = {lookup_id}")

    t0 = time.perf_counter()
    handle, out = (run_memwal if system == "memwal" else run_lance)()
    first = (time.perf_counter() - t0) * 1000
    warm_ms = []
    for _ in range(warm if query != "open" else 0):
        t1 = time.perf_counter()
        if system == "memwal":
            handle.sql(QUERIES[query][0].format(x=lookup_id)).to_arrow_table()
        else:
            run_lance()
        warm_ms.append((time.perf_counter() - t1) * 1000)
    return {"first_ms": first, "warm_ms": warm_ms, "value": _summary(query, out)}


def _summary(query: str, out: Any) -> Any:
    if out is None:
        return None
    if isinstance(out, int):
        return out
    if query == "filtered_agg":
        v = out.column(0)[0].as_py() if hasattr(out, "column") else out.as_py()
        return round(float(v), 4)
    if query in _COUNTS:
        return int(out.column(0)[0].as_py())
    if query == "pk_lookup":
        return [round(float(a), 4) for a in out.column("amount").to_pylist()]
    return int(out.num_rows)


_COUNTS = {
    "count": "key runs and mask kept",
    "count_written": "mask kept before the WAL tail",
    "count_runs": "key runs kept",
    "count_cold": "none kept",
}
WARM_WRITTEN = "count_eventual"
"""The untimed process that keeps what ``count_written`` starts from: an eventual snapshot's count
(no WAL tail), as a process that read the table before its last writes."""
QUERIES[WARM_WRITTEN] = QUERIES["count"]
TIMED = tuple(q for q in QUERIES if q != WARM_WRITTEN)
"""The queries timed (all but the untimed warm-up)."""


@functools.cache
def kept_dir(kind: str) -> str:
    """A directory of what earlier processes kept on this machine, made on first use (by the
    parent only: children are given theirs) and removed at exit. ``"kept"``: key runs and whole
    base masks, which every child but ``count_written``'s, ``count_runs``' and ``count_cold``'s
    shares, warmed by one untimed process per table, as on a machine that read the table once
    before; ``"written"``: what a process that read the table before its WAL tail was written
    kept (:data:`WARM_WRITTEN`), copied for each ``count_written`` child."""
    path = tempfile.mkdtemp(prefix=f"memwal-bench-{kind}-")
    atexit.register(shutil.rmtree, path, True)
    return path


def run_child(system: str, uri: str, query: str, lookup_id: int, warm: int) -> dict[str, Any]:
    """One fresh process; its JSON result. ``count_cold`` starts with nothing kept (the first
    process to read the table's base fragments since they were written); ``count_runs`` with a
    copy of the key runs kept, and no mask."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", system, uri, query, str(lookup_id), str(warm)]
    with tempfile.TemporaryDirectory(prefix="memwal-bench-cold-") as cold:
        from memwal_query import key_runs  # the folder of key runs in a cache directory

        kept, written = kept_dir("kept"), kept_dir("written")
        if query == "count_runs" and Path(kept, key_runs.KIND).is_dir():
            shutil.copytree(Path(kept, key_runs.KIND), Path(cold, key_runs.KIND))
        if query == "count_written":
            shutil.copytree(written, cold, dirs_exist_ok=True)
        own = {"count_written": cold, "count_runs": cold, "count_cold": cold, WARM_WRITTEN: written}
        env = {**os.environ, "MEMWAL_CACHE_DIR": own.get(query, kept)}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


# -- the oracle ----------------------------------------------------------------------------


def oracle(uri: str, lookup_id: int) -> dict[str, Any]:
    """Count, sum(amount < 10) and the lookup row from numpy over every level's rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    import memwal_query as mq
    from memwal_query.format.wal import GEN_COLUMN, SEQ_COLUMN

    snap = mq.open_table(uri).snapshot
    cols = ["id", "amount"]
    parts = []
    for region in snap.regions:
        for g in region.generations:
            t = g.dataset.to_table(columns=[*cols, "_tombstone"], with_row_address=True)
            parts.append(
                pa.table(
                    {
                        **{c: t.column(c) for c in cols},
                        "_tombstone": pc.fill_null(t.column("_tombstone"), False),
                        "_gen": pa.array(np.full(t.num_rows, g.generation, np.int64)),
                        "_pos": t.column("_rowaddr"),
                    }
                )
            )
        if region.memtable is not None:
            m = region.memtable.table
            parts.append(
                pa.table(
                    {
                        **{c: m.column(c) for c in cols},
                        "_tombstone": pc.fill_null(m.column("_tombstone"), False),
                        "_gen": m.column(GEN_COLUMN),
                        "_pos": m.column(SEQ_COLUMN).cast(pa.uint64()),
                    }
                )
            )
    newer = pa.concat_tables(parts)
    # newest version per key among the newer levels: highest generation, then latest position
    s = newer.take(pc.sort_indices(newer, [("id", "ascending"), ("_gen", "descending"), ("_pos", "descending")]))
    ids = s.column("id").to_numpy()
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    newest = s.filter(pa.array(first))
    live_newer = newest.filter(pc.invert(newest.column("_tombstone")))
    base = snap.base.to_table(columns=cols)
    base_ids = base.column("id").to_numpy()
    base_live = ~np.isin(base_ids, newest.column("id").to_numpy())
    amounts = np.concatenate([base.column("amount").to_numpy()[base_live], live_newer.column("amount").to_numpy()])
    all_ids = np.concatenate([base_ids[base_live], live_newer.column("id").to_numpy()])
    live = int(base_live.sum()) + live_newer.num_rows
    return {
        "count": live,
        "filtered_agg": round(float(amounts[amounts < 10].sum()), 4),
        "two_columns": live,
        "pk_lookup": [round(float(a), 4) for a in amounts[all_ids == lookup_id]],
    }


# -- the parent ----------------------------------------------------------------------------


def spread(runs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs)}


def bench_size(
    uri: str, lookup_id: int, repeat: int, warm: int, seed: int, queries: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Each of ``queries``, ``repeat`` rounds of fresh processes, memwal and pylance interleaved."""
    want = oracle(uri, lookup_id)
    run_child("memwal", uri, "count", lookup_id, 0)  # keeps the key runs and the whole mask: not timed
    run_child("memwal", uri, WARM_WRITTEN, lookup_id, 0)  # keeps them for the keys before the WAL tail
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    for q in queries or TIMED:
        runs: dict[str, list[dict[str, Any]]] = {"memwal": [], "lance": []}
        for _ in range(repeat):
            order = ["memwal", "lance"]
            rng.shuffle(order)
            for system in order:
                runs[system].append(run_child(system, uri, q, lookup_id, warm))
        asked = "count" if q in _COUNTS else q
        for r in runs["memwal"]:
            if asked in want and r["value"] != want[asked]:
                msg = f"wrong answer: {q} = {r['value']!r}, oracle {want[asked]!r} ({uri})"
                raise AssertionError(msg)
        row: dict[str, Any] = {}
        for system, rs in runs.items():
            row[system] = {
                "first_ms": spread([r["first_ms"] for r in rs]),
                "first_runs_ms": [r["first_ms"] for r in rs],
            }
            warm_runs = [w for r in rs for w in r["warm_ms"]]
            if warm_runs:
                row[system]["warm_ms"] = spread(warm_runs)
        row["first_ratio"] = row["memwal"]["first_ms"]["median"] / row["lance"]["first_ms"]["median"]
        if "warm_ms" in row["memwal"]:
            row["warm_ratio"] = row["memwal"]["warm_ms"]["median"] / row["lance"]["warm_ms"]["median"]
        out[q] = row
        m, a = row["memwal"]["first_ms"], row["lance"]["first_ms"]
        print(
            f"  {q:13s} first: memwal {m['median']:8.1f} ms [{m['min']:.0f}-{m['max']:.0f}]  "
            f"pylance {a['median']:8.1f} ms [{a['min']:.0f}-{a['max']:.0f}]  ratio {row['first_ratio']:.2f}x"
            + (f"  warm ratio {row['warm_ratio']:.2f}x" if "warm_ratio" in row else ""),
            flush=True,
        )
    return out


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for size, r in results.items():
        for q in ("filtered_agg", "two_columns"):  # pk_lookup: reported, no target (open dominates)
            if q not in r:
                continue
            v = r[q]["first_ratio"]
            out.append({"target": f"{size}: fresh open + {q} <= 2x pylance on the base", "value": v, "limit": 2.0})
        for q, kept in _COUNTS.items():
            if q not in r:
                continue
            v = r[q]["memwal"]["first_ms"]["median"]
            out.append({"target": f"{size}: fresh open + count(*) <= 50 ms ({kept})", "value": v, "limit": 50.0})
    sizes = sorted(results, key=int)
    if len(sizes) > 1 and all("open" in results[s] for s in sizes):
        small, big = results[sizes[0]], results[sizes[-1]]
        v = big["open"]["memwal"]["first_ms"]["median"] / small["open"]["memwal"]["first_ms"]["median"]
        out.append({"target": f"open at {sizes[-1]} rows <= 1.25x open at {sizes[0]} rows", "value": v, "limit": 1.25})
    for t in out:
        t["pass"] = t["value"] <= t["limit"]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[2_000_000, 20_000_000], help="base rows")
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--newer-rows", type=int, default=200_000, help="upserts over all flushed generations")
    p.add_argument("--generations", type=int, default=4, help="flushed generations per region (first merged)")
    p.add_argument("--tail-rows", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=5, help="fresh processes per system and query")
    p.add_argument("--warm", type=int, default=3, help="warm repeats of the query inside each process")
    p.add_argument("--dir", help="keep (and reuse) the tables here; default: a temp dir removed afterwards")
    p.add_argument("--queries", nargs="+", choices=TIMED, help="default: all")
    p.add_argument("--out", default=str(BENCH / "results" / "first_query.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        system, uri, query, lookup_id, warm = sys.argv[2:7]
        print(json.dumps(_child(system, uri, query, int(lookup_id), int(warm))))
        return
    args = parse_args(argv)
    from bench_read import BuildParams, ensure_table, machine_info

    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or tmp
        results: dict[str, Any] = {}
        for size in args.sizes:
            params = BuildParams(
                size, args.regions, args.newer_rows, args.generations, args.tail_rows, args.seed, key_index=True
            )
            uri, info, _ = ensure_table(root, params)
            print(f"base {size:,} rows: {uri}", flush=True)
            results[str(size)] = bench_size(
                uri, int(info["lookup_id"]), args.repeat, args.warm, args.seed, args.queries and tuple(args.queries)
            )
    goals = targets(results)
    for t in goals:
        print(f"  {'PASS' if t['pass'] else 'MISS'}  {t['target']}: {t['value']:.2f} (limit {t['limit']})")
    doc = {
        "machine": machine_info(),
        "params": {k: v for k, v in vars(args).items() if k not in ("dir", "out")},
        "queries": {q: {"memwal": sql, "anchor": anchor} for q, (sql, anchor) in QUERIES.items()},
        "results": results,
        "targets": goals,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
