"""MemWAL index inline region snapshots: decoding, discovery (eventual reads), region values."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.file import LanceFileWriter

import memwal_query as mq
import memwal_query.snapshot.load as snapshot_mod
from memwal_query.format.inline_snapshots import decode_inline_snapshots

from lsm_model import PK

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])


def _inline_bytes(tmp_path: Path, rows: list[dict[str, object]]) -> bytes:
    t = pa.table(
        {
            "shard_id": pa.array([r["id"] for r in rows], pa.string()),
            "shard_spec_id": pa.array([1] * len(rows), pa.uint32()),
            "shard_field_bucket": pa.array([r["bucket"] for r in rows], pa.int32()),
        }
    )
    p = str(tmp_path / "inline.lance")
    with LanceFileWriter(p, t.schema) as w:
        w.write_batch(t)
    return Path(p).read_bytes()


def test_decode(tmp_path: Path) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    regions = decode_inline_snapshots(_inline_bytes(tmp_path, [{"id": a, "bucket": 1}, {"id": b, "bucket": 3}]))
    assert [(r.region_id, r.spec_id, r.values) for r in regions] == [(a, 1, {"bucket": 1}), (b, 1, {"bucket": 3})]
    with pytest.raises(mq.MemWalCorruptionError, match="^idx: inline region snapshots are not a readable Lance file"):
        decode_inline_snapshots(b"garbage", where="idx")


def test_inline_snapshots_drive_eventual_discovery_and_pruning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    ds = lance.write_dataset(pa.table({"id": [100], "v": [0]}, schema=SCHEMA), uri)
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4)
    from memwal_query.regionspec.spec import evaluate_spec, lance_field_ids

    table0 = mq.open_table(uri)
    spec = table0.snapshot.index.specs[0]
    regions: dict[int, str] = {}
    for key in range(40):  # random region ids: values come only from the inline snapshot
        b = evaluate_spec(spec, pa.table({"id": pa.array([key], pa.int64())}), lance_field_ids(ds)).column(0)[0].as_py()
        rid = regions.setdefault(b, str(uuid.uuid4()))
        with lance.dataset(uri).mem_wal_writer(rid) as w:
            w.put(pa.table({"id": [key], "v": [key]}, schema=SCHEMA))
    listed = sorted(regions.items())[:3]  # the index's snapshot knows 3 of the 4 regions
    data = _inline_bytes(tmp_path, [{"id": r, "bucket": b} for b, r in listed])
    real = snapshot_mod.read_version

    def with_inline(s: Any, v: int) -> Any:
        index, digest = real(s, v)
        return dataclasses.replace(index, inline_snapshots=data), digest

    monkeypatch.setattr(snapshot_mod, "read_version", with_inline)
    eventual = mq.open_table(uri, consistency="eventual")
    assert sorted(eventual.region_ids) == sorted(r for _, r in listed)
    assert "inline region snapshots" in eventual.explain()
    strong = mq.open_table(uri)
    assert len(strong.region_ids) == 4 and strong.count_rows() == 41
    values = strong.region_values()
    for b, r in listed:
        assert values[r] is not None and values[r].values == {"bucket": b}  # type: ignore[union-attr]
        assert values[r].source == "MemWAL index inline region snapshot"  # type: ignore[union-attr]
    plan = strong.plan("id = 7")
    assert len(plan.pruned_regions) >= 2  # the unlisted region is never pruned (values unknown)
    assert strong.lookup(7).to_pylist() == [{"id": 7, "v": 7}]
