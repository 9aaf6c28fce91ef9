"""The change feed against the dict model: random put / delete / flush / merge / GC sequences.

After every step, for the last few checkpoints (older snapshots and their tokens), the
changes since the checkpoint applied to the checkpoint's rows give the newer snapshot's
rows, which equal the model; the keys reported were all written since the last flush
before the checkpoint (the cost follows the changes) unless a garbage-collected merge
forced the base-version comparison.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import memwal_query as mq
from memwal_query.changes import CHANGE_COLUMN, change_schema

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
    gc_since: bool = False


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

    def gc(self) -> None:
        """Remove the directories of merged generations (what a merger's GC does)."""
        for region, merged in self.merged.items():
            for g, path in self.t.flushed(region):
                d = Path(self.t.uri, "_mem_wal", region, path)
                if g <= merged and d.exists():
                    shutil.rmtree(d)
                    for c in self.checkpoints:
                        c.gc_since = True
                    event("garbage-collected")

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
                got = new.changes(since)
                assert got.schema == change_schema(SCHEMA, ["id"])
                assert apply(c.rows, got) == now, f"after {step}: changes since a checkpoint do not give the snapshot"
                keys = set(got.column("id").to_pylist())
                if not c.gc_since:
                    assert keys <= c.allowed, f"after {step}: keys never written since: {keys - c.allowed}"


OPS = st.one_of(
    st.tuples(st.just("put"), st.lists(KEYS, min_size=1, max_size=40)),
    st.tuples(st.just("put"), st.lists(KEYS, min_size=1, max_size=5)),
    st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=10)),
    st.tuples(st.just("flush"), st.lists(st.integers(0, 3), max_size=2)),
    st.tuples(st.just("flush"), st.lists(st.integers(0, 3), min_size=1, max_size=4)),
    st.tuples(st.just("merge"), st.lists(st.integers(0, 3), min_size=1, max_size=3)),
    st.tuples(st.just("gc")),
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


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEQUENCES)
def test_changes_applied_to_the_old_rows_give_the_new_rows(case: Any) -> None:
    run_feed(case)


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("MEMWAL_PROPERTY_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(SEQUENCES)
def test_changes_applied_to_the_old_rows_give_the_new_rows_many(case: Any) -> None:
    run_feed(case)
