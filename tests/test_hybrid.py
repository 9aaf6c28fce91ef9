"""Hybrid search: merged KNN and merged full-text search fused by reciprocal rank."""

from __future__ import annotations

import pytest

import memwal_query as mq
from memwal_query.demo import category_centroids, write_demo_table
from memwal_query.errors import InvalidArgumentError
from memwal_query.hybrid import RRF_K, rrf


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_demo_table(
        str(tmp_path_factory.mktemp("hybrid") / "events"), base_rows=1500, update_rows=200, memtable_rows=150, seed=4
    )


def test_fusion_of_the_two_merged_searches(demo: str) -> None:
    t = mq.open_table(demo)
    query = category_centroids()[3]
    got = t.search_hybrid("vec", query, "note", "late refund", k=8, depth=40, columns=["id", "note"])
    assert got.column_names == ["id", "note", "_distance", "_score", "_relevance_score"]
    assert {c.num_chunks for c in got.columns} == {1}  # was a chunk per row
    knn = t.nearest("vec", query, 40, columns=["id"]).column("id").to_pylist()
    fts = t.search_text("note", "late refund", 40, columns=["id"]).column("id").to_pylist()
    fused = rrf([knn, fts], RRF_K)
    want = sorted(fused, key=lambda key: -fused[key])[:8]
    assert got.column("_relevance_score").to_pylist() == pytest.approx([fused[i] for i in want])
    assert [fused[i] for i in got.column("id").to_pylist()] == pytest.approx([fused[i] for i in want])
    live = {r["id"]: r["note"] for r in t.to_arrow(columns=["id", "note"]).to_pylist()}
    assert all(live[r["id"]] == r["note"] for r in got.to_pylist())
    both = [r for r in got.to_pylist() if r["_distance"] is not None and r["_score"] is not None]
    assert all(r["id"] in knn and r["id"] in fts for r in both)


def test_filter_applies_to_both_searches(demo: str) -> None:
    t = mq.open_table(demo)
    got = t.search_hybrid("vec", category_centroids()[0], "note", "gift", k=10, filter="category = 'music'")
    assert got.num_rows == 10 and set(got.column("category").to_pylist()) == {"music"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"k": 0}, "k must be a positive integer"), ({"depth": 3}, "depth must be"), ({"rrf_k": -1}, "rrf_k")],
)
def test_bad_arguments(demo: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        mq.open_table(demo).search_hybrid("vec", category_centroids()[0], "note", "gift", **kwargs)  # type: ignore[arg-type]
