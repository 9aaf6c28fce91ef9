"""The README's code runs as written, on the demo table (``./dev demo data``).

Every ```python and ```bash block of README.md runs here, in order, in a fresh process
each, from a directory holding ``data/events`` written by the demo's own writer: Python
blocks as scripts, ``memwal ...`` lines of bash blocks through the CLI. A block preceded by
``<!-- sketch: why -->`` is not run (set-up, Spark, S3, benchmarks), and the test checks
that each such mark says why.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from memwal_query.demo import leave_wal_tail, write_demo_table

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"(?:<!-- sketch: (?P<why>[^>]*?) -->\n)?```(?P<lang>python|bash)\n(?P<code>.*?)```", re.S)


def _blocks() -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["code"], m["why"]) for m in _BLOCK.finditer(README.read_text())]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme")
    uri = write_demo_table(str(root / "data" / "events"), base_rows=5000, update_rows=500, memtable_rows=300, seed=2)
    leave_wal_tail(uri, 5000)  # as ./dev demo does
    return root


def test_readme_has_runnable_and_sketch_blocks() -> None:
    blocks = _blocks()
    assert sum(why is None for _, _, why in blocks) >= 3
    assert all(why is None or why.strip() for _, _, why in blocks)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_readme_code_runs_as_written(workdir: Path) -> None:
    ran = 0
    for lang, code, why in _blocks():
        if why is not None:
            continue
        if lang == "python":
            proc = _run([sys.executable, "-c", code], workdir)
            assert proc.returncode == 0, f"README block failed:\n{code}\n{proc.stderr[-2000:]}"
            assert "Traceback" not in proc.stderr
            ran += 1
            continue
        for line in code.splitlines():
            command, _, comment = line.partition("  #")
            if not command.startswith("memwal "):
                continue
            args = re.findall(r'"[^"]*"|\S+', command)[1:]
            proc = _run([sys.executable, "-m", "memwal_query.cli", *[a.strip('"') for a in args]], workdir)
            if "an error" in comment:
                assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
                assert proc.stderr.startswith("memwal: error: ") and "PyErr" not in proc.stderr
            else:
                assert proc.returncode == 0, f"{line}\n{proc.stderr[-2000:]}"
            ran += 1
    assert ran >= 7
