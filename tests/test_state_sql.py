"""The table's state in SQL: memwal_regions / memwal_generations / memwal_wal / memwal_history."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memwal_query as mq
from memwal_query.describe import describe_table


def rows(table: mq.Table, query: str) -> list[dict[str, Any]]:
    return table.sql(query).to_arrow_table().to_pylist()


def test_regions_match_inspect(events: Any) -> None:
    t = mq.open_table(events.uri)
    d = describe_table(t)
    got = rows(t, "SELECT * FROM memwal_regions('t') ORDER BY region_id")
    assert [r["region_id"] for r in got] == sorted(t.region_ids)
    for r, want in zip(got, sorted(d["regions"], key=lambda x: x["region_id"]), strict=True):
        assert r["merged_generation"] == want["merged_generation"] == 1
        assert r["manifest_version"] == want["manifest_version"]
        assert r["memtable_live_rows"] == want["memtable_live_rows"]
        assert r["wal_tail_rows"] == want["wal"]["tail_rows"] > 0  # a writer is left open
        assert r["spec_values"].startswith('{"bucket": ')
        assert r["unmerged_generations"] == len(want["unmerged_generations"])


def test_generations_merged_and_unmerged(events: Any) -> None:
    t = mq.open_table(events.uri)
    got = rows(t, "SELECT * FROM memwal_generations('t') ORDER BY region_id, generation")
    assert {(r["generation"], r["status"]) for r in got} == {(1, "merged"), (2, "unmerged")}
    for r in got:
        assert r["rows"] > 0 and r["path"].endswith(f"_gen_{r['generation']}")
        if r["status"] == "unmerged":
            assert r["live_rows"] == r["rows"] - r["superseded_rows"]
        else:
            assert r["live_rows"] is None and "merged into base" in r["note"]
    joined = rows(
        t,
        "SELECT r.region_id, count(*) AS n FROM memwal_regions('t') r "
        "JOIN memwal_generations('t') g ON r.region_id = g.region_id GROUP BY r.region_id",
    )
    assert sorted(j["n"] for j in joined) == [2] * len(t.region_ids)


def test_wal_tail_entries(events: Any) -> None:
    t = mq.open_table(events.uri)
    got = rows(t, "SELECT * FROM memwal_wal('t') ORDER BY region_id, position")
    replayed = [r for r in got if r["status"] == "replayed"]
    assert sum(r["rows"] for r in replayed) == sum(r.memtable.table.num_rows for r in t.snapshot.regions if r.memtable)
    assert sum(r["deletes"] for r in replayed) > 0  # the open writer deleted keys
    assert all(r["generation"] == 3 for r in replayed)
    eventual = mq.open_table(events.uri, consistency="eventual")
    assert rows(eventual, "SELECT * FROM memwal_wal('t') ORDER BY position") == []  # no WAL read; ORDER BY works


def test_history_up_to_the_snapshot(events: Any) -> None:
    t = mq.open_table(events.uri)
    got = rows(t, "SELECT * FROM memwal_history('t') ORDER BY version")
    assert [r["version"] for r in got] == list(range(1, t.version + 1))
    assert [r["is_snapshot"] for r in got] == [False] * (t.version - 1) + [True]
    assert got[0]["operation"] == "Overwrite" and "Update" in {r["operation"] for r in got}
    assert got[-1]["rows"] == t.snapshot.base.count_rows()
    older = mq.open_table(events.uri, version=3)
    assert [r["version"] for r in rows(older, "SELECT version FROM memwal_history('t')")] == [1, 2, 3]


def test_empty_function_results_sort(events: Any) -> None:
    t = mq.open_table(events.uri)
    assert rows(t, "SELECT * FROM memwal_lookup('t', [999999]) ORDER BY id") == []
    assert rows(t, f"SELECT * FROM memwal_changes('t', '{t.change_token}') ORDER BY id") == []
    assert rows(t, f"SELECT count(*) AS n FROM memwal_changes('t', '{t.change_token}')") == [{"n": 0}]


def test_described_wal_tail_positions(tmp_path: Any) -> None:
    """A region whose writer flushed everything has a tail of no entry: its positions are
    empty (they read ``[7, 6]``: the first position after the flushed ones, then the last)."""
    import pyarrow as pa

    from lsm_model import PK, ModelTable

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [1, 2], "v": [0, 0]}, schema=schema), unsharded=True)
    t.put(pa.table({"id": [3], "v": [1]}, schema=schema))
    t.flush()
    (region,) = describe_table(mq.open_table(t.uri))["regions"]
    assert region["wal"]["tail_entries"] == 0 and region["wal"]["tail_positions"] == []
    t.put(pa.table({"id": [4], "v": [1]}, schema=schema))
    t.put(pa.table({"id": [5], "v": [1]}, schema=schema))
    (region,) = describe_table(mq.open_table(t.uri))["regions"]
    first, last = region["wal"]["tail_positions"]
    assert region["wal"]["tail_entries"] == 2 and first <= last
    t.flush()


def test_history_of_a_base_compacted_with_a_scalar_index(tmp_path: Any) -> None:
    """pylance 14 cannot decode the transaction of a compaction that rewrote an index
    (``TypeError`` from ``RewrittenIndex``) and so reads no transaction at all:
    ``memwal_history`` failed as a whole. Only a ``Rewrite`` holds a rewritten index: the
    version that fails that way is named one."""
    import lance
    import pyarrow as pa

    from lsm_model import PK

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    uri = str(tmp_path / "t")
    for i in range(3):
        lance.write_dataset(pa.table({"id": [i], "v": [i]}, schema=schema), uri, mode="append")
    lance.dataset(uri).create_scalar_index("id", "BTREE")
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=1024)
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
    t = mq.open_table(uri)
    got = {r["version"]: r["operation"] for r in rows(t, "SELECT version, operation FROM memwal_history('t')")}
    assert list(got) == list(range(1, t.version + 1))
    assert [v for v, op in got.items() if op is None] == []
    assert got[t.version - 1] == "Rewrite"  # the compaction
    assert got[1] == "Overwrite" and got[2] == got[3] == "Append" and got[4] == "CreateIndex"


def test_history_of_a_table_deleted_after_it_was_opened(tmp_path: Any) -> None:
    """It returned no rows and no error (the other state functions raised)."""
    import shutil

    import pyarrow as pa

    from lsm_model import PK, ModelTable

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [1], "v": [0]}, schema=schema), unsharded=True)
    table = mq.open_table(t.uri)
    shutil.rmtree(t.uri)
    with pytest.raises(mq.MemWalError, match=f"memwal_history: {t.uri} lists no version up to"):
        table.sql("SELECT * FROM memwal_history('t')").to_arrow_table()


def test_a_generations_rows_are_the_rows_written_in_every_state(tmp_path: Any) -> None:
    """A key put three times in one flush: pylance writes all three rows and hides two with the
    generation's deletion file. ``rows`` of the unmerged generation counted the visible ones (and
    the explain line too), of the same generation merged or rebuilt from the WAL every row written."""
    import lance
    import pyarrow as pa

    from memwal_write import merge_generations

    from lsm_model import PK, ModelTable

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": [1, 2], "v": [0, 0]}, schema=schema), unsharded=True)
    t.put(pa.table({"id": [7, 7, 7, 1, 8], "v": [1, 2, 3, 1, 1]}, schema=schema))
    t.flush()
    table = mq.open_table(t.uri)
    (gen,) = [g for g in table.snapshot.regions[0].generations]
    assert lance.dataset(gen.uri).count_rows() == 3  # what Lance shows of the five rows written
    query = "SELECT generation, status, rows, superseded_rows, live_rows FROM memwal_generations('t') ORDER BY 1"
    unmerged = rows(table, query)[-1]
    assert unmerged == {
        "generation": gen.generation,
        "status": "unmerged",
        "rows": 5,
        "superseded_rows": 2,
        "live_rows": 3,
    }
    assert f"generation {gen.generation}: 5 rows, 2 superseded/deleted dropped" in table.explain()
    assert table.sql("SELECT v FROM t WHERE id = 7").to_pylist() == [{"v": 3}]
    merge_generations(t.uri)
    merged = rows(mq.open_table(t.uri), query)[-1]
    assert (merged["status"], merged["rows"]) == ("merged", 5)


def test_history_timestamps_are_instants_whatever_the_readers_time_zone(events: Any) -> None:
    """pylance gives a version's commit time as a naive local time: stored as such, the same
    version read 11:50 in UTC and 06:50 in New York, and "versions of the last hour" was wrong
    outside UTC."""
    script = (
        "import sys, memwal_query as mq\n"
        "t = mq.open_table(sys.argv[1])\n"
        "q = \"SELECT timestamp, to_unixtime(timestamp) AS s FROM memwal_history('t') ORDER BY version DESC LIMIT 1\"\n"
        "got = t.sql(q).to_arrow_table()\n"
        "print(got.schema.field(0).type, got.column(1)[0].as_py(), sep='|')  # what SQL computes with\n"
    )
    seen = []
    for tz in ("UTC", "America/New_York", "Asia/Kolkata"):
        env = {**os.environ, "TZ": tz}
        out = subprocess.run([sys.executable, "-c", script, events.uri], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        typ, when = out.stdout.strip().split("|")
        seen.append((typ, float(when)))
    assert {typ for typ, _ in seen} == {"timestamp[us, tz=UTC]"}
    assert max(w for _, w in seen) - min(w for _, w in seen) < 1e-3
    manifest = max(Path(events.uri, "_versions").iterdir(), key=lambda p: p.stat().st_mtime)
    assert abs(seen[0][1] - manifest.stat().st_mtime) < 120
