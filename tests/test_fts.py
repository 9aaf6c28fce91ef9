"""Full-text search across LSM levels, against one INVERTED index over the live rows.

The oracle is a plain Lance table holding the dict model's live rows with the same
INVERTED index; merged search must return the same top-k with scores within 1%.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.query import MatchQuery, PhraseQuery

import memwal_query as mq

from lsm_model import PK, ModelTable

WORDS = (
    "apple banana cherry date elder fig grape honey ice jam kiwi lemon mango nut olive pear "
    "quince rasp straw tomato the and of running runs RUN Café café naïve über O'Brien e-mail "
    "x1y2 3.14 東京 données Straße jumping jumped résumé"
).split()


def texts(n: int, rng: np.random.Generator) -> list[str | None]:
    p = 1.0 / np.arange(1, len(WORDS) + 1) ** 1.1
    p /= p.sum()
    out: list[str | None] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.02:
            out.append(None)
        elif r < 0.03:
            out.append("the and of")  # stop words only: no document
        else:
            words = rng.choice(WORDS, size=int(rng.integers(1, 14)), p=p)
            sep = rng.choice([" ", ", ", "! ", " - "], size=len(words))
            out.append("".join(f"{w}{s}" for w, s in zip(words, sep, strict=True)).strip())
    return out


def schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("text", pa.string()),
        ]
    )


def rows(ids: Any, rng: np.random.Generator) -> list[dict[str, Any]]:
    ids = [int(i) for i in ids]
    return [
        {"id": i, "cat": ["a", "b", "c"][int(rng.integers(0, 3))], "text": t}
        for i, t in zip(ids, texts(len(ids), rng), strict=True)
    ]


def build(path: str, *, seed: int = 0, params: dict[str, Any] | None = None, keep_open: bool = True) -> ModelTable:
    """4 bucket regions; text-changing updates, deletes, re-inserts, a merged generation
    (deleted base rows in the base index, unindexed base fragments), a WAL tail."""
    rng = np.random.default_rng(seed)
    base = pa.Table.from_pylist(rows(range(1500), rng), schema=schema())
    t = ModelTable(path, schema(), base, bucket=("id", 4), max_memtable_rows=120, inverted=("text", params or {}))
    t.put(rows(rng.choice(1900, 300, replace=False), rng))
    t.delete([(int(k),) for k in rng.choice(1500, 40, replace=False)])
    t.flush()
    for r in t.regions()[:2]:
        gens = t.flushed(r)
        if gens:
            t.merge(r, gens[0][0])
    t.put(rows([7, 7, 11], rng))  # duplicates in one batch: the last wins
    t.delete([(5,), (6,), (1950,)])
    t.put(rows([5, 1950], rng))  # re-inserts
    t.put(rows(rng.choice(1900, 250, replace=False), rng))
    t.flush()
    t.put(rows(rng.choice(2000, 80, replace=False), rng))  # left open: the WAL tail
    t.delete([(int(k),) for k in rng.choice(2000, 10, replace=False)])
    if not keep_open:
        t.flush()
    return t


def oracle(t: ModelTable, path: str, params: dict[str, Any] | None = None) -> lance.LanceDataset:
    ds = lance.write_dataset(t.expected(), path)
    ds.create_scalar_index("text", "INVERTED", **(params or {}))
    return lance.dataset(path)


def oracle_search(
    ds: lance.LanceDataset, query: str, k: int, filt: str | None = None, phrase: bool = False
) -> pa.Table:
    q = PhraseQuery(query, "text") if phrase else MatchQuery(query, "text")
    kwargs: dict[str, Any] = {"columns": ["id", "_score"], "full_text_query": q, "limit": k}
    if filt:
        kwargs.update(filter=filt, prefilter=True)
    return ds.scanner(**kwargs).to_table()


def assert_same(got: pa.Table, want: pa.Table, k: int) -> None:
    """Same top-k (ties at the cut may swap) and scores within 1%."""
    gs, ws = got.column("_score").to_pylist(), want.column("_score").to_pylist()
    assert len(gs) == len(ws), (got, want)
    np.testing.assert_allclose(gs, ws, rtol=0.01)
    cut = ws[-1] if len(ws) == k else -1.0
    sure = lambda t: {i for i, s in zip(t["id"].to_pylist(), t["_score"].to_pylist(), strict=True) if s > cut * 1.01}  # noqa: E731
    assert sure(got) == sure(want)
    assert set(got["id"].to_pylist()) <= set(want["id"].to_pylist()) | {
        i for i, s in zip(got["id"].to_pylist(), gs, strict=True) if abs(s - cut) <= 0.01 * cut
    }


QUERIES = ["apple", "apple banana", "running jumped", "cafe über", "apple apple kiwi", "東京 données", "O'Brien e-mail"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelTable, lance.LanceDataset]:
    root = tmp_path_factory.mktemp("fts")
    t = build(str(root / "t"))
    return t, oracle(t, str(root / "oracle"))


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("k", [1, 10, 50])
def test_merged_search_equals_one_index_over_live_rows(tables: Any, query: str, k: int) -> None:
    t, ds = tables
    table = mq.open_table(t.uri)
    got = table.search_text("text", query, k=k, columns=["id", "text"])
    assert got.column_names == ["id", "text", "_score"]
    assert_same(got, oracle_search(ds, query, k), k)
    live = {r["id"]: r["text"] for r in t.expected().to_pylist()}
    assert all(live[i] == tx for i, tx in zip(got["id"].to_pylist(), got["text"].to_pylist(), strict=True))


@pytest.mark.parametrize("filt", ["cat = 'a'", "id < 300", "id IN (5, 7, 11, 1950)", "cat = 'b' AND id > 1000"])
def test_filter_applies_to_live_values(tables: Any, filt: str) -> None:
    t, ds = tables
    table = mq.open_table(t.uri)
    for query in ["apple banana", "cherry"]:
        assert_same(table.search_text("text", query, k=20, filter=filt), oracle_search(ds, query, 20, filt), 20)


def test_filter_prunes_regions(tables: Any) -> None:
    t, _ = tables
    from memwal_query.fts.search import search_text

    table = mq.open_table(t.uri)
    _, stats = search_text(table, "text", "apple", k=5, filter="id = 7")
    assert len(stats.pruned_regions) == 3
    assert not any(r in s for s in stats.sources for r in stats.pruned_regions)


def test_eventual_snapshot_and_naive_union_differs(tables: Any, tmp_path: Path) -> None:
    t, _ = tables
    table = mq.open_table(t.uri, consistency="eventual")
    live = table.to_arrow()
    ds = lance.write_dataset(live, str(tmp_path / "o"))
    ds.create_scalar_index("text", "INVERTED")
    for q in QUERIES[:3]:
        assert_same(table.search_text("text", q, k=10), oracle_search(ds, q, 10), 10)


@pytest.mark.parametrize("query", QUERIES)
def test_threshold_rounds_find_the_same_top_k(tables: Any, query: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source searched top-m first (no source small enough to take whole)."""
    import memwal_query.fts.search as search

    monkeypatch.setattr(search, "_SMALL_SOURCE", 0)
    t, ds = tables
    table = mq.open_table(t.uri)
    for k in (1, 3, 25):
        got, stats = search.search_text(table, "text", query, k=k)
        assert not stats.exhaustive
        assert_same(got, oracle_search(ds, query, k), k)
