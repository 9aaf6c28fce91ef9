"""A writer process, a merger process and a reading test process on one table.

The writer runs a deterministic sequence of puts / deletes / flushes (from a seed)
and records how many operations completed in a progress file (atomic rename). The
merger merges flushed generations (oldest first per region, merge_insert +
mark_sstables_as_compacted as ``ModelTable.merge`` does), retrying after commit
conflicts, and optionally deletes the merged generation directories (GC). The test
process loops: progress p0, refresh (or open), ``SELECT id, v``, progress p1; the
answer must be the model state after k operations with p0 <= k <= p1 + 1 (an operation
may be visible before its progress is written).

Every put / delete touches one region only, so each operation becomes visible at once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.mem_wal import evaluate_sharding_spec

import memwal_query as mq

from lsm_model import PK, ModelTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
N_KEYS = 150
BUCKETS = 3
MAX_MEMTABLE_ROWS = 50
N_OPS = 350
OP_PAUSE_S = 0.02
MIN_READS = 60

Op = tuple[Any, ...]  # ("put", region, [(id, v)...]) | ("delete", region, [id...]) | ("flush",)


class AttachedTable(ModelTable):
    """A ModelTable over an existing table (no base write), with 1 ms WAL flushes."""

    def __init__(self, uri: str) -> None:  # noqa: D107 - deliberately skips ModelTable.__init__
        self.uri = uri
        self.schema = SCHEMA
        self.pk = ["id"]
        self.max_rows = MAX_MEMTABLE_ROWS
        self.ds = lance.dataset(uri)
        self.bucketed = True
        self.model = {}
        self.writers = {}

    def writer(self, region: str) -> Any:
        w = self.writers.get(region)
        if w is None:
            w = lance.dataset(self.uri).mem_wal_writer(
                region, max_memtable_rows=self.max_rows, max_wal_flush_interval_ms=1
            )
            self.writers[region] = w
        return w


def make_ops(seed: int, key_region: list[str]) -> list[Op]:
    rng = random.Random(seed)
    by_region: dict[str, list[int]] = {}
    for k, r in enumerate(key_region):
        by_region.setdefault(r, []).append(k)
    regions = sorted(by_region)
    ops: list[Op] = []
    for i in range(N_OPS):
        x = rng.random()
        if x < 0.07:
            ops.append(("flush",))
            continue
        region = rng.choice(regions)
        keys = by_region[region]
        if x < 0.72:  # upserts; duplicates inside one batch happen (last wins)
            ids = [rng.choice(keys) for _ in range(rng.randint(1, 25))]
            ops.append(("put", region, [(k, i * 100 + j) for j, k in enumerate(ids)]))
        else:  # deletes of present and absent keys
            ops.append(("delete", region, [rng.choice(keys) for _ in range(rng.randint(1, 8))]))
    return ops


def model_states(base: dict[int, int], ops: list[Op]) -> list[tuple[tuple[int, int], ...]]:
    """states[k]: sorted (id, v) rows after the first k operations."""
    cur = dict(base)
    out = [tuple(sorted(cur.items()))]
    for op in ops:
        if op[0] == "put":
            for k, v in op[2]:
                cur[k] = v
        elif op[0] == "delete":
            for k in op[2]:
                cur.pop(k, None)
        out.append(tuple(sorted(cur.items())))
    return out


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def writer_main(uri: str, seed: int, key_region: list[str], workdir: str) -> None:
    work = Path(workdir)
    try:
        t = AttachedTable(uri)
        for done, op in enumerate(make_ops(seed, key_region), start=1):
            if op[0] == "put":
                rows = pa.table({"id": [k for k, _ in op[2]], "v": [v for _, v in op[2]]}, schema=SCHEMA)
                t.writer(op[1]).put(rows)
            elif op[0] == "delete":
                t.writer(op[1]).delete(pa.table({"id": pa.array(op[2], pa.int64())}))
            else:
                t.flush()
            _write_atomic(work / "progress", str(done))
            time.sleep(OP_PAUSE_S)
        t.flush()
    except BaseException:
        (work / "writer.err").write_text(traceback.format_exc())
        raise


def merger_main(uri: str, workdir: str, gc: bool) -> None:
    work = Path(workdir)
    t = AttachedTable(uri)
    merged: dict[str, int] = {}
    stats: Counter[str] = Counter()
    errors: list[str] = []
    try:
        while not (work / "stop").exists():
            for region in t.regions():
                gens = [(g, p) for g, p in t.flushed(region) if g > merged.get(region, 0)]
                if not gens:
                    continue
                g, path = min(gens)
                try:
                    t.merge(region, g)
                except Exception as err:  # noqa: BLE001 - a commit conflict: retried next pass
                    stats["merge_failed"] += 1
                    errors.append(f"merge {region[:8]} gen {g}: {type(err).__name__}: {str(err)[:300]}")
                    continue
                merged[region] = g
                stats["merged"] += 1
                if gc:
                    shutil.rmtree(f"{uri}/_mem_wal/{region}/{path}", ignore_errors=True)
                    stats["gc"] += 1
            time.sleep(0.03)
    except BaseException:
        errors.append(traceback.format_exc())
        raise
    finally:
        _write_atomic(work / "merger.log", repr(dict(stats)) + "\n" + "\n".join(errors[:20]))


def _regions_outside(
    got: list[tuple[int, int]], candidates: list[tuple[tuple[int, int], ...]], key_region: list[str]
) -> list[str]:
    """Regions whose rows in ``got`` equal their rows in none of the candidate states."""
    g = dict(got)
    out = []
    for region in sorted(set(key_region)):
        mine = {k for k, r in enumerate(key_region) if r == region}
        have = {k: v for k, v in g.items() if k in mine}
        if not any({k: v for k, v in s if k in mine} == have for s in candidates):
            out.append(region[:8])
    return out


def _diff(got: list[tuple[int, int]], want: tuple[tuple[int, int], ...]) -> str:
    g, w = dict(got), dict(want)
    lost = sorted(k for k in w if k not in g)
    extra = sorted(k for k in g if k not in w)
    stale = sorted(k for k in w if k in g and g[k] != w[k])
    return f"lost={lost[:10]} extra(resurrected/unknown)={extra[:10]} wrong_version={stale[:10]}"


@pytest.mark.slow
@pytest.mark.parametrize("gc", [False, True], ids=["no-gc", "gc"])
def test_reader_sees_a_prefix_state_while_writer_and_merger_run(tmp_path: Path, gc: bool) -> None:
    uri = str(tmp_path / "t")
    work = tmp_path / "work"
    work.mkdir()
    seed = 1234 + int(gc)
    base = {k: -k for k in range(0, N_KEYS, 3)}
    mt = ModelTable(
        uri,
        SCHEMA,
        pa.Table.from_pylist([{"id": k, "v": v} for k, v in base.items()], schema=SCHEMA),
        bucket=("id", BUCKETS),
        max_memtable_rows=MAX_MEMTABLE_ROWS,
    )
    spec = mt.ds.mem_wal_index_details()["sharding_specs"][0]
    keys = pa.record_batch({"id": pa.array(range(N_KEYS), pa.int64())})
    buckets = evaluate_sharding_spec(keys, spec, mt.ds.lance_schema).column(0).to_pylist()
    key_region = [mt.region_of_bucket(int(b)) for b in buckets]
    states = model_states(base, make_ops(seed, key_region))
    _write_atomic(work / "progress", "0")

    ctx_mp = mp.get_context("spawn")
    writer = ctx_mp.Process(target=writer_main, args=(uri, seed, key_region, str(work)))
    merger = ctx_mp.Process(target=merger_main, args=(uri, str(work), gc))
    writer.start()
    merger.start()

    failures: list[str] = []
    errors: list[str] = []
    error_stages: Counter[str] = Counter()
    reads = 0
    gone_errors = 0
    reads_during_write = 0
    per_region_cuts = 0
    table = mq.open_table(uri)
    t_end = time.monotonic() + 75
    try:
        while time.monotonic() < t_end:
            writing = writer.is_alive()
            if not writing and reads >= MIN_READS:
                break
            p0 = int((work / "progress").read_text())
            how = "refresh" if reads % 2 == 0 else "open"
            stage = how
            try:
                table = table.refresh() if how == "refresh" else mq.open_table(uri)
                stage = f"query after {how}"
                ctx = datafusion.SessionContext()
                table.register(ctx, "t")
                res = ctx.sql("SELECT id, v FROM t ORDER BY id").to_arrow_table()
            except Exception as err:  # noqa: BLE001 - reported below
                reads += 1
                if stage.startswith("query") and GONE in str(err):
                    # GC removed a generation between open and query: the documented,
                    # retryable error (never a wrong answer); the next read refreshes.
                    gone_errors += 1
                    continue
                errors.append(f"read {reads} ({stage}, progress {p0}): {type(err).__name__}: {str(err)[:300]}")
                error_stages[stage] += 1
                continue
            p1 = int((work / "progress").read_text())
            reads += 1
            reads_during_write += writing and p1 > 0
            got = list(zip(res.column("id").to_pylist(), res.column("v").to_pylist(), strict=True))
            dup = [k for k, n in Counter(k for k, _ in got).items() if n > 1]
            if dup:
                failures.append(f"read {reads}: duplicate keys {dup[:10]}")
            window = range(p0, min(p1 + 1, N_OPS) + 1)
            if not table.snapshot.consistent_cut:
                # writers kept every re-check from settling: each region as of its own read
                per_region_cuts += 1
                wrong = _regions_outside(got, [states[k] for k in window], key_region)
                if wrong:
                    failures.append(f"read {reads}: progress {p0}..{p1}: regions {wrong} match no state")
            elif not any(tuple(got) == states[k] for k in window):
                best = min(window, key=lambda k: len(set(got) ^ set(states[k])))
                failures.append(
                    f"read {reads}: progress {p0}..{p1}: no model state matches; nearest k={best}: "
                    + _diff(got, states[best])
                )
    finally:
        writer.join(timeout=60)
        (work / "stop").write_text("1")
        merger.join(timeout=60)
        for p in (writer, merger):
            if p.is_alive():
                p.kill()
    merger_log = (work / "merger.log").read_text() if (work / "merger.log").exists() else "(no merger log)"
    writer_err = (work / "writer.err").read_text() if (work / "writer.err").exists() else ""
    print(
        f"gc={gc}: {reads} reads ({reads_during_write} while writing, {gone_errors} hit a GC'd generation, "
        f"{per_region_cuts} not one instant)"
    )
    print(f"merger: {merger_log}")
    assert gone_errors <= reads // 4, f"{gone_errors} of {reads} reads hit a garbage-collected generation"
    assert writer.exitcode == 0, writer_err
    assert merger.exitcode == 0, merger_log
    assert not errors and not failures, (
        f"{len(errors)} of {reads} reads failed {dict(error_stages)}, {len(failures)} answered wrong:\n"
        + "\n".join(errors[:4] + failures[:4])
    )
    assert reads_during_write >= MIN_READS // 2, f"only {reads_during_write} reads overlapped the writer"
    assert per_region_cuts <= reads // 10, f"{per_region_cuts} of {reads} snapshots did not settle on one instant"
    # once everything is flushed (and merged as far as the merger got): the final state
    final = mq.open_table(uri).to_arrow().sort_by("id")
    assert list(zip(final.column("id").to_pylist(), final.column("v").to_pylist(), strict=True)) == list(states[-1])


# -- deterministic reproductions of the races the GC variant above runs into ----------------


def _small_table(path: Path) -> ModelTable:
    """Base row 1000 + 20 upserts flushed as generation 1 of each region (nothing merged)."""
    t = AttachedTable.__new__(AttachedTable)
    ModelTable.__init__(t, str(path), SCHEMA, pa.table({"id": [1000], "v": [0]}, schema=SCHEMA), bucket=("id", 2))
    t.put([{"id": k, "v": k} for k in range(20)])
    t.flush()
    return t


def _merge_and_gc(t: ModelTable, *, partial: bool = False) -> None:
    """Merge every flushed generation, then delete its directory (``partial``: only its
    data and deletion files, as a GC caught half-way through would leave it)."""
    for region in t.regions():
        for g, path in t.flushed(region):
            t.merge(region, g)
            gen_dir = Path(t.uri) / "_mem_wal" / region / path
            for sub in ["data", "_deletions"] if partial else [""]:
                shutil.rmtree(gen_dir / sub, ignore_errors=True)


def _ids(table: mq.Table) -> list[tuple[int, int]]:
    res = table.sql("SELECT id, v FROM t ORDER BY id").to_arrow_table()
    return list(zip(res.column("id").to_pylist(), res.column("v").to_pylist(), strict=True))


def _expected(t: ModelTable) -> list[tuple[int, int]]:
    return sorted((r["id"], r["v"]) for r in t.model.values())


def _merge_gc_after_index_read(monkeypatch: pytest.MonkeyPatch, t: ModelTable, *, partial: bool = False) -> None:
    """The next snapshot reads base version V, then a merger merges + GCs before the
    snapshot opens the generations (the race the concurrent test hits)."""
    import memwal_query.snapshot.load as snapshot_mod

    orig = snapshot_mod.read_version
    fired: list[bool] = []

    def read_index_then_gc(storage: Any, version: int) -> Any:
        got = orig(storage, version)
        if not fired:
            fired.append(True)
            _merge_and_gc(t, partial=partial)
        return got

    monkeypatch.setattr(snapshot_mod, "read_version", read_index_then_gc)


def test_open_racing_merge_and_gc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation directories gone when opened: retried with the newer base (works)."""
    t = _small_table(tmp_path / "t")
    _merge_gc_after_index_read(monkeypatch, t)
    assert _ids(mq.open_table(t.uri)) == _expected(t)


def test_refresh_racing_merge_and_gc_of_a_cached_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BUG: refresh() reuses the generation dataset cached by the previous snapshot and
    never notices its directory is gone, so no retry with the newer base happens and the
    query fails with Lance "Not found ... _gen_1/data/...". Expected: as for a fresh open."""
    t = _small_table(tmp_path / "t")
    table = mq.open_table(t.uri)  # caches the generation datasets
    _merge_gc_after_index_read(monkeypatch, t)
    assert _ids(table.refresh()) == _expected(t)


def test_open_racing_a_half_done_gc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BUG: a generation directory caught half-deleted (``_versions`` still there, data
    files gone) is opened as if it were intact: no retry, the read fails. Expected: the
    same retry with the newer base as for a missing directory."""
    t = _small_table(tmp_path / "t")
    _merge_gc_after_index_read(monkeypatch, t, partial=True)
    assert _ids(mq.open_table(t.uri)) == _expected(t)


GONE = "garbage-collected after this snapshot was opened; refresh() the table and retry"


def test_query_of_a_snapshot_whose_generation_was_merged_and_gcd(tmp_path: Path) -> None:
    """A snapshot opened before merge + GC, queried after: its rows are only in a newer
    base version, so the old snapshot cannot answer. Contract: a clear error that says
    so (a MemWalError; through DataFusion, DataFusion's error carrying that message),
    never a wrong answer; a refresh then answers correctly."""
    t = _small_table(tmp_path / "t")
    table = mq.open_table(t.uri)
    _merge_and_gc(t)
    with pytest.raises(mq.MemWalError, match="refresh"):
        table.to_arrow()
    with pytest.raises(mq.MemWalError, match=GONE.split(";")[0]):
        _ids(table)
    keys = [k for k, _ in _expected(t)]
    with pytest.raises(mq.MemWalError, match="garbage-collected after this snapshot was opened; refresh"):
        table.lookup(keys)  # was pyarrow's ArrowInvalid with Lance's "Not found" and a Rust path
    assert _ids(table.refresh()) == _expected(t)


# -- a writer's order across regions ----------------------------------------------------------


def _writes_between_region_reads(monkeypatch: pytest.MonkeyPatch, t: ModelTable) -> tuple[int, int]:
    """The next snapshot reads region A; then, before it reads region B, a writer puts key
    ``a`` into A and after that key ``b`` into B. Returns ``(a, b)``."""
    import memwal_query.snapshot.load as snapshot_mod

    first, second = t.regions()
    routed = t.route(pa.table({"id": pa.array(range(100, 200), pa.int64())}))
    a, b = routed[first].column("id")[0].as_py(), routed[second].column("id")[0].as_py()
    first_read = threading.Event()
    fired: list[bool] = []
    orig = snapshot_mod._load_region

    def load_region(storage: Any, region_id: str, *args: Any) -> Any:
        if region_id == second and not fired:
            assert first_read.wait(30), "region A was never read"
            fired.append(True)
            t.put([{"id": a, "v": 1}])
            t.put([{"id": b, "v": 2}])
        out = orig(storage, region_id, *args)
        if region_id == first:
            first_read.set()
        return out

    monkeypatch.setattr(snapshot_mod, "_load_region", load_region)
    return a, b


def test_strong_snapshot_keeps_a_writers_order_across_regions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Region A is read before the writer's put to A, region B after its later put to B:
    the snapshot must not show the later write without the earlier one. The re-check
    after reading finds A's WAL grown and reads it again: both writes, one instant."""
    t = _small_table(tmp_path / "t")
    a, b = _writes_between_region_reads(monkeypatch, t)
    table = mq.open_table(t.uri)
    got = dict(_ids(table))
    assert (got.get(a), got.get(b)) == (1, 2)
    assert table.snapshot.consistent_cut
    assert sorted(got.items()) == _expected(t)
    assert "all regions as of one instant" in table.explain()
    t.flush()


def test_strong_snapshot_says_when_it_could_not_settle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no re-check passes allowed, the same race leaves region A as first read, and
    the snapshot says it is not one instant (the state a re-check exists to prevent)."""
    import memwal_query.snapshot.load as snapshot_mod

    monkeypatch.setattr(snapshot_mod, "MAX_CUT_ROUNDS", 0)
    t = _small_table(tmp_path / "t")
    a, b = _writes_between_region_reads(monkeypatch, t)
    table = mq.open_table(t.uri)
    got = dict(_ids(table))
    assert (got.get(a), got.get(b)) == (None, 2)
    assert not table.snapshot.consistent_cut
    assert "writers kept moving" in table.explain()
    t.flush()


def test_eventual_snapshot_claims_no_instant(tmp_path: Path) -> None:
    t = _small_table(tmp_path / "t")
    assert not mq.open_table(t.uri, consistency="eventual").snapshot.consistent_cut
    assert mq.open_table(t.uri).snapshot.consistent_cut


def test_two_sinks_writing_the_same_regions_at_once_both_land(tmp_path: Path) -> None:
    """Two streaming queries into one table (each its own sink_id) commit their batches at the same
    time: each batch opens a writer per region, so the two fence each other. A fenced commit failed
    and ended its query; it writes its rows again now, after a random, growing wait."""
    from memwal_write.spark_sink import SinkOptions, apply_rows

    uri = str(tmp_path / "t")
    lance.write_dataset(SCHEMA.empty_table(), uri).initialize_mem_wal(bucket_column="id", num_buckets=4)
    errors: list[str] = []

    def sink(name: str, keys: list[int]) -> None:
        opts = SinkOptions.from_options({"path": uri, "sink_id": name})
        for version in range(6):
            rows = pa.table({"id": pa.array(keys, pa.int64()), "v": pa.array([version] * len(keys), pa.int64())})
            try:
                apply_rows(rows, opts)
            except Exception as err:  # noqa: BLE001 - what the test reports
                errors.append(f"{name}: {err}")

    threads = [threading.Thread(target=sink, args=(n, list(range(o, 400, 2)))) for n, o in (("a", 0), ("b", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]
    got = mq.open_table(uri).to_arrow().sort_by("id")
    assert got.column("id").to_pylist() == list(range(400)) and set(got.column("v").to_pylist()) == {5}


def test_a_lost_claim_of_a_region_is_explained_as_fencing() -> None:
    from memwal_write.spark_tasks import fenced, fencing_explained

    raw = "cannot open a writer for region r of t: Failed to claim shard r: another writer claimed epoch 1 (>= 1)"
    assert fenced(mq.MemWalError(raw)) and not fenced(mq.MemWalError("disk full"))
    with pytest.raises(mq.MemWalError, match="^a region writer of t was fenced: .* one at a time. Cause: cannot"):
        with fencing_explained("t"):
            raise mq.MemWalError(raw)


def test_a_fenced_writer_says_so_once_for_all_its_regions(tmp_path: Path) -> None:
    """Closing a writer fenced in every region gave Lance's message once per region (each with
    the region's id twice): one line, but hundreds of characters per region."""
    from memwal_write import RoutedWriter

    uri = str(tmp_path / "t")
    lance.write_dataset(SCHEMA.empty_table(), uri).initialize_mem_wal(bucket_column="id", num_buckets=4)
    rows = pa.table({"id": pa.array(range(40), pa.int64()), "v": pa.array(range(40), pa.int64())})
    fenced = RoutedWriter.open(uri)
    fenced.put(rows)
    with RoutedWriter.open(uri) as newer:
        newer.put(rows)
    with pytest.raises(mq.MemWalError) as err:
        fenced.close()
    msg = str(err.value)
    regions = mq.open_table(uri).snapshot.regions
    assert len(regions) == 4 and all(msg.count(r.region_id) == 1 for r in regions), msg
    assert msg.count("Writer fenced") == 1 and "for shard <region>" in msg and "\n" not in msg


def test_base_history_is_read_while_other_threads_query_the_same_snapshot(tmp_path: Path) -> None:
    """pylance's ``get_transactions`` holds its dataset object exclusively while it reads: the
    base's operations (read by a snapshot's first search to plan its index catch-up, and on a
    refresh that gains base versions) were read through the snapshot's own base object, so a
    query on another thread failed with "Already mutably borrowed", and a read that lost the
    race was kept: the catch-up plan unusable (flat search) for the rest of the process."""
    from memwal_query.format.transactions import read_operations

    dim = 8
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("vec", pa.list_(pa.float32(), dim)),
        ]
    )
    rng = np.random.default_rng(3)

    def rows(ids: range | list[int]) -> list[dict[str, Any]]:
        return [{"id": i, "vec": rng.normal(size=dim).astype(np.float32).tolist()} for i in ids]

    base = pa.Table.from_pylist(rows(range(600)), schema=schema)
    t = ModelTable(
        str(tmp_path / "t"),
        schema,
        base,
        bucket=("id", 2),
        prepare=lambda ds: ds.create_index("vec", index_type="IVF_FLAT", num_partitions=2),
        maintained_indexes=[],
    )
    merged: set[tuple[str, int]] = set()
    for round_ in range(2):  # base versions after the index: merges
        t.put(rows([round_ * 50 + i for i in range(40)] + [700 + round_]))
        t.flush()
        for region in t.regions():
            for g, _ in t.flushed(region):
                if (region, g) not in merged:
                    t.merge(region, g)
                    merged.add((region, g))
    t.put(rows([3, 4]))

    # the read itself, on a dataset object another thread queries meanwhile
    shared = lance.dataset(t.uri)
    alone = {v: type(op).__name__ for v, op in read_operations(lance.dataset(t.uri), shared.version, 4).items()}
    failures: list[str] = []
    stop = time.monotonic() + 0.5

    def reads() -> None:
        while time.monotonic() < stop:
            got = {v: type(op).__name__ for v, op in read_operations(shared, shared.version, 4).items()}
            if got != alone:
                failures.append(f"read {got} != {alone}")

    reader = threading.Thread(target=reads)
    reader.start()
    while time.monotonic() < stop:
        try:
            shared.count_rows()
            shared.to_table(columns=["id"], filter="id = 3")
        except RuntimeError as err:
            failures.append(str(err))
    reader.join()
    assert not failures, failures[:3]

    # through the API: a fresh table's catch-up plan racing queries on the same snapshot
    index = "vec_idx"  # Lance names an index after its column
    want = mq.open_table(t.uri).catchup_plan(index).reason
    assert "cannot be read" not in want

    def plan(table: mq.Table, barrier: threading.Barrier, reasons: list[str]) -> None:
        barrier.wait()
        reasons.append(table.catchup_plan(index).reason)

    def query(table: mq.Table, barrier: threading.Barrier, _: list[str]) -> None:
        barrier.wait()
        for _ in range(5):
            try:
                table.count_rows()
                table.lookup([1, 2, 3])
            except Exception as err:  # noqa: BLE001 - any failure is the finding
                failures.append(repr(err))

    for _ in range(8):
        table, barrier, reasons = mq.open_table(t.uri), threading.Barrier(3), []
        threads = [threading.Thread(target=f, args=(table, barrier, reasons)) for f in (plan, query, query)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        assert reasons == [want] and not failures, (reasons, failures[:3])


def test_a_folder_created_while_it_is_listed_is_listed(tmp_path: Path) -> None:
    """A writer's first write creates ``_mem_wal/``, a region's folder, its ``manifest/`` and
    ``wal/`` while readers, the merger and the collector list them: pyarrow's local listing
    failed with the "not found" it met before the folder appeared (``open_table`` and
    ``merge_generations`` raised StorageError "cannot list ..." racing a new table's first
    ``write_arrow``). Such a listing is made again."""
    from memwal_query.format.storage import Storage

    storage = Storage.open(str(tmp_path))
    made, failures, listed = [0], [], [0]
    stop = time.monotonic() + 1.0

    def create() -> None:
        while time.monotonic() < stop:
            (tmp_path / f"d{made[0]}").mkdir()
            (tmp_path / f"d{made[0]}" / "x").touch()
            made[0] += 1

    maker = threading.Thread(target=create)
    maker.start()
    while time.monotonic() < stop:
        name = f"d{made[0]}"  # the folder about to be created
        try:
            got = storage.list_dir(name)
        except Exception as err:  # noqa: BLE001 - any failure is the finding
            failures.append(repr(err))
            continue
        listed[0] += 1
        assert got in ([], [("x", False)]), got
    maker.join()
    assert made[0] > 100 and listed[0] > 100 and not failures, (made, listed, failures[:3])
