"""A table's objects are freed when the last reference to them goes, not by the garbage collector.

Objects in a reference cycle wait for Python's garbage collector, which runs on whatever
thread allocates at the time: a DataFusion worker running a scan, where freeing the Lance
datasets a view holds crashed the process now and then (a segmentation fault, ~1 run in 5
of the CLI tests). Here every access path runs with the collector off; once the tables are
dropped, their views must be gone, and the collector must find none of our objects.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import datafusion
import pytest

import memwal_query as mq
from memwal_query.demo import DIM, write_demo_table


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _ours(objects: list[object]) -> list[str]:
    return sorted({type(o).__qualname__ for o in objects if type(o).__module__.startswith("memwal_query")})


def test_no_reference_cycle_holds_a_table(tmp_path: Path, collector_off: None) -> None:
    """SQL (a scan, a count, a limit), lookups, vector, text and hybrid search, a stream, a
    refresh, the change feed, explain and a catalog query: afterwards the views are freed
    by reference counting, and no object of ours is left for the collector."""
    uri = str(tmp_path / "events")
    write_demo_table(uri, base_rows=2000, update_rows=400, memtable_rows=150, seed=3)
    t = mq.open_table(uri)
    views = [weakref.ref(t.view)]
    assert t.sql("SELECT count(*) AS n FROM t").to_pydict()["n"][0] == t.count_rows()
    t.sql("SELECT sum(amount) FROM t WHERE amount < 10").to_arrow_table()
    t.sql("SELECT * FROM t LIMIT 3").to_arrow_table()
    t.lookup([1, 2, 3])
    t.nearest("vec", [0.5] * DIM, k=3)
    t.search_text("note", "alpha", k=3)
    t.search_hybrid("vec", [0.5] * DIM, "note", "alpha", k=3)
    t.to_reader().read_all()
    t.explain()
    again = t.refresh()
    views.append(weakref.ref(again.view))
    again.changes(t.change_token)
    ctx = datafusion.SessionContext()
    mq.register_catalog(ctx, str(tmp_path))
    ctx.sql("SELECT count(*) FROM memwal.public.events").to_arrow_table()
    del t, again, ctx
    assert [v() for v in views] == [None, None]
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        assert _ours(gc.garbage) == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
