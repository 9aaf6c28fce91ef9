"""Keys of other shapes, snapshot lifecycle, in-process MemTables, clear errors."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq

from builders import build_events, events_schema, rows
from lsm_model import PK, ModelTable, sort_table


def composite_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("tenant", pa.string(), nullable=False, metadata=PK),
            pa.field("v", pa.float64()),
            pa.field("seq", pa.int32(), nullable=False, metadata=PK),
        ]
    )


def test_composite_string_key_unsharded(tmp_path: Path) -> None:
    schema = composite_schema()
    names = ["ä", "b", "", "x y", "ß" * 5]
    base = pa.Table.from_pylist(
        [{"tenant": t, "v": float(i), "seq": i} for t in names for i in range(50)], schema=schema
    )
    t = ModelTable(str(tmp_path / "c"), schema, base, unsharded=True, max_memtable_rows=40)
    t.put([{"tenant": "b", "v": -1.0, "seq": 3}, {"tenant": "b", "v": -2.0, "seq": 3}])  # dup in batch
    t.put([{"tenant": n, "v": 100.0 + i, "seq": i} for n in ["ä", "new"] for i in range(30)])
    t.delete([("x y", 1), ("x y", 2), ("nope", 9)])
    t.flush()
    t.put([{"tenant": "x y", "v": 7.0, "seq": 1}])  # re-insert after delete, in the WAL tail
    t.delete([("ä", 0)])
    table = mq.open_table(t.uri)
    assert table.primary_key == ("tenant", "seq")
    got = sort_table(table.to_arrow(), ["tenant", "seq"])
    assert got.equals(sort_table(t.expected(), ["tenant", "seq"]))
    ctx = datafusion.SessionContext()
    table.register(ctx, "c")
    ctx.register_record_batches("o", [t.expected().to_batches()])
    q = "SELECT tenant, count(*) AS n, sum(v) AS s FROM {} WHERE v >= 0 GROUP BY tenant ORDER BY tenant"
    assert ctx.sql(q.format("c")).to_pylist() == ctx.sql(q.format("o")).to_pylist()
    t.flush()


def test_refresh_sees_new_writes_and_old_snapshot_is_frozen(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=3, keep_open=False)
    first = mq.open_table(t.uri)
    n_first = first.count_rows()
    rng = np.random.default_rng(9)
    t.put(rows(range(5000, 5100), 9, rng))
    t.delete([(1,), (2,)])
    t.flush()
    t.put(rows(range(6000, 6010), 10, rng))  # WAL tail
    second = first.refresh()
    assert first.count_rows() == n_first  # frozen
    assert sort_table(second.to_arrow(), ["id"]).equals(sort_table(t.expected(), ["id"]))
    # what did not change was reused: the same opened generation datasets
    old = {g.uri: g.dataset for r in first.snapshot.regions for g in r.generations}
    new = {g.uri: g.dataset for r in second.snapshot.regions for g in r.generations}
    shared = set(old) & set(new)
    assert shared and all(old[u] is new[u] for u in shared)
    t.flush()


def test_refresh_after_merge_skips_merged_generation(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=4, keep_open=False)
    table = mq.open_table(t.uri)
    r = table.snapshot.regions[0]
    g = r.generations[0].generation
    t.merge(r.region_id, g)
    newer = table.refresh()
    assert newer.version > table.version
    r2 = next(x for x in newer.snapshot.regions if x.region_id == r.region_id)
    assert r2.merged_generation == g and all(x.generation > g for x in r2.generations)
    assert sort_table(newer.to_arrow(), ["id"]).equals(sort_table(t.expected(), ["id"]))


class _Live:
    def __init__(self, region_id: str, generation: int, batches: list[pa.RecordBatch]) -> None:
        self.region_id = region_id
        self.generation = generation
        self._b = batches

    def to_batches(self) -> list[pa.RecordBatch]:
        return self._b


def test_in_process_live_memtable_is_read(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=5, keep_open=False)
    region = t.regions()[0]
    gen = max(g for g, _ in t.flushed(region)) + 1
    upd = pa.Table.from_pylist(
        [
            {"id": 10_000, "cat": "z", "amount": 1.0, "qty": 1, "_tombstone": False},
            {"id": 10_000, "cat": "zz", "amount": 2.0, "qty": 2, "_tombstone": False},
            {"id": 10_001, "cat": "z", "amount": 3.0, "qty": 3, "_tombstone": False},
            {"id": 10_001, "cat": None, "amount": None, "qty": None, "_tombstone": True},
        ],
        schema=pa.schema(list(events_schema()) + [pa.field("_tombstone", pa.bool_())]),
    )
    live = _Live(region, gen, upd.to_batches())
    table = mq.open_table(t.uri, live=[live])
    got = {r["id"]: r for r in table.to_arrow().to_pylist()}
    assert got[10_000]["cat"] == "zz" and 10_001 not in got
    assert "in-process" in table.explain()
    with pytest.raises(mq.InvalidArgumentError, match="invalid region id"):
        mq.open_table(t.uri, live=[_Live("not-a-uuid", 1, [])])


def test_deleted_unmerged_generation_is_rebuilt_from_the_wal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t = build_events(str(tmp_path / "e"), seed=6, keep_open=False)
    table = mq.open_table(t.uri)
    r = next(r for r in table.snapshot.regions if r.generations)
    gone = r.generations[0]
    shutil.rmtree(gone.uri)
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        again = mq.open_table(t.uri)
    assert any("served from the WAL" in m and gone.uri in m for m in caplog.messages)
    r2 = next(x for x in again.snapshot.regions if x.region_id == r.region_id)
    assert [g.lost_uri for g in r2.generations if g.generation == gone.generation] == [gone.uri]
    assert "REBUILT from WAL positions" in again.explain()
    assert sort_table(again.to_arrow().cast(t.schema), ["id"]).equals(sort_table(t.expected(), ["id"]))


# -- errors -----------------------------------------------------------------------


def test_a_table_is_not_pickled_its_uri_is(tmp_path: Path) -> None:
    """pickle (a Table handed to a multiprocessing worker) and deepcopy failed with "cannot
    pickle 'mappingproxy' object", naming neither the Table nor its table."""
    import copy
    import pickle

    t = ModelTable(
        str(tmp_path / "t"),
        events_schema(),
        pa.Table.from_pylist(rows(range(5), 0, np.random.default_rng(0)), schema=events_schema()),
        bucket=("id", 2),
    )
    table = mq.open_table(t.uri)
    for attempt in (lambda: pickle.dumps(table), lambda: copy.deepcopy(table)):
        with pytest.raises(mq.MemWalError, match=f"a Table \\({t.uri}\\) cannot be pickled or copied: pass its URI"):
            attempt()
    assert mq.open_table(pickle.loads(pickle.dumps(table.uri))).count_rows() == 5


def test_a_process_that_cannot_start_threads_is_told_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a low address-space limit (``ulimit -v`` below ~3 GiB here) Python cannot start a
    thread: ``open_table`` failed with a bare RuntimeError "can't start new thread", naming
    neither the table nor the limit."""
    import concurrent.futures

    rng = np.random.default_rng(0)
    base = pa.Table.from_pylist(rows(range(5), 0, rng), schema=events_schema())
    t = ModelTable(str(tmp_path / "t"), events_schema(), base, bucket=("id", 2))
    t.put(pa.Table.from_pylist(rows(range(3, 9), 1, rng), schema=events_schema()))

    def refused(*_: object, **__: object) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(concurrent.futures.ThreadPoolExecutor, "submit", refused)
        with pytest.raises(mq.MemWalError, match=f"cannot open {t.uri}: the process cannot start another thread"):
            mq.open_table(t.uri)
    assert mq.open_table(t.uri).count_rows() == 9
    t.flush()


def test_missing_table(tmp_path: Path) -> None:
    with pytest.raises(mq.TableNotFoundError, match=str(tmp_path / "nope")):
        mq.open_table(str(tmp_path / "nope"))


def test_not_a_memwal_table(tmp_path: Path) -> None:
    uri = str(tmp_path / "plain")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK)])
    lance.write_dataset(pa.table({"id": pa.array([1], pa.int64())}).cast(schema), uri)
    with pytest.raises(mq.NotAMemWalTableError, match="initialize_mem_wal"):
        mq.open_table(uri)
    # a plain table without a key either: what it lacks first (the key error, fixed, led to this one)
    bare = str(tmp_path / "bare")
    lance.write_dataset(pa.table({"id": [1]}), bare)
    with pytest.raises(mq.NotAMemWalTableError, match="initialize_mem_wal"):
        mq.open_table(bare)


def test_no_primary_key(tmp_path: Path) -> None:
    uri = str(tmp_path / "nopk")
    ds = lance.write_dataset(pa.table({"id": [1, 2]}), uri)
    ds.initialize_mem_wal()
    with pytest.raises(mq.NoPrimaryKeyError, match="unenforced-primary-key") as e:
        mq.open_table(uri)
    assert uri in str(e.value)


def test_unreadable_base_manifest(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=7, keep_open=False)
    ds = lance.dataset(t.uri)
    latest = max(Path(t.uri, "_versions").glob("*.manifest"), key=lambda p: p.stat().st_mtime)
    # Lance keeps an in-memory copy per process; damage a copy of the table instead
    copy = tmp_path / "copy"
    shutil.copytree(t.uri, copy)
    target = copy / "_versions" / latest.name
    data = target.read_bytes()
    target.write_bytes(data[:-16] + b"\x00" * 12 + b"LANC")
    with pytest.raises(mq.ManifestError) as e:
        mq.open_table(str(copy))
    assert str(copy) in str(e.value)
    del ds


def test_unreadable_region_manifest(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=8, keep_open=False)
    region = t.regions()[0]
    mdir = Path(t.uri, "_mem_wal", region, "manifest")
    victim = sorted(p for p in mdir.glob("*.binpb"))[0]
    victim.write_bytes(b"\xff\xff\xff garbage")
    (mdir / "version_hint.json").write_text('{"version": 1}')
    with pytest.raises(mq.ManifestError, match=region) as e:
        mq.open_table(t.uri)
    assert victim.name in str(e.value)


def test_bad_arguments(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=2, keep_open=False)
    with pytest.raises(mq.InvalidArgumentError, match="consistency"):
        mq.open_table(t.uri, consistency="sometimes")  # type: ignore[arg-type]
    with pytest.raises(mq.InvalidArgumentError, match="unknown storage option"):
        mq.open_table("s3://bucket/t", storage_options={"aws_acess_key": "typo"})
    table = mq.open_table(t.uri)
    with pytest.raises(mq.InvalidArgumentError, match="SessionContext"):
        table.register(object(), "x")  # type: ignore[arg-type]
    with pytest.raises(mq.InvalidArgumentError, match="unknown column"):
        table.to_arrow(columns=["id", "nope"])
    import pyarrow.compute as pc

    with pytest.raises(mq.InvalidArgumentError, match=r"invalid filter \(id == \"5\"\) for .*: .*no kernel"):
        table.to_reader(filter=pc.field("id") == pa.scalar("5"))  # pyarrow compares no int with a string
    # a parser's position is in the predicate (it counted from memwal's "SELECT * FROM t WHERE ")
    with pytest.raises(mq.InvalidArgumentError, match="found: = at Line: 1, Column: 6"):
        table.plan("id = = 3")
    latest = lance.dataset(t.uri).version
    with pytest.raises(mq.TableNotFoundError, match=f"has no version 999999 \\(latest: {latest}\\)"):
        mq.open_table(t.uri, version=999999)


def test_errors_quoting_a_multi_line_cause_are_one_line(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=2, keep_open=False)
    table = mq.open_table(t.uri)
    # DataFusion's schema error spans two lines ("... Did you mean ...?\nValid fields are ...").
    for call in (lambda: table.explain("nope = 1"), lambda: table.plan("nope = 1")):
        with pytest.raises(mq.InvalidArgumentError, match="nope") as info:
            call()
        message = str(info.value)
        assert "\n" not in message and "Valid fields are" in message and t.uri in message


def test_ffi_version_check_names_both_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    from memwal_query import compat

    versions = {"pylance": "14.0.2", "datafusion": "55.0.0"}
    monkeypatch.setattr(compat, "_version", lambda pkg: versions[pkg])
    with pytest.raises(mq.UnsupportedVersionError, match=r"DataFusion 54.*55\.0\.0"):
        compat.require_ffi_compatible()
    versions["datafusion"] = "54.1.0"
    compat.require_ffi_compatible()
    versions["datafusion"] = "57.0.0"
    with pytest.raises(mq.UnsupportedVersionError, match="57.0.0"):
        compat.check_datafusion_supported()


def test_region_uuid_dirs_only(tmp_path: Path) -> None:
    t = build_events(str(tmp_path / "e"), seed=1, keep_open=False)
    os.makedirs(os.path.join(t.uri, "_mem_wal", "not-a-region"))
    table = mq.open_table(t.uri)
    dirs = os.listdir(os.path.join(t.uri, "_mem_wal"))
    assert "not-a-region" in dirs
    assert sorted(table.region_ids) == sorted(d for d in dirs if d != "not-a-region")
    assert all(str(uuid.UUID(r)) == r for r in table.region_ids)


def test_key_in_two_regions_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    schema = events_schema()
    rng = np.random.default_rng(0)
    t = ModelTable(str(tmp_path / "x"), schema, pa.Table.from_pylist(rows(range(10), 0, rng), schema=schema))
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    t.put(rows([3, 4], 1, rng), region=a)
    t.put(rows([4, 5], 2, rng), region=b)  # key 4 in two regions: a writer bug
    t.flush()
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        table = mq.open_table(t.uri)
    assert table.merge_state.cross_region_keys == 1
    assert any("more than one region" in m for m in caplog.messages)
    assert "1 keys have rows in more than one region" in table.explain()


def test_generation_merged_and_collected_during_open_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merger merges generation g and GC removes it after the reader read base version V:
    the reader must retry with the newest base (which holds g's rows), not lose them."""
    import memwal_query.snapshot.load as snapshot_mod

    t = build_events(str(tmp_path / "e"), seed=13, keep_open=False)
    old_version = lance.dataset(t.uri).version
    region = next(r for r in t.regions() if t.flushed(r))
    gens = [g for g, _ in t.flushed(region)]
    table = mq.open_table(t.uri)
    rs = next(r for r in table.snapshot.regions if r.region_id == region)
    g = rs.generations[0]
    t.merge(region, g.generation)
    shutil.rmtree(g.uri)  # GC after the merge
    real = snapshot_mod.lance_dataset
    calls = []

    def stale_first(storage, given, purpose="", version=None):  # type: ignore[no-untyped-def]
        calls.append(version)
        return real(storage, given, purpose, old_version if len(calls) == 1 else version)

    monkeypatch.setattr(snapshot_mod, "lance_dataset", stale_first)
    again = mq.open_table(t.uri)
    assert len(calls) == 2 and again.version > old_version
    assert sort_table(again.to_arrow(), ["id"]).equals(sort_table(t.expected(), ["id"]))
    # the retried snapshot has g merged and reads exactly the generations after it
    r2 = next(r for r in again.snapshot.regions if r.region_id == region)
    assert r2.merged_generation == g.generation
    assert [x.generation for x in r2.generations] == [x for x in gens if x > g.generation]


def test_refresh_reads_only_new_base_fragments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening and refreshing read no base key; the lazy base mask reads a fragment's keys
    when a query first needs it, and after a merge (a new base version) only the
    fragments the merge added or changed, not the whole base."""
    import lance.fragment

    import memwal_query.base_reads as base_reads_module

    t = build_events(str(tmp_path / "e"), seed=21, keep_open=False)
    read: list[int] = []
    real = lance.fragment.LanceFragment.to_table

    def counting(self, *a, **k):  # type: ignore[no-untyped-def]
        if k.get("columns") == ["id"]:  # a base key read (generations are read whole-dataset)
            read.append(self.fragment_id)
        return real(self, *a, **k)

    def direct(storage, meta, *a, **k):  # type: ignore[no-untyped-def]
        read.append(meta.id)  # a base key read from the fragment's data file
        return real_direct(storage, meta, *a, **k)

    real_direct = base_reads_module.read_columns
    monkeypatch.setattr(lance.fragment.LanceFragment, "to_table", counting)
    monkeypatch.setattr(base_reads_module, "read_columns", direct)
    table = mq.open_table(t.uri)
    assert read == []  # open reads no base key
    before = {f.fragment_id for f in lance.dataset(t.uri).get_fragments()}
    assert table.count_rows() == t.expected().num_rows
    assert sorted(read) == sorted(before)  # count(*) decided every fragment once
    assert table.merge_state.base_mask.status().complete
    region = next(r for r in t.regions() if t.flushed(r))
    t.merge(region, min(g for g, _ in t.flushed(region) if g > table.snapshot.index.merged_generation(region)))
    after = lance.dataset(t.uri).get_fragments()
    changed = [f for f in after if f.fragment_id not in before or f.metadata.deletion_file is not None]
    read.clear()
    newer = table.refresh()
    assert newer.version > table.version
    assert read == []  # refresh reads no base key either
    assert newer.count_rows() == t.expected().num_rows
    assert 0 < len(read) <= len(changed) < len(after), (read, len(changed), len(after))
    assert sort_table(newer.to_arrow(), ["id"]).equals(sort_table(t.expected(), ["id"]))
    read.clear()
    newest = newer.refresh()  # nothing changed: no base key read at all
    assert newest.count_rows() == t.expected().num_rows
    assert read == []


def test_a_table_deleted_after_it_was_opened(tmp_path: Path) -> None:
    """Reads said the column had no INVERTED index (wrong advice), the table's "latest version
    is None", or quoted Lance's "Not found"; each says the table is gone now."""
    from memwal_query.demo import write_demo_table

    uri = write_demo_table(str(tmp_path / "t"), base_rows=300, update_rows=50, memtable_rows=20, seed=3)
    t = mq.open_table(uri)
    shutil.rmtree(uri)
    reads = {
        "count_rows": t.count_rows,
        "search_text": lambda: t.search_text("note", "refund", k=3),
        "nearest": lambda: t.nearest("vec", np.zeros(t.snapshot.schema.field("vec").type.list_size, np.float32)),
        "lookup": lambda: t.lookup([1]),
    }
    for name, read in reads.items():
        with pytest.raises(mq.MemWalError, match=f"nor can {uri}: it was removed after this snapshot") as err:
            read()
        assert "refresh() the table and retry" in str(err.value), name
    with pytest.raises(mq.TableNotFoundError, match=f"no Lance table at {uri}"):
        t.refresh()


@pytest.mark.parametrize("deleted_in_first", [True, False])
def test_key_in_two_regions_reads_alike_on_every_path(tmp_path: Path, deleted_in_first: bool) -> None:
    """Keys written to two regions (a writer's bug the spec cannot order): every access path
    shows each region's newest live version, as scans do. Lookups (and the change feed, which
    looks keys up) took a key for settled in the first region holding it, tombstone or not."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])
    uri = str(tmp_path / "t")
    lance.write_dataset(pa.table({"id": [1, 5, 7], "v": ["b1", "b5", "b7"]}, schema=schema), uri).initialize_mem_wal()
    before = mq.open_table(uri)
    first, second = "00000000-0000-4000-8000-000000000001", "ffffffff-0000-4000-8000-000000000001"
    deleting, putting = (first, second) if deleted_in_first else (second, first)
    with lance.dataset(uri).mem_wal_writer(putting) as w:
        w.put(pa.table({"id": [5, 7], "v": ["p5", "p7"]}, schema=schema))
    with lance.dataset(uri).mem_wal_writer(deleting) as w:
        w.put(pa.table({"id": [7], "v": ["d7"]}, schema=schema))
        w.delete(pa.table({"id": pa.array([5], pa.int64())}))
    table = mq.open_table(uri)
    want = [(1, "b1"), (5, "p5"), (7, "d7"), (7, "p7")]

    def pairs(t: pa.Table) -> list[tuple[int, str]]:
        return sorted(zip(t.column("id").to_pylist(), t.column("v").to_pylist(), strict=True))

    assert pairs(table.sql("SELECT id, v FROM t").to_arrow_table()) == want
    assert pairs(table.lookup([1, 5, 7])) == want
    assert pairs(table.lookup([5])) == [(5, "p5")]
    assert pairs(table.sql("SELECT id, v FROM memwal_lookup('t', [1, 5, 7])").to_arrow_table()) == want
    changed = table.changes(before)
    assert pairs(changed.filter(pc.field("_change") == "upsert")) == want[1:]
