"""The change feed against the dict model: random put / delete / flush / merge / GC sequences,
with base compactions and memwal_write's merger among them.

After every step, for the last few checkpoints (older snapshots and their tokens), the
changes since the checkpoint applied to the checkpoint's rows give the newer snapshot's
rows, which equal the model; the keys reported were all written since the last flush
before the checkpoint (the cost follows the changes). Garbage collection removes merged
generations (the WAL since the checkpoint answers instead) and WAL entries of merged
generations (then the changes may be unknown: ChangesUnavailableError, nothing else).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import memwal_query as mq
from memwal_query.changes import CHANGE_COLUMN, change_schema
from memwal_query.format.names import parse_bitrev64_name
from memwal_query.format.storage import Storage
from memwal_query.format.wal import WalEntry, read_wal_entry, wal_entry_path
from memwal_query.snapshot import latest_region_manifest

from lsm_model import PK, ModelTable

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("v", pa.int64()),
        pa.field("c", pa.string()),
    ]
)
KEYS = st.integers(min_value=0, max_value=40)


class FastModelTable(ModelTable):
    """Writers flush their WAL every millisecond (durable puts return quickly)."""

    def writer(self, region: str) -> Any:
        w = self.writers.get(region)
        if w is None:
            w = lance.dataset(self.uri).mem_wal_writer(
                region, max_memtable_rows=self.max_rows, max_wal_flush_interval_ms=1
            )
            self.writers[region] = w
        return w


Rows = dict[int, dict[str, Any]]


def rows_of(table: mq.Table) -> Rows:
    return {r["id"]: r for r in table.to_arrow().to_pylist()}


def apply(rows: Rows, changes: pa.Table) -> Rows:
    out = dict(rows)
    for r in changes.to_pylist():
        kind = r.pop(CHANGE_COLUMN)
        if kind == "upsert":
            out[r["id"]] = r
        else:
            assert kind == "delete" and r["v"] is None and r["c"] is None, r
            out.pop(r["id"], None)
    return out


@dataclass
class Checkpoint:
    table: mq.Table
    token: str
    rows: Rows
    #: keys a change since here may name: written since the last flush before it, or after it
    allowed: set[int] = field(default_factory=set)
    wal_gone: bool = False


class Feed:
    def __init__(self, path: str, buckets: int, base: list[int]) -> None:
        rows = {k: {"id": k, "v": -1 - k, "c": "b"} for k in base}
        rows[1000] = {"id": 1000, "v": -1, "c": "z"}  # the base keeps a fragment
        self.t = FastModelTable(
            path,
            SCHEMA,
            pa.Table.from_pylist(list(rows.values()), schema=SCHEMA),
            bucket=("id", buckets),
            max_memtable_rows=30,
        )
        self.seq = 0
        self.merged: dict[str, int] = {}
        self.since_flush: set[int] = set()
        self.checkpoints: list[Checkpoint] = []
        self.checkpoint(False)

    def model(self) -> Rows:
        return {k[0]: r for k, r in self.t.model.items()}

    def touched(self, keys: list[int]) -> None:
        self.since_flush |= set(keys)
        for c in self.checkpoints:
            c.allowed |= set(keys)

    def put(self, keys: list[int]) -> None:
        self.seq += 1
        self.t.put([{"id": k, "v": self.seq * 100 + i, "c": "abc"[k % 3]} for i, k in enumerate(keys)])
        self.touched(keys)

    def delete(self, keys: list[int]) -> None:
        self.t.delete([(k,) for k in keys])
        self.touched(keys)

    def flush(self, picks: list[int]) -> None:
        """Close every writer (MemTables become generations), then merge some."""
        self.t.flush()
        self.since_flush = set()
        self.merge(picks)

    def merge(self, picks: list[int]) -> None:
        for pick in picks:
            todo = {}
            for r in self.t.regions():
                gens = [g for g, _ in self.t.flushed(r) if g > self.merged.get(r, 0)]
                if gens:
                    todo[r] = min(gens)
            if not todo:
                return
            region = sorted(todo)[pick % len(todo)]
            self.t.merge(region, todo[region])
            self.merged[region] = todo[region]
            event("merged")

    def compact(self) -> None:
        """Compact the base: new fragments and row addresses, deletions materialised."""
        self.t.compact_base(30)
        event("compacted the base")

    def ours(self) -> None:
        """memwal_write's merger: every flushed generation of every region, oldest first."""
        if self.t.merge_all(self.merged):
            event("merged by memwal_write")

    def gc(self) -> None:
        """Remove the directories of merged generations (what a merger's GC does)."""
        for region, merged in self.merged.items():
            for g, path in self.t.flushed(region):
                d = Path(self.t.uri, "_mem_wal", region, path)
                if g <= merged and d.exists():
                    shutil.rmtree(d)
                    event("garbage-collected a generation")

    def gc_wal(self) -> None:
        """Remove the WAL entries of merged generations that no replay reads any more."""
        storage = Storage.open(self.t.uri)
        for region, merged in self.merged.items():
            m = latest_region_manifest(storage, region)
            for name, _ in storage.list_dir(f"_mem_wal/{region}/wal"):
                position = parse_bitrev64_name(name.removesuffix(".arrow"))
                if m is None or position is None or position > m.replay_after_wal_position:
                    continue
                entry = read_wal_entry(storage, region, position)
                if isinstance(entry, WalEntry) and entry.generation <= merged:
                    Path(self.t.uri, wal_entry_path(region, position)).unlink()
                    for c in self.checkpoints:
                        c.wal_gone = True
                    event("garbage-collected WAL entries")

    def checkpoint(self, eventual: bool) -> None:
        table = mq.open_table(self.t.uri, consistency="eventual" if eventual else "strong")
        rows = rows_of(table)
        if not eventual:
            assert rows == self.model(), "strong snapshot differs from the model"
        self.checkpoints.append(Checkpoint(table, table.change_token, rows, set(self.since_flush)))

    def check(self, step: str) -> None:
        new = mq.open_table(self.t.uri)
        now = rows_of(new)
        assert now == self.model(), f"after {step}: snapshot differs from the model"
        for c in self.checkpoints[-3:]:
            for since in (c.token, c.table):
                try:
                    got = new.changes(since)
                except mq.ChangesUnavailableError:
                    assert c.wal_gone, f"after {step}: changes unavailable though the WAL is complete"
                    event("changes unavailable")
                    continue
                assert got.schema == change_schema(SCHEMA, ["id"])
                assert apply(c.rows, got) == now, f"after {step}: changes since a checkpoint do not give the snapshot"
                keys = set(got.column("id").to_pylist())
                assert keys <= c.allowed, f"after {step}: keys never written since: {keys - c.allowed}"


OPS = st.one_of(
    st.tuples(st.just("put"), st.lists(KEYS, min_size=1, max_size=40)),
    st.tuples(st.just("put"), st.lists(KEYS, min_size=1, max_size=5)),
    st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=10)),
    st.tuples(st.just("flush"), st.lists(st.integers(0, 3), max_size=2)),
    st.tuples(st.just("flush"), st.lists(st.integers(0, 3), min_size=1, max_size=4)),
    st.tuples(st.just("merge"), st.lists(st.integers(0, 3), min_size=1, max_size=3)),
    st.tuples(st.just("gc")),
    st.tuples(st.just("compact")),
    st.tuples(st.just("ours")),
    st.tuples(st.just("gc_wal")),
    st.tuples(st.just("put"), st.lists(KEYS, min_size=25, max_size=70)),
    st.tuples(st.just("checkpoint"), st.booleans()),
    st.tuples(st.just("checkpoint"), st.just(False)),
)
SEQUENCES = st.tuples(
    st.integers(2, 3), st.lists(KEYS, max_size=20, unique=True), st.lists(OPS, min_size=6, max_size=14)
)


def run_feed(case: tuple[int, list[int], list[tuple[Any, ...]]]) -> None:
    buckets, base, ops = case
    tmp = tempfile.mkdtemp(prefix="memwal-changes-")
    try:
        feed = Feed(tmp + "/t", buckets, base)
        try:
            for i, op in enumerate(ops):
                getattr(feed, op[0])(*op[1:])
                feed.check(f"step {i} {op}")
        finally:
            feed.t.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Found by this test: key 39 sits in a MemTable at the checkpoint and is deleted after it;
# the generation holding both is merged (the base never sees 39) and garbage-collected.
GC_AFTER_DELETE = (
    3,
    [],
    [("put", [0] * 20), ("put", [0, 39]), ("put", [0] * 7), ("checkpoint", False), ("put", [0])]
    + [("delete", [0, 39]), ("flush", [0]), ("merge", [0, 1, 2]), ("gc",), ("gc_wal",)],
)


# Found by the slow run: a merged generation and its WAL entries are garbage-collected, then
# a new writer writes at the freed WAL positions; they must not pass for the lost entries.
WAL_POSITION_REUSED = (2, [], [("put", [0]), ("flush", []), ("flush", [0]), ("gc",), ("gc_wal",), ("put", [1])])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEQUENCES)
@example(GC_AFTER_DELETE)
@example(WAL_POSITION_REUSED)
def test_changes_applied_to_the_old_rows_give_the_new_rows(case: Any) -> None:
    run_feed(case)


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("MEMWAL_PROPERTY_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(SEQUENCES)
def test_changes_applied_to_the_old_rows_give_the_new_rows_many(case: Any) -> None:
    run_feed(case)


# -- deterministic cases ---------------------------------------------------------------------


def small_table(path: str, n: int = 20) -> FastModelTable:
    base = pa.Table.from_pylist([{"id": i, "v": i, "c": "b"} for i in range(n)], schema=SCHEMA)
    return FastModelTable(path, SCHEMA, base, bucket=("id", 2), max_memtable_rows=30)


def test_a_token_survives_a_process_restart(tmp_path: Path) -> None:
    t = small_table(str(tmp_path / "t"))
    t.put([{"id": 1, "v": 100, "c": "x"}])
    t.flush()
    script = "import sys, memwal_query as mq; print(mq.open_table(sys.argv[1]).change_token)"
    token = subprocess.run(
        [sys.executable, "-c", script, t.uri], capture_output=True, text=True, check=True
    ).stdout.strip()
    t.put([{"id": 2, "v": 200, "c": "y"}, {"id": 50, "v": 500, "c": "z"}])
    t.delete([(3,)])
    t.flush()
    t.merge(t.regions()[0], t.flushed(t.regions()[0])[-1][0])
    got = mq.open_table(t.uri).changes(token)
    assert got.to_pylist() == [
        {"id": 2, "v": 200, "c": "y", "_change": "upsert"},
        {"id": 3, "v": None, "c": None, "_change": "delete"},
        {"id": 50, "v": 500, "c": "z", "_change": "upsert"},
    ]
    # and the other way round: a token taken here, the changes computed in a new process
    token = mq.open_table(t.uri).change_token
    t.put([{"id": 7, "v": 700, "c": "q"}])
    script = "import sys, memwal_query as mq; print(mq.open_table(sys.argv[1]).changes(sys.argv[2]).to_pylist())"
    out = subprocess.run([sys.executable, "-c", script, t.uri, token], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([{"id": 7, "v": 700, "c": "q", "_change": "upsert"}])
    t.flush()


def test_sql_changes_equal_the_python_ones(tmp_path: Path) -> None:
    t = small_table(str(tmp_path / "t"))
    old = mq.open_table(t.uri)
    t.put([{"id": i, "v": -i, "c": "n"} for i in range(5, 12)])
    t.delete([(0,), (1,)])
    new = old.refresh()
    sql = new.sql(f"SELECT * FROM memwal_changes('t', '{old.change_token}') ORDER BY id").to_arrow_table()
    assert sql.to_pylist() == new.changes(old).to_pylist() == new.changes(old.change_token).to_pylist()
    assert sql.num_rows == 9
    assert new.changes(new.change_token).num_rows == 0  # nothing since itself
    t.flush()


def test_tokens_of_other_tables_and_newer_tokens_are_refused(tmp_path: Path) -> None:
    t = small_table(str(tmp_path / "t"))
    other_schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("w", pa.int64())])
    other = FastModelTable(str(tmp_path / "o"), other_schema, pa.table({"id": [1], "w": [1]}, schema=other_schema))
    with pytest.raises(mq.InvalidArgumentError, match="belongs to another table"):
        mq.open_table(t.uri).changes(mq.open_table(other.uri).change_token)
    twin = small_table(str(tmp_path / "twin"))  # same columns, another table
    with pytest.raises(mq.InvalidArgumentError, match="holds another MemWAL index"):
        mq.open_table(t.uri).changes(mq.open_table(twin.uri).change_token)
    old = mq.open_table(t.uri)
    t.put([{"id": 1, "v": 1, "c": "x"}])
    new = old.refresh()
    with pytest.raises(mq.InvalidArgumentError, match="the change token is newer than this snapshot"):
        old.changes(new)
    with pytest.raises(mq.InvalidArgumentError, match="open this one with consistency='strong'"):
        mq.open_table(t.uri, consistency="eventual").changes(new.change_token)
    with pytest.raises(mq.InvalidArgumentError, match="an older Table"):
        new.changes(42)  # type: ignore[arg-type]
    t.flush()
    merged = t.regions()[0]
    t.merge(merged, t.flushed(merged)[-1][0])
    with pytest.raises(mq.InvalidArgumentError, match="base version"):
        mq.open_table(t.uri, version=old.version).changes(mq.open_table(t.uri).change_token)


def test_garbage_collected_history(tmp_path: Path) -> None:
    """GC'd merged generations: the WAL since the token answers; that gone too: a clear error.

    Key 39 is written before the token into a MemTable and deleted after it: the merge of
    the generation holding both never touches the base (a base diff would miss it).
    """
    t = small_table(str(tmp_path / "t"))
    t.put([{"id": 39, "v": 1, "c": "m"}, {"id": 4, "v": 4, "c": "m"}])
    before = mq.open_table(t.uri)
    rows = rows_of(before)
    t.put([{"id": 4, "v": 44, "c": "g"}, {"id": 31, "v": 31, "c": "g"}])
    t.delete([(5,), (39,)])
    t.flush()
    for r in t.regions():
        g, path = t.flushed(r)[-1]
        t.merge(r, g)
        shutil.rmtree(Path(t.uri, "_mem_wal", r, path))
    after = mq.open_table(t.uri)
    got = after.changes(before.change_token)
    assert apply(rows, got) == rows_of(after)
    assert set(got.column("id").to_pylist()) == {4, 5, 31, 39}
    for wal in Path(t.uri, "_mem_wal").glob("*/wal/*.arrow"):
        wal.unlink()
    with pytest.raises(mq.ChangesUnavailableError, match=r"region [0-9a-f-]+: generation 1, merged since") as err:
        mq.open_table(t.uri).changes(before.change_token)
    assert t.uri in str(err.value) and "its WAL entries" in str(err.value)


def test_composite_keys(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            pa.field("a", pa.int32(), nullable=False, metadata=PK),
            pa.field("b", pa.string(), nullable=False, metadata=PK),
            pa.field("v", pa.float64(), nullable=False),
        ]
    )
    base = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"], "v": [1.0, 2.0, 3.0]}, schema=schema)
    t = FastModelTable(str(tmp_path / "t"), schema, base, unsharded=True)
    old = mq.open_table(t.uri)
    t.put([{"a": 1, "b": "y", "v": 20.0}, {"a": 3, "b": "z", "v": 30.0}])
    t.delete([(2, "x")])
    got = old.refresh().changes(old.change_token)
    assert got.schema == change_schema(schema, ["a", "b"])  # v nullable for deletes
    assert got.to_pylist() == [
        {"a": 1, "b": "y", "v": 20.0, "_change": "upsert"},
        {"a": 2, "b": "x", "v": None, "_change": "delete"},
        {"a": 3, "b": "z", "v": 30.0, "_change": "upsert"},
    ]
    t.flush()


class Buffered:
    """An in-process MemTable (memwal_query.LiveMemTable) holding rows no one made durable."""

    def __init__(self, region_id: str, rows: list[dict[str, Any]]) -> None:
        self.region_id = region_id
        self.generation = 99
        self._rows = rows

    def to_batches(self) -> list[pa.RecordBatch]:
        return pa.Table.from_pylist(self._rows, schema=SCHEMA).to_batches()


def test_rows_only_an_older_snapshot_held_in_memory(tmp_path: Path) -> None:
    t = small_table(str(tmp_path / "t"))
    t.put([{"id": 1, "v": 1, "c": "b"}])
    t.flush()
    region = t.regions()[0]
    old = mq.open_table(t.uri, live=[Buffered(region, [{"id": 1, "v": 111, "c": "m"}])])
    assert rows_of(old)[1]["v"] == 111
    new = mq.open_table(t.uri)  # the buffered row never became durable
    got = new.changes(old)
    assert apply(rows_of(old), got) == rows_of(new)
    assert got.column("id").to_pylist() == [1]
    # Its token could not say what the buffered row was: changes(token) returned nothing.
    with pytest.raises(mq.InvalidArgumentError, match=f"{t.uri}: region {region} holds rows handed in with live="):
        _ = old.change_token


def test_rows_only_the_newer_snapshot_holds_in_memory(tmp_path: Path) -> None:
    t = small_table(str(tmp_path / "t"))
    t.put([{"id": 1, "v": 1, "c": "b"}])
    t.flush()
    old = mq.open_table(t.uri)
    new = mq.open_table(t.uri, live=[Buffered(t.regions()[0], [{"id": 2, "v": 222, "c": "m"}])])
    for since in (old, old.change_token):  # in-process rows are newer than any token
        got = new.changes(since)
        assert got.column("id").to_pylist() == [2] and apply(rows_of(old), got) == rows_of(new)


def test_a_column_named_like_the_change_column_is_refused(tmp_path: Path) -> None:
    """A table with its own ``_change`` column: the feed's column clashed with it and pyarrow's
    ValueError about field names came out."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field(CHANGE_COLUMN, pa.string())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [1], CHANGE_COLUMN: ["mine"]}, schema=schema))
    old = mq.open_table(t.uri)
    t.put([{"id": 2, CHANGE_COLUMN: "x"}])
    new = mq.open_table(t.uri)
    assert new.to_arrow().num_rows == 2
    with pytest.raises(mq.InvalidArgumentError, match=f"{t.uri} has a column named '_change'"):
        new.changes(old.change_token)


def test_generation_garbage_collected_after_the_snapshot_opened(tmp_path: Path) -> None:
    """The snapshot's generation merged and garbage-collected before ``changes()`` read it:
    pyarrow's ArrowInvalid ("Not found") came out; now memwal's error saying to refresh."""
    from memwal_write import merge_generations

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [0], "v": [0]}, schema=schema), unsharded=True)
    token = mq.open_table(t.uri).change_token
    t.put([{"id": i, "v": i} for i in range(1, 3000)])
    t.flush()
    snap = mq.open_table(t.uri)
    merge_generations(t.uri)
    (region,) = t.regions()
    for _, path in t.flushed(region):
        shutil.rmtree(Path(t.uri, "_mem_wal", region, path))
    with pytest.raises(mq.MemWalError, match="no longer readable.* refresh\\(\\) the table and retry"):
        snap.changes(token)
    assert mq.open_table(t.uri).changes(token).num_rows == 2999  # a fresh snapshot reads the base


def test_a_snapshot_that_left_a_generation_out(tmp_path: Path) -> None:
    """A token of a snapshot opened with ``on_missing_generation="skip"``: it claimed the
    left-out generation as seen, so the feed never read its keys (changes: none, rows differ)."""
    t = small_table(str(tmp_path / "t"))
    t.put([{"id": i, "v": -i, "c": "g"} for i in range(3, 9)])
    t.flush()
    region = next(r for r in t.regions() if t.flushed(r))
    (_, path), *_ = t.flushed(region)
    hidden = [Path(t.uri, "_mem_wal", region, path), Path(t.uri, "_mem_wal", region, "wal")]
    for d in hidden:  # the generation and the WAL entries it could be rebuilt from
        d.rename(d.with_name(d.name + ".away"))
    old = mq.open_table(t.uri, on_missing_generation="skip")
    assert [s.missing for r in old.snapshot.regions for s in r.skipped] == [True]
    token = old.change_token
    for d in hidden:  # back again
        d.with_name(d.name + ".away").rename(d)
    new = mq.open_table(t.uri)
    assert rows_of(old) != rows_of(new)
    for since in (token, old):
        got = new.changes(since)
        assert apply(rows_of(old), got) == rows_of(new)
    # merged and collected, but for its WAL entry: the token's WAL position is past that
    # entry, which was dropped as seen (changes: none)
    from memwal_write import collect_garbage, merge_generations

    merge_generations(t.uri)
    collect_garbage(t.uri, older_than=0)
    assert not Path(t.uri, "_mem_wal", region, path).exists()
    newest = mq.open_table(t.uri)
    assert apply(rows_of(old), newest.changes(token)) == rows_of(newest)


def test_a_newer_snapshot_that_left_out_a_generation_the_token_saw(tmp_path: Path) -> None:
    """Its rows are missing from the newer snapshot and no level written since names their
    keys: the changes were none (silently wrong); they are unknown."""
    t = small_table(str(tmp_path / "t"))
    t.put([{"id": i, "v": -i, "c": "g"} for i in range(3, 9)])
    t.flush()
    token = mq.open_table(t.uri).change_token
    region = next(r for r in t.regions() if t.flushed(r))
    (_, path), *_ = t.flushed(region)
    for d in (Path(t.uri, "_mem_wal", region, path), Path(t.uri, "_mem_wal", region, "wal")):
        shutil.rmtree(d)
    new = mq.open_table(t.uri, on_missing_generation="skip")
    with pytest.raises(mq.ChangesUnavailableError, match=f"region {region}: this snapshot left out generation 1"):
        new.changes(token)


def test_a_base_restored_to_before_a_merge(tmp_path: Path) -> None:
    """The merged generation goes back with the base: its rows are read from the generation
    again, and a token taken after the merge answers (it was refused as "newer than this
    snapshot; refresh() the table", which no refresh changed)."""
    t = small_table(str(tmp_path / "t"))
    before_merge = lance.dataset(t.uri).version
    t.put([{"id": 30, "v": 30, "c": "m"}, {"id": 2, "v": 22, "c": "m"}])
    t.flush()
    for r in t.regions():
        for g, _ in t.flushed(r):
            t.merge(r, g)
    old = mq.open_table(t.uri)
    token = old.change_token
    lance.dataset(t.uri, version=before_merge).restore()
    t.put([{"id": 31, "v": 31, "c": "n"}])
    new = mq.open_table(t.uri)
    assert new.snapshot.base_version > old.snapshot.base_version
    got = new.changes(token)
    assert got.column("id").to_pylist() == [31]
    assert apply(rows_of(old), got) == rows_of(new)
    t.flush()


def test_a_token_of_another_table_after_its_version_was_cleaned_up(tmp_path: Path) -> None:
    """Two tables with the same key and region spec have the same region ids; once
    ``cleanup_old_versions`` removed the token's base version from this table, the other
    table's token was taken as this table's (its generation directory names tell them apart)."""
    import datetime

    t = small_table(str(tmp_path / "t"))
    twin = small_table(str(tmp_path / "twin"))
    for table in (t, twin):
        table.put([{"id": i, "v": i, "c": "x"} for i in range(20, 30)])
        table.flush()
    token = mq.open_table(twin.uri).change_token
    for r in t.regions():
        for g, _ in t.flushed(r):
            t.merge(r, g)
    lance.dataset(t.uri).cleanup_old_versions(older_than=datetime.timedelta(0), delete_unverified=True)
    with pytest.raises(mq.InvalidArgumentError, match=f"{t.uri}: the change token belongs to another table"):
        mq.open_table(t.uri).changes(token)
    # the twin flushed more generations than this table has: no generation of that number here
    for _ in range(3):
        twin.put([{"id": 40, "v": 1, "c": "y"}, {"id": 41, "v": 1, "c": "y"}])
        twin.flush()
    with pytest.raises(mq.InvalidArgumentError, match="this table no such generation"):
        mq.open_table(t.uri).changes(mq.open_table(twin.uri).change_token)


@pytest.mark.parametrize("how", ["overwritten", "index dropped", "restored before it"])
def test_a_token_taken_before_the_memwal_layer_was_set_up_anew(tmp_path: Path, how: str) -> None:
    """``_mem_wal`` removed and the MemWAL layer set up anew (after an overwrite, a dropped
    MemWAL index, or a restore to before it): its regions start over at the same ids and WAL
    positions, so a token taken from the old layer's WAL tail was read as one of the new
    layer's, and key 25, only in the old tail, was never reported deleted."""
    uri = str(tmp_path / "t")
    t = small_table(uri)
    t.put([{"id": 25, "v": 25, "c": "old tail"}, {"id": 2, "v": 2, "c": "old tail"}])
    token = mq.open_table(uri).change_token
    t.flush()
    shutil.rmtree(Path(uri, "_mem_wal"))
    if how == "overwritten":
        base = pa.Table.from_pylist([{"id": i, "v": i, "c": "b"} for i in range(10)], schema=SCHEMA)
        t = FastModelTable(uri, SCHEMA, base, bucket=("id", 2), write_params={"mode": "overwrite"})
    else:
        if how == "index dropped":
            lance.dataset(uri).drop_index("__lance_mem_wal")
        else:
            lance.dataset(uri, version=1).restore()
        lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
        t = FastModelTable.attach(uri, SCHEMA)
    for batch in range(3):  # the new layer's WAL goes past the old one's positions
        t.put([{"id": i, "v": batch, "c": "new"} for i in range(12)])
    with pytest.raises(mq.ChangesUnavailableError, match="MemWAL layer was set up anew since the change token"):
        mq.open_table(uri).changes(token)
    t.flush()
