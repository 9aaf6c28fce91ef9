"""The merged table streams as Arrow: DuckDB reads it and gets the rows DataFusion and the model get."""

from __future__ import annotations

import datafusion
import duckdb
import pyarrow as pa

import memwal_query as mq

from lsm_model import sort_table


def _datafusion(table: mq.Table, sql: str) -> pa.Table:
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    return ctx.sql(sql).to_arrow_table()


def test_to_reader_is_a_record_batch_reader(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    reader = table.to_reader()
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema == table.schema
    assert sum(b.num_rows for b in reader) == events.expected().num_rows


def test_duckdb_scans_the_reader_variable(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    assert any(r.memtable is not None for r in table.snapshot.regions)  # the WAL tail is part of it
    reader = table.to_reader()  # noqa: F841 - DuckDB finds the Python variable by name
    got = duckdb.sql("SELECT * FROM reader").to_arrow_table()
    expected = sort_table(events.expected(), ["id"]).to_pylist()
    assert got.schema.names == table.schema.names
    assert sort_table(got, ["id"]).to_pylist() == expected
    assert sort_table(_datafusion(table, "SELECT * FROM t"), ["id"]).to_pylist() == expected


def test_duckdb_registered_view_matches_datafusion(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    con = duckdb.connect()
    con.register("merged", table.to_reader(columns=["id", "cat", "amount", "qty"]))
    con.execute("CREATE TEMP TABLE m AS SELECT * FROM merged")  # a reader is consumed once
    queries = [
        "SELECT cat, count(*) AS n, sum(amount) AS s, max(qty) AS q FROM {t} GROUP BY cat ORDER BY cat",
        "SELECT id, amount FROM {t} WHERE amount >= 1000 ORDER BY id",
        "SELECT id, cat FROM {t} WHERE id IN (5, 6, 7, 11, 2100) ORDER BY id",
        "SELECT count(*) AS n FROM {t} WHERE cat LIKE 'a%' AND qty BETWEEN 3 AND 30",
    ]
    oracle = duckdb.connect()
    oracle.register("model", events.expected())
    for q in queries:
        duck = con.sql(q.format(t="m")).to_arrow_table()
        df = _datafusion(table, q.format(t="t"))
        model = oracle.sql(q.format(t="model")).to_arrow_table()
        assert duck.to_pylist() == df.to_pylist() == model.to_pylist(), q


def test_duckdb_reads_a_projected_filtered_stream(events) -> None:  # type: ignore[no-untyped-def]
    table = mq.open_table(events.uri)
    reader = table.to_reader(columns=["id", "qty"])
    assert reader.schema.names == ["id", "qty"]
    got = duckdb.sql("SELECT id FROM reader WHERE qty > 25 ORDER BY id").fetchall()
    want = sorted(k[0] for k, row in events.model.items() if row["qty"] > 25)
    assert [r[0] for r in got] == want


def test_duckdb_over_the_dataset_is_refused_with_what_to_use(events) -> None:  # type: ignore[no-untyped-def]
    """``Table.dataset()`` is DataFusion's: DuckDB pushed its filters into it and read them
    answered in DataFusion's order (a NaN with its sign bit set below every number; above in
    DuckDB), and before that failed with an AttributeError. It is refused, naming the streams."""
    import pytest

    table = mq.open_table(events.uri)
    ds = table.dataset()  # noqa: F841 - DuckDB finds the Python variable by name
    with pytest.raises(duckdb.Error, match=r"hand DuckDB table\.to_stream\(\) or table\.to_reader\(\)"):
        duckdb.sql("SELECT count(*) FROM ds").fetchall()
    stream = table.to_stream()  # noqa: F841 - DuckDB finds the Python variable by name
    assert duckdb.sql("SELECT count(*) FROM stream").fetchall() == [(table.count_rows(),)]


def test_sql_text_as_a_dataset_filter_is_refused(events) -> None:  # type: ignore[no-untyped-def]
    """``table.dataset().to_table(filter="id < 0")`` ignored the text and returned every row."""
    import pyarrow.compute as pc
    import pytest

    ds = mq.open_table(events.uri).dataset()
    for call in (lambda: ds.to_table(filter="id < 0"), lambda: ds.count_rows(filter="id < 0")):
        with pytest.raises(mq.InvalidArgumentError, match=r"pyarrow\.compute expressions, not str .*to_reader"):
            call()
    assert ds.count_rows(filter=pc.field("id") < 0) == 0
