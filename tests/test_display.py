"""HTML and text views of a snapshot (what Jupyter shows for a Table and for explain())."""

from __future__ import annotations

import html
import json

import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.demo import write_demo_table
from memwal_query.display import ExplainText, describe_table, explain_html, format_text_table, freshness, table_html

from builders import plain_live_rows


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> mq.Table:
    # a folder name that needs escaping in HTML
    root = tmp_path_factory.mktemp("display") / "a&b<c>"
    uri = write_demo_table(str(root / "events"), base_rows=400, update_rows=80, memtable_rows=40, seed=7)
    return mq.open_table(uri)


def test_table_html(table: mq.Table) -> None:
    out = table_html(table)
    assert out.startswith('<div class="memwal">') and out.endswith("</div>")
    assert "a&amp;b&lt;c&gt;" in out and "a&b<c>" not in out
    # the first cell is "live rows": counted by plain Lance reads, not by the reader
    assert out.index("<th>live rows</th>") < out.index("<th>primary key</th>")
    assert out.split('<td class="n">', 1)[1].split("</td>", 1)[0] == f"{plain_live_rows(table.uri).num_rows:,}"
    assert f"base v{table.version}" in out
    newest = max(r.manifest.version for r in table.snapshot.regions if r.manifest is not None)
    assert f"highest region manifest version v{newest}" in out
    for rid in table.region_ids:
        assert f'title="{rid}"' in out
    for values in table.region_values().values():
        assert values is not None
        for k, v in values.values.items():
            assert html.escape(f"{k}={v!r}") in out
    assert "<script" not in out


def test_explain_html_lists_every_source(table: mq.Table) -> None:
    out = explain_html(table)
    assert "memwal explain" in out and "<details>" in out
    for r in table.snapshot.regions:
        for g in r.generations:
            assert f"generation {g.generation}" in out
        for s in r.skipped:
            assert html.escape(f"skipped: {s.reason}") in out
    # the full text explanation is embedded, escaped
    assert html.escape(table.explain().splitlines()[1].strip()) in out


def test_explain_html_with_predicate(table: mq.Table) -> None:
    out = explain_html(table, "id = 42")
    plan = table.plan("id = 42")
    assert len(plan.regions) == 1 and "1 region read, 3 pruned" in out
    for p in plan.pruned:
        assert html.escape(f"pruned: {p.reason}") in out
    # same text as Table.explain(predicate)
    assert html.escape(table.explain("id = 42").splitlines()[-1]) in out
    with pytest.raises(mq.InvalidArgumentError):
        explain_html(table, "no_such_column = 1")


def test_explain_html_eventual(table: mq.Table) -> None:
    eventual = mq.open_table(table.uri, consistency="eventual")
    assert "not read (eventual consistency)" in explain_html(eventual)
    assert "not read (eventual)" in table_html(eventual)


def test_explain_text_is_a_str_with_html() -> None:
    e = ExplainText("line 1\nline 2", "<pre>x</pre>")
    assert e == "line 1\nline 2" and e.splitlines() == ["line 1", "line 2"]
    assert e._repr_html_() == "<pre>x</pre>"


def test_describe_table_is_json_ready(table: mq.Table) -> None:
    d = describe_table(table)
    json.dumps(d)
    assert d["live_rows"] == plain_live_rows(table.uri).num_rows
    assert d["freshness"] == freshness(table)
    assert len(d["regions"]) == len(table.region_ids)
    total = (
        d["base_rows"]
        - d["base_rows_masked"]
        + sum(g["rows"] - g["dropped"] for r in d["regions"] for g in r["unmerged_generations"])
        + sum(r["memtable_live_rows"] for r in d["regions"])
    )
    assert total == d["live_rows"]


def test_format_text_table() -> None:
    t = pa.table({"n": [1, 100], "s": ["x" * 50, None]})
    out = format_text_table(t, max_cell=10)
    lines = out.splitlines()
    assert lines[3] == "|   1 | xxxxxxxxx… |"
    assert lines[4] == "| 100 | NULL       |"
    assert lines[-1] == "2 rows"
    assert format_text_table(pa.table({"a": pa.array([], pa.int64())})).splitlines()[-1] == "0 rows"
