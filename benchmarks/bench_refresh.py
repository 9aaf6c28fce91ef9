"""Refreshing a snapshot of a table with many unmerged generations: the cost must follow
what changed, not how many generations there are.

What it does
------------
1. For each ``--generations`` size, builds a table (``--base-rows`` rows, ``--regions`` bucket
   regions) and flushes generations the way a stream of small ``write_arrow`` calls does:
   one row per region per call, one generation per region per call, none merged.
2. Measures, interleaved round by round (``--repeat`` rounds): ``Table.refresh()`` with
   nothing written; a refresh after one row was put into one region's WAL tail (a writer
   kept open); and the anchors a user would otherwise pay: a new ``open_table`` and
   pylance's ``lance.dataset(uri)`` (the base alone). Every refreshed table's row count is
   checked against a fresh open's.
3. Target: a refresh with nothing new costs at most a quarter of a fresh ``open_table``
   at every size (it re-read every generation's folder and re-ranked every key before).

``python benchmarks/bench_refresh.py --dir /tmp/memwal-refresh`` keeps the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for p in (str(REPO), str(BENCH)):
    if p not in sys.path:
        sys.path.insert(0, p)

import memwal_query as mq  # noqa: E402  (first: it keeps Lance's log quiet)

# isort: split
import lance  # noqa: E402
import pyarrow as pa  # noqa: E402
from bench_first_query import spread  # noqa: E402
from bench_open_large import SCHEMA  # noqa: E402
from bench_read import machine_info  # noqa: E402

from memwal_write import RoutedWriter, write_arrow  # noqa: E402


def _rows(ids: list[int], tag: float) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "amount": [tag + i % 97 for i in ids]}, SCHEMA)


def _keys_by_region(uri: str, start: int, count: int) -> list[list[int]]:
    """Keys ``start .. start + count`` grouped by the region each routes to."""
    with RoutedWriter.open(uri) as w:
        candidates = pa.table({"id": pa.array(range(start, start + count), pa.int64())})
        regions = w.region_values(candidates).column(0).to_pylist()
    groups: dict[object, list[int]] = {}
    for key, region in zip(candidates.column("id").to_pylist(), regions, strict=True):
        groups.setdefault(region, []).append(key)
    return [groups[r] for r in sorted(groups, key=str)]


def build(uri: str, a: argparse.Namespace, generations: int) -> list[int]:
    """The table with ``generations`` unmerged generations (one per region per write_arrow
    call); returns keys of one region that were never written (for the timed puts)."""
    t0 = time.perf_counter()
    lance.write_dataset(_rows(list(range(a.base_rows)), 0.0), uri).initialize_mem_wal(
        bucket_column="id", num_buckets=a.regions
    )
    calls = -(-generations // a.regions)
    groups = _keys_by_region(uri, a.base_rows, 2 * a.regions * (calls + a.repeat) + 64)
    if len(groups) != a.regions or min(len(g) for g in groups) < calls + a.repeat:
        raise AssertionError("too few candidate keys per region")
    for call in range(calls):
        write_arrow(uri, _rows([g[call] for g in groups], float(call)))
    print(f"  {calls * a.regions:,} generations in {time.perf_counter() - t0:.1f} s", flush=True)
    return groups[0][calls : calls + a.repeat]


def measure(uri: str, a: argparse.Namespace, keys: list[int]) -> dict[str, Any]:
    """Interleaved rounds of refreshes and fresh opens, in milliseconds."""
    table = mq.open_table(uri).refresh()
    times: dict[str, list[float]] = {"refresh_nothing_new": [], "refresh_after_one_put": [], "open_table": []}
    times["lance_dataset"] = []
    with RoutedWriter.open(uri) as writer:

        def timed(name: str, fn: Callable[[], Any]) -> Any:
            t0 = time.perf_counter()
            out = fn()
            times[name].append((time.perf_counter() - t0) * 1000)
            return out

        for r in range(a.repeat):
            table = timed("refresh_nothing_new", table.refresh)
            writer.put(_rows([keys[r]], 1e6))  # one region's WAL tail
            table = timed("refresh_after_one_put", table.refresh)
            fresh = timed("open_table", lambda: mq.open_table(uri))
            timed("lance_dataset", lambda: lance.dataset(uri))
            if table.count_rows() != fresh.count_rows():
                raise AssertionError(f"refreshed {table.count_rows()} rows, a fresh open {fresh.count_rows()}")
    generations = sum(len(r.generations) for r in table.snapshot.regions)
    out: dict[str, Any] = {"generations": generations, "ms": {k: spread(v) for k, v in times.items()}}
    opened = out["ms"]["open_table"]["median"]
    out["ratios"] = {
        "refresh_nothing_new_vs_open": out["ms"]["refresh_nothing_new"]["median"] / opened,
        "refresh_after_one_put_vs_open": out["ms"]["refresh_after_one_put"]["median"] / opened,
    }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--generations", default="50,200,800", help="sizes: unmerged generations in all")
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--base-rows", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=10, help="interleaved rounds per size")
    p.add_argument("--dir", help="keep (and reuse) the tables here")
    p.add_argument("--out", default=str(BENCH / "results" / "refresh.json"))
    a = p.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in a.generations.split(",")):
            folder = Path(a.dir or tmp) / f"refresh-g{size}-r{a.regions}-b{a.base_rows}"
            uri, done = str(folder / "table"), folder / "built.json"
            if not done.exists():
                folder.mkdir(parents=True, exist_ok=True)
                print(f"building {uri} ...", flush=True)
                done.write_text(json.dumps(build(uri, a, size)))
            results[str(size)] = got = measure(uri, a, json.loads(done.read_text()))
            ms = got["ms"]
            print(
                f"  {got['generations']:,} generations: refresh {ms['refresh_nothing_new']['median']:.1f} ms, "
                f"after a put {ms['refresh_after_one_put']['median']:.1f} ms, open_table "
                f"{ms['open_table']['median']:.1f} ms, lance.dataset {ms['lance_dataset']['median']:.1f} ms",
                flush=True,
            )
    goals = []
    for size, got in results.items():
        value = got["ratios"]["refresh_nothing_new_vs_open"]
        target = f"refresh with nothing new <= 0.25x a fresh open_table ({got['generations']} generations)"
        goals.append({"target": target, "value": value, "limit": 0.25, "pass": value <= 0.25, "size": size})
    for g in goals:
        print(f"  {'PASS' if g['pass'] else 'MISS'}  {g['target']}: {g['value']:.2f}")
    doc = {
        "machine": machine_info(),
        "params": {k: v for k, v in vars(a).items() if k not in ("dir", "out")},
        "results": results,
        "targets": goals,
    }
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
