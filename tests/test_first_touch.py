"""What a new user meets first: one-line errors from SQL functions and writes, a quiet demo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datafusion
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
import memwal_write as mw
from memwal_query.change_token import ChangeToken
from memwal_query.cli import main
from memwal_query.demo import DIM, write_demo_table
from memwal_query.errors import InvalidArgumentError, MemWalError, TableNotFoundError
from memwal_query.lance_log import NOISE
from memwal_query.sql_functions import FUNCTION_NAMES

VEC = str([0.5] * DIM)
# A change token of a table with other columns (see memwal_query.change_token).
OTHER_TOKEN = ChangeToken("0" * 16, "", 1, "strong", ()).encode()
# SQL function -> (bad call, our message, our exception type), at least one per function.
BAD_CALLS: dict[str, list[tuple[str, str, type[MemWalError]]]] = {
    "memwal_knn": [
        (
            f"memwal_knn('t', 'no_such_column', {VEC}, 3)",
            "unknown vector column 'no_such_column'",
            InvalidArgumentError,
        ),
        (f"memwal_knn('t', 'amount', {VEC}, 3)", "column 'amount' of ", InvalidArgumentError),
        (f"memwal_knn('nope', 'vec', {VEC}, 3)", "no memwal table named 'nope'", InvalidArgumentError),
        (f"memwal_knn('t', 'vec', {VEC}, 'x')", "memwal_knn: k must be an integer, got 'x'", InvalidArgumentError),
        ("memwal_knn('t', 'vec', [0.5, 0.5], 3)", "2", InvalidArgumentError),  # wrong dimension
        ("memwal_knn('t')", "takes 4 to 7 arguments, got 1", InvalidArgumentError),
        (f"memwal_knn('t', 'vec', {VEC}, 3, 'no_col = 1')", "no_col", InvalidArgumentError),
    ],
    "memwal_lookup": [
        ("memwal_lookup('t')", "takes 2 arguments, got 1", InvalidArgumentError),
        ("memwal_lookup('t', ['a', 'b'])", "do not fit the key column 'id'", InvalidArgumentError),
        ("memwal_lookup('t', [1.5])", "was truncated", InvalidArgumentError),
        ("memwal_lookup('t', [CAST(1.5 AS DECIMAL(3, 1))])", "do not fit the key column 'id'", InvalidArgumentError),
        ("memwal_lookup('t', id)", "memwal_lookup: the keys must be a literal", InvalidArgumentError),
    ],
    "memwal_regions": [
        ("memwal_regions()", "memwal_regions(table) takes 1 argument, got 0", InvalidArgumentError),
        ("memwal_regions('nope')", "memwal_regions: no memwal table named 'nope'", InvalidArgumentError),
    ],
    "memwal_generations": [
        ("memwal_generations('t', 2)", "memwal_generations(table) takes 1 argument, got 2", InvalidArgumentError),
        ("memwal_generations(id)", "memwal_generations: the table name must be a literal", InvalidArgumentError),
    ],
    "memwal_wal": [("memwal_wal('nope')", "memwal_wal: no memwal table named 'nope'", InvalidArgumentError)],
    "memwal_history": [("memwal_history()", "memwal_history(table) takes 1 argument, got 0", InvalidArgumentError)],
    "memwal_changes": [
        ("memwal_changes('t')", "memwal_changes(table, change_token) takes 2 arguments, got 1", InvalidArgumentError),
        ("memwal_changes('t', 'abc')", "'abc' is not a memwal change token", InvalidArgumentError),
        ("memwal_changes('t', 42)", "the change token must be a string", InvalidArgumentError),
        ("memwal_changes('t', 'mwc1.AAAA')", "is not a valid memwal change token", InvalidArgumentError),
        (f"memwal_changes('t', '{OTHER_TOKEN}')", "belongs to another table", InvalidArgumentError),
    ],
    "memwal_fts": [
        ("memwal_fts('t', 'note', 'refund')", "takes 4 or 5 arguments, got 3", InvalidArgumentError),
        ("memwal_fts('nope', 'note', 'refund', 3)", "no memwal table named 'nope'", InvalidArgumentError),
        ("memwal_fts('t', 'category', 'books', 3)", "column 'category' of ", InvalidArgumentError),  # no index
        ("memwal_fts('t', 'amount', 'x', 3)", "not a string column", InvalidArgumentError),
        ("memwal_fts('t', 'nope', 'x', 3)", "unknown text column 'nope'", InvalidArgumentError),
        ("memwal_fts('t', 'note', 'x', 'y')", "memwal_fts: k must be an integer, got 'y'", InvalidArgumentError),
        ("memwal_fts('t', 'note', 7, 3)", "memwal_fts: the query must be a string, got 7", InvalidArgumentError),
        ("memwal_fts('t', 'note', 'refund', 3, 'no_col = 1')", "no_col", InvalidArgumentError),
    ],
    "memwal_hybrid": [
        (f"memwal_hybrid('t', 'vec', {VEC}, 'note')", "takes 6 or 7 arguments, got 4", InvalidArgumentError),
        (f"memwal_hybrid('t', 'vec', {VEC}, 'category', 'x', 3)", "has no INVERTED index", InvalidArgumentError),
        ("memwal_hybrid('t', 'vec', [0.5, 0.5], 'note', 'x', 3)", "dimension 2", InvalidArgumentError),
        (f"memwal_hybrid('t', 'vec', {VEC}, 'note', 'x', 0)", "k must be a positive integer", InvalidArgumentError),
    ],
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_demo_table(
        str(tmp_path_factory.mktemp("first") / "events"), base_rows=800, update_rows=100, memtable_rows=60, seed=9
    )


def test_every_sql_function_has_bad_calls() -> None:
    assert set(BAD_CALLS) == set(FUNCTION_NAMES)


CASES = [(name, *case) for name, cases in BAD_CALLS.items() for case in cases]


@pytest.mark.parametrize(("name", "call", "message", "kind"), CASES, ids=[c[1][:40] for c in CASES])
def test_sql_function_error_is_ours_in_python_and_one_line_in_the_cli(
    demo: str, capsys: pytest.CaptureFixture[str], name: str, call: str, message: str, kind: type[MemWalError]
) -> None:
    query = f"SELECT * FROM {call}"
    with pytest.raises(kind) as err:
        mq.open_table(demo).sql(query).collect()
    assert message in str(err.value) and "PyErr" not in str(err.value) and "Traceback" not in str(err.value)
    assert main(["sql", demo, query]) == 1
    out, stderr = capsys.readouterr()
    assert out == "" and stderr.count("\n") == 1, stderr
    assert stderr.startswith("memwal: error: ") and message in stderr and "PyErr" not in stderr
    # In the user's own SessionContext DataFusion shows our error inside its own text, with
    # the traceback it was raised with: one frame, not the path through our modules.
    ctx = datafusion.SessionContext()
    mq.open_table(demo).register(ctx, "t")
    with pytest.raises(Exception) as theirs:
        ctx.sql(query).collect()
    assert message in str(theirs.value) and str(theirs.value).count("File ") <= 1, theirs.value


def test_sql_functions_still_answer(demo: str) -> None:
    t = mq.open_table(demo)
    live = t.to_arrow(columns=["id"]).column("id").to_pylist()
    got = t.sql(f"SELECT id FROM memwal_lookup('t', [{live[0]}, {live[1]}])").to_arrow_table()
    assert sorted(got.column("id").to_pylist()) == sorted(live[:2])
    assert t.sql(f"SELECT id FROM memwal_knn('t', 'vec', {VEC}, 3)").to_arrow_table().num_rows == 3
    fts = t.sql("SELECT id, _score FROM memwal_fts('t', 'note', 'refund', 4) ORDER BY _score DESC, id").to_pylist()
    assert fts == sorted(
        t.search_text("note", "refund", 4, columns=["id"]).to_pylist(), key=lambda r: (-r["_score"], r["id"])
    )
    hybrid = t.sql(f"SELECT id FROM memwal_hybrid('t', 'vec', {VEC}, 'note', 'refund', 5, 'amount > 10')")
    assert hybrid.to_arrow_table().num_rows == 5


def test_sql_error_without_a_function_is_one_line(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", demo, "SELECT nope FROM t"]) == 1
    _, stderr = capsys.readouterr()
    assert stderr.count("\n") == 1 and stderr.startswith("memwal: error: query failed: ") and "nope" in stderr
    with pytest.raises(MemWalError, match="nope"):
        mq.open_table(demo).sql("SELECT nope FROM t")


def test_predicate_datafusion_cannot_push_down_is_one_line(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    """datafusion-python 55 cannot hand ``a < 0 AND (a = 0 AND a = 1)`` to any pyarrow-dataset scan."""
    query = "SELECT id FROM t WHERE id < 0 AND (id = 0 AND id = 1)"
    with pytest.raises(MemWalError) as raw:  # raised when the DataFrame runs
        mq.open_table(demo).sql(query).collect()
    ours = str(raw.value)
    assert "datafusion-python limitation" in ours and "PyErr" not in ours and "\n" not in ours
    assert main(["sql", demo, query]) == 1
    _, stderr = capsys.readouterr()
    assert stderr.count("\n") == 1 and "datafusion-python limitation" in stderr
    # the contradiction alone is ours to answer (no rows), not an error
    assert mq.open_table(demo).sql("SELECT id FROM t WHERE id = 0 AND id = 1").to_arrow_table().num_rows == 0


def test_errors_while_a_sql_dataframe_runs_are_memwal_errors(demo: str) -> None:
    """Table.sql returns a DataFrame that runs later: what fails then is a one-line MemWalError,
    from the DataFrame and from every DataFrame derived from it."""
    table = mq.open_table(demo)
    df = table.sql("SELECT id, 1 / (id - id) AS boom FROM t")
    for run in (df.collect, df.to_arrow_table, df.to_pandas, df.limit(3).to_pydict):
        with pytest.raises(MemWalError, match="query failed: .*Divide by zero") as info:
            run()
        assert "\n" not in str(info.value)
    ok = table.sql("SELECT id FROM t").filter(datafusion.col("id") < 5).sort(datafusion.col("id"))
    assert ok.to_pydict()["id"] == sorted(i for i in table.to_arrow().column("id").to_pylist() if i < 5)
    with pytest.raises(MemWalError, match="nope"):
        ok.select("nope")


WRITES: dict[str, Callable[[str], Any]] = {
    "write_arrow": lambda uri: mw.write_arrow(uri, pa.table({"id": [1]})),
    "write_arrow deletes": lambda uri: mw.write_arrow(uri, None, deletes=pa.table({"id": [1]})),
    "RoutedWriter.open": lambda uri: mw.RoutedWriter.open(uri),
    "merge_generations": lambda uri: mw.merge_generations(uri),
}


@pytest.mark.parametrize("entry", sorted(WRITES))
@pytest.mark.parametrize("relative", [False, True])
def test_write_to_a_missing_table_names_the_path_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str, relative: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    uri = "no/such/table" if relative else str(tmp_path / "no" / "such")
    with pytest.raises(TableNotFoundError) as err:
        WRITES[entry](uri)
    msg = str(err.value)
    assert f"no Lance table at {uri}" in msg and "\n" not in msg
    assert not re.search(r"\.rs:\d+", msg)
    if relative:
        assert str(tmp_path / "no" / "such" / "table") in msg  # and where that is


def test_write_to_a_directory_without_a_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match=f"no Lance table at {re.escape(str(tmp_path))} for writing"):
        mw.write_arrow(str(tmp_path), pa.table({"id": [1]}))


def test_demo_is_quiet_and_says_what_to_try_next(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}
    proc = subprocess.run(
        [sys.executable, "-m", "memwal_query.demo", str(tmp_path), "--base-rows", "3000"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no dependency log lines, no warnings
    assert NOISE not in proc.stdout and "lance::" not in proc.stdout
    uri = str(tmp_path / "events")
    assert f"writing {uri}" in proc.stdout and "Next, try:" in proc.stdout
    assert f"memwal sql {uri}" in proc.stdout and "notebooks" in proc.stdout
    # what the demo printed is what the table holds
    n = mq.open_table(uri).count_rows()
    assert re.search(rf"\|\s+{n}\s+\|", proc.stdout)
    # the table keeps a WAL tail for the README's examples (its writer stopped without flushing)
    tail = mq.open_table(uri).sql("SELECT sum(rows) AS n FROM memwal_wal('t')").to_pylist()[0]["n"]
    assert tail and mq.open_table(uri, consistency="eventual").count_rows() == n


def test_lance_noise_filter_keeps_other_lance_errors(tmp_path: Path) -> None:
    """With a filter for another message, the same run prints pylance's line: the filter hides only NOISE."""
    from memwal_query.lance_log import everything_but

    where = str(tmp_path / "t")
    script = (
        "from memwal_query.demo import write_demo_table; "
        f"write_demo_table({where!r}, base_rows=300, update_rows=60, memtable_rows=40)"
    )
    env = {**os.environ, "LANCE_LOG": f"error,lance=error/{everything_but('another message')}"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and NOISE in proc.stderr
    env.pop("LANCE_LOG")
    proc = subprocess.run(
        [sys.executable, "-c", script.replace("'t'", "'u'").replace("/t'", "/u'")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0 and NOISE not in proc.stderr


def test_a_fenced_writer_prints_no_lance_lines(tmp_path: Path) -> None:
    """pylance logged one ERROR line per region when a writer was fenced, then raised the same
    failure from ``close()``: a Spark sink writing a fenced batch again printed them on every retry."""
    script = f"""
import memwal_query as mq, lance, pyarrow as pa
from memwal_write import RoutedWriter
pk = {{"lance-schema:unenforced-primary-key": "true"}}
schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=pk), pa.field("v", pa.int64())])
lance.write_dataset(schema.empty_table(), {str(tmp_path / "t")!r}).initialize_mem_wal(bucket_column="id", num_buckets=3)
rows = pa.table({{"id": pa.array(range(30), pa.int64()), "v": pa.array(range(30), pa.int64())}})
fenced = RoutedWriter.open({str(tmp_path / "t")!r})
fenced.put(rows)
with RoutedWriter.open({str(tmp_path / "t")!r}) as newer:
    newer.put(rows)
try:
    fenced.close()
except mq.MemWalError as err:
    print("fenced" if "Writer fenced" in str(err) else err)
"""
    env = {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout == "fenced\n", proc.stdout + proc.stderr
    assert proc.stderr == ""


def test_file_uris_are_percent_decoded_as_pylance_reads_them(tmp_path: Path) -> None:
    """pylance writes ``file:///.../my%20table`` into the folder ``my table``; memwal looked
    for a folder literally named ``my%20table``."""
    from urllib.parse import quote

    import lance

    from memwal_write import write_arrow

    from lsm_model import PK

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    uri = "file://" + quote(str(tmp_path / "my table#1"))
    lance.write_dataset(pa.table({"id": [1, 2], "v": [0, 0]}, schema=schema), uri).initialize_mem_wal(unsharded=True)
    assert [p.name for p in tmp_path.iterdir()] == ["my table#1"]
    write_arrow(uri, pa.table({"id": [3], "v": [1]}))
    assert sorted(mq.open_table(uri).to_arrow().column("id").to_pylist()) == [1, 2, 3]


def test_a_path_pyarrow_refuses_is_a_memwal_error(tmp_path: Path) -> None:
    """A NUL in a path made pyarrow raise ArrowInvalid (no MemWalError; a CLI traceback)."""
    with pytest.raises(mq.MemWalError, match="NUL"):
        mq.open_table(str(tmp_path / "x\x00y"))


def test_open_of_a_missing_table_names_the_location_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~/x`` or ``file:x`` resolve to another path: the error named only that one."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for given, resolved in (("~/gone", tmp_path / "gone"), ("file:gone", tmp_path / "gone")):
        with pytest.raises(TableNotFoundError) as err:
            mq.open_table(given)
        assert f"no Lance table at {resolved}" in str(err.value) and f"given as {given!r}" in str(err.value)
    with pytest.raises(TableNotFoundError) as err:
        mq.open_table(str(tmp_path / "gone"))
    assert "given as" not in str(err.value)  # the same path: named once


def test_a_version_that_is_not_a_version_number(demo: str) -> None:
    """``version=-1`` raised pylance's OverflowError, ``"2"`` (Lance: a tag name) said the table
    "has no version 2 (latest: ...)" and ``True`` opened version 1."""
    for bad in (-1, 0, "2", True, 2.0):
        with pytest.raises(mq.InvalidArgumentError, match=f"{demo}: version must be a base version number"):
            mq.open_table(demo, version=bad)  # type: ignore[arg-type]
    newest = mq.open_table(demo).version
    assert mq.open_table(demo, version=np.int64(newest)).version == newest


def test_columns_given_as_one_string(demo: str) -> None:
    """``columns="amount"`` was read character by character ("unknown column(s) ['a', 'm', ...]")."""
    t = mq.open_table(demo)
    dim = t.snapshot.schema.field("vec").type.list_size
    calls = {
        "lookup": lambda: t.lookup([1], columns="amount"),
        "to_reader": lambda: t.to_reader(columns="amount"),
        "to_arrow": lambda: t.to_arrow(columns="amount"),
        "nearest": lambda: t.nearest("vec", np.zeros(dim, np.float32), columns="amount"),
        "search_text": lambda: t.search_text("note", "fast", columns="amount"),
    }
    for call in calls.values():
        with pytest.raises(
            mq.InvalidArgumentError, match=re.escape(f"columns of {demo}: a list of names, not the string")
        ):
            call()
    assert t.lookup([1], columns=["amount"]).column_names == ["amount"]


def test_one_key_given_as_a_dict_of_its_parts(demo: str) -> None:
    """``lookup({"id": 42})`` raised pyarrow's TypeError ('int' object is not iterable)."""
    t = mq.open_table(demo)
    assert t.lookup({"id": 42}).equals(t.lookup([42])) and t.lookup([42]).num_rows == 1
    with pytest.raises(mq.InvalidArgumentError, match="lookup keys as a dict"):
        t.lookup({"id": [1], "x": [1, 2]})


def test_a_file_given_as_the_table(tmp_path: Path) -> None:
    """A Parquet file given as the table: a StorageError about ``.../file.parquet/_versions/...``
    being "Not a directory"; there is no table there, as for any other path."""
    import pyarrow.parquet as pq

    path = str(tmp_path / "events.parquet")
    pq.write_table(pa.table({"id": [1]}), path)
    with pytest.raises(mq.TableNotFoundError, match=f"no Lance table at {path} \\(no _versions directory\\)"):
        mq.open_table(path)
    with pytest.raises(mq.TableNotFoundError, match=f"no Lance table at {path} for writing"):
        mw.write_arrow(path, pa.table({"id": [2]}))


def test_the_lance_log_filter_hides_exactly_the_messages_and_prefixes_given() -> None:
    """The filter's regex (no look-ahead: Rust's regex has none) against the rule it encodes,
    on random texts over an alphabet of the characters that matter (shared prefixes, regex
    metacharacters)."""
    import random

    from memwal_query.lance_log import everything_but

    rng = random.Random(7)
    alphabet = "ab(-'"

    def text(most: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))

    for _ in range(1500):
        messages = [text(4) or "a" for _ in range(rng.randint(0, 3))]
        prefixes = [text(4) or "b" for _ in range(rng.randint(0, 2))]
        if not messages and not prefixes:
            continue
        pattern = re.compile(everything_but(*messages, prefixes=prefixes))
        for t in [*messages, *prefixes, *(text(6) for _ in range(20))]:
            hidden = t in messages or any(t.startswith(p) for p in prefixes)
            assert bool(pattern.search(t)) != hidden, (messages, prefixes, t)
