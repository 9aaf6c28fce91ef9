"""The ``memwal`` command: sql / inspect / verify, output formats, exit codes, errors."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import memwal_query as mq
from memwal_query.cli import ProgressBar, main, parse_storage_options
from memwal_query.demo import write_demo_table
from memwal_query.errors import InvalidArgumentError
from memwal_query.format.decode import bitrev64_name
from memwal_query.format.wal import wal_entry_path

from builders import plain_live_rows
from lsm_model import sort_table

REPO = Path(__file__).resolve().parents[1]


class Terminal(io.StringIO):
    """stderr as a terminal (where tickers and progress bars are drawn)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("cli")
    return write_demo_table(str(root / "events"), base_rows=600, update_rows=120, memtable_rows=60, seed=5)


@pytest.fixture(scope="module")
def live(demo: str) -> pa.Table:
    """The demo's live rows by plain Lance reads (the oracle: no memwal_query involved)."""
    return sort_table(plain_live_rows(demo), ["id"])


@pytest.fixture
def copy(demo: str, tmp_path: Path) -> str:
    dst = tmp_path / "events"
    shutil.copytree(demo, dst)
    return str(dst)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- sql ---------------------------------------------------------------------------------


def test_sql_pretty_registers_t_and_folder_name(demo: str, live: pa.Table, capsys: pytest.CaptureFixture[str]) -> None:
    n = live.num_rows
    code, out, err = run(capsys, "sql", demo, "SELECT count(*) AS n FROM t")
    assert code == 0 and err == ""
    assert out.splitlines()[0].startswith("+") and f"| {n} |" in out and "1 row" in out
    code, out, _ = run(capsys, "sql", demo, "SELECT count(*) AS n FROM events")
    assert code == 0 and f"| {n} |" in out


@pytest.mark.parametrize("folder", ["events.lance", "Events", 'ev"en ts'])
def test_sql_registers_a_folder_name_sql_must_quote(
    demo: str, live: pa.Table, tmp_path: Path, capsys: pytest.CaptureFixture[str], folder: str
) -> None:
    """A folder name that is not a plain SQL name (a dot, capitals) failed every query, ``FROM t``
    too; it is registered quoted, and the SQL functions take it as written."""
    dst = tmp_path / folder
    shutil.copytree(demo, dst)
    n, quoted = live.num_rows, '"' + folder.replace('"', '""') + '"'
    for query in ["SELECT count(*) AS n FROM t", f"SELECT count(*) AS n FROM {quoted}"]:
        code, out, err = run(capsys, "sql", str(dst), query)
        assert code == 0 and f"| {n} |" in out, (query, err)
    key = live.column("id")[0].as_py()
    name = folder.replace("'", "''")
    code, out, err = run(capsys, "sql", str(dst), f"SELECT count(*) AS n FROM memwal_lookup('{name}', [{key}])")
    assert code == 0 and "| 1 |" in out, err
    if folder.isidentifier():  # FROM Events unquoted: DataFusion looks for "events"; say how to name it
        code, _, err = run(capsys, "sql", str(dst), f"SELECT count(*) FROM {folder}")
        assert code == 1 and err.endswith(f"not found (the table is t, or {quoted} quoted)\n"), err
    if "." in folder:  # Table.sql(name=...) takes the name as DataFusion does: the error says to quote it
        with pytest.raises(InvalidArgumentError, match=f"quote it, {quoted}"):
            mq.open_table(str(dst)).sql("SELECT 1", name=folder)
        assert (
            mq.open_table(str(dst)).sql(f"SELECT count(*) FROM {quoted}", name=quoted).to_arrow_table()[0][0].as_py()
            == n
        )


def test_sql_csv_json_arrow_agree(
    demo: str, live: pa.Table, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    q = "SELECT id, category, amount FROM t WHERE id < 200"
    expected = live.filter(pa.compute.less(live.column("id"), 200)).select(["id", "category", "amount"])

    assert main(["sql", demo, q, "--format", "csv"]) == 0
    got_csv = pacsv.read_csv(io.BytesIO(capsysbinary.readouterr().out))
    assert sort_table(got_csv, ["id"]).to_pylist() == expected.to_pylist()

    assert main(["sql", demo, q, "-f", "json"]) == 0
    rows = json.loads(capsysbinary.readouterr().out)
    assert sorted(rows, key=lambda r: r["id"]) == expected.to_pylist()

    out = tmp_path / "rows.arrows"
    assert main(["sql", demo, q, "-f", "arrow", "--output", str(out)]) == 0
    with pa.ipc.open_stream(out.read_bytes()) as r:
        assert sort_table(r.read_all(), ["id"]).equals(expected)
    # a query failing while it runs left a file of headers alone in place of the one there
    kept = tmp_path / "kept.csv"
    kept.write_text("earlier\n")
    assert main(["sql", demo, "SELECT 1 / (id - id) AS x FROM t", "-f", "csv", "-o", str(kept)]) != 0
    assert kept.read_text() == "earlier\n" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.csv", "rows.arrows"]
    link = tmp_path / "link.csv"  # a link is written through, not replaced by a file
    link.symlink_to(kept)
    assert main(["sql", demo, "SELECT 1 AS one", "-f", "csv", "-o", str(link)]) == 0
    assert link.is_symlink() and kept.read_text().splitlines() == ['"one"', "1"]
    assert main(["sql", demo, "SELECT 1 / (id - id) AS x FROM t", "-f", "csv", "-o", str(link)]) != 0
    assert link.is_symlink() and kept.read_text().splitlines() == ['"one"', "1"]  # not emptied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.csv", "link.csv", "rows.arrows"]


def test_sql_csv_writes_nested_values_as_json(
    demo: str, live: pa.Table, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    q = "SELECT id, vec, named_struct('c', category, 'n', id) AS s, make_array(id, NULL) AS l FROM t WHERE id < 40"
    assert main(["sql", demo, q, "--format", "csv"]) == 0
    got = pacsv.read_csv(io.BytesIO(capsysbinary.readouterr().out)).sort_by("id").to_pylist()
    want = live.filter(pa.compute.less(live.column("id"), 40)).to_pylist()
    assert [r["id"] for r in got] == [r["id"] for r in want] and want
    for g, w in zip(got, want, strict=True):
        assert json.loads(g["vec"]) == pytest.approx(w["vec"])
        assert json.loads(g["s"]) == {"c": w["category"], "n": w["id"]}
        assert json.loads(g["l"]) == [w["id"], None]


def test_sql_arrow_to_stdout_pipe(demo: str, live: pa.Table) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memwal_query.cli", "sql", demo, "SELECT * FROM t", "--format", "arrow"],
        capture_output=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = pa.ipc.open_stream(proc.stdout).read_all()
    assert sort_table(got, ["id"]).equals(live)


@pytest.mark.parametrize(
    "argv",
    [[], ["sql"], ["sql", "x", "q", "--format", "nope"], ["inspect", "x", "--bogus"], ["verify", "x", "-s"]],
)
def test_a_wrong_command_line_is_one_line_and_exit_1(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """argparse printed its usage and the error (up to 7 lines) and exited 2, which is what
    ``verify`` returns for "problems found"."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 1 and out == ""
    assert err.startswith("memwal: error: ") and err.endswith("--help)\n") and err.count("\n") == 1, err


def test_sql_runs_queries_only(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``CREATE TABLE x AS SELECT 1`` exited 0 with an empty table, and nothing was kept."""
    for statement, kind in (("CREATE TABLE x AS SELECT 1", "CreateMemoryTable"), ("SET a.b = 1", "SetVariable")):
        code, out, err = run(capsys, "sql", demo, statement)
        assert (code, out) == (1, "") and err.count("\n") == 1
        assert err.startswith("memwal: error: memwal sql runs one query (SELECT, WITH, EXPLAIN ...), not " + kind)
    # EXPLAIN's plans whole, one line a node (a table cut each plan's first line at 40 characters),
    # escaped as table cells are
    code, out, _ = run(capsys, "sql", demo, "EXPLAIN SELECT count(*) FROM t WHERE category = 'x\x1b[2J'")
    assert code == 0 and out.startswith("logical_plan:\nProjection: count(Int64(1)) AS count(*)\n")
    assert "\nphysical_plan:\n" in out and "DatasetExec" in out and "\x1b" not in out and "x\\x1b[2J" in out


def test_a_slow_query_shows_its_time_on_a_terminal_until_its_first_rows() -> None:
    """A 9 s query printed nothing until its result (``verify`` draws a bar)."""
    import time

    from memwal_query.cli_ticker import Ticker, ticking

    batch = pa.record_batch({"n": [1]})

    def slow() -> Any:
        time.sleep(0.8)
        yield batch

    for stream, first_rows_after, drawn in (
        (Terminal(), slow(), True),
        (Terminal(), [batch], False),
        (io.StringIO(), slow(), False),
    ):
        ticker = Ticker(stream, after=0.1)
        got = ticking(pa.RecordBatchReader.from_batches(batch.schema, first_rows_after), ticker).read_all()
        ticker.stop()
        assert got.num_rows == 1
        text = stream.getvalue()
        assert bool(re.search(r"running the query \.\.\. \d+ s \(Ctrl-C stops it\)", text)) == drawn, text
        assert text.endswith("\r\x1b[K") == drawn  # wiped before the rows are written


@pytest.mark.parametrize("command", ["sql", "verify"])
def test_an_interrupted_command_s_line_is_wiped_before_the_message(
    demo: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The command runs on a worker thread (Ctrl-C seen at once): ``memwal: interrupted`` was
    written after the ticker's ``running the query ... 8 s (Ctrl-C stops it)`` (or verify's
    progress bar), on its line, which could be drawn again after it."""
    import threading
    import time

    from memwal_query import cli
    from memwal_query.cli_ticker import Ticker

    screen = Terminal()
    still_running = threading.Event()

    def interrupted(args: Any) -> int:
        if command == "sql":
            Ticker(screen, after=0.0).start()
            while "running the query" not in screen.getvalue():
                time.sleep(0.01)
        else:
            bar = cli.ProgressBar("verifying", screen)  # the bar verify draws
            bar(1, 10, "data")

            def draws_on() -> None:  # the command still running after the interrupt
                still_running.wait(5)
                bar(5, 10, "data")

            threading.Thread(target=draws_on).start()
        raise KeyboardInterrupt  # as Ctrl-C reaches main while the command still runs

    monkeypatch.setattr(cli, f"_cmd_{command}", interrupted)
    code, _, err = run(capsys, command, demo, *(["SELECT 1"] if command == "sql" else []))
    assert (code, err) == (cli.EXIT_INTERRUPTED, "memwal: interrupted\n")
    drawn = screen.getvalue()
    still_running.set()
    time.sleep(0.6)  # the ticker redraws twice a second; the bar was asked to draw again
    assert screen.getvalue() == drawn and drawn.endswith("\r\x1b[K"), repr(drawn[-80:])


def test_sql_consistency_and_json_types(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "sql", demo, "SELECT * FROM t ORDER BY id LIMIT 1", "-f", "json", "--consistency", "eventual"
    )
    assert code == 0
    (row,) = json.loads(out)
    assert set(row) == {"id", "category", "amount", "ts", "vec", "note"} and isinstance(row["ts"], str)
    assert isinstance(row["vec"], list) and len(row["vec"]) == 16 and all(isinstance(x, float) for x in row["vec"])


def test_sql_max_rows(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "sql", demo, "SELECT id FROM t ORDER BY id", "--max-rows", "3")
    assert code == 0 and "3 rows; more rows not shown" in out


def test_sql_errors_are_one_line(demo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "sql", demo, "SELECT no_such_column FROM t")
    assert code == 1 and out == ""
    assert err.startswith("memwal: error: query failed") and err.count("\n") == 1
    code, _, err = run(capsys, "sql", str(tmp_path / "missing"), "SELECT 1")
    assert code == 1 and err.startswith("memwal: error: no Lance table") and "Traceback" not in err
    code, _, err = run(capsys, "sql", demo, "SELECT 1", "--storage-option", "novalue")
    assert code == 1 and "KEY=VALUE" in err
    code, _, err = run(capsys, "sql", "SELECT count(*) FROM t", demo)  # the two swapped
    assert code == 1 and err.count("\n") == 1 and "(the table comes first: memwal sql TABLE QUERY)" in err


def test_error_without_traceback_in_a_real_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memwal_query.cli", "inspect", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("memwal: error: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_storage_options_parsing() -> None:
    assert parse_storage_options(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(InvalidArgumentError):
        parse_storage_options(["=1"])


def test_console_script_declared() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'memwal = "memwal_query.cli:run"' in text


# -- inspect -------------------------------------------------------------------------------


def test_inspect_text_and_json(demo: str, live: pa.Table, capsys: pytest.CaptureFixture[str]) -> None:
    table = mq.open_table(demo)
    code, out, _ = run(capsys, "inspect", demo)
    assert code == 0
    assert f"base version {table.version}" in out and "bucket(id, num_buckets=4)" in out
    for rid in table.region_ids:
        assert rid in out
    # each base index and how its unindexed rows are served, as explain() says it
    for line in table.explain().splitlines():
        if line.strip().startswith("index note_idx:"):
            assert line.strip() in out
            break
    else:
        raise AssertionError("explain() names no note_idx line")
    assert "maintained indexes: all (every index of the base)" in out  # the demo maintains them all
    code, out, _ = run(capsys, "inspect", demo, "--json")
    d: dict[str, Any] = json.loads(out)
    assert d["maintain_all_indexes"] is True and d["maintained_indexes"] == []
    assert d["base_version"] == table.version and d["live_rows"] == live.num_rows
    assert {r["region_id"] for r in d["regions"]} == set(table.region_ids)
    values = table.region_values()
    for r in d["regions"]:
        rv = values[r["region_id"]]
        assert r["spec_values"] == (dict(rv.values) if rv is not None else None)
        assert r["merged_generation"] == 1 and 1 in r["flushed_generations"]
        assert all(g["generation"] > 1 for g in r["unmerged_generations"])
        assert r["wal"]["tail_read"] is True
    code, out, _ = run(capsys, "inspect", demo, "--json", "--consistency", "eventual")
    assert all(r["wal"]["tail_read"] is False for r in json.loads(out)["regions"])


@pytest.mark.parametrize(
    ("maintained", "said"), [(None, "all (every index of the base)"), (["k_idx"], "k_idx"), ([], "none")]
)
def test_inspect_and_explain_say_which_indexes_are_maintained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], maintained: list[str] | None, said: str
) -> None:
    """``initialize_mem_wal()`` without ``maintained_indexes`` maintains every base index (an
    empty list and a flag): inspect said "none" for it, as for a table that maintains none."""
    uri = str(tmp_path / "t")
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"})]
    )
    ds = lance.write_dataset(pa.table({"id": list(range(10))}, schema=schema), uri)
    ds.create_scalar_index("id", "BTREE", name="k_idx")
    lance.dataset(uri).initialize_mem_wal(
        unsharded=True, **({} if maintained is None else {"maintained_indexes": maintained})
    )
    code, out, _ = run(capsys, "inspect", uri)
    assert code == 0 and f"maintained indexes: {said}\n" in out
    explained = [line.strip() for line in mq.open_table(uri).explain().splitlines() if "maintained indexes" in line]
    assert explained == ([] if said == "none" else [f"maintained indexes: {said}"])


def test_inspect_escapes_a_spec_value_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line break in a string spec value showed as ``\\\\n`` (escaped by ``repr`` and again by
    the table): it shows as ``\\n``, and a backslash and an n as ``\\\\n``."""
    from memwal_write import write_arrow

    pk = {"lance-schema:unenforced-primary-key": "true"}
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=pk),
            pa.field("city", pa.string(), nullable=False, metadata=pk),
        ]
    )
    uri = str(tmp_path / "t")
    lance.write_dataset(pa.table({"id": [0], "city": ["z"]}, schema=schema), uri).initialize_mem_wal(
        identity_column="city"
    )
    write_arrow(uri, pa.table({"id": [1, 2], "city": ["a\nb", "x\\ny"]}, schema=schema))
    code, out, _ = run(capsys, "inspect", uri)
    assert code == 0 and "| bucket='a\\nb' " in out and "| bucket='x\\\\ny' " in out, out


# -- verify --------------------------------------------------------------------------------


def test_verify_ok(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "verify", demo)
    assert code == 0 and out.startswith("ok: ") and "4 regions" in out
    code, out, _ = run(capsys, "verify", demo, "--json")
    assert code == 0 and json.loads(out)["ok"] is True


def test_verify_keys_of_a_clean_base(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "verify", demo, "--keys")
    rows = lance.dataset(demo).count_rows()
    assert code == 0 and out.startswith("ok: ") and f"{rows:,} base keys" in out


def test_verify_keys_finds_a_key_stored_twice_in_the_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A base written with a repeated key before initialize_mem_wal (the key is unenforced):
    readers show both copies; ``verify --keys`` names the key and its row addresses."""
    pk = {"lance-schema:unenforced-primary-key": "true"}
    schema = pa.schema([pa.field("k", pa.string(), nullable=False, metadata=pk), pa.field("v", pa.int64())])
    uri = str(tmp_path / "t")
    rows = {"k": ["a", "b", "c", "b", "d", "b", "c"], "v": list(range(7))}
    lance.write_dataset(pa.table(rows, schema=schema), uri, max_rows_per_file=4).initialize_mem_wal(unsharded=True)
    assert mq.open_table(uri).count_rows() == 7  # every copy (the merge assumes unique base keys)
    code, out, _ = run(capsys, "verify", uri)
    assert code == 0  # not checked unless asked
    code, out, _ = run(capsys, "verify", uri, "--keys")
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert code == 2 and len(problems) == 1, out
    addrs = [1, 3, (1 << 32) + 1]  # 'b' at rows 1, 3 and 5 of fragments of 4 rows
    assert "2 primary keys are stored on more than one live base row (5 rows)" in problems[0]
    assert f"k='b' on 3 rows (row addresses {', '.join(map(str, addrs))})" in problems[0]
    assert "k='c' on 2 rows" in problems[0]
    report = json.loads(run(capsys, "verify", uri, "--keys", "--json")[1])
    assert report["ok"] is False and report["checked"]["base_keys"] == 7


def _region(uri: str) -> str:
    return mq.open_table(uri).region_ids[0]


def test_verify_missing_region_manifest_version(copy: str, capsys: pytest.CaptureFixture[str]) -> None:
    rid = _region(copy)
    victim = Path(copy) / f"_mem_wal/{rid}/manifest/{bitrev64_name(2)}.binpb"
    victim.unlink()
    code, out, _ = run(capsys, "verify", copy)
    assert code == 2
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 1 and str(victim) in problems[0] and "version 2 is missing" in problems[0]
    assert out.splitlines()[-1].startswith("1 problem")


def test_verify_undecodable_region_manifest(copy: str, capsys: pytest.CaptureFixture[str]) -> None:
    rid = _region(copy)
    victim = Path(copy) / f"_mem_wal/{rid}/manifest/{bitrev64_name(3)}.binpb"
    victim.write_bytes(b"\xff\xff garbage")
    code, out, _ = run(capsys, "verify", copy)
    assert code == 2 and f"problem: {victim}: region manifest does not decode" in out


def test_verify_names_both_manifests_when_an_epoch_goes_back(copy: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A writer epoch too high in manifest v3 shows as one going back in v4: the problem named
    v4 alone (intact) and not v3 (the damaged one); it names both now."""
    from hostile import edit_region_manifest

    rid = _region(copy)
    folder = Path(copy) / f"_mem_wal/{rid}/manifest"
    edit_region_manifest(folder / f"{bitrev64_name(3)}.binpb", lambda pb: setattr(pb, "writer_epoch", 99))
    code, out, _ = run(capsys, "verify", copy)
    line = f"problem: {folder / bitrev64_name(4)}.binpb: writer epoch went back from 99 (in manifest v3, "
    assert code == 2 and [p for p in out.splitlines() if p.startswith(line) and f"{bitrev64_name(3)}.binpb" in p], out


def test_verify_wal_gap_and_damaged_entry(copy: str, capsys: pytest.CaptureFixture[str]) -> None:
    table = mq.open_table(copy)
    region = table.snapshot.regions[0]
    assert region.manifest is not None
    after = region.manifest.replay_after_wal_position
    root = Path(copy)
    # a valid entry two positions past the tail leaves a hole ...
    any_entry = next((root / f"_mem_wal/{region.region_id}/wal").iterdir())
    shutil.copy(any_entry, root / wal_entry_path(region.region_id, after + 3))
    code, out, _ = run(capsys, "verify", copy)
    assert code == 2
    assert f"problem: {root / wal_entry_path(region.region_id, after + 2)}: WAL position {after + 2} is missing" in out
    # ... and a damaged entry followed by a valid one is corruption
    (root / wal_entry_path(region.region_id, after + 2)).write_bytes(b"not arrow")
    code, out, _ = run(capsys, "verify", copy)
    assert code == 2 and f"{root / wal_entry_path(region.region_id, after + 2)}: WAL entry does not decode" in out


def test_verify_torn_last_wal_entry_is_a_warning(copy: str, capsys: pytest.CaptureFixture[str]) -> None:
    table = mq.open_table(copy)
    region = table.snapshot.regions[0]
    assert region.manifest is not None
    last = max(region.manifest.replay_after_wal_position, region.wal_tail.last_position if region.wal_tail else 0)
    (Path(copy) / wal_entry_path(region.region_id, last + 1)).write_bytes(b"torn")
    code, out, _ = run(capsys, "verify", copy)
    assert code == 0 and "warning: " in out and "torn" in out and out.splitlines()[-1].startswith("ok: ")


def test_verify_missing_unmerged_generation(copy: str, capsys: pytest.CaptureFixture[str]) -> None:
    region = mq.open_table(copy).snapshot.regions[0]
    gen = region.generations[-1]
    shutil.rmtree(gen.uri)
    code, out, _ = run(capsys, "verify", copy)
    assert code == 2 and f"problem: {gen.uri}: unmerged generation {gen.generation} is lost (directory missing" in out
    assert "the WAL can rebuild it" in out


@pytest.mark.parametrize(
    ("kind", "damage", "said"),
    [
        ("data", "remove", "it is missing"),
        ("data", "cut", "the manifest records"),
        ("deletion", "remove", "it is missing"),
        ("deletion", "cut", "it does not decode"),
        ("deletion", "garbage", "it does not decode"),
    ],
)
def test_verify_damaged_base_files(
    copy: str, capsys: pytest.CaptureFixture[str], kind: str, damage: str, said: str
) -> None:
    """Every read of the table fails on a base data or deletion file cut short or replaced:
    verify only probed that the files exist, and said ok."""
    ds = lance.dataset(copy)
    frag = next(f for f in ds.get_fragments() if f.metadata.deletion_file is not None)
    meta = frag.metadata
    rel = f"data/{meta.files[0].path}" if kind == "data" else meta.deletion_file.path(frag.fragment_id)
    path = Path(copy) / rel
    data = path.read_bytes()
    if damage == "remove":
        path.unlink()
    else:
        path.write_bytes({"cut": data[: len(data) // 2], "grow": data + data[-64:], "garbage": b"x" * 64}[damage])
    code, out, _ = run(capsys, "verify", copy)
    assert code == 2, out
    line = f"problem: {path}: base fragment {frag.fragment_id} of version {ds.version} needs this file; "
    assert [p for p in out.splitlines() if p.startswith(line) and said in p], out
    with pytest.raises(mq.MemWalError):  # and reading agrees
        mq.open_table(copy).to_arrow()


@pytest.mark.parametrize("version", ["legacy", "2.0", "2.1", "2.2"])
def test_verify_reads_the_footer_of_every_lance_file_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    """Each Lance file format's footer (a 2.0 file's says 0.3): healthy files are ok."""
    uri = str(tmp_path / "t")
    pk = {"lance-schema:unenforced-primary-key": "true"}
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=pk), pa.field("s", pa.string())])
    data = pa.table({"id": list(range(500)), "s": [f"v{i}" for i in range(500)]}, schema=schema)
    ds = lance.write_dataset(data, uri, data_storage_version=version, max_rows_per_file=200)
    ds.delete("id < 10")
    lance.dataset(uri).initialize_mem_wal(unsharded=True)
    code, out, _ = run(capsys, "verify", uri)
    assert code == 0 and out.startswith("ok: "), out


def test_verify_of_data_files_under_another_base_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Data files written to another base path (``target_bases``; a shallow clone's) were
    looked for under the table's root: "missing", exit 2, while the table read fine."""
    from lance import DatasetBasePath

    uri = str(tmp_path / "t")
    pk = {"lance-schema:unenforced-primary-key": "true"}
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=pk)])
    other = DatasetBasePath(str(tmp_path / "other"), name="b2", is_dataset_root=False)
    data = pa.table({"id": list(range(10))}, schema=schema)
    lance.write_dataset(data, uri, initial_bases=[other], target_bases=["b2"]).initialize_mem_wal(unsharded=True)
    code, out, _ = run(capsys, "verify", uri)
    assert code == 0 and out.startswith("ok: "), out
    assert mq.open_table(uri).count_rows() == 10


def test_verify_warns_of_a_base_data_file_grown(copy: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Lance reads the bytes of a data file the manifest records: bytes added after them
    change no read (a warning, not a problem)."""
    want = mq.open_table(copy).to_arrow()
    rel = f"data/{lance.dataset(copy).get_fragments()[0].metadata.files[0].path}"
    with open(Path(copy) / rel, "ab") as f:
        f.write(b"x" * 64)
    code, out, _ = run(capsys, "verify", copy)
    assert code == 0 and f"warning: {Path(copy) / rel}: base fragment 0 " in out and "longer than the manifest" in out
    assert mq.open_table(copy).to_arrow().equals(want)


def test_verify_not_a_table_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "verify", str(tmp_path))
    assert code == 1 and out == "" and err.startswith("memwal: error: ")


def test_progress_only_on_a_terminal() -> None:
    plain, tty = io.StringIO(), Terminal()
    for stream in (plain, tty):
        bar = ProgressBar("verifying", stream)
        for i in range(1, 5):
            bar(i, 4, "region")
        bar.stop()
    assert plain.getvalue() == ""
    assert "4/4" in tty.getvalue()


ODD_VALUES = (
    "SELECT id, X'00ff' AS b, CAST('NaN' AS DOUBLE) AS nan, make_array(CAST('-Infinity' AS DOUBLE), 1.5) AS l, "
    "arrow_cast(3000000, 'Date32') AS d, 'a' || chr(10) || 'b' AS nl, 'a\\nb' AS slash, NULL AS z "
    "FROM t WHERE id < 3 ORDER BY id"
)


def test_sql_outputs_of_values_text_formats_lack(demo: str, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """Binary that is not UTF-8 (CSV crashed), NaN and infinities (JSON wrote null, or bare
    NaN inside lists: not JSON), dates after year 9999 (pretty and JSON crashed: Python has
    no such date), line breaks vs a backslash and an n (pretty showed them alike)."""
    assert main(["sql", demo, ODD_VALUES, "--format", "csv"]) == 0
    rows = pacsv.read_csv(io.BytesIO(capsysbinary.readouterr().out)).to_pylist()
    assert [base64.b64decode(r["b"]) for r in rows] == [b"\x00\xff"] * 3
    assert str(rows[0]["d"]) == "10183-09-21" and rows[0]["nl"] == "a\nb"

    def no_constant(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    assert main(["sql", demo, ODD_VALUES, "-f", "json"]) == 0
    rows = json.loads(capsysbinary.readouterr().out, parse_constant=no_constant)
    assert [(r["nan"], r["l"], r["d"], r["z"]) for r in rows] == [("NaN", ["-Infinity", 1.5], "10183-09-21", None)] * 3
    assert base64.b64decode(rows[0]["b"]) == b"\x00\xff"

    assert main(["sql", demo, ODD_VALUES]) == 0
    out = capsysbinary.readouterr().out.decode()
    assert "| 10183-09-21 |" in out and "| a\\nb |" in out and "| a\\\\nb |" in out and "| NULL |" in out


def test_sql_outputs_durations_times_and_names_exactly(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """JSON wrote durations as rounded seconds (1 ns as 0.0) or, beside one too long for
    Python, as unit-less counts; every text format cut nanosecond times of day to
    microseconds; JSON dropped columns whose names repeat; CSV wrote dictionary-encoded
    binary raw (a traceback when not UTF-8); a line break in a column name broke the table."""
    uri = str(tmp_path / "t")
    pk = {"lance-schema:unenforced-primary-key": "true"}
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=pk),
            pa.field("d", pa.duration("ns")),
            pa.field("t", pa.time64("ns")),
            pa.field("s", pa.struct([("d", pa.duration("ms"))])),
            pa.field("b", pa.dictionary(pa.int32(), pa.binary())),
        ]
    )
    data = pa.table(
        {
            "id": [1, 2],
            "d": pa.array([1, -1_234_567_890_123_456_789], pa.duration("ns")),
            "t": pa.array([1, 86_399_999_999_999], pa.time64("ns")),
            "s": pa.array([{"d": 1}, {"d": 2**62}], schema.field("s").type),
            "b": pa.array([b"\xff\x00", b"ok"]).dictionary_encode(),
        },
        schema=schema,
    )
    lance.write_dataset(data, uri).initialize_mem_wal(unsharded=True)
    want = [
        ("PT0.000000001S", "00:00:00.000000001", "PT0.001S", b"\xff\x00"),
        ("-PT1234567890.123456789S", "23:59:59.999999999", f"PT{2**62 // 1000}.{2**62 % 1000:03d}S", b"ok"),
    ]
    query = "SELECT * FROM t ORDER BY id"
    assert main(["sql", uri, query, "-f", "json"]) == 0
    rows = json.loads(capsysbinary.readouterr().out)
    assert [(r["d"], r["t"], r["s"]["d"], base64.b64decode(r["b"])) for r in rows] == want
    assert main(["sql", uri, query, "-f", "csv"]) == 0
    rows = pacsv.read_csv(io.BytesIO(capsysbinary.readouterr().out)).to_pylist()
    assert [(r["d"], r["t"], json.loads(r["s"])["d"], base64.b64decode(r["b"])) for r in rows] == want
    assert main(["sql", uri, 'SELECT d AS "a\nb", t FROM t ORDER BY id']) == 0
    out = capsysbinary.readouterr().out.decode()
    assert "| a\\nb " in out and "23:59:59.999999999" in out and "-PT1234567890.123456789S" in out
    assert main(["sql", uri, "SELECT a.id, b.id FROM t a JOIN t b ON a.id = b.id", "-f", "json"]) == 1
    err = capsysbinary.readouterr().err.decode()
    assert err.startswith("memwal: error: column name(s) ['id'] repeat") and err.count("\n") == 1


def test_exact_text_of_sliced_nested_values() -> None:
    """A slice of a fixed-size list of durations came out with every row of the array behind
    it (rows of other rows shown, or a ValueError from the JSON and CSV writers)."""
    from memwal_query.display import format_text_table, python_values

    t = pa.table(
        {
            "id": [0, 1, 2],
            "c": pa.array([[0, 1], [2, 3], [4, 5]], pa.list_(pa.duration("s"), 2)),
            "m": pa.array([[("k", 1)], [("k", 2)], [("k", 3)]], pa.map_(pa.string(), pa.time64("ns"))),
            "s": pa.array([{"d": 1}, {"d": 2}, {"d": 3}], pa.struct([("d", pa.duration("ns"))])),
        }
    )
    for part in (t.slice(0, 1), t.slice(1, 1), t.slice(2)):
        first = part.column("id")[0].as_py()
        assert python_values(part.column("c"), "c") == [[f"PT{2 * first}S", f"PT{2 * first + 1}S"]]
        assert python_values(part.column("m"), "m") == [[("k", f"00:00:00.00000000{first + 1}")]]
        assert python_values(part.column("s"), "s") == [{"d": f"PT0.00000000{first + 1}S"}]
        assert format_text_table(part).count("\n") == 5


def test_import_and_help_load_no_engine() -> None:
    """``import memwal_query`` and ``memwal --help`` took ~1 s loading Lance, DataFusion and
    pandas; they load on first use now (and Lance's known log noise is still set aside first)."""
    script = (
        "import os, sys, memwal_query as mq\n"
        "print(sorted(m for m in ('lance', 'datafusion', 'pandas') if m in sys.modules))\n"
        "print(os.environ.get('LANCE_LOG'))\n"
        "assert {'open_table', 'Table', 'register_catalog', 'MemWalError', 'catchup'} <= set(dir(mq))\n"
        "mq.open_table\n"
        "print(sorted(m for m in ('lance', 'datafusion') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env={})
    lines = out.stdout.splitlines()
    assert lines[0] == "[]", out.stdout
    assert lines[1].startswith("error,"), out.stdout  # set before lance loads
    assert lines[2] == "['datafusion', 'lance']", out.stdout
    helped = subprocess.run(
        [sys.executable, "-c", "import sys; from memwal_query.cli import main; main(['--help'])"],
        capture_output=True,
        text=True,
    )
    assert helped.returncode == 0 and "usage: memwal" in helped.stdout, helped
    assert "Traceback" not in helped.stderr
