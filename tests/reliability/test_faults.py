"""Damaged and unusual storage states: the reader stays correct or says exactly what is wrong."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import shutil
import uuid
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.format.decode import bitrev64_name

from lsm_model import PK

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])


def _table(path: Path) -> tuple[str, str]:
    uri = str(path / "t")
    lance.write_dataset(pa.table({"id": [0, 1, 2], "v": [0, 0, 0]}, schema=SCHEMA), uri).initialize_mem_wal(
        unsharded=True
    )
    return uri, str(uuid.uuid4())


def _crashed_writer(uri: str, region: str, ids: list[int], value: int) -> None:
    """A writer that puts and dies without closing (its WAL tail stays)."""
    import os

    w = lance.dataset(uri).mem_wal_writer(region)
    for i in ids:
        w.put(pa.table({"id": [i], "v": [value]}, schema=SCHEMA))
    os._exit(0)


def _crash(uri: str, region: str, ids: list[int], value: int) -> None:
    p = mp.get_context("spawn").Process(target=_crashed_writer, args=(uri, region, ids, value))
    p.start()
    p.join(60)
    assert p.exitcode == 0


def _wal(uri: str, region: str, pos: int) -> Path:
    return Path(uri, "_mem_wal", region, "wal", f"{bitrev64_name(pos)}.arrow")


def test_wal_tail_of_crashed_writers_and_fence_entries(tmp_path: Path) -> None:
    uri, region = _table(tmp_path)
    _crash(uri, region, [1, 10], 1)  # positions 1, 2 (epoch 1)
    _crash(uri, region, [2, 11], 2)  # fence at 3 (epoch 2), then 4, 5
    table = mq.open_table(uri)
    got = dict(zip(*table.to_arrow().to_pydict().values(), strict=True))
    assert got == {0: 0, 1: 1, 2: 2, 10: 1, 11: 2}
    assert table.snapshot.regions[0].wal_tail.skipped_positions == (3,)  # type: ignore[union-attr]


def test_entry_of_a_fenced_writer_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    uri, region = _table(tmp_path)
    _crash(uri, region, [1], 1)  # position 1, epoch 1
    _crash(uri, region, [2], 2)  # fence 2 (epoch 2), position 3
    # a zombie writer of epoch 1 managed to append at position 4 (overwrites id 2 with an old value)
    zombie = pa.table({"id": [2], "v": [-1], "_tombstone": [False]})
    zombie = zombie.replace_schema_metadata({"generation": "1", "writer_epoch": "1"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, zombie.schema) as w:
        w.write_table(zombie)
    _wal(uri, region, 4).write_bytes(sink.getvalue().to_pybytes())
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        table = mq.open_table(uri)
    got = dict(zip(*table.to_arrow().to_pydict().values(), strict=True))
    assert got[2] == 2
    assert any("fenced writer" in m for m in caplog.messages)
    assert "written by a fenced writer" in table.explain()


def test_torn_last_entry_is_not_committed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    uri, region = _table(tmp_path)
    _crash(uri, region, [1, 2, 3], 7)  # positions 1..3
    last = _wal(uri, region, 3)
    last.write_bytes(last.read_bytes()[:-20])  # torn write
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        table = mq.open_table(uri)
    got = dict(zip(*table.to_arrow().to_pydict().values(), strict=True))
    assert got == {0: 0, 1: 7, 2: 7}  # id 3's put was never committed
    assert any("torn" in m for m in caplog.messages)
    assert "torn" in table.explain()


def test_damaged_entry_followed_by_valid_ones_is_an_error(tmp_path: Path) -> None:
    uri, region = _table(tmp_path)
    _crash(uri, region, [1, 2, 3], 7)
    bad = _wal(uri, region, 2)
    bad.write_bytes(b"\x00garbage" + bad.read_bytes()[8:])
    with pytest.raises(mq.MemWalCorruptionError) as e:
        mq.open_table(uri)
    text = str(e.value)
    assert region in text and "position 2" in text and bad.name in text


def test_missing_entry_followed_by_others_is_an_error(tmp_path: Path) -> None:
    """A gap in the WAL tail (a position gone while later ones exist) ended the replay: the
    puts after it were left out without a word. An error names the missing position, as for
    a damaged one; eventual reads (flushed generations) are unaffected; at the end of the
    WAL a missing position is its end, as before."""
    uri, region = _table(tmp_path)
    _crash(uri, region, [1, 2, 3, 4], 7)  # positions 1..4
    _wal(uri, region, 2).unlink()
    with pytest.raises(mq.MemWalCorruptionError) as e:
        mq.open_table(uri)
    text = str(e.value)
    assert region in text and "(position 2) is missing, but position 3 after it exists" in text
    assert mq.open_table(uri, consistency="eventual").count_rows() == 3
    for pos in (4, 3):  # the gap closed from the end: 2 is the WAL's end again
        _wal(uri, region, pos).unlink()
    assert dict(zip(*mq.open_table(uri).to_arrow().to_pydict().values(), strict=True)) == {0: 0, 1: 7, 2: 0}


def test_stale_or_missing_version_hint(tmp_path: Path) -> None:
    uri, region = _table(tmp_path)
    for i in range(3):
        with lance.dataset(uri).mem_wal_writer(region) as w:
            w.put(pa.table({"id": [100 + i], "v": [i]}, schema=SCHEMA))
    hint = Path(uri, "_mem_wal", region, "manifest", "version_hint.json")
    want = mq.open_table(uri).to_arrow().sort_by("id")
    hint.write_text(json.dumps({"version": 1}))  # stale
    assert mq.open_table(uri).to_arrow().sort_by("id").equals(want)
    hint.unlink()  # missing
    assert mq.open_table(uri).to_arrow().sort_by("id").equals(want)
    hint.write_text("{not json")  # unreadable: probe from 1
    assert mq.open_table(uri).to_arrow().sort_by("id").equals(want)
    hint.write_text(json.dumps({"version": 999}))  # points past the end
    assert mq.open_table(uri).to_arrow().sort_by("id").equals(want)
    # no version 1 either (cleaned up or lost) and no hint: the region vanished (its
    # generations and WAL tail left out, the merger merged nothing); the folder is listed
    Path(uri, "_mem_wal", region, "manifest", f"{bitrev64_name(1)}.binpb").unlink()
    for what in ({"version": 1}, None):
        if what is None:
            hint.unlink()
        else:
            hint.write_text(json.dumps(what))
        assert mq.open_table(uri).to_arrow().sort_by("id").equals(want)


def test_damaged_latest_region_manifest_names_the_file(tmp_path: Path) -> None:
    uri, region = _table(tmp_path)
    with lance.dataset(uri).mem_wal_writer(region) as w:
        w.put(pa.table({"id": [5], "v": [5]}, schema=SCHEMA))
    mdir = Path(uri, "_mem_wal", region, "manifest")
    latest = json.loads((mdir / "version_hint.json").read_text())["version"]
    victim = mdir / f"{bitrev64_name(latest)}.binpb"
    victim.write_bytes(b"\x08\xff\xff\xff")  # truncated varint
    with pytest.raises(mq.ManifestError) as e:
        mq.open_table(uri)
    assert region in str(e.value) and victim.name in str(e.value)


def test_memwal_index_older_than_region_manifests(tmp_path: Path) -> None:
    """Opening an older base version (its MemWAL index predates later flushes and merges)
    still gives that version's base plus every generation it has not merged."""
    uri, region = _table(tmp_path)
    with lance.dataset(uri).mem_wal_writer(region) as w:
        w.put(pa.table({"id": [1], "v": [11]}, schema=SCHEMA))
    old = lance.dataset(uri).version
    from lsm_model import ModelTable

    m = ModelTable.__new__(ModelTable)
    m.uri, m.schema, m.pk = uri, SCHEMA, ["id"]
    m.merge(region, 1)
    assert mq.open_table(uri, version=old).to_arrow().sort_by("id").to_pydict() == {"id": [0, 1, 2], "v": [0, 11, 0]}
    assert mq.open_table(uri).to_arrow().sort_by("id").to_pydict() == {"id": [0, 1, 2], "v": [0, 11, 0]}


def test_missing_generation_directory_without_merge(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    uri, region = _table(tmp_path)
    with lance.dataset(uri).mem_wal_writer(region) as w:
        w.put(pa.table({"id": [1], "v": [11]}, schema=SCHEMA))
    (gen,) = [p for p in Path(uri, "_mem_wal", region).iterdir() if "_gen_" in p.name]
    shutil.rmtree(gen)
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        table = mq.open_table(uri)
    assert table.to_arrow().sort_by("id").to_pydict() == {"id": [0, 1, 2], "v": [0, 11, 0]}  # from the WAL
    assert any("served from the WAL" in m for m in caplog.messages)
    with pytest.raises(mq.GenerationLostError, match=f"region {region}: flushed generation 1 \\({gen}\\) is lost"):
        mq.open_table(uri, on_missing_generation="error")


def test_damaged_generation_is_rebuilt_or_an_error_never_a_silent_skip(tmp_path: Path) -> None:
    uri, region = _table(tmp_path)
    with lance.dataset(uri).mem_wal_writer(region) as w:
        w.put(pa.table({"id": [1], "v": [11]}, schema=SCHEMA))
    (gen,) = [p for p in Path(uri, "_mem_wal", region).iterdir() if "_gen_" in p.name]
    for m in (gen / "_versions").glob("*.manifest"):
        m.write_bytes(b"not a manifest")
    assert mq.open_table(uri).to_arrow().sort_by("id").to_pydict() == {"id": [0, 1, 2], "v": [0, 11, 0]}
    with pytest.raises(mq.GenerationLostError, match=f"region {region}: flushed generation 1 .* is lost: unreadable"):
        mq.open_table(uri, on_missing_generation="error")


def _base_with_deletions(path: Path) -> tuple[str, Path]:
    """A base with a deletion file (every 97th key deleted) and one unmerged generation."""
    uri = str(path / "t")
    ids = list(range(3000))
    lance.write_dataset(pa.table({"id": ids, "v": [i * 10 for i in ids]}, schema=SCHEMA), uri)
    lance.dataset(uri).delete("id % 97 = 3")
    lance.dataset(uri).initialize_mem_wal(unsharded=True)
    w = lance.dataset(uri).mem_wal_writer(str(uuid.uuid5(uuid.NAMESPACE_URL, "unsharded")))
    w.put(pa.table({"id": [1, 2], "v": [-1, -2]}, schema=SCHEMA))
    w.close()
    (deletions,) = Path(uri, "_deletions").iterdir()
    return uri, deletions


@pytest.mark.parametrize("damage", ["missing", "cut short"])
def test_damaged_base_files_are_memwal_errors_naming_them(tmp_path: Path, damage: str) -> None:
    """A base deletion file missing or cut short: ``to_arrow`` and ``count_rows`` raised
    pyarrow's ArrowInvalid, and a missing file was blamed on a merger's clean-up ("refresh the
    table") although the snapshot was of the latest version. Now memwal's errors name the
    fragment and file; a missing one under the latest version is a MemWalCorruptionError."""
    from memwal_query.cli import main

    uri, deletions = _base_with_deletions(tmp_path)
    if damage == "missing":
        deletions.unlink()
    else:
        deletions.write_bytes(deletions.read_bytes()[: deletions.stat().st_size // 2])
    want = mq.MemWalCorruptionError if damage == "missing" else mq.MemWalError
    calls = {
        "to_arrow": lambda t: t.to_arrow(),
        "count_rows": lambda t: t.count_rows(),
        "sql": lambda t: t.sql("SELECT * FROM t WHERE v > 5").to_arrow_table(),
        "to_reader": lambda t: t.to_reader().read_all(),
    }
    for name, call in calls.items():
        with pytest.raises(want) as got:
            call(mq.open_table(uri))  # a fresh snapshot each: nothing decided or cached yet
        text = str(got.value)
        assert "base fragment" in text and uri in text and deletions.name in text, (name, text)
        assert ".rs:" not in text and "refresh" not in text, (name, text)
    assert main(["verify", uri, "--keys"]) == 2  # a problem line, not a traceback
    if damage == "missing":
        assert main(["verify", uri]) == 2  # the file's absence, found without reading keys


def _merged_claim(uri: str, region: str, generation: int) -> None:
    """Edit the newest base manifest's MemWAL index: ``region`` merged ``generation``."""
    from memwal_query.format.decode import lance_manifest_file_name

    from hostile import edit_mem_wal_details

    def edit(d: Any) -> None:
        c = d.compacted_sstables.add()
        c.shard_id.uuid = uuid.UUID(region).bytes
        c.generation = generation

    edit_mem_wal_details(Path(uri, "_versions", lance_manifest_file_name(lance.dataset(uri).version)), edit)


def test_an_index_or_manifest_that_contradicts_itself_is_an_error(tmp_path: Path) -> None:
    """What memwal verify reports, readers trusted: a merged generation above every flushed
    one left the unmerged ones out (10 rows of 16), a flushed generation renumbered above the
    current one outranked the newer WAL tail; collect_garbage deleted the unmerged ones."""
    from memwal_write import collect_garbage

    from hostile import edit_region_manifest

    uri, region = _table(tmp_path)
    for i in range(2):
        with lance.dataset(uri).mem_wal_writer(region) as w:  # two flushed generations
            w.put(pa.table({"id": [10 + i], "v": [i]}, schema=SCHEMA))
    want = mq.open_table(uri).to_arrow()
    folders = sorted(p.name for p in Path(uri, "_mem_wal", region).iterdir())
    _merged_claim(uri, region, 99)
    for act in (lambda: mq.open_table(uri), lambda: collect_garbage(uri, older_than=0)):
        with pytest.raises(
            mq.MemWalCorruptionError, match="says generation 99 is merged, but .* only up to generation 2"
        ):
            act()
    assert sorted(p.name for p in Path(uri, "_mem_wal", region).iterdir()) == folders
    uri, region = _table(tmp_path / "b")
    with lance.dataset(uri).mem_wal_writer(region) as w:
        w.put(pa.table({"id": [10], "v": [0]}, schema=SCHEMA))
    mdir = Path(uri, "_mem_wal", region, "manifest")
    latest = sorted(mdir.glob("*.binpb"), key=lambda p: p.name[::-1])[-1]
    edit_region_manifest(latest, lambda pb: setattr(pb.sstables[0], "generation", 7))
    with pytest.raises(mq.MemWalCorruptionError, match="lists flushed generation 7, not below its current generation"):
        mq.open_table(uri)
    # generations 1 and 2 listed in each other's folders: their ranking was swapped without a word
    uri, region = _table(tmp_path / "c")
    for i in range(2):
        with lance.dataset(uri).mem_wal_writer(region) as w:
            w.put(pa.table({"id": [10], "v": [i]}, schema=SCHEMA))
    mdir = Path(uri, "_mem_wal", region, "manifest")
    latest = sorted(mdir.glob("*.binpb"), key=lambda p: p.name[::-1])[-1]

    def swap(pb: Any) -> None:
        first, second = pb.sstables[0].path, pb.sstables[1].path
        pb.sstables[0].path, pb.sstables[1].path = second, first

    edit_region_manifest(latest, swap)
    with pytest.raises(mq.MemWalCorruptionError, match="lists flushed generation 1 in folder .*, named for another"):
        mq.open_table(uri)
    from memwal_query.verify import verify_table

    assert any("named for another" in p.message for p in verify_table(uri).problems)
    assert want.num_rows == 5  # the base's 3 rows and the 2 flushed ones, before the edit


def test_a_writer_outrunning_the_manifest_probes_is_read_as_of_its_newest_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer committing region manifests faster than a reader probes them (a soak: 8,000
    versions, tiny MemTables) made every open fail ("keep appearing faster than they can be
    probed"); the highest one listed was the newest while the read ran: it is read."""
    import memwal_query.snapshot.manifests as manifests

    uri, region = _table(tmp_path)
    for i in range(3):
        with lance.dataset(uri).mem_wal_writer(region) as w:
            w.put(pa.table({"id": [10 + i], "v": [i]}, schema=SCHEMA))
    want = mq.open_table(uri).to_arrow().sort_by("id")
    monkeypatch.setattr(manifests, "_probe_newer", lambda *args: None)  # always more than the probes reach
    assert mq.open_table(uri).to_arrow().sort_by("id").equals(want)
