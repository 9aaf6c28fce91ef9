"""Read-path benchmark: merged SQL over a MemWAL table vs. the raw base and the alternatives.

What it does
------------
1. Builds (or reuses) a MemWAL table with pylance's own writer: a base of
   ``--base-rows`` rows written in one go, bucket sharding on ``id`` over
   ``--regions`` regions, ``--newer-rows`` upserts (updates of existing ids and new
   ids) plus deletes spread over ``--generations`` flushed generations per region,
   the first generation of every region merged into the base, and a live WAL tail
   (``--tail-rows`` rows put by writers that are never closed). Building is not
   timed in the results. With ``--dir`` the table is kept under a sub-folder named
   after the parameters and reused by later runs with the same parameters.
2. Measures, as the median of ``--repeat`` runs after one warm-up (a single run when
   the warm-up alone takes longer than 60 s), in milliseconds:

   * snapshot open: ``memwal_query.open_table(uri)`` (a cold ``Table`` each time);
   * our merged table registered in DataFusion: count, filtered aggregate,
     primary-key lookup, join + group-by with a small dimension table, full scan;
     as users get it (decoded columns kept in memory after the first query) and with
     ``cache=False`` (every query decodes Lance pages: the cost of a first query);
   * the same SQL over the raw base through the same provider with no newer levels
     ("raw base (DataFusion, same provider)": the primary anchor), likewise with and
     without the column cache;
   * Lance's own scanner over the raw base ("raw base (Lance scanner, no merge)");
   * pylance's ``LsmScanner`` over base + unmerged flushed generations (it cannot
     see another writer's WAL tail, so its row count differs by the tail);
   * the window-dedup query (``row_number() OVER (PARTITION BY id ...) = 1``) over
     the union of all levels as Arrow, in DataFusion and DuckDB;
   * peak RSS of a fresh process that only opens the table and runs the merged
     queries, and of this whole benchmark process.
3. Prints results, ratios and PASS/MISS against the targets, and writes everything
   with machine information to ``--out`` (JSON).

Before anything is timed, the merged answers (count and filtered sum) are checked
against the window-dedup query: a benchmark of wrong answers is worthless.

Run ``python benchmarks/bench_read.py --base-rows 300000`` for a quick run (about a
minute; add ``--skip-slow`` for seconds). The defaults (5M base rows) took about 9
minutes on 2 cores: building the table takes ~10 s, and one LsmScanner count or full
scan takes ~2.5 minutes (run once each), the window-dedup queries most of the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import datafusion  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from lance.mem_wal import LsmScanner, ShardWriter, evaluate_sharding_spec  # noqa: E402

import memwal_query as mq  # noqa: E402
from memwal_query.base_mask import BaseMask  # noqa: E402
from memwal_query.demo import bucket_region_id  # noqa: E402
from memwal_query.format.wal import GEN_COLUMN, SEQ_COLUMN  # noqa: E402
from memwal_query.merge import MergeState  # noqa: E402
from memwal_query.scan.dataset import MergedDataset  # noqa: E402
from memwal_query.snapshot import SnapshotCache  # noqa: E402
from memwal_write.merger import merge_generations  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}
CATEGORIES = [f"cat{i:02d}" for i in range(20)]
DEPARTMENTS = ["north", "south", "east", "west", "online"]
SLOW_CALL_S = 60.0
FAST_MIN_RUNS = 15  # timed runs for calls under a second: cheap, and steadier on a busy machine
TABLE_LAYOUT_VERSION = 1  # bump when build_table() changes what it writes

# Writers of the live WAL tail: kept referenced and never closed (closing flushes).
_OPEN_WRITERS: list[ShardWriter] = []


# -- the table -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildParams:
    """Everything that determines the benchmark table."""

    base_rows: int
    regions: int
    newer_rows: int
    generations: int
    tail_rows: int
    seed: int
    layout: int = TABLE_LAYOUT_VERSION
    key_index: bool = False  # a BTREE index on ``id`` built on the base before the MemWAL starts

    @property
    def name(self) -> str:
        return (
            f"memwal-b{self.base_rows}-r{self.regions}-n{self.newer_rows}-g{self.generations}"
            f"-t{self.tail_rows}-s{self.seed}-v{self.layout}{'-idx' if self.key_index else ''}"
        )

    @property
    def rows_per_generation(self) -> int:
        return math.ceil(self.newer_rows / self.generations)

    @property
    def max_memtable_rows(self) -> int:
        """Large enough that one write round (upserts + deletes) is one generation per region."""
        per_region = (self.rows_per_generation * 1.1) / self.regions
        return max(10_000, math.ceil(per_region * 1.5))


def table_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("a", pa.int32()),
            pa.field("category", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("ts", pa.timestamp("us")),
        ]
    )


def make_rows(rng: np.random.Generator, ids: np.ndarray, tag: int) -> pa.Table:
    """Rows for ``ids``; ``tag`` (0 = base, then the write round) shows in ``ts``."""
    n = len(ids)
    cats = np.array(CATEGORIES)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "a": pa.array(rng.integers(0, 100, n, dtype=np.int32)),
            "category": pa.array(cats[rng.integers(0, len(cats), n)]),
            "amount": pa.array(np.round(rng.random(n) * 1000, 2)),
            "ts": pa.array(np.full(n, 1_700_000_000_000_000 + tag, dtype="datetime64[us]")),
        },
        schema=table_schema(),
    )


def route(ds: lance.LanceDataset, table: pa.Table) -> dict[int, pa.Table]:
    """Split rows by the table's bucket spec, as pylance's writer routes them."""
    spec = ds.mem_wal_index_details()["sharding_specs"][0]
    batch = table.select(["id"]).combine_chunks().to_batches()[0]
    buckets = evaluate_sharding_spec(batch, spec, ds.lance_schema).column(0).to_numpy()
    return {int(b): table.filter(pa.array(buckets == b)) for b in np.unique(buckets)}


def write_round(
    ds: lance.LanceDataset,
    p: BuildParams,
    upserts: pa.Table,
    deletes: np.ndarray,
    *,
    close: bool,
) -> None:
    """Put ``upserts`` and delete ``deletes`` through one writer per region."""
    writers = {
        b: ds.mem_wal_writer(bucket_region_id(b), max_memtable_rows=p.max_memtable_rows) for b in range(p.regions)
    }
    chunk = min(p.max_memtable_rows, 10_000)
    for b, part in route(ds, upserts).items():
        for off in range(0, part.num_rows, chunk):
            writers[b].put(part.slice(off, chunk))
    if deletes.size:
        for b, part in route(ds, pa.table({"id": pa.array(deletes, pa.int64())})).items():
            for off in range(0, part.num_rows, chunk):
                writers[b].delete(part.slice(off, chunk))
    if close:
        for w in writers.values():
            w.close()  # flush: one generation per region
    else:
        _OPEN_WRITERS.extend(writers.values())


def merge_first_generation(uri: str) -> int:
    """Fold the oldest flushed generation of every region into the base (the merger job);
    returns how many were merged."""
    stats = merge_generations(uri, max_generations=1)
    return sum(s == "merged" for s in stats.column("status").to_pylist())


def build_table(uri: str, p: BuildParams) -> dict[str, Any]:
    """Write the benchmark table at ``uri``; returns what the benchmark needs to know."""
    rng = np.random.default_rng(p.seed)
    t0 = time.perf_counter()
    ds = lance.write_dataset(make_rows(rng, np.arange(p.base_rows), 0), uri)
    if p.key_index:
        ds.create_scalar_index("id", "BTREE")
    print(f"  base: {p.base_rows:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
    ds.initialize_mem_wal(bucket_column="id", num_buckets=p.regions, max_memtable_rows=p.max_memtable_rows)
    ds = lance.dataset(uri)
    next_new_id = p.base_rows
    lookup_id = 0
    for r in range(1, p.generations + 1):
        t1 = time.perf_counter()
        n_new = p.rows_per_generation * 3 // 10
        updated = rng.choice(p.base_rows, size=p.rows_per_generation - n_new, replace=False)
        new = np.arange(next_new_id, next_new_id + n_new)
        next_new_id += n_new
        ids = np.sort(np.concatenate([updated, new]))
        deletes = rng.choice(next_new_id, size=max(1, p.rows_per_generation // 100), replace=False)
        deletes = np.setdiff1d(deletes, ids)
        write_round(ds, p, make_rows(rng, ids, r), deletes, close=True)
        lookup_id = int(updated[0])  # an updated key of the newest flushed generation
        msg = f"  generation {r}: {len(ids):,} upserts, {deletes.size:,} deletes"
        if r == 1:
            k = merge_first_generation(uri)
            msg += f", merged into the base in {k} regions"
            ds = lance.dataset(uri)
        print(f"{msg} ({time.perf_counter() - t1:.1f} s)", flush=True)
    if p.tail_rows:
        n_new = p.tail_rows // 5
        ids = np.sort(
            np.concatenate(
                [
                    rng.choice(p.base_rows, size=p.tail_rows - n_new, replace=False),
                    np.arange(next_new_id, next_new_id + n_new),
                ]
            )
        )
        ids = np.unique(ids)
        deletes = np.setdiff1d(rng.choice(p.base_rows, size=max(1, p.tail_rows // 100), replace=False), ids)
        write_round(ds, p, make_rows(rng, ids, p.generations + 1), deletes, close=False)
        print(f"  WAL tail: {len(ids):,} upserts, {deletes.size:,} deletes (writers left open)", flush=True)
    return {"lookup_id": lookup_id, "build_seconds": time.perf_counter() - t0}


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
    print(f"building {uri} (not timed in the results) ...", flush=True)
    info = build_table(uri, p)
    info["params"] = dataclasses.asdict(p)
    params_file.write_text(json.dumps(info, indent=2))
    return uri, info, False


# -- timing ------------------------------------------------------------------------


@dataclasses.dataclass
class Timing:
    """Median and individual runs of one measured call, in ms."""

    median_ms: float
    runs_ms: list[float]
    note: str = ""
    value: Any = None


def measure(fn: Callable[[], Any], repeat: int) -> Timing:
    """One warm-up, then timed runs (see :func:`measure_interleaved`)."""
    return measure_interleaved({"": fn}, repeat)[""]


def measure_interleaved(fns: Mapping[str, Callable[[], Any]], repeat: int) -> dict[str, Timing]:
    """Time several calls in turn (a, b, b, a, ...) so that load from other work hits them alike.

    The order is shuffled every round (seeded): a call that always ran right after a
    cold scan (caches and allocator state spoiled) would be measured slower than the
    others for that alone.

    One warm-up each; then ``repeat`` rounds, at least ``FAST_MIN_RUNS`` when every
    warm-up took under a second, and a single run when a warm-up took over 60 s.
    """
    values: dict[str, Any] = {}
    warm: dict[str, float] = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        values[name] = fn()
        warm[name] = (time.perf_counter() - t0) * 1000
    if max(warm.values()) > SLOW_CALL_S * 1000:
        note = f"single run (> {SLOW_CALL_S:.0f} s)"
        return {n: Timing(warm[n], [warm[n]], note, values[n]) for n in fns}
    rounds = repeat if max(warm.values()) > 1000 else max(repeat, FAST_MIN_RUNS)
    runs: dict[str, list[float]] = {n: [] for n in fns}
    order = list(fns.items())
    rng = random.Random(len(order))
    for _ in range(rounds):
        rng.shuffle(order)
        for name, fn in order:
            t0 = time.perf_counter()
            values[name] = fn()
            runs[name].append((time.perf_counter() - t0) * 1000)
    return {n: Timing(statistics.median(runs[n]), runs[n], "", values[n]) for n in fns}


def check_same(what: str, got: Any, other: str, want: Any) -> None:
    """Stop the benchmark when two answers differ (floats: relative 1e-9)."""
    same = math.isclose(got, want, rel_tol=1e-9) if isinstance(want, float) else got == want
    if not same:
        msg = f"wrong answer: {what} = {got!r} but {other} = {want!r}"
        raise AssertionError(msg)


def scalar(t: pa.Table) -> Any:
    return t.column(0)[0].as_py() if t.num_rows else None


# -- the systems under test ------------------------------------------------------------


SQL = {
    "count": "SELECT count(*) FROM t",
    "filtered_agg": "SELECT sum(amount) FROM t WHERE a < 10",
    "pk_lookup": "SELECT * FROM t WHERE id = {lookup_id}",
    "join_group_by": (
        "SELECT d.dept, count(*) AS n, sum(t.amount) AS total FROM t JOIN dim d "
        "ON t.category = d.category GROUP BY d.dept ORDER BY d.dept"
    ),
    "full_scan": "SELECT * FROM t",
}
QUERY_LABELS = {
    "count": "count(*)",
    "filtered_agg": "sum(amount) WHERE a < 10",
    "pk_lookup": "WHERE id = X",
    "join_group_by": "join dim + group by",
    "full_scan": "full scan (SELECT *)",
}


COLUMNS = {  # result group -> (short name for the table, description)
    "merged": ("merged", "merged table (memwal_query provider) in DataFusion, decoded columns kept"),
    "raw_df": ("raw DF", "raw base (DataFusion, same provider, no newer levels, no merge), decoded columns kept"),
    "merged_nocache": ("merged cold", "merged table, cache=False (every query decodes Lance pages)"),
    "raw_df_nocache": ("raw DF cold", "raw base (same provider), no column cache"),
    "raw_lance": ("raw Lance", "raw base (Lance scanner, no merge)"),
    "lsm": ("LsmScanner", "pylance LsmScanner: base + unmerged flushed generations (no WAL tail)"),
    "window_df": ("window DF", "window dedup (row_number() = 1) over the union of all levels, DataFusion"),
    "window_duckdb": ("window DuckDB", "window dedup (row_number() = 1) over the union of all levels, DuckDB"),
}


def dimension_table() -> pa.Table:
    return pa.table(
        {
            "category": CATEGORIES,
            "dept": [DEPARTMENTS[i % len(DEPARTMENTS)] for i in range(len(CATEGORIES))],
        }
    )


def raw_base_dataset(table: mq.Table, *, cache: bool) -> MergedDataset:
    """Our provider over the snapshot's base with no newer levels (no merge work at all)."""
    snap = dataclasses.replace(table.snapshot, regions=())
    empty = MergeState(base_mask=BaseMask.none(), generation_drop={}, memtables={}, region_stats={}, seconds=0.0)
    return MergedDataset(snap, empty, resident=SnapshotCache() if cache else None)


def session(dataset: Any) -> datafusion.SessionContext:
    ctx = datafusion.SessionContext()
    ctx.register_dataset("t", dataset)
    ctx.register_record_batches("dim", [dimension_table().to_batches()])
    return ctx


def run_sql(ctx: datafusion.SessionContext, name: str, lookup_id: int) -> Any:
    """Run one benchmark query; returns a small summary of its answer."""
    out = ctx.sql(SQL[name].format(lookup_id=lookup_id)).to_arrow_table()
    if name in ("count", "filtered_agg"):
        return scalar(out)
    return out.num_rows


def bench_datafusion(
    ctxs: dict[str, datafusion.SessionContext], lookup_id: int, repeat: int
) -> dict[str, dict[str, Timing]]:
    """Every benchmark query on every session, the sessions interleaved per query."""
    out: dict[str, dict[str, Timing]] = {name: {} for name in ctxs}
    for q in SQL:
        fns = {name: (lambda ctx=ctx, q=q: run_sql(ctx, q, lookup_id)) for name, ctx in ctxs.items()}
        for name, t in measure_interleaved(fns, repeat).items():
            out[name][q] = t
    return out


def bench_lance_scanner(ds: lance.LanceDataset, lookup_id: int, repeat: int) -> dict[str, Timing]:
    ops: dict[str, Callable[[], Any]] = {
        "count": ds.count_rows,
        "filtered_agg": lambda: pc.sum(ds.to_table(columns=["amount"], filter="a < 10").column(0)).as_py(),
        "pk_lookup": lambda: ds.to_table(filter=f"id = {lookup_id}").num_rows,
        "full_scan": lambda: ds.to_table().num_rows,
    }
    return {q: measure(fn, repeat) for q, fn in ops.items()}


def lsm_scanner_factory(table: mq.Table) -> Callable[[], LsmScanner]:
    """pylance's LsmScanner over base + every unmerged flushed generation of the snapshot."""
    shards = table.pylance_shard_snapshots()
    base = lance.dataset(table.uri, version=table.version)
    return lambda: LsmScanner.from_snapshots(base, shards)  # builders mutate: a new one per call


def bench_lsm_scanner(make: Callable[[], LsmScanner], lookup_id: int, repeat: int) -> dict[str, Timing]:
    ops: dict[str, Callable[[], Any]] = {
        "count": lambda: make().count_rows(),
        "filtered_agg": lambda: pc.sum(make().filter("a < 10").to_table().column("amount")).as_py(),
        "pk_lookup": lambda: make().filter(f"id = {lookup_id}").to_table().num_rows,
        "full_scan": lambda: make().to_table().num_rows,
    }
    out = {}
    for q, fn in ops.items():
        out[q] = measure(fn, repeat)
        print(f"  LsmScanner {q}: {out[q].median_ms:,.0f} ms {out[q].note}", flush=True)
    return out


# -- window dedup over the union of all levels ---------------------------------------------

DEDUP = (
    "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY _gen DESC, _rowaddr DESC) AS _rn "
    "FROM u) WHERE _rn = 1 AND NOT _tombstone"
)
WINDOW_SQL = {
    "count": f"SELECT count(*) FROM ({DEDUP})",
    "filtered_agg": f"SELECT sum(amount) FROM ({DEDUP}) WHERE a < 10",
}


def union_of_levels(table: mq.Table) -> pa.Table:
    """Base (``_gen`` 0), unmerged generations and MemTable rows with ``_gen``, ``_rowaddr``, ``_tombstone``."""
    snap = table.snapshot
    data_cols = list(snap.schema.names)
    schema = pa.schema(
        list(snap.schema)
        + [
            pa.field("_gen", pa.int64()),
            pa.field("_rowaddr", pa.uint64()),
            pa.field("_tombstone", pa.bool_()),
        ]
    )

    def level(t: pa.Table, gen: pa.Array, addr: pa.ChunkedArray, tomb: Any) -> pa.Table:
        cols = [t.column(c) for c in data_cols] + [gen, addr, tomb]
        return pa.Table.from_arrays(cols, schema=schema)

    base = snap.base.to_table(with_row_address=True)
    n = base.num_rows
    parts = [level(base, pa.array(np.zeros(n, np.int64)), base.column("_rowaddr"), pa.array(np.zeros(n, bool)))]
    for region in snap.regions:
        for g in region.generations:
            t = g.dataset.to_table(with_row_address=True)
            gen = pa.array(np.full(t.num_rows, g.generation, np.int64))
            parts.append(level(t, gen, t.column("_rowaddr"), pc.fill_null(t.column("_tombstone"), False)))
        if region.memtable is not None:
            m = region.memtable.table
            parts.append(
                level(m, m.column(GEN_COLUMN), m.column(SEQ_COLUMN), pc.fill_null(m.column("_tombstone"), False))
            )
    return pa.concat_tables(parts).combine_chunks()


def window_session(union: pa.Table) -> datafusion.SessionContext:
    ctx = datafusion.SessionContext()
    k = os.cpu_count() or 1
    step = math.ceil(union.num_rows / k)
    ctx.register_record_batches("u", [union.slice(i, step).to_batches() for i in range(0, union.num_rows, step)])
    return ctx


def bench_window(union: pa.Table, ctx: datafusion.SessionContext, repeat: int) -> dict[str, dict[str, Timing]]:
    import duckdb

    con = duckdb.connect()
    con.register("u", union)
    out: dict[str, dict[str, Timing]] = {"datafusion": {}, "duckdb": {}}
    for q, sql in WINDOW_SQL.items():
        out["datafusion"][q] = measure(lambda sql=sql: scalar(ctx.sql(sql).to_arrow_table()), repeat)
        out["duckdb"][q] = measure(lambda sql=sql: con.execute(sql).fetchone()[0], repeat)
        print(
            f"  window dedup {q}: DataFusion {out['datafusion'][q].median_ms:,.0f} ms, "
            f"DuckDB {out['duckdb'][q].median_ms:,.0f} ms",
            flush=True,
        )
    con.close()
    return out


# -- memory ----------------------------------------------------------------------------


def peak_rss_mb() -> float:
    """Peak RSS of this process (``ru_maxrss``)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 / 1024 if sys.platform == "darwin" else rss / 1024


def own_peak_rss_mb() -> float:
    """Peak RSS of this process image only.

    Linux carries ``ru_maxrss`` over fork + exec, so a child started by a big parent
    would report the parent's peak; ``VmHWM`` belongs to the new address space.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return peak_rss_mb()


def probe_memory(uri: str, lookup_id: int) -> None:
    """Child process: open the table, run every merged query once, print peak RSS (JSON)."""
    before = own_peak_rss_mb()
    table = mq.open_table(uri)
    opened = own_peak_rss_mb()
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    ctx.register_record_batches("dim", [dimension_table().to_batches()])
    for q in SQL:
        run_sql(ctx, q, lookup_id)
    print(json.dumps({"after_imports_mb": before, "after_open_mb": opened, "after_queries_mb": own_peak_rss_mb()}))


def measure_memory_in_fresh_process(uri: str, lookup_id: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--probe-memory", uri, "--lookup-id", str(lookup_id)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# -- report ----------------------------------------------------------------------------


@contextlib.contextmanager
def work_dir(keep: str | None, prefix: str) -> Iterator[Path]:
    """``keep`` (created if needed; tables there are reused), else a temp dir removed on exit."""
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def machine_info() -> dict[str, Any]:
    def version(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "memwal_query_uncommitted_changes": bool(git("status", "--porcelain", "memwal_query")),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("pylance", "datafusion", "pyarrow", "duckdb", "numpy")},
    }


def ffi_provider_status(ds: lance.LanceDataset) -> str:
    """Whether pylance's native DataFusion provider works with the installed DataFusion."""
    try:
        provider = lance.FFILanceTableProvider(ds)
        datafusion.SessionContext().register_table("ffi", provider)
    except Exception as err:  # noqa: BLE001 - report whatever it raises
        return f"unavailable: {type(err).__name__}: {str(err).splitlines()[0]}"
    return "works"


def fmt_ms(t: Timing | None) -> str:
    if t is None:
        return "-"
    m = t.median_ms
    return f"{m:,.3f}" if m < 1 else f"{m:,.2f}" if m < 10 else f"{m:,.1f}" if m < 100 else f"{m:,.0f}"


def ratio(a: Timing | None, b: Timing | None) -> float | None:
    if a is None or b is None or b.median_ms <= 0:
        return None
    return a.median_ms / b.median_ms


def print_results(results: dict[str, dict[str, Timing]]) -> None:
    cols = list(results)
    width = max(len(c) for c in cols) + 2
    print("\n" + f"{'median ms':<26}" + "".join(f"{c:>{width}}" for c in cols))
    for q, label in QUERY_LABELS.items():
        print(f"{label:<26}" + "".join(f"{fmt_ms(results[c].get(q)):>{width}}" for c in cols))


def evaluate(
    results: dict[str, dict[str, Timing]], open_t: Timing, memory_mb: float
) -> tuple[dict[str, dict[str, float | None]], list[dict[str, Any]]]:
    merged, raw = results["merged"], results["raw_df"]
    ratios: dict[str, dict[str, float | None]] = {
        "merged_over_raw_base_df": {q: ratio(merged[q], raw[q]) for q in SQL},
        "merged_over_raw_base_df_nocache": {
            q: ratio(results["merged_nocache"][q], results["raw_df_nocache"][q]) for q in SQL
        },
        "merged_over_raw_base_lance": {q: ratio(merged[q], results["raw_lance"].get(q)) for q in SQL},
        "lsm_scanner_over_merged": {q: ratio(results["lsm"].get(q), merged[q]) for q in SQL},
        "window_df_over_merged": {q: ratio(results["window_df"].get(q), merged[q]) for q in SQL},
        "window_duckdb_over_merged": {q: ratio(results["window_duckdb"].get(q), merged[q]) for q in SQL},
        "window_duckdb_over_merged_nocache": {
            q: ratio(results["window_duckdb"].get(q), results["merged_nocache"][q]) for q in SQL
        },
    }
    targets = []

    def target(name: str, value: float | None, limit: float, higher_is_better: bool, unit: str) -> None:
        ok = None if value is None else (value >= limit if higher_is_better else value <= limit)
        targets.append({"target": name, "value": value, "limit": limit, "unit": unit, "pass": ok})

    for suffix, what in (("", ""), ("_nocache", ", both cache=False")):
        for q in SQL:
            target(
                f"merged {QUERY_LABELS[q]} <= 1.25x raw base (DataFusion{what})",
                ratios[f"merged_over_raw_base_df{suffix}"][q],
                1.25,
                False,
                "x",
            )
    for q in ("count", "full_scan"):
        target(
            f"merged {QUERY_LABELS[q]} >= 20x faster than LsmScanner",
            ratios["lsm_scanner_over_merged"][q],
            20,
            True,
            "x",
        )
    for engine in ("df", "duckdb"):
        for q in WINDOW_SQL:
            target(
                f"merged {QUERY_LABELS[q]} >= 10x faster than window dedup ({engine})",
                ratios[f"window_{engine}_over_merged"][q],
                10,
                True,
                "x",
            )
    target("snapshot open <= 1.5 s", open_t.median_ms / 1000, 1.5, False, "s")
    target("peak memory (fresh process, open + merged queries) <= 2 GB", memory_mb / 1024, 2.0, False, "GiB")
    return ratios, targets


def print_evaluation(ratios: dict[str, dict[str, float | None]], targets: list[dict[str, Any]]) -> None:
    print("\nratios (time / time)")
    for name, per_q in ratios.items():
        vals = ", ".join(f"{QUERY_LABELS[q]} {v:.2f}" for q, v in per_q.items() if v is not None)
        print(f"  {name}: {vals}")
    print("\ntargets")
    for t in targets:
        verdict = {True: "PASS", False: "MISS", None: "n/a "}[t["pass"]]
        v = t["value"]
        val = "-" if v is None else f"{v:,.0f} {t['unit']}" if v >= 100 else f"{v:.3g} {t['unit']}"
        print(f"  {verdict}  {t['target']}: {val}")


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--base-rows", type=int, default=5_000_000)
    p.add_argument("--regions", type=int, default=8)
    p.add_argument("--newer-rows", type=int, default=200_000, help="upserts over all flushed generations")
    p.add_argument("--generations", type=int, default=4, help="flushed generations per region (first is merged)")
    p.add_argument("--tail-rows", type=int, default=10_000, help="rows in the live WAL tail")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="timed runs after one warm-up (median reported)")
    p.add_argument("--dir", help="keep (and reuse) the table here; default: a temp dir removed afterwards")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "read.json"))
    p.add_argument("--skip-slow", action="store_true", help="skip LsmScanner and the window-dedup timings")
    p.add_argument("--probe-memory", help=argparse.SUPPRESS)
    p.add_argument("--lookup-id", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.generations < 2:
        p.error("--generations must be >= 2 (the first one is merged into the base)")
    return args


def run(args: argparse.Namespace, root: str) -> dict[str, Any]:
    params = BuildParams(args.base_rows, args.regions, args.newer_rows, args.generations, args.tail_rows, args.seed)
    t0 = time.perf_counter()
    uri, info, reused = ensure_table(root, params)
    lookup_id = int(info["lookup_id"])
    print(
        f"table {uri}: {'reused' if reused else 'built'} "
        f"({'built earlier in' if reused else 'in'} {info['build_seconds']:.1f} s; "
        f"this step {time.perf_counter() - t0:.1f} s)",
        flush=True,
    )

    # Snapshot open, cold: a new Table (and SnapshotCache) each time.
    open_t = measure(lambda: mq.open_table(uri), args.repeat)
    table: mq.Table = open_t.value
    open_t.value = None
    split = [(t.timings.snapshot, t.timings.merge) for t in [mq.open_table(uri) for _ in range(args.repeat)]]
    snap = table.snapshot
    stats = {
        "base_rows": snap.base.count_rows(),
        "base_fragments": len(snap.base.get_fragments()),
        "base_version": snap.base_version,
        "regions": len(snap.regions),
        "unmerged_generations": sum(len(r.generations) for r in snap.regions),
        "generation_rows": sum(g.num_rows for r in snap.regions for g in r.generations),
        "memtable_rows": sum(r.memtable.table.num_rows for r in snap.regions if r.memtable is not None),
        "base_shadowed_rows": table.merge_state.base_shadowed_rows,
        "open_snapshot_s_median": statistics.median(s for s, _ in split),
        "open_merge_s_median": statistics.median(m for _, m in split),
        "lookup_id": lookup_id,
    }
    print(
        f"snapshot open: {open_t.median_ms:,.0f} ms (snapshot {stats['open_snapshot_s_median'] * 1000:,.0f} ms"
        f" + merge {stats['open_merge_s_median'] * 1000:,.0f} ms); {stats}",
        flush=True,
    )

    merged_ctx = session(table.dataset())
    raw_ctx = session(raw_base_dataset(table, cache=True))
    cold_ctxs = {
        "merged_nocache": session(table.dataset(cache=False)),
        "raw_df_nocache": session(raw_base_dataset(table, cache=False)),
    }

    # Correctness guard: merged answers == window dedup over the union of all levels.
    union = union_of_levels(table)
    window_ctx = window_session(union)
    for q, sql in WINDOW_SQL.items():
        got, want = run_sql(merged_ctx, q, lookup_id), scalar(window_ctx.sql(sql).to_arrow_table())
        check_same(f"merged {q}", got, "window dedup", want)
    merged_rows = run_sql(merged_ctx, "count", lookup_id)
    check_same("Table.count_rows()", table.count_rows(), "merged count(*)", merged_rows)
    print(
        f"correctness guard passed: {merged_rows:,} live rows (count and filtered sum equal the window "
        f"dedup over {union.num_rows:,} rows of all levels)",
        flush=True,
    )

    results = bench_datafusion({"merged": merged_ctx, "raw_df": raw_ctx, **cold_ctxs}, lookup_id, args.repeat)
    print_results({COLUMNS[k][0]: v for k, v in results.items()})
    results["raw_lance"] = bench_lance_scanner(snap.base, lookup_id, args.repeat)
    memory = measure_memory_in_fresh_process(uri, lookup_id)
    print(
        f"peak RSS, fresh process: {memory['after_imports_mb']:,.0f} MB after imports, "
        f"{memory['after_open_mb']:,.0f} MB after open, {memory['after_queries_mb']:,.0f} MB after the "
        "merged queries",
        flush=True,
    )
    results["lsm"], results["window_df"], results["window_duckdb"] = {}, {}, {}
    lsm_rows = None
    if not args.skip_slow:
        results["lsm"] = bench_lsm_scanner(lsm_scanner_factory(table), lookup_id, args.repeat)
        lsm_rows = results["lsm"]["count"].value
        w = bench_window(union, window_ctx, args.repeat)
        results["window_df"], results["window_duckdb"] = w["datafusion"], w["duckdb"]
        for q in WINDOW_SQL:
            check_same(
                f"DuckDB window {q}",
                results["window_duckdb"][q].value,
                f"DataFusion window {q}",
                results["window_df"][q].value,
            )
    del union

    eventual_rows = mq.open_table(uri, consistency="eventual").count_rows()
    process_rss = peak_rss_mb()
    print_results({COLUMNS[k][0]: v for k, v in results.items()})
    print("\n".join(f"  {short}: {long}" for short, long in COLUMNS.values()))
    print(f"\nsnapshot open (cold open_table): {open_t.median_ms:,.0f} ms")
    print(
        f"peak RSS: fresh process open + merged queries {memory['after_queries_mb']:,.0f} MB; "
        f"this whole benchmark process {process_rss:,.0f} MB"
    )
    if lsm_rows is not None:
        print(
            f"LsmScanner rows {lsm_rows:,} vs merged without the WAL tail (eventual) {eventual_rows:,}: "
            f"{'same' if lsm_rows == eventual_rows else 'DIFFERENT'}"
        )
    ratios, targets = evaluate(results, open_t, memory["after_queries_mb"])
    print_evaluation(ratios, targets)
    ffi = ffi_provider_status(snap.base)
    print(f"\nlance.FFILanceTableProvider with this DataFusion: {ffi}")

    def timings(group: dict[str, Timing]) -> dict[str, Any]:
        return {q: dataclasses.asdict(t) for q, t in group.items()}

    return {
        "machine": machine_info(),
        "params": dataclasses.asdict(params),
        "repeat": args.repeat,
        "table": {**stats, "build_seconds": info["build_seconds"], "reused": reused},
        "snapshot_open": dataclasses.asdict(open_t),
        "results": {COLUMNS[k][1]: timings(v) for k, v in results.items()},
        "queries": SQL,
        "window_queries": WINDOW_SQL,
        "peak_rss_mb": {"fresh_process_merged_path": memory, "benchmark_process": process_rss},
        "lsm_scanner_rows": lsm_rows,
        "merged_rows_eventual": eventual_rows,
        "ratios": ratios,
        "targets": targets,
        "ffi_provider": ffi,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe_memory:
        probe_memory(args.probe_memory, args.lookup_id)
        return 0
    started = time.perf_counter()
    with work_dir(args.dir, "memwal-bench-") as root:
        report = run(args, str(root))
    report["total_seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {out} (total {report['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
