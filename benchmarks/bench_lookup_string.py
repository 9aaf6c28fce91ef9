"""Point lookups on a string primary key, against the base table's own BTREE index.

A table written with pylance's writer: a base with a BTREE index on ``key`` (strings
``u00000042``), ``rounds`` rounds of skewed upserts and deletes (one flushed generation
per region each), then a WAL tail (writers left open). Measured in one run, interleaved:

* single-key lookups: ``Table.lookup(k)`` (the region's key dict, built once per
  snapshot) vs the previous way of finding a string key in the key index (a hash join of
  the region's newer keys per call: ``merge._MAP_PROBE_MAX = 0``) vs
  ``lance.dataset(uri).to_table(filter="key = 'k'")`` on the base;
* 1,000 keys in one call (dict and hash join) vs one base ``key IN (...)`` query.

Every answer is checked first against the rows written (a dict kept while writing) and
the base rows. ``python benchmarks/bench_lookup_string.py`` writes
``results/lookup_string.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import evaluate_sharding_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_read import machine_info  # noqa: E402
from lookup_levels import _OPEN_WRITERS, interleaved, make_rows, skewed_keys  # noqa: E402

import memwal_query as mq  # noqa: E402
import memwal_query.merge as merge_module  # noqa: E402
from memwal_query.demo import bucket_region_id  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}


def _name(k: int) -> str:
    return f"u{k:08d}"


def rows(rng: np.random.Generator, ids: np.ndarray, tag: int) -> pa.Table:
    """``lookup_levels.make_rows`` with the integer key replaced by its string name."""
    t = make_rows(rng, ids, tag).drop_columns(["id"])
    key = pa.array([_name(int(k)) for k in ids], pa.string())
    return t.add_column(0, pa.field("key", pa.string(), nullable=False, metadata=PK), key)


def _route(ds: lance.LanceDataset, t: pa.Table) -> dict[int, pa.Table]:
    spec = ds.mem_wal_index_details()["sharding_specs"][0]
    batch = t.select(["key"]).combine_chunks().to_batches()[0]
    buckets = evaluate_sharding_spec(batch, spec, ds.lance_schema).column(0).to_numpy()
    return {int(b): t.filter(pa.array(buckets == b)) for b in np.unique(buckets)}


def build(uri: str, base_rows: int, regions: int, rounds: int, round_rows: int, tail_rows: int) -> dict[str, Any]:
    """Write the table; returns the model of the keys written after the base: key -> amount (None: deleted)."""
    rng = np.random.default_rng(3)
    ds = lance.write_dataset(rows(rng, np.arange(base_rows), 0), uri)
    ds.create_scalar_index("key", "BTREE")
    lance.dataset(uri).initialize_mem_wal(bucket_column="key", num_buckets=regions, max_memtable_rows=10**7)
    ds = lance.dataset(uri)
    model: dict[str, Any] = {}
    space = int(base_rows * 1.2)
    for r in range(rounds + 1):
        n = round_rows if r < rounds else tail_rows
        ids = skewed_keys(rng, n, space)
        dels = np.setdiff1d(skewed_keys(rng, max(1, n // 50), space), ids)
        writers = {b: ds.mem_wal_writer(bucket_region_id(b), max_memtable_rows=10**7) for b in range(regions)}
        for b, part in _route(ds, rows(rng, ids, r + 1)).items():
            writers[b].put(part)
        for b, part in _route(ds, pa.table({"key": [_name(int(k)) for k in dels]})).items():
            writers[b].delete(part)
        if r < rounds:
            for w in writers.values():
                w.close()  # one flushed generation per region
        else:
            _OPEN_WRITERS.extend(writers.values())  # the WAL tail
        model.update({_name(int(k)): float(k % 1000 + (r + 1) * 10_000) for k in ids})
        model.update({_name(int(k)): None for k in dels})
    return model


def _in(keys: list[str]) -> str:
    return f"key IN ({', '.join(repr(k) for k in keys)})"


def check(table: mq.Table, base: lance.LanceDataset, model: dict[str, Any], keys: list[str]) -> None:
    """Stop unless ``Table.lookup`` equals the model (keys written later) or the base row, both ways of finding keys."""
    in_base = {r["key"]: r["amount"] for r in base.to_table(columns=["key", "amount"], filter=_in(keys)).to_pylist()}
    want = {k: (model[k] if k in model else in_base.get(k)) for k in keys}
    want = {k: v for k, v in want.items() if v is not None}
    for probe_max in (0, merge_module._MAP_PROBE_MAX):
        saved, merge_module._MAP_PROBE_MAX = merge_module._MAP_PROBE_MAX, probe_max
        try:
            got = {r["key"]: r["amount"] for r in table.lookup(keys, columns=["key", "amount"]).to_pylist()}
        finally:
            merge_module._MAP_PROBE_MAX = saved
        if got != want:
            bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[:5]
            raise AssertionError(f"lookup differs from the rows written at keys {bad}")


def _joined(table: mq.Table, keys: Any) -> pa.Table:
    """A lookup with the key index searched by a hash join per call (the code before the key dict)."""
    saved, merge_module._MAP_PROBE_MAX = merge_module._MAP_PROBE_MAX, 0
    try:
        return table.lookup(keys)
    finally:
        merge_module._MAP_PROBE_MAX = saved


def measure(uri: str, model: dict[str, Any], base_rows: int, lookups: int, batch_repeat: int) -> dict[str, Any]:
    """Single keys and 1,000 keys: ours (dict, hash join) against the base's BTREE index."""
    t0 = time.perf_counter()
    table = mq.open_table(uri)
    open_s = time.perf_counter() - t0
    base = lance.dataset(uri)
    rng = np.random.default_rng(11)
    newer = sorted(model)
    keys = [str(k) for k in rng.choice(newer, lookups // 2, replace=False)]  # half with a newer version
    keys += [_name(int(k)) for k in rng.choice(int(base_rows * 1.2), lookups - len(keys), replace=False)]
    keys = [str(k) for k in rng.permutation(keys)]
    batch = [_name(int(k)) for k in rng.choice(int(base_rows * 1.2), 1000, replace=False)]
    check(table, base, model, keys[:200])
    check(table, base, model, batch)
    single = interleaved(
        {
            "ours": lambda k: table.lookup(k),
            "ours_hash_join": lambda k: _joined(table, k),
            "base_btree": lambda k: base.to_table(filter=f"key = '{k}'"),
        },
        keys,
    )
    many = interleaved(
        {
            "ours": lambda b: table.lookup(b),
            "ours_hash_join": lambda b: _joined(table, b),
            "base_btree_in": lambda b: base.to_table(filter=_in(b)),
        },
        [batch] * batch_repeat,
    )
    merge = table.view.merge
    return {
        "open_s": open_s,
        "generations": sum(len(r.generations) for r in table.view.snapshot.regions),
        "unmerged_rows": sum(s.newer_rows for s in merge.region_stats.values()),
        "newer_keys": len(merge.newer),
        "newer_keys_index_mb": merge.newer.nbytes / 2**20,
        "wal_tail_rows": sum(r.memtable.table.num_rows for r in table.view.snapshot.regions if r.memtable),
        "single": single,
        "single_ratio_p50": single["ours"]["p50_ms"] / single["base_btree"]["p50_ms"],
        "single_hash_join_ratio_p50": single["ours_hash_join"]["p50_ms"] / single["base_btree"]["p50_ms"],
        "batch_1000": many,
        "batch_ratio_p50": many["ours"]["p50_ms"] / many["base_btree_in"]["p50_ms"],
        "batch_hash_join_ratio_p50": many["ours_hash_join"]["p50_ms"] / many["base_btree_in"]["p50_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=300_000)
    p.add_argument("--regions", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--round-rows", type=int, default=20_000)
    p.add_argument("--tail-rows", type=int, default=5_000)
    p.add_argument("--lookups", type=int, default=1000)
    p.add_argument("--batch-repeat", type=int, default=15)
    p.add_argument("--root", default="/tmp/memwal-bench-lookup-string")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "lookup_string.json"))
    a = p.parse_args(argv)
    params = {k: getattr(a, k) for k in ("base_rows", "regions", "rounds", "round_rows", "tail_rows")}
    root = Path(a.root)
    root.mkdir(parents=True, exist_ok=True)
    uri = str(root / ("strings_" + "_".join(str(v) for v in params.values()) + f"_{time.time_ns()}"))
    t0 = time.perf_counter()
    model = build(uri, **params)
    print(f"built {uri} in {time.perf_counter() - t0:.1f} s", flush=True)
    res: dict[str, Any] = {
        "machine": machine_info(),
        "params": params | {"lookups": a.lookups, "batch_repeat": a.batch_repeat},
    }
    res |= measure(uri, model, a.base_rows, a.lookups, a.batch_repeat)
    res["targets"] = [
        {"target": f"string keys: {what}", "value": res[key], "limit": limit, "unit": "x", "pass": res[key] <= limit}
        for what, key, limit in [
            ("single lookup p50 vs base BTREE", "single_ratio_p50", 1.5),
            ("1000 keys vs one base IN query", "batch_ratio_p50", 3.0),
        ]
    ]
    Path(a.out).write_text(json.dumps(res, indent=1))
    s, m = res["single"], res["batch_1000"]
    print(
        f"string keys, {res['generations']} generations + {res['wal_tail_rows']} WAL tail rows:\n"
        f"  single p50 ours {s['ours']['p50_ms']:.2f} ms (hash join {s['ours_hash_join']['p50_ms']:.2f}),"
        f" base BTREE {s['base_btree']['p50_ms']:.2f} ms: {res['single_ratio_p50']:.2f}x (target <= 1.5x)\n"
        f"  1,000 keys p50 ours {m['ours']['p50_ms']:.1f} ms (hash join {m['ours_hash_join']['p50_ms']:.1f}),"
        f" base IN {m['base_btree_in']['p50_ms']:.1f} ms: {res['batch_ratio_p50']:.2f}x (target <= 3x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
