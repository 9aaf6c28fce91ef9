"""The demo: write a MemWAL table with pylance's own writer, then query it merged.

Run ``python -m memwal_query.demo [DIR]``. It creates a small events table (base
rows, several flushed generations per region, updates, deletes, one generation
merged into the base, and a writer left open so its WAL tail is live), registers
the merged table in DataFusion, runs a few queries and prints ``explain()``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import datafusion
import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import ShardWriter, evaluate_sharding_spec

__all__ = ["events_schema", "write_demo_table", "bucket_region_id", "main"]

PK = {"lance-schema:unenforced-primary-key": "true"}
# Region naming convention for regions created from a bucket spec (FORMAT.md).
_REGION_NS = uuid.UUID("4c534d57-5249-5445-5f53-484152443031")


def bucket_region_id(bucket: int) -> str:
    """Deterministic region UUID for bucket ``bucket`` of a bucket spec."""
    return str(uuid.uuid5(_REGION_NS, f"bucket-{bucket}"))


def events_schema() -> pa.Schema:
    """Schema of the demo table: ``id`` (primary key), category, amount, ts."""
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("category", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("ts", pa.timestamp("us")),
        ]
    )


def _rows(rng: np.random.Generator, ids: np.ndarray, tag: int) -> pa.Table:
    n = len(ids)
    cats = np.array(["books", "games", "music", "sport", "tools"])
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "category": pa.array(cats[rng.integers(0, len(cats), n)]),
            "amount": pa.array(np.round(rng.random(n) * 100 + tag, 2)),
            "ts": pa.array(np.full(n, 1_700_000_000_000_000 + tag, dtype="datetime64[us]")),
        },
        schema=events_schema(),
    )


def _route(ds: lance.LanceDataset, table: pa.Table) -> dict[int, pa.Table]:
    details = ds.mem_wal_index_details()
    if details is None:
        msg = f"{ds.uri} has no MemWAL index"
        raise ValueError(msg)
    spec = details["sharding_specs"][0]
    batch = table.select(["id"]).combine_chunks().to_batches()[0]
    buckets = evaluate_sharding_spec(batch, spec, ds.lance_schema).column(0).to_numpy()
    return {int(b): table.filter(pa.array(buckets == b)) for b in np.unique(buckets)}


class _LazyWriters(dict[int, ShardWriter]):
    """One pylance region writer per bucket, opened on first use."""

    def __init__(self, ds: lance.LanceDataset, max_rows: int) -> None:
        super().__init__()
        self._ds = ds
        self._max_rows = max_rows

    def __missing__(self, bucket: int) -> ShardWriter:
        w = self._ds.mem_wal_writer(bucket_region_id(bucket), max_memtable_rows=self._max_rows)
        self[bucket] = w
        return w


@contextmanager
def _writers(ds: lance.LanceDataset, max_rows: int) -> Iterator[dict[int, ShardWriter]]:
    writers = _LazyWriters(ds, max_rows)
    try:
        yield writers
    finally:
        for w in writers.values():
            w.close()


def _put(writers: dict[int, ShardWriter], ds: lance.LanceDataset, table: pa.Table, chunk: int) -> None:
    for bucket, part in _route(ds, table).items():
        for off in range(0, part.num_rows, chunk):
            writers[bucket].put(part.slice(off, chunk))


def write_demo_table(
    uri: str,
    *,
    base_rows: int = 100_000,
    regions: int = 4,
    update_rows: int = 20_000,
    rounds: int = 3,
    memtable_rows: int = 5_000,
    seed: int = 0,
    leave_open: bool = False,
) -> str:
    """Write a demo MemWAL table with pylance's writer and return its URI.

    Args:
        uri: Where to create it (must not exist).
        base_rows: Rows in the base table (ids ``0 .. base_rows-1``).
        regions: Number of bucket regions (bucket spec on ``id``).
        update_rows: Upserted rows per round (updates and new ids).
        rounds: Write rounds; each closes its writers, flushing generations.
        memtable_rows: The writers' ``max_memtable_rows`` (smaller = more generations).
        seed: Random seed.
        leave_open: Leave a last round of writes in open writers' WAL (the
            writers are returned through :data:`OPEN_WRITERS` and stay open).

    Returns:
        ``uri``.
    """
    rng = np.random.default_rng(seed)
    ds = lance.write_dataset(_rows(rng, np.arange(base_rows), 0), uri)
    ds.initialize_mem_wal(bucket_column="id", num_buckets=regions, max_memtable_rows=memtable_rows)
    ds = lance.dataset(uri)
    chunk = max(1, min(memtable_rows, 10_000))
    for r in range(1, rounds + 1):
        with _writers(ds, memtable_rows) as writers:
            ids = rng.choice(base_rows + update_rows * rounds, size=update_rows, replace=False)
            _put(writers, ds, _rows(rng, np.sort(ids), r), chunk)
            dels = rng.choice(base_rows, size=max(1, update_rows // 50), replace=False)
            for bucket, part in _route(ds, pa.table({"id": pa.array(dels, pa.int64())})).items():
                writers[bucket].delete(part)
        if r == 1:
            _merge_first_generations(uri)
            ds = lance.dataset(uri)
    if leave_open:
        w: dict[int, ShardWriter] = {}
        for b in range(regions):
            w[b] = ds.mem_wal_writer(bucket_region_id(b), max_memtable_rows=memtable_rows)
        ids = rng.choice(base_rows, size=min(1000, base_rows), replace=False)
        _put(w, ds, _rows(rng, np.sort(ids), rounds + 1), chunk)
        OPEN_WRITERS.extend(w.values())
    return uri


OPEN_WRITERS: list[ShardWriter] = []


def _merge_first_generations(uri: str) -> None:
    """Merge the oldest flushed generation of every region into the base (the merger job)."""
    from memwal_write.merger import merge_generations  # the writer side of the project

    merge_generations(uri, max_generations=1)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m memwal_query.demo``."""
    import memwal_query as mq

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("dir", nargs="?", help="where to create the table (default: a temp dir)")
    p.add_argument("--base-rows", type=int, default=200_000)
    p.add_argument("--regions", type=int, default=4)
    args = p.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="memwal-demo-")
    uri = f"{root.rstrip('/')}/events"
    t0 = time.perf_counter()
    write_demo_table(uri, base_rows=args.base_rows, regions=args.regions, leave_open=True)
    print(f"wrote {uri} with pylance's MemWAL writer in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    table = mq.open_table(uri)
    print(f"opened snapshot in {(time.perf_counter() - t0) * 1000:.0f} ms\n")
    ctx = datafusion.SessionContext()
    table.register(ctx, "events")
    for q in [
        "SELECT count(*) AS live_rows FROM events",
        "SELECT category, count(*) AS n, round(sum(amount), 2) AS total "
        "FROM events GROUP BY category ORDER BY category",
        "SELECT * FROM events WHERE id = 42",
    ]:
        print(q)
        ctx.sql(q).show()
    print(table.explain())
    for w in OPEN_WRITERS:
        w.close()
    OPEN_WRITERS.clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
