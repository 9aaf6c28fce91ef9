"""Vector search with a lagging merger, on clustered vectors, against numpy over the model.

One table written with pylance's writer: a base of clustered vectors (a Gaussian
mixture) with an IVF_PQ index; per region one large generation (pylance's writer
builds its own vector index) and many small ones (updates of hot keys that move
vectors to another cluster, new keys, deletes); a WAL tail. Oracle: exact search with
numpy over the model's live rows. Every returned row must be the live version, its
``_distance`` exact; with ``refine_factor`` recall@10 >= 0.95; rows of the newer
levels (searched exactly in memory when every partition is probed) are never missed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
import memwal_query.vector_pool as vector_pool

from lsm_model import PK, ModelTable

DIM = 16
CLUSTERS = 8
PARTITIONS = 8
SMALL_ROUNDS = 18
CENTERS = np.random.default_rng(42).standard_normal((CLUSTERS, DIM)).astype(np.float32) * 2


def _schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("vec", pa.list_(pa.float32(), DIM)),
        ]
    )


def _mixture(rng: np.random.Generator, n: int) -> np.ndarray:
    c = rng.choice(CLUSTERS, n, p=np.array([8, 6, 4, 3, 2, 2, 1, 1]) / 27)
    return CENTERS[c] + rng.standard_normal((n, DIM)).astype(np.float32) * 0.4


def _rows(ids: Any, rng: np.random.Generator) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    v = _mixture(rng, len(ids))
    return pa.table(
        {
            "id": ids,
            "cat": np.array(["x", "y", "z"])[ids % 3],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), DIM),
        },
        schema=_schema(),
    )


class Lagging:
    """The model table and the keys written after the base (the newer levels' rows)."""

    def __init__(self, t: ModelTable) -> None:
        self.t = t
        self.newer: set[int] = set()

    def put(self, rows: pa.Table) -> None:
        self.t.put(rows)
        self.newer |= set(rows.column("id").to_pylist())


@pytest.fixture(scope="module")
def lagging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lagging]:
    rng = np.random.default_rng(7)
    uri = str(tmp_path_factory.mktemp("lagging") / "t")

    def index(ds: lance.LanceDataset) -> None:
        ds.create_index("vec", index_type="IVF_PQ", num_partitions=PARTITIONS, num_sub_vectors=4)

    base = _rows(np.arange(3000), rng)
    t = ModelTable(uri, _schema(), base, bucket=("id", 2), max_memtable_rows=5000, prepare=index)
    lag = Lagging(t)
    lag.put(_rows(rng.choice(3500, 1600, replace=False), rng))  # one large generation per region
    t.flush()
    hot = rng.choice(3500, 200, replace=False)
    for _ in range(SMALL_ROUNDS):  # small generations: hot keys moved again, new keys, deletes
        ids = np.unique(np.concatenate([rng.choice(hot, 20, replace=False), rng.choice(4000, 30, replace=False)]))
        lag.put(_rows(ids, rng))
        t.delete([(int(k),) for k in rng.choice(4000, 5, replace=False)])
        t.flush()
    lag.put(_rows(rng.choice(4000, 60, replace=False), rng))  # WAL tail
    yield lag
    t.flush()


@pytest.fixture
def large_is_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test table's large generations (~800 rows) count as large: searched by their own index."""
    monkeypatch.setattr(vector_pool, "LARGE_GENERATION_ROWS", 500)


def _live(model: dict[Any, dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    rows = list(model.values())
    return np.array([r["id"] for r in rows]), np.array([r["vec"] for r in rows], dtype=np.float32)


def _check(table: mq.Table, lag: Lagging, q: np.ndarray, got: pa.Table, *, newer_exact: bool) -> float:
    """Every row live, distances exact and ascending; returns recall@10 against numpy."""
    model = lag.t.model
    ids, mat = _live(model)
    dist = ((mat - q) ** 2).sum(axis=1)
    assert got.num_rows == 10
    rows = got.to_pylist()
    for r in rows:
        assert model.get((r["id"],)) == {k: r[k] for k in ("id", "cat", "vec")}, f"stale or deleted row {r['id']}"
        want = float(((np.asarray(r["vec"], dtype=np.float32) - q) ** 2).sum())
        assert r["_distance"] == pytest.approx(want, rel=1e-4, abs=1e-4)
    d = [r["_distance"] for r in rows]
    assert d == sorted(d)
    if newer_exact:  # the newer levels are searched exactly: none of their rows closer than the 10th is missed
        returned = {r["id"] for r in rows}
        closer = {int(i) for i, x in zip(ids, dist, strict=True) if x < d[-1] * (1 - 1e-4) and int(i) in lag.newer}
        assert closer <= returned, f"newer rows missed: {sorted(closer - returned)}"
    exact = set(ids[np.argsort(dist)[:10]].tolist())
    return len(exact & {r["id"] for r in rows}) / 10


def _queries(n: int, seed: int = 3) -> np.ndarray:
    return _mixture(np.random.default_rng(seed), n)


def test_lagging_merger_has_many_generations(lagging: Lagging) -> None:
    view = mq.open_table(lagging.t.uri).view
    gens = [g for r in view.snapshot.regions for g in r.generations]
    assert len(gens) >= 2 * SMALL_ROUNDS
    assert sum(g.num_rows >= 500 for g in gens) == 2
    assert all(g.dataset.describe_indices() for g in gens), "pylance's writer indexes every generation"


def test_refine_recall_and_exact_distances(lagging: Lagging, large_is_small: None) -> None:
    table = mq.open_table(lagging.t.uri)
    recalls = []
    for q in _queries(20):
        got = table.nearest("vec", q, k=10, nprobes=PARTITIONS, refine_factor=10)
        recalls.append(_check(table, lagging, q, got, newer_exact=False))
    assert np.mean(recalls) >= 0.95, recalls
    stats = table.last_nearest_stats
    assert stats is not None and stats.memory is not None
    assert len(stats.memory.indexed) == 2 and len(stats.memory.pooled) >= 2 * SMALL_ROUNDS
    assert any("its index" in s for s in stats.sources) and any("in memory" in s for s in stats.sources)
    assert any("memtable" in s for s in stats.sources)


def test_pool_is_exact_when_every_partition_is_probed(lagging: Lagging) -> None:
    table = mq.open_table(lagging.t.uri)  # every generation in memory (none reaches 100,000 rows)
    recalls = []
    for q in _queries(15, seed=4):
        got = table.nearest("vec", q, k=10, nprobes=PARTITIONS, refine_factor=20)
        recalls.append(_check(table, lagging, q, got, newer_exact=True))
    assert np.mean(recalls) >= 0.95, recalls
    stats = table.last_nearest_stats
    assert stats is not None and stats.memory is not None and not stats.memory.indexed


def test_probing_fewer_partitions_keeps_recall_of_the_base(lagging: Lagging) -> None:
    """nprobes < partitions: the pool probes the base index's nearest centroids like the base does."""
    table = mq.open_table(lagging.t.uri)
    base = lance.dataset(lagging.t.uri)
    ids, mat = _live(lagging.t.model)
    base_rows = base.to_table(columns=["id", "vec"])
    bids = base_rows.column("id").to_numpy()
    bmat = np.array(base_rows.column("vec").to_pylist(), dtype=np.float32)
    ours, theirs = [], []
    for q in _queries(30, seed=5):
        got = table.nearest("vec", q, k=10, nprobes=2)
        ours.append(_check(table, lagging, q, got, newer_exact=False))
        b = base.to_table(nearest={"column": "vec", "q": q, "k": 10, "nprobes": 2}, columns=["id"])
        exact = set(bids[np.argsort(((bmat - q) ** 2).sum(axis=1))[:10]].tolist())
        theirs.append(len(exact & set(b.column("id").to_pylist())) / 10)
    assert np.mean(ours) >= np.mean(theirs) - 0.02, (np.mean(ours), np.mean(theirs))


def test_over_budget_generations_searched_through_lance(lagging: Lagging, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMWAL_KNN_MEMORY_MB", "0")
    table = mq.open_table(lagging.t.uri)
    for q in _queries(8, seed=6):
        got = table.nearest("vec", q, k=10, nprobes=PARTITIONS, refine_factor=20)
        _check(table, lagging, q, got, newer_exact=True)
    stats = table.last_nearest_stats
    assert stats is not None and stats.memory is not None
    assert not stats.memory.pooled and len(stats.memory.over_budget) >= 2 * SMALL_ROUNDS
    assert "0 MB budget" in table.explain()


def test_explain_reports_the_memory_budget(lagging: Lagging) -> None:
    text = mq.open_table(lagging.t.uri).explain()
    line = next(ln for ln in text.splitlines() if "KNN on vec" in ln)
    assert "MB of a 1,024 MB budget" in line and f"{2 * SMALL_ROUNDS + 2} generations" in line


def test_refresh_reuses_generation_parts(lagging: Lagging) -> None:
    """A refresh reads only the new generation into memory; answers follow the new writes."""
    table = mq.open_table(lagging.t.uri)
    q = _queries(1, seed=8)[0]
    table.nearest("vec", q, k=10, nprobes=PARTITIONS)
    before = {k: v for k, v in table.view.cache.vector_parts.items() if k[0] == "part"}
    rng = np.random.default_rng(11)
    near = _rows(np.arange(9000, 9005), rng)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.tile(q + 0.01, 5)), DIM)
    lagging.put(near.set_column(2, "vec", vec))
    lagging.t.flush()
    fresh = table.refresh()
    got = fresh.nearest("vec", q, k=10, nprobes=PARTITIONS, refine_factor=20)
    _check(fresh, lagging, q, got, newer_exact=True)
    assert set(range(9000, 9005)) <= set(got.column("id").to_pylist())
    after = {k: v for k, v in fresh.view.cache.vector_parts.items() if k[0] == "part"}
    assert all(after[k] is v for k, v in before.items())  # the same objects: not read again
    assert len(after) > len(before)  # plus the new generations


def test_vector_matrix_zeroes_null_vectors_and_null_elements_of_any_slice() -> None:
    from memwal_query.vector_distance import vector_matrix

    rng = np.random.default_rng(5)
    n, dim = 50, 4
    values = rng.random(n * dim).astype(np.float32)
    element_null = rng.random(n * dim) < 0.05
    row_null = rng.random(n) < 0.2
    child = pa.array(values, pa.float32(), mask=element_null)
    for nulls_inside in (True, False):
        vals = child if nulls_inside else pa.array(values)
        arr = pa.FixedSizeListArray.from_arrays(vals, dim, mask=pa.array(row_null))
        want = np.where(element_null & nulls_inside, 0, values).reshape(n, dim)
        want[row_null] = 0
        cases = [
            (arr, slice(None)),
            (arr.slice(7, 30), slice(7, 37)),
            (pa.chunked_array([arr[:9], arr[9:]]), slice(None)),
        ]
        for col, rows in cases:
            mat, valid = vector_matrix(col, dim)
            assert mat.dtype == np.float32 and mat.flags["C_CONTIGUOUS"]
            np.testing.assert_array_equal(mat, want[rows])
            np.testing.assert_array_equal(valid, ~row_null[rows])
    # other float types take the copying path: NaN and infinite values in valid vectors stay
    odd = np.array([[np.inf, 1.0], [np.nan, 2.0], [3.0, 4.0]])
    for typ in (pa.float64(), pa.float16()):
        vals = pa.array(odd.ravel(), typ, mask=np.array([False, False, False, True, False, False]))
        mat, valid = vector_matrix(pa.FixedSizeListArray.from_arrays(vals, 2, mask=pa.array([False, False, True])), 2)
        np.testing.assert_array_equal(mat, np.array([[np.inf, 1.0], [np.nan, 0.0], [0.0, 0.0]], np.float32))
        assert valid.tolist() == [True, True, False]


def test_held_large_generations_answer_as_lance_reads_them(
    lagging: Lagging, large_is_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large generations held in memory give the rows and distances of the same search read through Lance."""
    import dataclasses

    import memwal_query.vector as vector
    import memwal_query.vector_levels as vector_levels

    held = mq.open_table(lagging.t.uri)
    plan = vector.knn_memory(held, "vec")
    assert len(plan.held) == 2 and set(plan.held) == set(plan.indexed)
    assert "2 of them held in memory" in plan.describe()
    q0 = _queries(1, seed=13)[0]
    _check(held, lagging, q0, held.nearest("vec", q0, k=10, nprobes=2), newer_exact=False)
    stats = held.last_nearest_stats  # the first search does not wait: it read them through Lance
    assert stats is not None and not any("rows held in memory" in s for s in stats.sources)
    vector.wait_warm()  # read in the background after it (and the base mask decided)
    answers = []
    for q in _queries(12, seed=12):
        got = held.nearest("vec", q, k=10, nprobes=2)
        _check(held, lagging, q, got, newer_exact=False)
        answers.append(got)
    stats = held.last_nearest_stats
    assert stats is not None and sum("rows held in memory" in s for s in stats.sources) == 2

    plan_pool = vector_levels.plan_pool
    monkeypatch.setattr(vector_levels, "plan_pool", lambda *a: dataclasses.replace(plan_pool(*a), held=()))
    read = mq.open_table(lagging.t.uri)
    read.nearest("vec", q0, k=10, nprobes=2)
    vector.wait_warm()  # the same base search as above (by address, the mask decided)
    for q, want in zip(_queries(12, seed=12), answers, strict=True):
        got = read.nearest("vec", q, k=10, nprobes=2)
        assert got.column("id").to_pylist() == want.column("id").to_pylist()
        np.testing.assert_allclose(got.column("_distance").to_numpy(), want.column("_distance").to_numpy(), rtol=1e-6)
    stats = read.last_nearest_stats
    assert stats is not None and not any("rows held in memory" in s for s in stats.sources)


def test_held_rows_found_by_address_in_any_order() -> None:
    from memwal_query.errors import MemWalError
    from memwal_query.vector_pool import Partitioning, part_of

    rng = np.random.default_rng(1)
    rows = _rows(np.arange(6), rng)
    addrs = np.array([5, 1, 4, 0, (1 << 32) | 2, 3], dtype=np.uint64)  # two fragments, out of order
    snap = type("Snap", (), {"schema": _schema()})()
    part = part_of(rows.append_column("_rowaddr", pa.array(addrs)), "vec", snap, Partitioning(None, False, "flat"))
    want = np.array([4, 0, 3, 2, 1])
    np.testing.assert_array_equal(part.positions(addrs[want], "generation 3"), want)
    with pytest.raises(MemWalError, match="generation 3: its index returned rows it does not hold"):
        part.positions(np.array([2], dtype=np.uint64), "generation 3")


def test_base_hits_told_live_by_address_once_the_mask_is_decided(lagging: Lagging) -> None:
    """Newer keys outnumber half the base: after a first search the base mask is decided in the
    background, and later searches drop superseded base hits by address (with and without refine)."""
    import memwal_query.vector as vector

    table = mq.open_table(lagging.t.uri)
    view = table.view
    assert len(view.merge.newer) >= 0.5 * lance.dataset(lagging.t.uri).count_rows()
    assert not view.merge.base_mask.status().complete and not view.merge.base_mask.all_known
    table.nearest("vec", _queries(1, seed=14)[0], k=10, nprobes=2)
    vector.wait_warm()
    assert view.merge.base_mask.status().complete and view.merge.base_mask.all_known
    for q in _queries(10, seed=15):
        _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=2), newer_exact=False)
        _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=2, refine_factor=5), newer_exact=False)


def test_background_read_stops_when_told_and_can_be_claimed_again(lagging: Lagging, large_is_small: None) -> None:
    import memwal_query.vector as vector
    from memwal_query.vector_pool import Partitioning, claim_part, ready_part, warm_part

    view = mq.open_table(lagging.t.uri).view
    flat = Partitioning(None, False, "flat")
    g = vector.knn_memory(view, "vec").held[0]
    assert claim_part(g, "vec", view.cache, flat) and not claim_part(g, "vec", view.cache, flat)
    warm_part(g, "vec", view.snapshot, view.cache, flat, stop=lambda: True)  # the interpreter exiting
    assert ready_part(g, "vec", view.cache, flat) is None
    assert claim_part(g, "vec", view.cache, flat)  # not left marked as being read
    warm_part(g, "vec", view.snapshot, view.cache, flat, stop=lambda: False)
    part = ready_part(g, "vec", view.cache, flat)
    assert part is not None and part.table.num_rows == g.num_rows


def test_exit_right_after_a_search_is_clean(lagging: Lagging) -> None:
    """A process that exits while the first search's background reads are queued exits cleanly."""
    import subprocess
    import sys

    script = (
        "import numpy as np, memwal_query as mq, memwal_query.vector_pool as vp\n"
        "vp.LARGE_GENERATION_ROWS = 500\n"
        f"t = mq.open_table({lagging.t.uri!r})\n"
        "print(t.nearest('vec', np.zeros(16, np.float32), k=3, nprobes=2).num_rows)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "3"
    assert "panic" not in proc.stderr.lower() and "Traceback" not in proc.stderr


def test_background_reads_can_be_turned_off(
    lagging: Lagging, large_is_small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MEMWAL_KNN_BACKGROUND=0: the first search reads the pool, the held rows and the base mask itself."""
    import memwal_query.vector as vector

    monkeypatch.setenv("MEMWAL_KNN_BACKGROUND", "0")
    table = mq.open_table(lagging.t.uri)
    q = _queries(1, seed=16)[0]
    _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=2), newer_exact=False)
    first = table.last_nearest_stats
    assert first is not None and not any("flat for now" in s for s in first.sources)  # the pool read first
    assert table.view.merge.base_mask.all_known  # no wait_warm(): decided before nearest returned
    _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=2), newer_exact=False)
    stats = table.last_nearest_stats
    assert stats is not None and sum("rows held in memory" in s for s in stats.sources) == 2
    assert len(vector.knn_memory(table, "vec").held) == 2


def test_first_search_does_not_wait_for_the_pool(lagging: Lagging) -> None:
    """A first search searches the small generations through Lance (flat, exact) and the MemTables
    in memory; the pool is read in the background and serves the searches after it."""
    import memwal_query.vector as vector

    table = mq.open_table(lagging.t.uri)
    qs = _queries(6, seed=21)
    _check(table, lagging, qs[0], table.nearest("vec", qs[0], k=10, nprobes=2), newer_exact=True)
    stats = table.last_nearest_stats
    assert stats is not None and stats.memory is not None
    small = len(stats.memory.pooled)
    assert small >= 2 * SMALL_ROUNDS
    assert sum(s.endswith("(flat for now)") for s in stats.sources) == small
    assert [s for s in stats.sources if s.startswith("in memory")] == [
        s for s in stats.sources if s.startswith("in memory") and s.endswith("memtable")
    ]  # the MemTables alone
    vector.wait_warm()
    for q in qs[1:]:
        _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=PARTITIONS), newer_exact=True)
        _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=2), newer_exact=False)
    stats = table.last_nearest_stats
    assert stats is not None and not any("flat for now" in s for s in stats.sources)
    assert any(s.startswith("in memory, exact") and f"{small} generations" in s for s in stats.sources)


def test_refreshed_snapshot_lays_out_the_pool_at_once(lagging: Lagging) -> None:
    """Generations read for an earlier snapshot are not searched through Lance again."""
    import memwal_query.vector as vector

    table = mq.open_table(lagging.t.uri)
    table.nearest("vec", _queries(1, seed=22)[0], k=10, nprobes=2)
    vector.wait_warm()
    again = table.refresh()
    q = _queries(1, seed=23)[0]
    _check(again, lagging, q, again.nearest("vec", q, k=10, nprobes=PARTITIONS), newer_exact=True)
    stats = again.last_nearest_stats
    assert stats is not None and not any("flat for now" in s for s in stats.sources)


def test_pool_read_stopped_at_exit_is_claimed_again(lagging: Lagging, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool read stopped by an exiting interpreter keeps nothing; the next search starts it again."""
    import threading

    import memwal_query.vector as vector
    import memwal_query.vector_background as background

    class ExitsSoon:
        """The interpreter starts exiting after a few checks (mid-read)."""

        def __init__(self) -> None:
            self.calls = 0

        def is_set(self) -> bool:
            self.calls += 1
            return self.calls > 4

    monkeypatch.setenv("MEMWAL_KNN_BACKGROUND", "1")
    table = mq.open_table(lagging.t.uri)
    q = _queries(1, seed=24)[0]
    exits = ExitsSoon()
    monkeypatch.setattr(background, "EXITING", exits)
    table.nearest("vec", q, k=10, nprobes=2)
    vector.wait_warm()
    assert exits.calls > 4  # it started, then stopped
    monkeypatch.setattr(background, "EXITING", threading.Event())
    table.nearest("vec", q, k=10, nprobes=2)
    stats = table.last_nearest_stats
    assert stats is not None and any(s.endswith("(flat for now)") for s in stats.sources)  # nothing kept
    vector.wait_warm()  # claimed again by that search: read to the end this time
    _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=PARTITIONS), newer_exact=True)
    stats = table.last_nearest_stats
    assert stats is not None and not any("flat for now" in s for s in stats.sources)


def test_searches_from_several_threads_while_the_pool_is_read(lagging: Lagging) -> None:
    """Searches on several threads of a fresh table (the pool read in the background meanwhile)
    all equal the model, on whichever path each one took (the base's hits may differ between
    the paths: its index is approximate and the base mask, decided meanwhile, changes how
    many it is asked for)."""
    from concurrent.futures import ThreadPoolExecutor

    import memwal_query.vector as vector

    table = mq.open_table(lagging.t.uri)
    qs = _queries(24, seed=25)

    def search(q: np.ndarray) -> pa.Table:
        return table.nearest("vec", q, k=10, nprobes=PARTITIONS)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(search, qs))
    vector.wait_warm()
    for q, got in zip(qs, answers, strict=True):
        _check(table, lagging, q, got, newer_exact=True)
        _check(table, lagging, q, search(q), newer_exact=True)  # from the pool now
    stats = table.last_nearest_stats
    assert stats is not None and not any("flat for now" in s for s in stats.sources)


def test_base_live_rows_held_answer_as_lance_reads_them(lagging: Lagging, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the base's live rows held in memory, searches return the rows and distances of the
    same searches taking the base's live hits from Lance."""
    import memwal_query.vector as vector
    from memwal_query.describe import describe_table

    table = mq.open_table(lagging.t.uri)
    table.nearest("vec", _queries(1, seed=26)[0], k=10, nprobes=2)
    vector.wait_warm()  # the mask, then the live rows
    table.nearest("vec", _queries(1, seed=26)[0], k=10, nprobes=2)  # a search of the decided mask
    vector.wait_warm()
    view = table.view
    base_rows = lance.dataset(lagging.t.uri).count_rows()
    text = next(k["text"] for k in describe_table(table)["knn_memory"] if k["column"] == "vec")
    live = base_rows - view.merge.base_mask.count()
    assert f"the base's {live:,} live rows held in memory for KNN on vec" in text
    answers = []
    for q in _queries(10, seed=27):
        for refine in (None, 5):
            got = table.nearest("vec", q, k=10, nprobes=2, refine_factor=refine)
            _check(table, lagging, q, got, newer_exact=False)
            answers.append(got)
    stats = table.last_nearest_stats
    assert stats is not None and any("its live rows in memory" in s for s in stats.sources)

    monkeypatch.setattr(vector, "held_base", lambda *a: None)  # the hits' rows from Lance
    for (q, refine), want in zip(((q, r) for q in _queries(10, seed=27) for r in (None, 5)), answers, strict=True):
        got = table.nearest("vec", q, k=10, nprobes=2, refine_factor=refine)
        assert got.column("id").to_pylist() == want.column("id").to_pylist()
        assert got.column("cat").to_pylist() == want.column("cat").to_pylist()
        np.testing.assert_allclose(got.column("_distance").to_numpy(), want.column("_distance").to_numpy(), rtol=1e-6)
    stats = table.last_nearest_stats
    assert stats is not None and not any("its live rows in memory" in s for s in stats.sources)


def test_base_live_rows_not_held_over_the_budget(lagging: Lagging, monkeypatch: pytest.MonkeyPatch) -> None:
    import memwal_query.vector as vector
    from memwal_query.describe import describe_table

    monkeypatch.setenv("MEMWAL_KNN_MEMORY_MB", "0.05")  # the pool itself is over it too: Lance searches
    table = mq.open_table(lagging.t.uri)
    for q in _queries(3, seed=28):
        _check(table, lagging, q, table.nearest("vec", q, k=10, nprobes=2), newer_exact=False)
        vector.wait_warm()
    text = next(k["text"] for k in describe_table(table)["knn_memory"] if k["column"] == "vec")
    assert "the base's live rows are not held for KNN on vec: over the memory budget" in text
    stats = table.last_nearest_stats
    assert stats is not None and not any("its live rows in memory" in s for s in stats.sources)


def test_base_rows_of_another_base_version_are_forgotten(lagging: Lagging, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live rows kept for an older base version (a merge wrote a new one) are dropped by the next
    search, also when the base's hits are no longer told live by address."""
    import memwal_query.vector as vector

    table = mq.open_table(lagging.t.uri)
    view = table.view
    base = view.snapshot.base
    older = ("base-part", base.uri, int(base.version) - 1, "vec")
    other_column = ("base-part", base.uri, int(base.version) - 1, "other")
    with view.cache.lock:
        view.cache.vector_parts[older] = "rows of an older version"
        view.cache.vector_parts[other_column] = "rows of another column"
    monkeypatch.setattr(vector, "_by_address", lambda _view: False)
    table.nearest("vec", _queries(1, seed=29)[0], k=10, nprobes=2)
    vector.wait_warm()
    with view.cache.lock:
        assert older not in view.cache.vector_parts
        assert other_column in view.cache.vector_parts  # only the searched column's
        assert not any(k[0] == "base-part" and k[3] == "vec" for k in view.cache.vector_parts)  # nothing read
