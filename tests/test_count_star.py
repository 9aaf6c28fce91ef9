"""``SELECT count(*) FROM t`` answered from the merged table's row count (``memwal_query.count_star``).

Every query is also run by DataFusion over the same merged table registered in a session of
its own (``Table.register``: no count is taken there), on a table written by pylance's MemWAL
writer (generations, merges, deletes, a WAL tail); the counts equal the dict model's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import datafusion
import lance
import pyarrow as pa
import pytest

import memwal_query as mq

from builders import build_events
from lsm_model import ModelTable


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelTable]:
    t = build_events(str(tmp_path_factory.mktemp("count") / "t"), seed=12)
    yield t
    t.flush()


def _scanned(query: str, t: mq.Table, name: str = "t") -> pa.Table:
    """``query`` run by DataFusion over the merged table (a scan)."""
    ctx = datafusion.SessionContext()
    t.register(ctx, name)
    return ctx.sql(query).to_arrow_table()


COUNTED = [
    "SELECT count(*) FROM t",
    "select COUNT(*) from t",
    "SELECT count(1) AS n FROM t",
    'SELECT count(*) AS "rows", count(1), count(*) AS again FROM t',
]
SCANNED = [
    "SELECT count(*) FROM t WHERE amount < 10",
    "SELECT count(id) FROM t",
    "SELECT count(NULL) FROM t",
    "SELECT count(*) + 1 AS n FROM t",
    "SELECT count(DISTINCT 1) FROM t",
    "SELECT count(*) FILTER (WHERE amount < 10) FROM t",
    "SELECT count(*) FROM t GROUP BY id % 3 ORDER BY 1",
    "SELECT count(*) FROM t LIMIT 0",
    "SELECT count(*) FROM (SELECT * FROM t LIMIT 5)",
    "SELECT count(*) FROM t a JOIN t b ON a.id = b.id",
    "SELECT count(*) FROM t HAVING count(*) > 1000000",
    "SELECT count(*), sum(amount) FROM t",
]


@pytest.mark.parametrize("query", COUNTED)
def test_a_count_of_the_whole_table_is_the_row_count(table: ModelTable, query: str) -> None:
    """Only counts of the whole table: a one-row plan of the table's row count (no scan), with
    DataFusion's columns and the model's count."""
    t = mq.open_table(table.uri)
    df = t.sql(query)
    plan = df.logical_plan().display_indent()
    assert "TableScan" not in plan and "EmptyRelation" in plan
    got = df.to_arrow_table()
    want = _scanned(query, t)
    assert got.schema == want.schema and got.equals(want)
    assert set(got.to_pylist()[0].values()) == {len(table.model)}


@pytest.mark.parametrize("query", SCANNED)
def test_any_other_count_is_run_by_datafusion(table: ModelTable, query: str) -> None:
    """A filter, a column or NULL counted, an expression, DISTINCT, FILTER, GROUP BY, a limit,
    a subquery, a join, HAVING, another aggregate: scanned, as DataFusion answers it."""
    t = mq.open_table(table.uri)
    df = t.sql(query)
    assert "TableScan" in df.logical_plan().display_indent()
    got = df.to_arrow_table()
    assert got.equals(_scanned(query, t))


def test_the_count_follows_the_name_and_session_given(table: ModelTable) -> None:
    """In a session of the user's, the table's own name is counted; another table of that
    session of the same shape is scanned; a count answered equals the model after writes."""
    t = mq.open_table(table.uri)
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("other", [[pa.record_batch({"id": [1, 2, 3]})]])
    got = t.sql("SELECT count(*) AS n FROM events", name="events", ctx=ctx)
    assert "EmptyRelation" in got.logical_plan().display_indent()
    assert got.to_pydict() == {"n": [len(table.model)]}
    other = t.sql("SELECT count(*) AS n FROM other", name="events", ctx=ctx)
    assert "TableScan" in other.logical_plan().display_indent() and other.to_pydict() == {"n": [3]}
    table.put([{**table.model[next(iter(table.model))], "id": 900_000}])
    table.delete([(next(iter(table.model))[0],)])
    assert t.refresh().sql("SELECT count(*) FROM t").to_pylist() == [{"count(*)": len(table.model)}]


def test_a_damaged_table_fails_when_the_count_runs(tmp_path: Path) -> None:
    """A base data file gone: the count fails when it runs (as any query's scan), naming the file's table."""
    table = build_events(str(tmp_path / "t"), seed=13)
    frag = lance.dataset(table.uri).get_fragments()[0]
    (Path(table.uri) / "data" / frag.metadata.files[0].path).unlink()
    t = mq.open_table(table.uri)
    df = t.sql("SELECT count(*) FROM t")
    with pytest.raises(mq.MemWalError, match=str(Path(table.uri).name)):
        df.to_arrow_table()
