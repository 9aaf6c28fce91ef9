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
import faulthandler, itertools, os, signal, sys, time
faulthandler.dump_traceback_later(15)  # still running then: every thread's stack on stderr, for the report
# as in a terminal: a test run started in the background (``cmd &`` without job control) ignores
# Ctrl-C, and its children inherit that (each of these hung 20 s in such a CI run)
signal.signal(signal.SIGINT, signal.default_int_handler)
import memwal_query.scan.fragment as fragment
real = fragment.recorded
PAUSE = float(os.environ.get("PAUSE", "0.05"))
def endless(batches):  # a scan that never ends: its first batch again every PAUSE seconds
    first = list(itertools.islice(real(batches), 1))
    while True:
        time.sleep(PAUSE)
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
    print("interrupted", flush=True)
    fragment.recorded = real
    n = t.sql("SELECT count(*) AS n FROM t").to_arrow_table().column("n")[0].as_py()
    print(f"then {n} rows", flush=True)
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


def _interrupted(script: str, uri: str, *, signals: int = 1, pause: float = 0.05) -> tuple[list[str], str, float, int]:
    """Run ``script`` on ``uri`` in a child process whose scans take ``pause`` seconds a batch,
    send it ``signals`` SIGINTs (0.3 s apart) a second after it said ``go``; returns the lines
    it printed after (each within the bound of the one before), its stderr, how long after the
    last SIGINT its first line (or its end) came, and its exit code (-1: still running)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PAUSE": str(pause)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "go\n"
        time.sleep(1.0)  # the query running, its scans busy
        for i in range(signals):
            time.sleep(0.3 if i else 0)
            proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        lines: list[str] = []
        took = BOUND_SECONDS
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while sel.select(BOUND_SECONDS):
                took = min(took, time.monotonic() - sent)
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
        try:
            code = proc.wait(BOUND_SECONDS)
        except subprocess.TimeoutExpired:
            code = -1
            proc.kill()
        return lines, proc.stderr.read(), took, code  # type: ignore[union-attr]
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

    lines, err, took, code = _interrupted(_API, uri)
    want = mq.open_table(uri).count_rows()
    assert lines == ["interrupted\n", f"then {want} rows\n"] and took < 5.0, f"{lines} {took:.1f} s after SIGINT {err}"
    assert code == 0


def test_a_second_ctrl_c_returns_at_once_and_the_next_query_runs(uri: str) -> None:
    """Scans taking 8 s a batch: a second Ctrl-C returns before the interrupted query ended, and
    the next query reads every row while it still ends (it failed, "query interrupted"; it
    waits for the batches in flight: they hold DataFusion's worker threads)."""
    import memwal_query as mq

    lines, err, took, _ = _interrupted(_API, uri, signals=2, pause=8.0)
    want = mq.open_table(uri).count_rows()
    assert lines == ["interrupted\n", f"then {want} rows\n"], f"{lines} {err}"
    assert took < 5.0  # back before the batch in flight ended


def test_ctrl_c_ends_the_cli_at_once(uri: str) -> None:
    """``memwal sql``: one line on stderr and exit code 130, within the bound (unfixed: never)."""
    lines, err, took, code = _interrupted(_CLI, uri)
    assert (lines, err, code) == ([], "memwal: interrupted\n", 130) and took < 5.0, f"{took:.1f} s after SIGINT {err}"


def test_a_query_returns_what_it_returns_and_raises_what_it_raises() -> None:
    """On the main thread the query runs on a worker thread and hands back its value or its
    exception; on other threads it runs where it is asked."""
    where: list[str] = []
    own = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a script (pytest's may differ)
    try:
        _returns_and_raises(where)
    finally:
        signal.signal(signal.SIGINT, own)


def _returns_and_raises(where: list[str]) -> None:

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


def test_a_ctrl_c_ends_the_scans_of_its_query_not_those_begun_after() -> None:
    """A scan started in an interrupted query's era fails at its next batch, naming the
    interrupt; a scan of a query begun after it runs (an abandoned query may still be ending)."""
    era = scan_gate.INTERRUPTS.begin()
    old = scan_gate.guarded(iter([1, 2]))
    scan_gate.INTERRUPTS.stop(era)
    with pytest.raises(QueryInterruptedError, match="interrupted"):
        list(old)
    scan_gate.INTERRUPTS.begin()
    assert list(scan_gate.guarded(iter([1, 2]))) == [1, 2]
