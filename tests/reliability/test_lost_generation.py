"""A lost unmerged generation is rebuilt from the WAL, an error, or (opt-in) skipped: never silently missing.

Tables are written by pylance's own writer (one writer session = one flushed generation
of one unsharded region); the dict model decides the expected rows. Which WAL entries
belong to a generation is read straight from the entries' Arrow metadata, independently
of the reader's own scan.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

import datafusion
import lance
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.cli import main
from memwal_query.format import machine_cache
from memwal_write import merge_generations

from builders import build_events
from lsm_model import PK, ModelTable, sort_table

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64()), pa.field("s", pa.string())]
)
Op = tuple[str, list[dict[str, Any]] | list[int]]


def _rows(ids: range | list[int], v: int) -> list[dict[str, Any]]:
    return [{"id": i, "v": v, "s": f"{i}-{v}"} for i in ids]


#: One writer session per generation: generation g = SESSIONS[g - 1].
SESSIONS: list[list[Op]] = [
    [("put", _rows(range(0, 30), 1)), ("delete", [90, 91, 92])],
    [("put", _rows([20, 21, 21, 22], 2)), ("put", _rows(range(25, 50), 2)), ("delete", [0, 1, 2, 93])],
    [("put", _rows(range(40, 60), 3)), ("put", _rows([1, 90], 3)), ("delete", [45])],
    [("put", _rows([5, 6, 45, 120], 4)), ("delete", [25, 26]), ("put", _rows([26], 4))],
]


def _apply(model: dict[int, dict[str, Any]], op: Op) -> None:
    kind, arg = op
    for item in arg:
        if kind == "put":
            assert isinstance(item, dict)
            model[item["id"]] = item
        else:
            assert isinstance(item, int)
            model.pop(item, None)


def _base() -> pa.Table:
    return pa.Table.from_pylist(_rows(range(100), 0), schema=SCHEMA)


def _model_without(generation: int) -> pa.Table:
    """The dict model replayed without one generation's session (what ``skip`` must return)."""
    model = {r["id"]: r for r in _base().to_pylist()}
    for g, session in enumerate(SESSIONS, start=1):
        if g != generation:
            for op in session:
                _apply(model, op)
    return pa.Table.from_pylist(list(model.values()), schema=SCHEMA)


def _build(path: Path) -> ModelTable:
    t = ModelTable(str(path / "t"), SCHEMA, _base(), unsharded=True, max_memtable_rows=10_000)
    for session in SESSIONS:
        for kind, arg in session:
            if kind == "put":
                t.put(arg)  # type: ignore[arg-type]
            else:
                t.delete([(k,) for k in arg])  # type: ignore[union-attr]
        t.flush()
    (region,) = t.regions()
    assert [g for g, _ in t.flushed(region)] == [1, 2, 3, 4]
    return t


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> ModelTable:
    return _build(tmp_path_factory.mktemp("lost"))


@pytest.fixture
def table(written: ModelTable, tmp_path: Path) -> ModelTable:
    """A private copy of the written table (tests damage it)."""
    dst = tmp_path / "t"
    shutil.copytree(written.uri, dst)
    t = ModelTable.__new__(ModelTable)
    t.__dict__.update(written.__dict__)
    t.uri, t.writers, t.model = str(dst), {}, dict(written.model)
    return t


def _region(t: ModelTable) -> str:
    (region,) = t.regions()
    return region


def _gen_dir(t: ModelTable, generation: int) -> Path:
    region = _region(t)
    return Path(t.uri, "_mem_wal", region, dict(t.flushed(region))[generation])


def _wal_entries_of(t: ModelTable, generation: int) -> list[Path]:
    """WAL files whose entry was written to ``generation``'s MemTable (Arrow schema metadata)."""
    out = []
    for f in sorted(Path(t.uri, "_mem_wal", _region(t), "wal").iterdir()):
        meta = pa.ipc.open_stream(f.read_bytes()).schema.metadata or {}
        if meta.get(b"fence_sentinel") != b"true" and int(meta.get(b"generation", b"0")) == generation:
            out.append(f)
    assert out, f"no WAL entry of generation {generation}"
    return out


def _rows_of(table: mq.Table) -> pa.Table:
    return sort_table(table.to_arrow().cast(SCHEMA), ["id"])


def _expected(t: ModelTable) -> pa.Table:
    return sort_table(t.expected(), ["id"])


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "memwal_query" and r.levelno >= logging.WARNING]


# -- rebuilt from the WAL ------------------------------------------------------------------


@pytest.mark.parametrize("generation", [4, 2], ids=["newest", "middle"])
def test_lost_generation_is_rebuilt_from_the_wal(
    table: ModelTable, generation: int, caplog: pytest.LogCaptureFixture
) -> None:
    lost = _gen_dir(table, generation)
    shutil.rmtree(lost)
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        t = mq.open_table(table.uri)
    assert _rows_of(t).equals(_expected(table))
    assert t.count_rows() == len(table.model)
    (warning,) = _warnings(caplog)
    assert f"flushed generation {generation} ({lost})" in warning and "served from the WAL" in warning
    (src,) = [g for g in t.snapshot.regions[0].generations if g.rebuilt_from_wal]
    assert src.generation == generation and src.lost_uri == str(lost)
    text = t.explain()
    assert f"REBUILT from WAL positions {src.wal_positions[0]}..{src.wal_positions[1]}" in text  # type: ignore[index]
    assert str(lost) in text and "merge_generations" in text
    # newest-wins order across the rebuilt generation and its neighbours, also for lookups
    keys = [1, 5, 20, 21, 25, 26, 45, 90, 93, 120, 999]
    got = {r["id"]: r for r in t.lookup(keys).to_pylist()}
    assert got == {k: table.model[(k,)] for k in keys if (k,) in table.model}
    ctx = datafusion.SessionContext()
    t.register(ctx, "h", hidden_columns=True)
    only_here = {4: 120, 2: 27}[generation]  # last written by this generation
    assert ctx.sql(f"SELECT _gen FROM h WHERE id = {only_here}").to_pydict() == {"_gen": [generation]}
    filtered = t.sql("SELECT * FROM t WHERE v >= 2").to_arrow_table().cast(SCHEMA)
    want = _expected(table).filter(pa.compute.greater_equal(_expected(table).column("v"), 2))
    assert sort_table(filtered, ["id"]).equals(want)
    again = t.refresh()
    assert again.snapshot.on_missing_generation == "recover" and _rows_of(again).equals(_expected(table))


def test_partly_deleted_generation_is_rebuilt(table: ModelTable) -> None:
    for f in (_gen_dir(table, 3) / "data").iterdir():
        f.unlink()
    assert _rows_of(mq.open_table(table.uri)).equals(_expected(table))


def test_damaged_generation_is_rebuilt(table: ModelTable) -> None:
    for m in (_gen_dir(table, 2) / "_versions").glob("*.manifest"):
        m.write_bytes(b"not a manifest")
    assert _rows_of(mq.open_table(table.uri)).equals(_expected(table))
    with pytest.raises(mq.GenerationLostError, match="unreadable"):
        mq.open_table(table.uri, on_missing_generation="error")


def _cut_data_files(gen: Path, keep: float) -> None:
    for f in (gen / "data").iterdir():
        f.write_bytes(f.read_bytes()[: int(f.stat().st_size * keep)])


def _damaged(table: ModelTable, damage: str) -> Path:
    """Generation 2's directory, damaged as ``damage`` says (generation 2 writes key 21 twice:
    its dataset has a deletion file)."""
    gen = _gen_dir(table, 2)
    if damage == "deletion file missing":
        deletions = list((gen / "_deletions").iterdir())
        assert deletions
        for f in deletions:
            f.unlink()
    else:
        _cut_data_files(gen, 0.5 if damage == "data file cut short" else 0.0)
    return gen


@pytest.mark.parametrize("damage", ["data file cut short", "data file emptied", "deletion file missing"])
def test_generation_that_opens_but_cannot_be_read_is_rebuilt(
    table: ModelTable, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its manifest and files are there, its rows cannot be read: opening a table failed with
    a generic error under every policy (no rebuild from the WAL, no ``GenerationLostError``)
    and ``verify`` said the table was fine, while the merger rebuilt the same generation."""
    gen = _damaged(table, damage)
    t = mq.open_table(table.uri)
    assert _rows_of(t).equals(_expected(table))
    (src,) = [g for g in t.snapshot.regions[0].generations if g.rebuilt_from_wal]
    assert src.generation == 2 and src.lost_uri == str(gen)
    keys = [0, 20, 21, 22, 27, 49, 93]
    assert {r["id"]: r for r in t.lookup(keys).to_pylist()} == {
        k: table.model[(k,)] for k in keys if (k,) in table.model
    }
    with pytest.raises(mq.GenerationLostError, match="generation 2 .* is lost: unreadable"):
        mq.open_table(table.uri, on_missing_generation="error")
    assert main(["verify", table.uri]) == 2
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem: ")]
    cut = "data file data/.* is [0-9,]+ bytes, its manifest says [0-9,]+"
    why = "its rows cannot be read" if damage == "deletion file missing" else cut
    assert len(problems) == 1 and re.search(
        f"{re.escape(str(gen))}: unmerged generation 2 is lost \\({why}", problems[0]
    )
    assert ".rs:" not in problems[0]


@pytest.mark.parametrize("damage", ["data file cut short", "data file emptied", "deletion file missing"])
def test_a_generation_damaged_after_its_ranking_was_kept_is_rebuilt(table: ModelTable, damage: str) -> None:
    """A new snapshot takes the ranking of a region's generations kept on this machine
    (``memwal_query.snapshot.kept_ranks``) instead of reading their keys, the read that found a
    generation that opens but cannot be read: damaged after its ranking was kept, it is still
    found (its files' sizes and times name another ranking) and rebuilt from the WAL."""
    assert _rows_of(mq.open_table(table.uri)).equals(_expected(table))  # ranks and keeps
    machine_cache.settle()
    assert not mq.open_table(table.uri).view.cache.generation_keys  # the kept ranking: no key read
    _damaged(table, damage)
    t = mq.open_table(table.uri)
    assert _rows_of(t).equals(_expected(table))
    (src,) = [g for g in t.snapshot.regions[0].generations if g.rebuilt_from_wal]
    assert src.generation == 2
    with pytest.raises(mq.GenerationLostError, match="generation 2 .* is lost: unreadable"):
        mq.open_table(table.uri, on_missing_generation="error")


@pytest.mark.parametrize("keep", [0.5, 0.0], ids=["cut short", "emptied"])
def test_a_kept_generation_cut_short_since_is_rebuilt_on_refresh(table: ModelTable, keep: float) -> None:
    """A refresh kept a generation's dataset open since the first open and checked only that
    its files exist: its data file cut short, lookups failed ("Invalid range ... for object of
    size ...") where a fresh open rebuilt the generation from the WAL."""
    t = mq.open_table(table.uri)
    keys = [0, 20, 21, 22, 27, 49, 93]
    assert len(t.lookup(keys)) == sum((k,) in table.model for k in keys)
    _cut_data_files(_gen_dir(table, 2), keep)
    refreshed = t.refresh()
    (src,) = [g for g in refreshed.snapshot.regions[0].generations if g.rebuilt_from_wal]
    assert src.generation == 2
    assert _rows_of(refreshed).equals(_expected(table))
    assert {r["id"]: r for r in refreshed.lookup(keys).to_pylist()} == {
        k: table.model[(k,)] for k in keys if (k,) in table.model
    }


# -- the WAL cannot rebuild it ----------------------------------------------------------------


@pytest.mark.parametrize("generation", [4, 2], ids=["newest", "middle"])
@pytest.mark.parametrize("wal_lost", ["all", "last"])
def test_lost_generation_without_its_wal_entries(
    table: ModelTable, generation: int, wal_lost: str, caplog: pytest.LogCaptureFixture
) -> None:
    region = _region(table)
    lost = _gen_dir(table, generation)
    shutil.rmtree(lost)
    entries = _wal_entries_of(table, generation)
    for f in entries if wal_lost == "all" else entries[-1:]:
        f.unlink()
    with pytest.raises(mq.GenerationLostError) as err:
        mq.open_table(table.uri)
    msg = str(err.value)
    assert "\n" not in msg and isinstance(err.value, mq.MemWalCorruptionError)
    assert table.uri in msg and f"region {region}" in msg and f"generation {generation} ({lost})" in msg
    assert "the WAL cannot rebuild it" in msg and "on_missing_generation='skip'" in msg

    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        t = mq.open_table(table.uri, on_missing_generation="skip")
    expected = sort_table(_model_without(generation), ["id"])
    assert not expected.equals(_expected(table))  # the generation contributed something
    assert _rows_of(t).equals(expected)
    (warning,) = _warnings(caplog)
    assert f"generation {generation} ({lost})" in warning and "left out" in warning
    text = t.explain()
    assert "LEFT OUT" in text and f"generation {generation}: skipped: LOST" in text and str(lost) in text
    assert "its rows are missing" in text
    again = t.refresh()
    assert again.snapshot.on_missing_generation == "skip" and _rows_of(again).equals(expected)


def test_error_policy_never_rebuilds(table: ModelTable) -> None:
    lost = _gen_dir(table, 3)
    shutil.rmtree(lost)
    with pytest.raises(mq.GenerationLostError, match=f"generation 3 \\({lost}\\) is lost: directory missing"):
        mq.open_table(table.uri, on_missing_generation="error")


def test_invalid_policy(table: ModelTable) -> None:
    with pytest.raises(mq.InvalidArgumentError, match="on_missing_generation"):
        mq.open_table(table.uri, on_missing_generation="ignore")  # type: ignore[arg-type]


# -- merged + garbage-collected: still skipped silently -------------------------------------------


def test_merged_and_garbage_collected_generation_is_skipped_silently(
    table: ModelTable, caplog: pytest.LogCaptureFixture
) -> None:
    region = _region(table)
    table.merge(region, 1)
    table.merge(region, 2)
    for g in (1, 2):
        shutil.rmtree(_gen_dir(table, g))
        for f in _wal_entries_of(table, g):
            f.unlink()  # a merged generation's WAL entries may go too
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        t = mq.open_table(table.uri, on_missing_generation="error")
    assert _warnings(caplog) == []
    assert _rows_of(t).equals(_expected(table))
    assert [s.generation for s in t.snapshot.regions[0].skipped] == [1, 2]
    assert "WARNING" not in t.explain()


@pytest.mark.parametrize("wal", ["kept", "removed"])
def test_a_past_version_names_generations_merged_and_collected_since(
    table: ModelTable, wal: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pinned older base version has not merged generations a newer version merged before
    GC removed them: they are not lost (nothing to repair), and the message says so."""
    region = _region(table)
    before = lance.dataset(table.uri).version
    table.merge(region, 1)
    table.merge(region, 2)
    newest = lance.dataset(table.uri).version
    dirs = {g: _gen_dir(table, g) for g in (1, 2)}
    for g in (1, 2):
        shutil.rmtree(dirs[g])
        if wal == "removed":
            for f in _wal_entries_of(table, g):
                f.unlink()
    if wal == "kept":  # served from the WAL: the rows the old version shows, no warning
        with caplog.at_level(logging.INFO, logger="memwal_query"):
            t = mq.open_table(table.uri, version=before)
        assert _warnings(caplog) == [] and _rows_of(t).equals(_expected(table))
        (info,) = [r.getMessage() for r in caplog.records if "generation 1 (" in r.getMessage()]
        assert f"base version {newest} has" in info and "repair" not in info
        return
    with pytest.raises(mq.GenerationLostError) as err:
        mq.open_table(table.uri, version=before)
    msg = str(err.value)
    assert f"flushed generation 1 ({dirs[1]}) is gone" in msg and "is lost" not in msg, msg
    assert f"base version {before}, which was asked for, has not merged it" in msg
    assert f"base version {newest} has" in msg and "open the latest version" in msg
    assert "restore the directory" not in msg and "\n" not in msg
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        t = mq.open_table(table.uri, version=before, on_missing_generation="skip")
    assert [s.generation for s in t.snapshot.regions[0].skipped] == [1, 2]
    assert "skipped: GONE (merged by a newer base version" in t.explain()
    assert all("is gone" in w for w in _warnings(caplog)) and len(_warnings(caplog)) == 2


# -- repair, verify, a multi-region table -------------------------------------------------------


def test_merger_repairs_a_lost_generation(table: ModelTable, caplog: pytest.LogCaptureFixture) -> None:
    shutil.rmtree(_gen_dir(table, 2))
    stats = merge_generations(table.uri)
    assert stats.column("status").to_pylist() == ["merged"] * 4
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        t = mq.open_table(table.uri)
    assert _warnings(caplog) == [] and _rows_of(t).equals(_expected(table))
    base = sort_table(lance.dataset(table.uri).to_table().cast(SCHEMA), ["id"])
    assert base.equals(_expected(table))


def test_merger_refuses_a_generation_the_wal_cannot_rebuild(table: ModelTable) -> None:
    shutil.rmtree(_gen_dir(table, 2))
    _wal_entries_of(table, 2)[0].unlink()
    with pytest.raises(mq.GenerationLostError, match="generation 2 .*the WAL cannot rebuild it"):
        merge_generations(table.uri)


def test_verify_reports_a_lost_generation(table: ModelTable, capsys: pytest.CaptureFixture[str]) -> None:
    region = _region(table)
    lost = _gen_dir(table, 3)
    shutil.rmtree(lost)
    assert main(["verify", table.uri]) == 2
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem: ")]
    assert problems == [
        f"problem: {lost}: unmerged generation 3 is lost (directory missing; the region's merged generation is 0); "
        f"the WAL can rebuild it (WAL positions {_positions(table, 3)} hold all its {_session_rows(3)} rows): "
        "readers serve it from "
        "the WAL; run memwal_write.merge_generations to repair"
    ], region
    for f in _wal_entries_of(table, 3):
        f.unlink()
    assert main(["verify", table.uri]) == 2
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 1 and problems[0].startswith(f"problem: {lost}: unmerged generation 3 is lost")
    assert problems[0].endswith(
        f"the WAL cannot rebuild it (the WAL holds 0 of its {_session_rows(3)} rows (no entry of generation 3 left)): "
        "its rows are lost"
    )


def _session_rows(generation: int) -> int:
    return sum(len(arg) for _, arg in SESSIONS[generation - 1])


def _positions(t: ModelTable, generation: int) -> str:
    from memwal_query.format.decode import parse_bitrev64_name

    pos = [parse_bitrev64_name(f.name) for f in _wal_entries_of(t, generation)]
    return f"{min(pos)}..{max(pos)}"  # type: ignore[type-var]


def test_lost_generation_of_a_bucketed_table_with_a_wal_tail(tmp_path: Path) -> None:
    """4 bucket regions, generation 1 merged, generation 2 lost in one region, writers still open."""
    t = build_events(str(tmp_path / "e"), seed=21)
    try:
        table = mq.open_table(t.uri)
        region = next(r for r in table.snapshot.regions if r.generations)
        lost = region.generations[-1]
        shutil.rmtree(lost.uri)
        got = mq.open_table(t.uri)
        cols = t.schema.names
        assert sort_table(got.to_arrow().select(cols).cast(t.schema), ["id"]).equals(sort_table(t.expected(), ["id"]))
        assert any(g.rebuilt_from_wal for r in got.snapshot.regions for g in r.generations)
    finally:
        t.flush()


def test_a_generation_written_before_a_column_change_that_cannot_be_read_is_rebuilt(table: ModelTable) -> None:
    """A generation older than the base's columns is read into a copy with them: a data file
    cut short failed there with pyarrow's ``ArrowInvalid`` under every policy (no rebuild
    from the WAL, no ``GenerationLostError``)."""
    gen = _gen_dir(table, 2)
    _cut_data_files(gen, 0.5)
    lance.dataset(table.uri).add_columns(pa.field("extra", pa.int64()))  # all NULL
    got = sort_table(mq.open_table(table.uri).to_arrow(), ["id"])
    assert got.column("extra").null_count == got.num_rows
    assert got.drop_columns(["extra"]).cast(SCHEMA).equals(_expected(table))
    with pytest.raises(mq.GenerationLostError, match="generation 2 .* is lost: unreadable"):
        mq.open_table(table.uri, on_missing_generation="error")


@pytest.mark.parametrize("policy", ["recover", "skip"])
def test_inspect_text_says_a_generation_is_lost(
    table: ModelTable, policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memwal inspect`` (text) listed a generation rebuilt from the WAL as a plain unmerged
    one, and one left out (its rows missing from every answer) not at all; only ``--json`` and
    ``explain()`` said so."""
    region = _region(table)
    lost = _gen_dir(table, 2)
    shutil.rmtree(lost)
    if policy == "skip":
        _wal_entries_of(table, 2)[-1].unlink()  # the WAL cannot rebuild it: left out
    assert main(["inspect", table.uri, "--on-missing-generation", policy]) == 0
    out = capsys.readouterr().out
    if policy == "recover":
        assert "WARNING: lost generation(s) " in out and "rebuilt from the WAL" in out
        assert f"region {region} generation 2: REBUILT from WAL positions" in out and str(lost) in out
    else:
        assert "LEFT OUT: their rows are missing" in out
        assert f"region {region} generation 2: skipped: " in out


def test_a_generation_without_its_tombstones_is_rebuilt_by_the_merger_too(tmp_path: Path) -> None:
    """A generation folder holding a Lance dataset without ``_tombstone`` (not one pylance
    wrote): readers rebuild its rows from the WAL; the merger raised a bare KeyError."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": list(range(10)), "v": [0] * 10}, schema=schema))
    t.put([{"id": i, "v": 1} for i in range(5, 15)])
    t.flush()
    t.delete([(6,)])
    t.flush()
    region = next(r for r in t.regions() if t.flushed(r))
    folder = Path(t.uri, "_mem_wal", region, dict(t.flushed(region))[1])
    shutil.rmtree(folder)
    lance.write_dataset(pa.table({"id": pa.array([5], pa.int64()), "v": pa.array([1], pa.int64())}), str(folder))
    want = sort_table(t.expected(), ["id"])
    assert sort_table(mq.open_table(t.uri).to_arrow(), ["id"]).equals(want)
    assert "merged" in merge_generations(t.uri).column("status").to_pylist()
    assert sort_table(mq.open_table(t.uri).to_arrow(), ["id"]).equals(want)


@pytest.mark.parametrize("odd", ["null tombstone", "null key", "int8 tombstone"])
def test_a_generation_with_rows_pylance_never_writes_is_lost(tmp_path: Path, odd: str) -> None:
    """A flushed generation whose delete's ``_tombstone`` is NULL brought the deleted key back
    (read as a put; the merger kept it in the base); a NULL key was counted and shown as NULL
    in a NOT NULL column; an int8 ``_tombstone`` failed every read without naming the
    generation. Such a generation is lost: rebuilt from the WAL (readers, merger), a verify
    problem."""
    from memwal_query.verify import verify_table

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    t = ModelTable(str(tmp_path / "t"), schema, pa.table({"id": list(range(10)), "v": [0] * 10}, schema=schema))
    t.put([{"id": i, "v": 1} for i in range(5, 15)])
    t.delete([(0,), (1,)])
    t.flush()
    region = next(r for r in t.regions() if t.flushed(r))
    folder = Path(t.uri, "_mem_wal", region, dict(t.flushed(region))[1])
    rows = lance.dataset(str(folder)).to_table()
    flags = rows.column("_tombstone")
    if odd == "null tombstone":
        rows = rows.set_column(2, "_tombstone", pa.array([None if f else False for f in flags.to_pylist()], pa.bool_()))
    elif odd == "null key":
        rows = rows.set_column(0, pa.field("id", pa.int64()), pa.array([None, *rows.column("id").to_pylist()[1:]]))
    else:
        rows = rows.set_column(2, "_tombstone", flags.cast(pa.int8()))
    shutil.rmtree(folder)
    lance.write_dataset(rows, str(folder))
    want = sort_table(t.expected(), ["id"])
    assert sort_table(mq.open_table(t.uri).to_arrow(), ["id"]).equals(want)
    report = verify_table(t.uri)
    assert not report.ok and any(
        "is lost" in p.message and "the WAL can rebuild it" in p.message for p in report.problems
    )
    assert "merged" in merge_generations(t.uri).column("status").to_pylist()
    assert sort_table(mq.open_table(t.uri).to_arrow(), ["id"]).equals(want)


def test_an_open_reads_again_while_merges_move_the_base_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy merger and collector (a soak: every 0.3 s) removed generations between each of the
    3 reads an open made: GenerationLostError on a healthy table. An open reads again while the
    base version keeps moving; a generation missing from two reads of one base version is lost."""
    from types import SimpleNamespace

    import memwal_query.snapshot.load as load

    events = build_events(str(tmp_path / "events"))
    missing = SimpleNamespace(missing=True)

    def reads(versions: list[int], clean_at: int | None) -> tuple[list[int], list[bool]]:
        seen: list[int] = []

        def once(*args: Any, **kwargs: Any) -> Any:
            i = len(seen)
            seen.append(versions[i])
            skipped = [] if clean_at is not None and i >= clean_at else [missing]
            return SimpleNamespace(base_version=versions[i], regions=[SimpleNamespace(skipped=skipped)])

        resolved: list[bool] = []
        monkeypatch.setattr(load, "_load_once", once)
        monkeypatch.setattr(load, "resolve_missing_generations", lambda snap, *a, **k: resolved.append(True) or snap)
        load.load_snapshot(events.uri)
        return seen, resolved

    assert reads([5, 6, 7, 8, 9, 10], clean_at=5)[0] == [5, 6, 7, 8, 9, 10]  # base moving: read on
    assert reads([5, 6, 6, 7], clean_at=None)[0] == [5, 6, 6]  # the base did not move: lost
    events.flush()


@pytest.mark.parametrize("after_the_copy", ["a WAL tail", "a flushed generation"])
def test_a_refresh_after_the_table_was_restored_from_an_older_copy(tmp_path: Path, after_the_copy: str) -> None:
    """A table replaced by an older copy of itself (a backup restored: the same base manifest):
    ``refresh()`` kept the WAL entries and region manifests it had read, so it showed rows
    written after the copy, or called a generation written after it lost. A WAL entry read
    before that is gone, or a generation missing on a refresh, has it read the table afresh."""
    uri, backup = str(tmp_path / "t"), str(tmp_path / "backup")
    t = ModelTable(uri, SCHEMA, pa.Table.from_pylist(_rows(range(4), 0), schema=SCHEMA), unsharded=True)
    t.put(_rows([0], 1))
    t.flush()
    shutil.copytree(uri, backup)
    want = sorted(mq.open_table(backup).to_arrow().to_pylist(), key=lambda r: r["id"])
    t.put(_rows([1, 2], 2))
    if after_the_copy == "a flushed generation":
        t.flush()
    reader = mq.open_table(uri)
    assert sorted(reader.to_arrow().to_pylist(), key=lambda r: r["id"]) != want
    shutil.rmtree(uri)
    shutil.copytree(backup, uri)
    t.writers.clear()
    for table in (reader.refresh(), mq.open_table(uri)):
        assert sorted(table.to_arrow().to_pylist(), key=lambda r: r["id"]) == want


def test_a_lost_generation_is_warned_about_once_and_refreshes_stay_light(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generation really lost (served from the WAL) is not taken for a table restored from an
    older copy: a refresh does not read everything afresh (a rebuild from the whole WAL on every
    refresh, 4 -> 45 ms at 400 entries), and its warning is logged once, not on every refresh."""
    from memwal_query.snapshot.cache import SnapshotCache

    t = ModelTable(str(tmp_path / "t"), SCHEMA, pa.Table.from_pylist(_rows(range(4), 0), schema=SCHEMA), unsharded=True)
    t.put(_rows(range(2, 40), 1))
    t.flush()
    t.put(_rows([5], 2))
    region = t.regions()[0]
    shutil.rmtree(t.storage().child_uri(f"_mem_wal/{region}/{t.flushed(region)[0][1]}"))
    resets: list[int] = []
    reset = SnapshotCache.reset
    monkeypatch.setattr(SnapshotCache, "reset", lambda self: (resets.append(1), reset(self))[1])
    want = sorted(t.model.values(), key=lambda r: r["id"])
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        table = mq.open_table(t.uri)
        for _ in range(3):
            table = table.refresh()
            assert sorted(table.to_arrow().to_pylist(), key=lambda r: r["id"]) == want
    assert sum("served from the WAL" in m for m in caplog.messages) == 1
    assert not resets
    t.flush()
