"""A process that ends right after a LIMIT query exits 0 (see ``memwal_query.scan_gate``).

Before the scan gate, DataFusion threads still decoding an abandoned partition were
killed by the interpreter's finalization and the process aborted (exit 134) after
printing correct rows: every run on these tables did. Each run here is a fresh
process; the rows it prints are checked against the dict model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from builders import build_events, events_schema, rows
from lsm_model import ModelTable

SCRIPT = """
import json, sys, datafusion, memwal_query as mq
t = mq.open_table(sys.argv[1])
ctx = datafusion.SessionContext()
t.register(ctx, "t", cache=sys.argv[3] == "1")
print(json.dumps(ctx.sql(sys.argv[2]).to_arrow_table().to_pylist()))
"""

# (query, limit, predicate on a model row)
SHAPES: list[tuple[str, int, Any]] = [
    ("SELECT id, cat, amount, qty FROM t LIMIT 2", 2, lambda r: True),
    ("SELECT * FROM t WHERE amount > 10 LIMIT 5", 5, lambda r: r["amount"] is not None and r["amount"] > 10),
    ("SELECT id, cat, amount, qty FROM t WHERE cat = 'b' LIMIT 1", 1, lambda r: r["cat"] == "b"),
]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("exit")
    levels = build_events(str(root / "levels"), seed=3)  # generations, a merge, an open writer's WAL tail
    base = pa.Table.from_pylist(rows(range(20_000), 0, np.random.default_rng(1)), schema=events_schema())
    plain = ModelTable(str(root / "plain"), events_schema(), base, bucket=("id", 4))  # nothing newer than the base
    yield {"levels": levels, "plain": plain}
    levels.flush()


def _run(argv: list[str]) -> list[dict[str, Any]]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-500:]}"
    assert "FATAL" not in proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _check(got: list[dict[str, Any]], model: ModelTable, limit: int, pred: Any) -> None:
    live = {k[0]: r for k, r in model.model.items() if pred(r)}
    assert len(got) == min(limit, len(live))
    for r in got:
        assert r["id"] in live and r == {c: live[r["id"]][c] for c in r}


def _argv(how: str, uri: str, query: str) -> list[str]:
    if how == "cli":
        return [sys.executable, "-m", "memwal_query.cli", "sql", uri, query, "--format", "json"]
    return [sys.executable, "-c", SCRIPT, uri, query, "1" if how == "cached" else "0"]


@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("name", ["levels", "plain"])
def test_cli_exits_cleanly_after_limit(tables: dict[str, ModelTable], name: str, shape: int) -> None:
    query, limit, pred = SHAPES[shape]
    _check(_run(_argv("cli", tables[name].uri, query)), tables[name], limit, pred)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cli", "cached", "uncached"])
@pytest.mark.parametrize("name", ["levels", "plain"])
def test_many_runs_exit_cleanly_after_limit(tables: dict[str, ModelTable], name: str, how: str) -> None:
    """36 fresh processes: 2 tables x 3 query shapes x (CLI, script with cache on / off) x 2."""
    for _ in range(2):
        for query, limit, pred in SHAPES:
            _check(_run(_argv(how, tables[name].uri, query)), tables[name], limit, pred)


def test_script_ending_after_limit_query_exits_cleanly(tables: dict[str, ModelTable], tmp_path: Path) -> None:
    script = tmp_path / "last_query.py"
    script.write_text(SCRIPT)
    query, limit, pred = SHAPES[0]
    _check(_run([sys.executable, str(script), tables["levels"].uri, query, "1"]), tables["levels"], limit, pred)


def test_gate_waits_for_a_call_in_flight_and_ends_later_calls() -> None:
    import threading
    import time

    from memwal_query.scan_gate import ScanGate, guarded

    gate = ScanGate()
    inside, release, done = threading.Event(), threading.Event(), []

    def slow() -> Any:
        yield 1
        inside.set()
        release.wait(5)  # a fragment decode in flight (GIL released)
        yield 2
        yield 3  # never asked for: the gate is closed by then

    def consume() -> None:
        done.extend(guarded(slow(), gate))

    t = threading.Thread(target=consume)
    t.start()
    assert inside.wait(5)
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    assert gate.close(timeout=5)  # waited for the call in flight
    assert time.monotonic() - started >= 0.15
    t.join(5)
    assert done == [1, 2]
    assert list(guarded(iter([4]), gate)) == []  # a scan starting after close ends at once
    assert ScanGate().close(timeout=0)  # no scan ever: returns at once


def test_scan_generators_closed_after_module_teardown_stay_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan left unfinished (a LIMIT) can be closed at interpreter exit after module globals
    were set to None: its ``except (..., pa.ArrowException)`` clause then raised AttributeError
    ("Exception ignored in: <generator ... guard>" printed after a clean run). Closing passes
    GeneratorExit before any clause that names a module global."""
    import memwal_query.engine_errors as engine_errors
    import memwal_query.scan.filters as filters
    import memwal_query.scan.lance_fragment as lance_fragment

    def endless() -> Any:
        while True:
            yield pa.record_batch({"a": [1]})

    import memwal_query.spark_read as spark_read

    class Endless:  # a source fragment whose scan never ends (what a Spark task reads)
        def scanner(self, **_: Any) -> Any:
            return type("S", (), {"to_batches": staticmethod(endless)})()

    frag = lance_fragment.LanceFragment.__new__(lance_fragment.LanceFragment)
    gens = [
        frag.guard(endless()),
        engine_errors.recorded(endless()),
        filters.applying(endless(), pa.compute.field("a") > 0, "t"),
        spark_read.spark_scan([Endless()], None, None, pa.schema([("a", pa.int64())])),  # type: ignore[list-item]
    ]
    for g in gens:
        next(g)
    monkeypatch.setattr(lance_fragment, "pa", None)  # what finalization leaves
    monkeypatch.setattr(engine_errors, "MemWalError", None)
    monkeypatch.setattr(filters, "pa", None)
    monkeypatch.setattr(spark_read, "MemWalError", None)
    for g in gens:
        g.close()  # raised AttributeError / TypeError before


def test_ctrl_c_while_the_exit_waits_for_scans_is_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt in the exit hook (Ctrl-C while it waits for scan calls in flight)
    came out as "Exception ignored in atexit callback" and a traceback: the wait is cut short."""
    from memwal_query import scan_gate

    waits: list[float] = []

    class Interrupted(scan_gate.ScanGate):
        def close(self, timeout: float = scan_gate.EXIT_WAIT_SECONDS) -> bool:
            waits.append(timeout)
            if len(waits) == 1:
                raise KeyboardInterrupt
            return True

    monkeypatch.setattr(scan_gate, "GATE", Interrupted())
    scan_gate._close_at_exit()  # noqa: SLF001 - the exit hook itself
    assert waits == [scan_gate.EXIT_WAIT_SECONDS, 2.0]


FORK = """
import faulthandler, json, os, sys
import memwal_query as mq
table = mq.open_table(sys.argv[1])
parent = table.sql("SELECT sum(amount) AS s FROM t").to_pydict()["s"][0]
made_before = table.sql("SELECT count(*) AS n FROM t")
pid = os.fork()
if pid == 0:  # no Lance call here: pylance is not fork-safe (it warns at every fork)
    faulthandler.dump_traceback_later(20, exit=True)  # a hang ends the child (exit 1)
    out = {}
    for name, call in [("sql", lambda: table.sql("SELECT 1")), ("frame", lambda: made_before.to_pydict())]:
        try:
            out[name] = repr(call())
        except mq.MemWalError as err:
            out[name] = "refused: " + str(err)
    print(json.dumps(out), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps({"sum": parent, "child_status": status}))
"""


def test_sql_in_a_process_forked_after_queries_is_refused(tables: dict[str, ModelTable]) -> None:
    """DataFusion's worker threads do not survive fork(): in a child forked after the parent ran
    a query (multiprocessing's default on Linux), SQL waited forever. It is refused, naming
    spawn, before anything runs."""
    uri = tables["plain"].uri
    proc = subprocess.run([sys.executable, "-c", FORK, uri], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stderr[-3000:]
    child, parent = (json.loads(line) for line in lines)
    assert parent["child_status"] == 0, proc.stderr[-2000:]
    assert parent["sum"] == sum(r["amount"] for r in tables["plain"].model.values())
    assert child["sql"].startswith(f"refused: cannot query {uri} with DataFusion in process"), child["sql"]
    assert child["frame"].startswith("refused: cannot query a memwal DataFrame with DataFusion"), child["frame"]
    assert 'multiprocessing.get_context("spawn")' in child["sql"]


def test_memwal_thread_pools_work_in_a_forked_child() -> None:
    """Vector and text searches hand work to memwal's thread pools: a pool made in the parent
    has no threads in a forked child, and a search there waited forever. The child makes its own."""
    import os

    from memwal_query.forked import ThreadPool

    pending: list[object] = ["a future of the parent's"]
    pool = ThreadPool(2, "memwal-test", after_fork=pending)
    assert pool.get().submit(sum, [1, 2]).result() == 3  # the parent's threads exist now
    read, write = os.pipe()
    with pytest.warns(UserWarning, match="lance is not fork-safe"):  # pylance's, at every fork
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            done = pool.get().submit(sum, [3, 4]).result(timeout=10)
            os.write(write, f"{done} {len(pending)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert (os.read(read, 100).decode(), status) == ("7 0", 0)
    assert pool.get().submit(sum, [5]).result() == 5 and pending  # the parent's pool, untouched
