"""Searches through a base index with a filter whose column has a scalar index that covers
fewer fragments than the searched index (e.g. the vector or INVERTED index rebuilt after
merges, the BTREE on the filter column not): every fragment the searched index covers is
searched with the filter. Lance's ``fast_search`` also left out the fragments the filter's
index does not cover, and their matching rows were missing from the answer."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq

from lsm_model import PK, ModelTable

DIM = 8
WORDS = np.array(["apple", "box", "late", "refund", "gift", "red"])
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.string()),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
        pa.field("note", pa.string()),
    ]
)


def _rows(ids: np.ndarray, tag: int, rng: np.random.Generator) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    vec = rng.normal(size=(len(ids), DIM)).astype(np.float32) + (ids % 4)[:, None].astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "cat": [f"c{(int(i) * 7 + tag) % 5}" for i in ids],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), DIM),
            "note": [" ".join(rng.choice(WORDS, 3)) for _ in ids],
        },
        schema=SCHEMA,
    )


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> ModelTable:
    """BTREE on ``cat``, IVF_FLAT on ``vec`` and INVERTED on ``note`` before the MemWAL; a merge;
    the vector and text indexes rebuilt (covering the merged fragments, the BTREE not); another
    merge (the catch-up generations) and an unmerged generation."""
    rng = np.random.default_rng(3)
    uri = str(tmp_path_factory.mktemp("cov") / "t")

    def prepare(ds: lance.LanceDataset) -> None:
        ds.create_scalar_index("cat", "BTREE")
        ds.create_index("vec", "IVF_FLAT", num_partitions=4)
        ds.create_scalar_index("note", "INVERTED")

    t = ModelTable(
        uri, SCHEMA, _rows(np.arange(3000), 0, rng), bucket=("id", 2), max_memtable_rows=2000, prepare=prepare
    )
    t.put(_rows(rng.choice(3400, 500, replace=False), 1, rng))
    t.delete([(int(k),) for k in rng.choice(3000, 50, replace=False)])
    t.flush()
    t.merge_all({})
    lance.dataset(uri).create_index("vec", "IVF_FLAT", num_partitions=4, replace=True)
    lance.dataset(uri).create_scalar_index("note", "INVERTED", replace=True)
    t.put(_rows(rng.choice(3400, 300, replace=False), 3, rng))
    t.delete([(int(k),) for k in rng.choice(3400, 30, replace=False)])
    t.flush()
    t.merge_all({})
    t.put(_rows(rng.choice(3400, 200, replace=False), 4, rng))
    t.flush()
    indexes = {i.name: {f for s in i.segments for f in s.fragment_ids} for i in lance.dataset(uri).describe_indices()}
    assert indexes["cat_idx"] < indexes["vec_idx"]  # what the tests are about
    assert indexes["cat_idx"] < indexes["note_idx"]
    return t


@pytest.mark.parametrize("catchup", ["always", "never"])
def test_filtered_vector_search_through_a_rebuilt_index(rebuilt: ModelTable, catchup: str) -> None:
    rng = np.random.default_rng(9)
    live = list(rebuilt.model.values())
    keys = np.array([r["id"] for r in live])
    vecs = np.array([r["vec"] for r in live], dtype=np.float32)
    cats = np.array([r["cat"] for r in live])
    table = mq.open_table(rebuilt.uri).with_index_catchup(catchup)
    if catchup == "always":
        assert table.catchup_plan("vec_idx").usable
    for _ in range(12):
        q = rng.normal(size=DIM).astype(np.float32) + 1
        d = np.where(cats == "c2", ((vecs - q) ** 2).sum(1), np.inf)
        want = sorted(keys[np.argsort(d, kind="stable")[:10]].tolist())
        got = table.nearest("vec", q, k=10, nprobes=4, refine_factor=4, filter="cat = 'c2'")
        assert sorted(got.column("id").to_pylist()) == want
        assert all(r["cat"] == "c2" for r in got.to_pylist())


@pytest.mark.parametrize("word", ["apple", "refund"])
def test_filtered_text_search_through_a_rebuilt_index(rebuilt: ModelTable, word: str) -> None:
    table = mq.open_table(rebuilt.uri)
    want = sorted(r["id"] for r in rebuilt.model.values() if r["cat"] == "c1" and word in r["note"].split())
    got = table.search_text("note", word, k=len(rebuilt.model), filter="cat = 'c1'")
    assert sorted(got.column("id").to_pylist()) == want and want
