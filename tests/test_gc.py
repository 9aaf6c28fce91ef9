"""Garbage collection (``memwal_write.collect_garbage``) on tables written by pylance's writer:
it removes merged generations' directories and the WAL entries only they held, and nothing an
acknowledged write or a later read needs. Checked against the dict model after every step,
with writers open across the collection and a lost unmerged generation rebuilt after it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.format.names import parse_bitrev64_name
from memwal_query.snapshot import latest_region_manifest
from memwal_query.verify import verify_table
from memwal_write import collect_garbage

from lsm_model import PK, ModelTable, sort_table

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])


def _rows(ids: np.ndarray, v: int) -> list[dict[str, int]]:
    return [{"id": int(i), "v": v} for i in ids]


def _check(t: ModelTable) -> None:
    got = sort_table(mq.open_table(t.uri).to_arrow().cast(SCHEMA), ["id"])
    assert got.equals(sort_table(t.expected(), ["id"]))


def _wal_positions(t: ModelTable, region: str) -> set[int]:
    names = [n for n, d in t.storage().list_dir(f"_mem_wal/{region}/wal") if not d]
    return {p for p in (parse_bitrev64_name(n) for n in names) if p is not None}


def _table(tmp_path: Path) -> ModelTable:
    return ModelTable(
        str(tmp_path / "t"), SCHEMA, pa.Table.from_pylist(_rows(np.arange(400), 0), schema=SCHEMA), bucket=("id", 3)
    )


def test_collects_merged_generations_and_loses_no_write(tmp_path: Path) -> None:
    t = _table(tmp_path)
    rng = np.random.default_rng(7)
    merged: dict[str, int] = {}
    for step in range(1, 9):
        t.put(_rows(rng.choice(600, 40, replace=False), step))
        t.delete([(int(k),) for k in rng.choice(600, 8, replace=False)])
        if step % 2 == 0:
            t.flush()
        if step % 3 == 0:
            t.merge_all(merged)
        # a writer may be open (its MemTable in the WAL tail) while the collector runs
        before = {r: _wal_positions(t, r) for r in t.regions()}
        removed = collect_garbage(t.uri, older_than=0)
        for r in t.regions():
            m = latest_region_manifest(t.storage(), r)
            assert m is not None
            left = {g for g, _ in t.flushed(r) if (Path(t.uri, "_mem_wal", r) / dict(t.flushed(r))[g]).exists()}
            assert all(g > merged.get(r, 0) for g in left)  # every merged one went
            unmerged = {g for g, _ in t.flushed(r) if g > merged.get(r, 0)}
            assert unmerged <= left  # no unmerged one did
            tail = {p for p in before[r] if p > m.replay_after_wal_position}
            assert tail <= _wal_positions(t, r)  # WAL entries after the replay position stay
        for row in removed.to_pylist():
            assert not Path(t.uri, row["path"]).exists() and row["generation"] <= merged[row["region_id"]]
        _check(t)
        assert verify_table(t.uri).ok
    t.put(_rows(np.arange(590, 610), 99))  # writers go on after the collection
    t.flush()
    _check(t)
    assert t.merge_all(merged) > 0
    collect_garbage(t.uri, older_than=0)
    _check(t)
    for r in t.regions():  # all merged: nothing of the merged generations is left
        assert not [n for n, d in t.storage().list_dir(f"_mem_wal/{r}") if d and "_gen_" in n]


def test_keeps_what_a_lost_unmerged_generation_is_rebuilt_from(tmp_path: Path) -> None:
    t = _table(tmp_path)
    t.put(_rows(np.arange(0, 30), 1))
    t.flush()
    t.put(_rows(np.arange(20, 60), 2))
    t.delete([(5,), (25,)])
    t.flush()
    region = t.regions()[0]
    gens = dict(t.flushed(region))
    t.merge(region, min(gens))  # the first merged, the second not
    removed = collect_garbage(t.uri, older_than=0)
    mine = {r["generation"] for r in removed.to_pylist() if r["region_id"] == region}
    assert mine - {0} == {min(gens)}  # generation 0: writers' fence entries
    shutil.rmtree(Path(t.uri, "_mem_wal", region, gens[max(gens)]))  # lose the unmerged one
    _check(t)  # rebuilt from the WAL entries the collector kept


def test_grace_period_and_dry_run(tmp_path: Path) -> None:
    t = _table(tmp_path)
    t.put(_rows(np.arange(0, 50), 1))
    t.flush()
    t.merge_all({})
    assert collect_garbage(t.uri).num_rows == 0  # merged less than an hour ago
    dry = collect_garbage(t.uri, older_than=0, dry_run=True)
    assert dry.num_rows > 0 and all(Path(t.uri, p).exists() for p in dry.column("path").to_pylist())
    done = collect_garbage(t.uri, older_than=0)
    assert done.equals(dry) and not any(Path(t.uri, p).exists() for p in done.column("path").to_pylist())
    assert collect_garbage(t.uri, older_than=0).num_rows == 0
    _check(t)
    with pytest.raises(mq.InvalidArgumentError, match="older_than must be a number of seconds >= 0"):
        collect_garbage(t.uri, older_than=-1)
