"""What a terminal or a notebook shows of a table that holds anything: names and values that
are escape sequences, line breaks, direction overrides or HTML; and the ``memwal`` process
when its output goes nowhere (closed, a full disk) or it is interrupted while exiting."""

from __future__ import annotations

import html.parser
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.cli import main
from memwal_query.terminal_text import shown, width

REPO = Path(__file__).resolve().parents[1]
PK = {"lance-schema:unenforced-primary-key": "true"}
HOSTILE = [
    "\x1b[2J",  # clears the screen
    "a\nFAKE ROW",  # a line break
    "\x9b31m",  # the 8-bit CSI
    "nel\x85x",  # next line (C1)
    "ls\u2028x",  # line separator
    "\u202egnp.exe",  # right-to-left override: shows as exe.png
    "\u2067isolate",  # a direction isolate
]
#: Characters text is written with: shown as they are.
KEPT = [
    "می\u200cخواهم",
    "👨\u200d👩\u200d👧",
    "10\xa0000",
    "soft\xadhyphen",
    "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A table whose key column's name and values hold control and direction characters and HTML."""
    uri = str(tmp_path_factory.mktemp("hostile") / "t")
    key = "k\x1b[2J\nFAKE"
    schema = pa.schema(
        [
            pa.field(key, pa.int64(), nullable=False, metadata=PK),
            pa.field("v", pa.string()),
            pa.field("<img src=x onerror=alert(2)>", pa.string()),
            pa.field("日本", pa.string()),
        ]
    )
    n = len(HOSTILE)
    rows = {
        key: list(range(n)),
        "v": HOSTILE,
        "<img src=x onerror=alert(2)>": ["<script>alert(1)</script>", "&amp;", *["x"] * (n - 2)],
        "日本": ["語", "ab", *["日本語"] * (n - 2)],
    }
    lance.write_dataset(pa.table(rows, schema=schema), uri).initialize_mem_wal(unsharded=True)
    return uri


def _no_raw_controls(text: str) -> None:
    acting = {"Cc", "Zl", "Zp", "Cs"}
    raw = [c for c in text if c != "\n" and (unicodedata.category(c) in acting or c in "\u202e\u2067")]
    assert not raw, f"raw characters on the terminal: {raw!r}"


def test_shown_escapes_what_is_not_printable() -> None:
    for value in HOSTILE:
        out = shown(value)
        assert out.isprintable() and out.encode().decode("unicode_escape") == value, (value, out)
    assert all(shown(text) == text for text in KEPT), [shown(text) for text in KEPT]
    assert shown("a\\nb") == "a\\\\nb" and shown("a\\nb", backslash=False) == "a\\nb"
    assert width("日本") == 4 and width("e\u0301") == 1


def test_pretty_output_escapes_and_aligns(hostile: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sql", hostile, "SELECT * FROM t ORDER BY 1"])
    out, _ = capsys.readouterr()
    assert code == 0
    _no_raw_controls(out)
    lines = out.splitlines()
    assert len(lines) == 4 + len(HOSTILE) + 1  # rules, header, one line a row, the count
    table = [line for line in lines if line.startswith(("+", "|"))]
    assert len({width(line) for line in table}) == 1, "columns do not line up (double-width characters)"
    assert "\\u202egnp.exe" in out and "\\x9b31m" in out and "k\\x1b[2J\\nFAKE" in out


def test_inspect_and_verify_escape_names(hostile: str, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["inspect", hostile], ["verify", hostile]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0 and err == "", argv
        _no_raw_controls(out)
    main(["inspect", hostile])
    out, _ = capsys.readouterr()
    assert "primary key: k\\x1b[2J\\nFAKE" in out
    table = mq.open_table(hostile)
    for text in (str(table.explain()), str(table.explain("v = 'x'")), repr(table)):
        _no_raw_controls(text)


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_query_results_in_a_notebook_are_escaped(hostile: str) -> None:
    """A ``Table.sql`` result rendered as DataFusion renders it put names and values into the
    page as they were: a ``<script>`` value ran, an ``<img onerror>`` column name too."""
    df = mq.open_table(hostile).sql("SELECT * FROM t ORDER BY 1")
    page = _Tags()
    page.feed(df._repr_html_())
    assert "img" not in page.tags and page.tags.count("script") == 2  # DataFusion's own two
    text = "".join(page.text)
    assert "<script>alert(1)</script>" in text and "&amp;" in text and "<img src=x onerror=alert(2)>" in text
    shown_text = repr(df)
    _no_raw_controls(shown_text)
    assert "k\\x1b[2J\\nFAKE" in shown_text and f"{len(HOSTILE)} rows" in shown_text
    many = mq.open_table(hostile).sql("SELECT * FROM t CROSS JOIN t AS u")  # more rows than shown
    assert "more rows not shown" in repr(many) and "Data truncated" in many._repr_html_()


def test_show_prints_the_escaped_text_table(hostile: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``Table.sql(...).show()`` (the README's examples) printed DataFusion's stray
    ``DataFrame()`` line, then the values as they are (``\x1b[2J`` cleared the terminal)."""
    df = mq.open_table(hostile).sql("SELECT * FROM t ORDER BY 1")
    df.show()
    out = capsys.readouterr().out
    _no_raw_controls(out)
    assert out == repr(df) + "\n" and "DataFrame()" not in out
    df.show(1)
    assert capsys.readouterr().out.rstrip().endswith("1 row; more rows not shown")


def _memwal(argv: list[str], stdout: object, closed: bool = False) -> subprocess.CompletedProcess[str]:
    """``memwal ARGV`` in a process of its own (with its standard output closed: ``>&-``)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-c", "from memwal_query.cli import run; run()", *argv]
    if closed:
        cmd = ["sh", "-c", 'exec "$0" "$@" >&-', *cmd]
    return subprocess.run(cmd, text=True, stdout=stdout, stderr=subprocess.PIPE, env=env, cwd=REPO, check=False)


@pytest.mark.parametrize("format", ["pretty", "csv", "arrow"])
def test_results_to_a_full_disk_or_a_closed_stdout(hostile: str, tmp_path: Path, format: str) -> None:
    """``> /dev/full``, ``-o /dev/full`` and ``>&-`` printed tracebacks: one line, exit 1."""
    query = ["sql", hostile, "SELECT * FROM t", "-f", format]
    with open(os.devnull, "w") as null, open("/dev/full", "w") as full:
        runs = {
            "full stdout": _memwal(query, stdout=full),
            "full file": _memwal([*query, "-o", "/dev/full"], stdout=null),
            "closed stdout": _memwal(query, stdout=null, closed=True),
        }
    import stat

    # -o writes a regular file beside it and renames it; a device is written as it is (renamed
    # onto, /dev/full became a regular file)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    for what, proc in runs.items():
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, (what, proc.stderr)
        assert proc.stderr.startswith("memwal: error: "), (what, proc.stderr)
    assert "No space left on device" in runs["full file"].stderr
    assert "standard output is closed" in runs["closed stdout"].stderr
    with open(os.devnull, "w") as null:
        written = _memwal([*query, "-o", str(tmp_path / "out")], stdout=null, closed=True)
    assert written.returncode == 0 and (tmp_path / "out").stat().st_size > 0  # -o needs no stdout


def test_ctrl_c_while_exiting_ends_quietly(hostile: str) -> None:
    """A Ctrl-C while the exit waits for DataFusion's scans (``ScanGate.close`` at exit) printed
    a KeyboardInterrupt traceback ("Exception ignored in atexit callback") after the results."""
    code = (
        "import atexit, os, signal, sys, time\n"
        "from memwal_query.cli import run\n"
        "import memwal_query.scan_gate\n"  # its exit hook registered first: runs after this one
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(2)))\n"
        "run()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code, "sql", hostile, "SELECT count(*) AS n FROM t"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 130 and proc.stderr == "", proc.stderr
    assert f"| {len(HOSTILE)} |" in proc.stdout


def test_notebook_view_keeps_datafusions_formatter(tmp_path: Path) -> None:
    """The escaped notebook view went through text made beforehand: DataFusion's type
    formatters were not applied and a short value with markup was cut inside an entity."""
    from datafusion.dataframe_formatter import get_formatter, reset_formatter

    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])
    value = 'it\'s "quoted" & <ok>'  # 20 characters: under max_cell_length (25), shown whole
    lance.write_dataset(pa.table({"id": [1234567], "v": [value]}, schema=schema), uri).initialize_mem_wal(
        unsharded=True
    )
    table = mq.open_table(uri)
    try:
        get_formatter().register_formatter(int, lambda v: f"{v:,}")
        for query in ("SELECT id, v FROM t", "SELECT id FROM t"):  # with markup, and without
            page = table.sql(query)._repr_html_()
            assert "1,234,567" in page, query
        page = _Tags()
        page.feed(table.sql("SELECT v FROM t")._repr_html_())
        assert value in "".join(page.text) and "button" not in page.tags
    finally:
        reset_formatter()


def test_a_long_value_with_markup_is_previewed_from_its_text(tmp_path: Path) -> None:
    """A value longer than ``max_cell_length`` is previewed cut: cut from the escaped text, the
    preview showed entities half-written (``&am``) and fewer characters than asked."""
    from datafusion.dataframe_formatter import get_formatter

    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])
    value = "&&&&&&&&&&&&&&&&&&&&&&&&<b>long</b> and more"  # over max_cell_length (25)
    lance.write_dataset(pa.table({"id": [1], "v": [value]}, schema=schema), uri).initialize_mem_wal(unsharded=True)
    page = _Tags()
    page.feed(mq.open_table(uri).sql("SELECT v FROM t")._repr_html_())
    limit = get_formatter().max_cell_length
    assert "button" in page.tags and "b" not in page.tags
    assert value[:limit] in page.text and value in page.text  # the preview, then the whole value
