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


def test_every_search_takes_no_column_and_refuses_one_twice(demo: str) -> None:
    """``columns=[]``: the scores alone, as ``to_arrow(columns=[])`` gives the rows alone (KNN
    and text search raised Lance's "No data files" or an ArrowInvalid); a column asked for
    twice is refused on every path (text search raised a KeyError, KNN dropped the copy)."""
    t = mq.open_table(demo)
    query = category_centroids()[2]
    searches = {
        "_distance": lambda cols: t.nearest("vec", query, k=6, columns=cols),
        "_score": lambda cols: t.search_text("note", "late refund", k=6, columns=cols),
        "_relevance_score": lambda cols: t.search_hybrid("vec", query, "note", "gift", k=6, columns=cols),
    }
    for score, search in searches.items():
        full = search(["id"])
        bare = search([])
        assert bare.column_names == [c for c in full.column_names if c != "id"], score
        assert bare.num_rows == full.num_rows == 6
        assert bare.column(score).to_pylist() == full.column(score).to_pylist()
        for cols in (["id", "id"], ["note", "id", "note"]):
            with pytest.raises(InvalidArgumentError, match="asked for more than once"):
                search(cols)
        with pytest.raises(InvalidArgumentError, match="unknown column"):
            search(["nope"])
