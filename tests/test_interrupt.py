"""Ctrl-C ends a running query at once (``memwal_query.interrupt``), where DataFusion, waiting
in native code for workers busy in scans, saw the signal only when they next let its timer
fire: never, for scans that keep their workers busy, and a minute for a heavy join.

The child processes run real queries on a table pylance's MemWAL writer wrote, with every
scan made endless (a batch every 50 ms, forever): only an interrupt ends them.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memwal_query import scan_gate
from memwal_query.errors import QueryInterruptedError
from memwal_query.interrupt import interruptibly

from builders import build_events

REPO = Path(__file__).resolve().parents[1]

_ENDLESS = """
import itertools, sys, time
import memwal_query.scan.fragment as fragment
real = fragment.recorded
def endless(batches):  # a scan that never ends: its first batch again every 50 ms
    first = list(itertools.islice(real(batches), 1))
    while True:
        time.sleep(0.05)
        yield from first
"""

_API = (
    _ENDLESS
    + """
import memwal_query as mq
t = mq.open_table(sys.argv[1])
fragment.recorded = endless
print("go", flush=True)
try:
    t.sql("SELECT count(*) FROM t").to_arrow_table()
    print("finished", flush=True)
except KeyboardInterrupt:
    fragment.recorded = real
    n = t.sql("SELECT count(*) AS n FROM t").to_arrow_table().column("n")[0].as_py()
    print(f"interrupted, then {n} rows", flush=True)
"""
)

_CLI = (
    _ENDLESS
    + """
fragment.recorded = endless
print("go", flush=True)
from memwal_query.cli import run
sys.argv = ["memwal", "sql", sys.argv[1], "SELECT count(*) FROM t"]
run()
"""
)

BOUND_SECONDS = 20.0
"""How long after SIGINT the child must answer (it takes well under a second)."""


def _interrupted(script: str, uri: str) -> tuple[str | None, str, float, int | None]:
    """Run ``script`` on ``uri`` in a child process, send it SIGINT a second after it said
    ``go``; returns its next line of output ("" at its end; None: nothing within the bound),
    its stderr, how long after SIGINT, and its exit code."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "go\n"
        time.sleep(1.0)  # the query running, its scans busy
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            line = proc.stdout.readline() if sel.select(BOUND_SECONDS) else None
        took = time.monotonic() - sent
        if line is None:
            return None, "", took, None
        code = proc.wait(BOUND_SECONDS)
        return line, proc.stderr.read(), took, code  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_events(str(tmp_path_factory.mktemp("interrupt") / "t")).uri


def test_ctrl_c_ends_a_query_at_once_and_the_next_one_runs(uri: str) -> None:
    """The query ends with KeyboardInterrupt within the bound (unfixed: never), and the next
    query of the same process reads every row (the scans run again)."""
    import memwal_query as mq

    line, _, took, code = _interrupted(_API, uri)
    want = mq.open_table(uri).count_rows()
    assert line == f"interrupted, then {want} rows\n", f"{line!r} {took:.1f} s after SIGINT"
    assert code == 0


def test_ctrl_c_ends_the_cli_at_once(uri: str) -> None:
    """``memwal sql``: one line on stderr and exit code 130, within the bound (unfixed: never)."""
    line, err, took, code = _interrupted(_CLI, uri)
    assert (line, err, code) == ("", "memwal: interrupted\n", 130), f"{took:.1f} s after SIGINT"


def test_a_query_returns_what_it_returns_and_raises_what_it_raises() -> None:
    """On the main thread the query runs on a worker thread and hands back its value or its
    exception; on other threads it runs where it is asked."""
    where: list[str] = []

    def query() -> int:
        where.append(threading.current_thread().name)
        return 42

    assert interruptibly(query) == 42 and where == ["memwal-query"]
    with pytest.raises(ZeroDivisionError):
        interruptibly(lambda: 1 // 0)
    box: list[object] = []
    other = threading.Thread(target=lambda: box.append(interruptibly(query)), name="mine")
    other.start()
    other.join()
    assert box == [42] and where[-1] == "mine"


def test_scans_fail_while_an_interrupted_query_ends() -> None:
    """While STOP is set a scan fails at its next batch, naming the interrupt; cleared, scans run."""
    scan_gate.STOP.set()
    try:
        with pytest.raises(QueryInterruptedError, match="interrupted"):
            list(scan_gate.guarded(iter([1, 2])))
    finally:
        scan_gate.STOP.clear()
    assert list(scan_gate.guarded(iter([1, 2]))) == [1, 2]
