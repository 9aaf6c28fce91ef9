"""Point lookups on tables with many LSM levels, against the base table's own BTREE index.

Used by ``bench_lookup_knn.py``. Two tables written with pylance's writer:

* **levels**: a base with a BTREE index on ``id``, ``rounds`` rounds of upserts and deletes
  (one flushed generation per region each, keys skewed: a Zipf-like draw hits a hot set of
  keys in round after round), then a WAL tail (writers left open);
* **lagging merger**: a smaller base, then ``>= 100`` generations holding ``>= 1M``
  unmerged rows (nothing merged), then a WAL tail.

Rows carry a 16-d vector from a Gaussian mixture (realistic row width). Per table, with
the anchor measured in the same run and interleaved (a, b, b, a, ...):

* single-key lookups: ``Table.lookup(k)`` vs ``lance.dataset(uri).to_table(filter="id = k")``
  on the base (its BTREE index), p50 / p95 over the same keys;
* 1,000 keys: one ``Table.lookup`` call vs one base ``id IN (...)`` query, repeated;
* a fresh process: ``open_table`` + its first lookup vs ``lance.dataset`` + its first
  filtered read (each in its own interpreter, times taken inside it).

Every answer of ours is checked first against the base rows and the rows written (a dict
kept while writing; the benchmark stops on a difference).
"""

from __future__ import annotations

import json
import os
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
from lance.mem_wal import ShardWriter, evaluate_sharding_spec

import memwal_query as mq
from memwal_query.demo import bucket_region_id

PK = {"lance-schema:unenforced-primary-key": "true"}
DIM = 16
_OPEN_WRITERS: list[ShardWriter] = []  # WAL tail writers: never closed (closing flushes)


def schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("vec", pa.list_(pa.float32(), DIM)),
        ]
    )


def make_rows(rng: np.random.Generator, ids: np.ndarray, tag: int) -> pa.Table:
    """Rows for ``ids``; vectors from a 32-component Gaussian mixture."""
    centers = np.random.default_rng(99).standard_normal((32, DIM)).astype(np.float32) * 4
    comp = rng.integers(0, 32, len(ids))
    v = centers[comp] + rng.standard_normal((len(ids), DIM)).astype(np.float32)
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "cat": np.array(["a", "b", "c", "d"])[comp % 4],
            "amount": (ids % 1000).astype(np.float64) + tag * 10_000,
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), DIM),
        },
        schema=schema(),
    )


def skewed_keys(rng: np.random.Generator, n: int, space: int) -> np.ndarray:
    """``n`` distinct keys of ``[0, space)``, Zipf-skewed (a hot set recurs across rounds)."""
    draw = np.unique(rng.zipf(1.3, n * 4) - 1)
    hot = np.random.default_rng(5).permutation(space)[draw[draw < space]]
    cold = rng.choice(space, n, replace=False)
    keys = np.unique(np.concatenate([hot[: n // 2], cold]))
    return np.sort(rng.permutation(keys)[:n])


def _route(ds: lance.LanceDataset, t: pa.Table) -> dict[int, pa.Table]:
    spec = ds.mem_wal_index_details()["sharding_specs"][0]
    batch = t.select(["id"]).combine_chunks().to_batches()[0]
    buckets = evaluate_sharding_spec(batch, spec, ds.lance_schema).column(0).to_numpy()
    return {int(b): t.filter(pa.array(buckets == b)) for b in np.unique(buckets)}


def _round(ds: lance.LanceDataset, regions: int, upserts: pa.Table, deletes: np.ndarray, *, close: bool) -> None:
    writers = {b: ds.mem_wal_writer(bucket_region_id(b), max_memtable_rows=10**7) for b in range(regions)}
    for b, part in _route(ds, upserts).items():
        for off in range(0, part.num_rows, 20_000):
            writers[b].put(part.slice(off, 20_000))
    if deletes.size:
        for b, part in _route(ds, pa.table({"id": pa.array(deletes, pa.int64())})).items():
            writers[b].delete(part)
    if close:
        for w in writers.values():
            w.close()  # one flushed generation per region
    else:
        _OPEN_WRITERS.extend(writers.values())


def build(uri: str, base_rows: int, regions: int, rounds: int, round_rows: int, tail_rows: int) -> dict[int, Any]:
    """Write the table; returns the model of the keys written after the base: key -> amount (None: deleted)."""
    rng = np.random.default_rng(3)
    ds = lance.write_dataset(make_rows(rng, np.arange(base_rows), 0), uri)
    ds.create_scalar_index("id", "BTREE")
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=regions, max_memtable_rows=10**7)
    ds = lance.dataset(uri)
    model: dict[int, Any] = {}
    space = int(base_rows * 1.2)
    for r in range(rounds + 1):
        n = round_rows if r < rounds else tail_rows
        if n == 0:
            continue
        ids = skewed_keys(rng, n, space)
        dels = np.setdiff1d(skewed_keys(rng, max(1, n // 50), space), ids)
        _round(ds, regions, make_rows(rng, ids, r + 1), dels, close=r < rounds)
        model.update({int(k): float(k % 1000 + (r + 1) * 10_000) for k in ids})
        model.update({int(k): None for k in dels})
    return model


def check(table: mq.Table, base: lance.LanceDataset, model: dict[int, Any], keys: list[int]) -> None:
    """Stop unless ``Table.lookup`` equals the model (keys written later) or the base row."""
    got = {r["id"]: r["amount"] for r in table.lookup(keys, columns=["id", "amount"]).to_pylist()}
    in_base = {r["id"]: r["amount"] for r in base.to_table(columns=["id", "amount"], filter=_in(keys)).to_pylist()}
    want = {k: (model[k] if k in model else in_base.get(k)) for k in keys}
    want = {k: v for k, v in want.items() if v is not None}
    if got != want:
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[:5]
        raise AssertionError(f"lookup differs from the rows written at keys {bad}")


def _in(keys: list[int]) -> str:
    return f"id IN ({', '.join(map(str, keys))})"


def interleaved(fns: dict[str, Callable[[Any], Any]], args: list[Any]) -> dict[str, dict[str, float]]:
    """Each argument through every function in turn (order alternating); p50 / p95 / spread in ms."""
    for fn in fns.values():
        fn(args[0])  # warm-up
    runs: dict[str, list[float]] = {n: [] for n in fns}
    order = list(fns.items())
    for i, x in enumerate(args):
        for name, fn in order if i % 2 == 0 else reversed(order):
            t0 = time.perf_counter()
            fn(x)
            runs[name].append((time.perf_counter() - t0) * 1000)
    out = {}
    for name, ts in runs.items():
        ts.sort()
        q = statistics.quantiles(ts, n=20) if len(ts) > 1 else [ts[0]] * 19
        out[name] = {"p50_ms": statistics.median(ts), "p5_ms": q[0], "p95_ms": q[18], "n": len(ts)}
    return out


_FRESH = """
import json, sys, time
t0 = time.perf_counter()
if sys.argv[1] == "ours":
    import memwal_query as mq
    t = mq.open_table(sys.argv[2])
    t1 = time.perf_counter()
    n = t.lookup(int(sys.argv[3])).num_rows
else:
    import lance
    ds = lance.dataset(sys.argv[2])
    t1 = time.perf_counter()
    n = ds.to_table(filter="id = " + sys.argv[3]).num_rows
t2 = time.perf_counter()
print(json.dumps({"open_ms": (t1 - t0) * 1000, "first_ms": (t2 - t1) * 1000, "rows": n}))
"""


def fresh(uri: str, keys: list[int]) -> dict[str, Any]:
    """Open + first lookup in a new interpreter (imports excluded from neither: both import)."""
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "base_btree": []}
    root = str(Path(__file__).resolve().parents[1])
    for i, k in enumerate(keys):
        for name in ("ours", "base_btree") if i % 2 == 0 else ("base_btree", "ours"):
            proc = subprocess.run(
                [sys.executable, "-c", _FRESH, name, uri, str(k)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": root},
            )
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {
        n: {m: statistics.median(r[m] for r in rs) for m in ("open_ms", "first_ms")} | {"n": len(rs)}
        for n, rs in runs.items()
    }


def measure(
    uri: str,
    model: dict[int, Any],
    base_rows: int,
    lookups: int,
    batch_repeat: int,
    batch_keys: int = 1000,
    fresh_runs: int = 6,
) -> dict[str, Any]:
    """Single keys, ``batch_keys`` keys in one call and ``fresh_runs`` fresh processes each,
    ours against the base's BTREE index."""
    t0 = time.perf_counter()
    table = mq.open_table(uri)
    open_s = time.perf_counter() - t0
    base = lance.dataset(uri)
    rng = np.random.default_rng(11)
    newer = sorted(model)
    # half the keys have a newer version (skewed writes), half only a base row (or none)
    keys = [int(k) for k in rng.choice(newer, lookups // 2, replace=False)]
    keys += [int(k) for k in rng.choice(int(base_rows * 1.2), lookups - len(keys), replace=False)]
    keys = [int(k) for k in rng.permutation(keys)]
    batch = [int(k) for k in rng.choice(int(base_rows * 1.2), batch_keys, replace=False)]
    check(table, base, model, keys[:200])
    check(table, base, model, batch)
    single = interleaved(
        {"ours": lambda k: table.lookup(k), "base_btree": lambda k: base.to_table(filter=f"id = {k}")}, keys
    )
    stats = table.last_lookup_stats
    many = interleaved(
        {"ours": lambda b: table.lookup(b), "base_btree_in": lambda b: base.to_table(filter=_in(b))},
        [batch] * batch_repeat,
    )
    merge = table.view.merge
    return {
        "open_s": open_s,
        "merge_s": merge.seconds,
        "generations": sum(len(r.generations) for r in table.view.snapshot.regions),
        "unmerged_rows": sum(s.newer_rows for s in merge.region_stats.values()),
        "newer_keys": len(merge.newer),
        "newer_keys_index_mb": merge.newer.nbytes / 2**20,
        "wal_tail_rows": sum(r.memtable.table.num_rows for r in table.view.snapshot.regions if r.memtable),
        "single": single,
        "single_ratio_p50": single["ours"]["p50_ms"] / single["base_btree"]["p50_ms"],
        "batch_1000": many,
        "batch_ratio_p50": many["ours"]["p50_ms"] / many["base_btree_in"]["p50_ms"],
        "last_single_stats": {k: v for k, v in vars(stats).items() if k != "notes"} if stats else None,
        "fresh_process": fresh(uri, keys[:fresh_runs]),
    }


def run_table(
    root: Path,
    name: str,
    params: dict[str, int],
    lookups: int,
    batch_repeat: int,
    batch_keys: int = 1000,
    fresh_runs: int = 6,
) -> dict[str, Any]:
    """Build (or reuse: the model is kept next to the table) and measure one table."""
    uri = str(root / (name + "_" + "_".join(str(v) for v in params.values())))
    model_file = Path(uri + ".model.json")
    if not model_file.exists():
        t0 = time.perf_counter()
        model = build(uri, **params)
        model_file.write_text(json.dumps(model))
        print(f"built {uri} in {time.perf_counter() - t0:.1f} s", flush=True)
    else:  # the WAL tail stays in the WAL when its writers are gone: a reader replays it
        model = {int(k): v for k, v in json.loads(model_file.read_text()).items()}
    out = measure(uri, model, params["base_rows"], lookups, batch_repeat, batch_keys, fresh_runs)
    out["params"] = params
    return out
