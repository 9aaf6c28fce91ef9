"""Storage cost contract: opening a snapshot and planning a query cost the same number of
storage requests whatever the table's history depth (past base versions, merged and
garbage-collected generations, region manifest versions, WAL entries already flushed)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import memwal_query as mq

from lsm_model import PK, ModelTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])


def _grow(uri: str, region: str, cycles: int, start: int) -> None:
    """Each cycle: a put + flush (new generation, manifest versions, WAL entry), a merge
    (new base versions), GC of the merged generation, and compaction of the base."""
    m = ModelTable.__new__(ModelTable)
    m.uri, m.schema, m.pk = uri, SCHEMA, ["id"]
    for i in range(start, start + cycles):
        with lance.dataset(uri).mem_wal_writer(region) as w:
            w.put(pa.table({"id": [i % 50], "v": [i]}, schema=SCHEMA))
        gen = max(g for g, _ in m.flushed(region))
        path = dict(m.flushed(region))[gen]
        m.merge(region, gen)
        shutil.rmtree(Path(uri, "_mem_wal", region, path))
    lance.dataset(uri).optimize.compact_files()


def _cost(uri: str) -> tuple[int, int, int]:
    before = lance.iops_counter()
    table = mq.open_table(uri)
    table.plan("id = 3")
    table.count_rows()
    lance_iops = lance.iops_counter() - before
    stats = table.io_stats
    return stats.requests, stats.bytes_read, lance_iops  # type: ignore[attr-defined]


def _measure(tmp_path: Path, depths: list[int]) -> dict[int, tuple[int, int, int]]:
    uri = str(tmp_path / "t")
    lance.write_dataset(pa.table({"id": list(range(50)), "v": [0] * 50}, schema=SCHEMA), uri).initialize_mem_wal(
        unsharded=True
    )
    region = str(uuid.uuid4())
    # an open writer keeps one live WAL entry in every measurement
    done = 0
    out = {}
    for d in depths:
        _grow(uri, region, d - done, done)
        done = d
        w = lance.dataset(uri).mem_wal_writer(region)
        w.put(pa.table({"id": [1000 + d], "v": [d]}, schema=SCHEMA))
        _cost(uri)  # warm Lance's metadata caches the same way for every depth
        out[d] = _cost(uri)
        w.close()
        gen = max(g for g, _ in ModelTable.flushed(_model(uri), region))
        ModelTable.merge(_model(uri), region, gen)
    return out


def _model(uri: str) -> ModelTable:
    m = ModelTable.__new__(ModelTable)
    m.uri, m.schema, m.pk = uri, SCHEMA, ["id"]
    return m


def _assert_flat(costs: dict[int, tuple[int, int, int]]) -> None:
    depths = sorted(costs)
    first = costs[depths[0]]
    for d in depths[1:]:
        ours, _, theirs = costs[d]
        assert ours <= first[0] + 1, f"our requests grew with history: {costs}"
        assert theirs <= first[2] + 4, f"Lance's requests grew with history: {costs}"


def test_open_cost_is_flat_in_history(tmp_path: Path) -> None:
    _assert_flat(_measure(tmp_path, [1, 10]))


@pytest.mark.slow
def test_open_cost_is_flat_in_history_deep(tmp_path: Path) -> None:
    _assert_flat(_measure(tmp_path, [1, 10, 100]))
