"""A reader that refreshes one table for hours (a dashboard, a notebook left open) holds what
its newest snapshot needs, not everything it ever read: decoded WAL entries of merged
generations and the base index's centroids of older base versions are let go."""

from __future__ import annotations

import os
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

import memwal_query as mq
from memwal_write import RoutedWriter, merge_generations, write_arrow

from lsm_model import PK

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("s", pa.string())])


def test_refresh_keeps_only_the_wal_entries_of_unmerged_generations(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    base = pa.table({"id": np.arange(1000), "s": ["x"] * 1000}, schema=SCHEMA)
    lance.write_dataset(base, uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
    model = {i: "x" for i in range(1000)}
    rng = np.random.default_rng(0)
    table = mq.open_table(uri)
    w = RoutedWriter.open(uri, max_wal_flush_interval_ms=1)
    for i in range(1, 71):
        ids = [int(k) for k in rng.integers(0, 1000, 3)]
        w.put(pa.table({"id": ids, "s": [f"v{i}"] * 3}, schema=SCHEMA))
        model.update(dict.fromkeys(ids, f"v{i}"))
        if i % 20 == 0:  # flush, merge (which removes the merged generations and their WAL)
            w.close()
            merge_generations(uri)
            w = RoutedWriter.open(uri, max_wal_flush_interval_ms=1)
        table = table.refresh()
    w.close()
    got = table.to_arrow()
    assert dict(zip(got.column("id").to_pylist(), got.column("s").to_pylist(), strict=True)) == model
    cache = table._view.cache
    tails = {(r.region_id, e.position) for r in table.snapshot.regions if r.wal_tail for e in r.wal_tail.entries}
    assert tails and tails <= set(cache.wal_entries)  # the 10 puts since the last merge
    replayed = {r.region_id: r.manifest.replay_after_wal_position for r in table.snapshot.regions if r.manifest}
    merged = {r.region_id: r.merged_generation for r in table.snapshot.regions}
    kept = [(pos, e.generation) for (region, pos), e in cache.wal_entries.items()]
    assert all(
        pos > replayed[region] or e.generation > merged[region] for (region, pos), e in cache.wal_entries.items()
    ), kept
    assert len(cache.wal_entries) < 30  # 73 entries were decoded in all


def test_refresh_keeps_one_copy_of_the_base_index_centroids(tmp_path: Path) -> None:
    dim = 8
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.list_(pa.float32(), dim))]
    )
    rng = np.random.default_rng(1)

    def rows(ids: list[int]) -> pa.Table:
        v = rng.normal(size=(len(ids), dim)).astype(np.float32)
        return pa.table({"id": ids, "v": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), dim)}, schema=schema)

    uri = str(tmp_path / "t")
    ds = lance.write_dataset(rows(list(range(2000))), uri)
    ds.create_index("v", "IVF_FLAT", num_partitions=8)
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=1)
    table = mq.open_table(uri)
    q = rng.normal(size=dim).astype(np.float32)
    versions = set()
    for _ in range(4):
        write_arrow(uri, rows([int(rng.integers(0, 2000))]))
        merge_generations(uri)  # a new base version with the same index
        table = table.refresh()
        versions.add(table.snapshot.base_version)
        assert table.nearest("v", q, k=3, nprobes=8).num_rows == 3
    assert len(versions) == 4
    kinds = [k for k in table._view.cache.vector_parts if k[0] in ("centroids", "metric")]
    assert kinds and all(k[3] == table.snapshot.base_version for k in kinds), kinds
    # the variable Lance reads for centroids is changed in place, never removed: removing (and
    # adding again) a variable can move the environment under Lance's threads reading it
    assert os.environ.get("LANCE_INCLUDE_VECTOR_CENTROIDS") == "false"
