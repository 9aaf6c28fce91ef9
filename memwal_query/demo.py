"""The demo: write a MemWAL table with pylance's own writer, then query it merged.

Run ``python -m memwal_query.demo [DIR]`` (``./dev demo``). It creates an events table
(base rows, several flushed generations per region, updates, deletes, one generation
merged into the base, a writer left open so its WAL tail is live, and at the end a WAL
tail left by a writer that stopped without flushing) with a vector
column ``vec`` (clustered by category) and a text column ``note``, then queries the
merged table: SQL, a point lookup, a vector search, ``explain()``; and prints the
commands to try next.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import datafusion
import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import ShardWriter, evaluate_sharding_spec

if TYPE_CHECKING:
    from memwal_query.table import Table

__all__ = ["events_schema", "category_centroids", "write_demo_table", "bucket_region_id", "main", "DIM", "CATEGORIES"]

PK = {"lance-schema:unenforced-primary-key": "true"}
# Region naming convention for regions created from a bucket spec (FORMAT.md).
_REGION_NS = uuid.UUID("4c534d57-5249-5445-5f53-484152443031")


def bucket_region_id(bucket: int) -> str:
    """Deterministic region UUID for bucket ``bucket`` of a bucket spec."""
    return str(uuid.uuid5(_REGION_NS, f"bucket-{bucket}"))


#: Dimension of the demo's ``vec`` column.
DIM = 16
CATEGORIES = ("books", "games", "music", "sport", "tools")
# Words of the ``note`` column, drawn with Zipf-like weights (a few words are common).
_WORDS = (
    "great fast delivery price quality gift late refund broken recommend cheap again "
    "box color size perfect love slow support return small works battery manual"
).split()


def events_schema() -> pa.Schema:
    """Schema of the demo table: ``id`` (primary key), category, amount, ts, vec, note."""
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("category", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("ts", pa.timestamp("us")),
            pa.field("vec", pa.list_(pa.float32(), DIM)),
            pa.field("note", pa.string()),
        ]
    )


def category_centroids() -> np.ndarray:
    """One centre per category (rows of a category cluster around it, 4 sub-clusters each)."""
    return np.random.default_rng(12345).normal(size=(len(CATEGORIES) * 4, DIM)).astype(np.float32)


def _rows(rng: np.random.Generator, ids: np.ndarray, tag: int) -> pa.Table:
    n = len(ids)
    cat = rng.integers(0, len(CATEGORIES), n)
    centre = category_centroids()[cat * 4 + rng.integers(0, 4, n)]
    vec = (centre + rng.normal(scale=0.25, size=(n, DIM))).astype(np.float32)
    weights = 1.0 / np.arange(1, len(_WORDS) + 1)
    words = np.array(_WORDS)[rng.choice(len(_WORDS), size=(n, 4), p=weights / weights.sum())]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "category": pa.array(np.array(CATEGORIES)[cat]),
            "amount": pa.array(np.round(rng.random(n) * 100 + tag, 2)),
            "ts": pa.array(np.full(n, 1_700_000_000_000_000 + tag, dtype="datetime64[us]")),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), DIM),
            "note": pa.array([" ".join(w) for w in words]),
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
    text_index: bool = True,
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
        text_index: Give ``note`` an INVERTED (full-text) index on the base; pylance
            then maintains it in every flushed generation.

    Returns:
        ``uri``.
    """
    rng = np.random.default_rng(seed)
    ds = lance.write_dataset(_rows(rng, np.arange(base_rows), 0), uri)
    if text_index:
        ds.create_scalar_index("note", "INVERTED")
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

#: Rows the demo's last writer leaves in the WAL (ids from the middle of the base).
TAIL_ROWS = 200


def leave_wal_tail(uri: str, base_rows: int) -> None:
    """Update up to :data:`TAIL_ROWS` live rows from another process whose writers stop without closing.

    Their WAL entries stay the table's WAL tail, as a writer that is still running (or died)
    leaves it: strong snapshots replay it, ``memwal_wal`` lists it, the next writer of the
    region recovers it. (A writer's ``close()`` flushes its MemTable into a generation.)
    """
    code = f"import memwal_query.demo as d; d._tail_then_exit({uri!r}, {int(base_rows)})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"writing the WAL tail of {uri} failed: {proc.stderr.strip()[-500:]}")


def _tail_then_exit(uri: str, base_rows: int) -> None:
    import memwal_query as mq

    ds = lance.dataset(uri)
    lo = base_rows // 2
    wanted = np.arange(lo, min(base_rows, lo + TAIL_ROWS))
    ids = np.sort(mq.open_table(uri).lookup(wanted, columns=["id"]).column("id").to_numpy())  # live: updates only
    writers = _LazyWriters(ds, 10 * TAIL_ROWS)
    _put(writers, ds, _rows(np.random.default_rng(99), ids, 9), TAIL_ROWS)
    sys.stdout.flush()
    os._exit(0)  # no close(): nothing flushes the MemTables


def _merge_first_generations(uri: str) -> None:
    """Merge the oldest flushed generation of every region into the base (the merger job)."""
    from memwal_write.merger import merge_generations  # the writer side of the project

    merge_generations(uri, max_generations=1)


def _step(text: str) -> float:
    print(text, end=" ", flush=True)
    return time.perf_counter()


def _done(t0: float) -> None:
    print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)


def _show(title: str, rows: pa.Table) -> None:
    from memwal_query.display import format_text_table

    print(f"\n{title}\n{format_text_table(rows)}")


def _queries(table: Table) -> None:
    ctx = datafusion.SessionContext()
    table.register(ctx, "events")
    for q in [
        "SELECT count(*) AS live_rows FROM events",
        "SELECT category, count(*) AS n, round(sum(amount), 2) AS total FROM events GROUP BY category "
        "ORDER BY category",
        "SELECT id, category, amount, note FROM events WHERE id = 42",
        "SELECT count(*) AS refunds FROM events WHERE note LIKE '%refund%'",
    ]:
        _show(q, ctx.sql(q).to_arrow_table())
    _show("table.lookup([42, 43])", table.lookup([42, 43], columns=["id", "category", "amount", "note"]))
    query = category_centroids()[0]  # the centre of a "books" cluster
    hits = table.nearest("vec", query, k=5, filter="category = 'books'")
    _show("table.nearest('vec', query, k=5, filter=\"category = 'books'\")", hits.drop_columns(["vec", "ts"]))
    print(f"\n{table.explain()}")


def _next_steps(uri: str) -> None:
    bin_dir = os.path.dirname(sys.executable)
    rel = os.path.relpath(bin_dir)
    if not rel.startswith(".."):
        bin_dir = rel
    print("\nNext, try:")
    print(f'  {bin_dir}/memwal sql {uri} "SELECT category, count(*) FROM t GROUP BY category"')
    print(f"  {bin_dir}/memwal inspect {uri}")
    print(f"  {bin_dir}/python -c 'import memwal_query as mq; print(mq.open_table(\"{uri}\").lookup(7))'")
    print(f"  notebooks: {bin_dir}/pip install jupyterlab && {bin_dir}/jupyter lab notebooks/01_quickstart.ipynb")
    print("  the README's examples run on this table (events = the table above)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m memwal_query.demo``."""
    import memwal_query as mq

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("dir", nargs="?", help="where to create the table (default: a temp dir)")
    p.add_argument("--base-rows", type=int, default=200_000, help="rows in the base table (default: 200,000)")
    p.add_argument("--regions", type=int, default=4, help="bucket regions on id (default: 4)")
    args = p.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="memwal-demo-")
    uri = f"{os.path.abspath(root).rstrip('/')}/events"
    if os.path.exists(uri):
        p.error(f"{uri} exists already: name another directory")
    t0 = _step(
        f"writing {uri} with pylance's MemWAL writer ({args.base_rows:,} base rows, {args.regions} regions, "
        "3 rounds of updates and deletes, one merge, a writer left open) ..."
    )
    write_demo_table(uri, base_rows=args.base_rows, regions=args.regions, leave_open=True)
    _done(t0)
    try:
        t0 = _step("opening a snapshot ...")
        table = mq.open_table(uri)
        _done(t0)
        _queries(table)
    finally:
        for w in OPEN_WRITERS:
            w.close()
        OPEN_WRITERS.clear()
    t0 = _step(f"leaving a WAL tail ({TAIL_ROWS} updates from a writer that stops without flushing) ...")
    leave_wal_tail(uri, args.base_rows)
    _done(t0)
    _next_steps(uri)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
