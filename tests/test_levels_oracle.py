"""Lookups and KNN where keys move across every level, checked row by row against the model.

One small table (2 bucket regions; an IVF_FLAT index on ``vec`` and a BTREE index on ``v``,
both built on the base before any write) whose keys move through every level a read merges:

* the base (generation 0);
* generation 1 of every region: merged into the base but not garbage-collected (its
  directory is still there): it must never serve a row again, except as a catch-up
  generation standing in for the base rows no index covers yet;
* generations 2 and 3, unmerged: keys updated in both, deleted in one and re-inserted in the
  other, duplicates inside one batch;
* a WAL tail: a writer left open, so its rows exist only in the WAL (strong consistency).

The oracles are independent of the code under test: the dict model of ``lsm_model`` and an
exact top-k over the model's rows computed with numpy. The writers maintain only the BTREE
index, so generations are searched flat; the base through IVF_FLAT probing every partition
(exact), flat, or with catch-up generations: every search is exact and answers are compared
row by row, in order. A twin table whose generations keep their own vector index
(IVF_HNSW_SQ, what pylance builds by default) is checked with everything but the exact order.
Every row version ever written is kept, so stale versions can be aimed at: a query vector
equal to a superseded version's vector, a filter only that old version matches.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq

from builders import build_events, plain_live_rows
from lsm_model import PK, ModelTable, sort_table

DIM = 8
NUM_PARTITIONS = 4  # IVF_FLAT: probing every partition is an exact search
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.string()),
        pa.field("v", pa.int64()),  # unique per written version: round * 1000 + position
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)
COLS = [f.name for f in SCHEMA]
Row = dict[str, Any]


class LevelTable(ModelTable):
    """The model table, also recording every version written and the round that last wrote a key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round = 0
        self.versions: list[Row] = list(self.model.values())
        self.last_write: dict[int, int] = {k: 0 for (k,) in self.model}
        self.merged: dict[str, int] = {}
        self.flushed_model: dict[tuple[Any, ...], Row] = {}

    def put(self, rows: Any, region: str | None = None) -> None:
        super().put(rows, region)
        for row in rows.to_pylist():
            self.versions.append(row)
            self.last_write[row["id"]] = self.round

    def delete(self, keys: Any, region: str | None = None) -> None:
        keys = list(keys)
        super().delete(keys, region)
        for (k,) in keys:
            self.last_write[k] = self.round


def _rows(ids: Any, tag: int, rng: np.random.Generator) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    vecs = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "cat": np.array(["x", "y", "z"])[rng.integers(0, 3, len(ids))],
            "v": tag * 1000 + np.arange(len(ids), dtype=np.int64),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), DIM),
        },
        schema=SCHEMA,
    )


def _dels(*ranges: range) -> list[tuple[int]]:
    return [(k,) for r in ranges for k in r]


def _segmented_indexes(ds: lance.LanceDataset) -> None:
    """Both indexes built one segment per fragment (Lance's distributed build), shared IVF centroids."""
    frags = [f.fragment_id for f in ds.get_fragments()]
    assert len(frags) > 1
    centroids = np.random.default_rng(5).standard_normal((NUM_PARTITIONS, DIM)).astype(np.float32)
    vec = [
        ds.create_index_uncommitted(
            "vec", "IVF_FLAT", num_partitions=NUM_PARTITIONS, ivf_centroids=centroids, fragment_ids=[f]
        )
        for f in frags
    ]
    ds.commit_existing_index_segments("vec_idx", "vec", vec)
    ds = lance.dataset(ds.uri)
    ds.commit_existing_index_segments(
        "v_idx", "v", [ds.create_index_uncommitted("v", "BTREE", fragment_ids=[f]) for f in frags]
    )


def build_levels(
    uri: str, *, generation_vector_index: bool = False, stable_row_ids: bool = False, segmented: bool = False
) -> LevelTable:
    """The table described in the module docs; its writers of round 4 stay open.

    ``generation_vector_index``: the writers also maintain the vector index (each generation
    gets its own IVF_HNSW_SQ copy, searched approximately); by default they maintain only the
    BTREE index, so every vector search is exact. ``stable_row_ids``: the base keeps stable
    row ids and is compacted before it is indexed (its row ids are not its row addresses).
    ``segmented``: the base has several fragments and each index one segment per fragment.
    """
    rng = np.random.default_rng(22)

    def indexes(ds: lance.LanceDataset) -> None:
        if segmented:
            _segmented_indexes(ds)
            return
        if stable_row_ids:
            ds.optimize.compact_files(target_rows_per_fragment=1_000_000)
            ds = lance.dataset(uri)
        ds.create_index("vec", index_type="IVF_FLAT", num_partitions=NUM_PARTITIONS)
        lance.dataset(ds.uri).create_scalar_index("v", index_type="BTREE")

    t = LevelTable(
        uri,
        SCHEMA,
        _rows(np.arange(400), 0, rng),
        bucket=("id", 2),
        max_memtable_rows=1000,
        prepare=indexes,
        maintained_indexes=None if generation_vector_index else ["v_idx"],
        write_params={"enable_stable_row_ids": True, "max_rows_per_file": 150}
        if stable_row_ids
        else {"max_rows_per_file": 150}
        if segmented
        else None,
    )
    ids = np.arange
    # round 1 -> generation 1, merged into the base below (its directory stays)
    t.round = 1
    t.put(_rows(np.r_[ids(0, 60), ids(400, 430)], 1, rng))
    t.delete(_dels(range(60, 80), range(5000, 5002)))  # present and absent keys
    t.flush()
    for r in t.regions():
        t.merge(r, 1)
        t.merged[r] = 1
    # round 2 -> generation 2: updates of keys merged in generation 1, re-inserts of keys it
    # deleted, new keys, a key twice in one batch (the later row wins)
    t.round = 2
    t.put(_rows(np.r_[ids(0, 20), ids(100, 140), ids(60, 70), ids(430, 440), [7]], 2, rng))
    t.delete(_dels(range(20, 30), range(140, 150)))
    t.flush()
    # round 3 -> generation 3: keys updated in generations 2 and 3, deleted after an update
    # in generation 2, re-inserted after a delete in generation 2
    t.round = 3
    t.put(_rows(np.r_[ids(0, 10), ids(100, 110), ids(140, 145), ids(20, 25), ids(440, 450)], 3, rng))
    t.delete(_dels(range(130, 140)))
    t.flush()
    t.flushed_model = dict(t.model)  # what an eventual read (flushed generations only) shows
    # round 4 -> the WAL tail of writers left open (also keys updated in every level)
    t.round = 4
    t.put(_rows(np.r_[ids(0, 5), ids(100, 103), ids(130, 135), ids(200, 210), ids(450, 455)], 4, rng))
    t.delete(_dels(range(5, 10), range(103, 105), range(432, 435)))
    return t


@pytest.fixture(scope="module")
def levels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    t = build_levels(str(tmp_path_factory.mktemp("levels") / "t"))
    yield t
    t.flush()


@pytest.fixture(scope="module")
def hnsw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    t = build_levels(str(tmp_path_factory.mktemp("hnsw") / "t"), generation_vector_index=True)
    yield t
    t.flush()


@pytest.fixture(scope="module")
def stable(tmp_path_factory: pytest.TempPathFactory) -> Any:
    t = build_levels(str(tmp_path_factory.mktemp("stable") / "t"), stable_row_ids=True)
    ds = lance.dataset(t.uri)
    both = ds.scanner(columns=[], with_row_id=True, with_row_address=True).to_table()
    assert ds.has_stable_row_ids and both["_rowid"] != both["_rowaddr"]
    yield t
    t.flush()


@pytest.fixture(scope="module")
def segmented(tmp_path_factory: pytest.TempPathFactory) -> Any:
    t = build_levels(str(tmp_path_factory.mktemp("segmented") / "t"), segmented=True)
    segments = {d.name: len(d.segments) for d in lance.dataset(t.uri).describe_indices()}
    assert segments["vec_idx"] > 1 and segments["v_idx"] > 1, segments
    yield t
    t.flush()


@pytest.fixture(scope="module")
def noindex(levels: LevelTable, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A copy of the table (WAL tail included) without the vector index: every search is flat."""
    uri = str(tmp_path_factory.mktemp("noindex") / "t")
    shutil.copytree(levels.uri, uri)
    lance.dataset(uri).drop_index("vec_idx")
    return uri


# -- oracles ----------------------------------------------------------------------------------


def exact_top_k(model: dict[Any, Row], q: np.ndarray, k: int, where: Callable[[Row], bool]) -> tuple[list[Row], Any]:
    """The k live rows nearest to ``q`` among those ``where`` accepts, and their squared L2 distances."""
    rows = [r for r in model.values() if where(r)]
    if not rows:
        return [], np.zeros(0)
    d = ((np.array([r["vec"] for r in rows], dtype=np.float32) - q) ** 2).sum(axis=1)
    order = np.argsort(d, kind="stable")[:k]
    return [rows[i] for i in order], d[order]


def assert_knn(
    got: pa.Table,
    model: dict[Any, Row],
    q: np.ndarray,
    k: int,
    where: Callable[[Row], bool],
    what: str,
    *,
    exact: bool = True,
) -> None:
    """Exactly the top-k live rows (all of them when fewer match), in order, each the live version.

    ``exact=False`` (a source searched through an approximate index): still exactly
    ``min(k, matching)`` distinct rows, each the live version and matching the filter, in
    ascending distance; at least k-1 of the exact top-k.
    """
    want, dist = exact_top_k(model, q, k, where)
    rows = got.to_pylist()
    for r in rows:
        assert {c: r[c] for c in COLS} == model.get((r["id"],)), f"{what}: not the live version of key {r['id']}"
    if exact:
        assert [r["id"] for r in rows] == [r["id"] for r in want], what
        np.testing.assert_allclose(got.column("_distance").to_numpy(), dist, rtol=1e-4, atol=1e-5, err_msg=what)
        return
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(want), what
    assert all(where(r) for r in rows), what
    d = got.column("_distance").to_numpy()
    assert (np.diff(d) >= 0).all(), what
    assert len(set(ids) & {r["id"] for r in want}) >= len(want) - 1, what


def _stale_versions(t: LevelTable) -> list[Row]:
    """Written versions that are not live any more (superseded or deleted)."""
    return [r for r in t.versions if t.model.get((r["id"],)) != r]


def _open(uri: str, mode: str) -> mq.Table:
    table = mq.open_table(uri)
    table.index_catchup = mode
    return table


# how the base is searched: its index + the unindexed rows flat / catch-up generations / no index;
# "generation-index": a twin table whose generations carry their own (approximate) vector index;
# "stable-row-ids": a twin whose base has stable row ids that are not its row addresses
# "segmented": a twin whose base indexes are made of one segment per fragment
SEARCHES = ["never", "always", "noindex", "generation-index", "stable-row-ids", "segmented", "segmented-always"]


def _table_for(search: str, request: pytest.FixtureRequest) -> tuple[mq.Table, LevelTable, bool]:
    """The table to search, its model, and whether every source is searched exactly."""
    if search == "generation-index":
        twin: LevelTable = request.getfixturevalue("hnsw")
        return _open(twin.uri, "never"), twin, False
    if search == "stable-row-ids":
        twin = request.getfixturevalue("stable")
        return _open(twin.uri, "never"), twin, True
    if search.startswith("segmented"):
        twin = request.getfixturevalue("segmented")
        return _open(twin.uri, "always" if search.endswith("always") else "never"), twin, True
    levels: LevelTable = request.getfixturevalue("levels")
    if search == "noindex":
        return _open(request.getfixturevalue("noindex"), "never"), levels, True
    return _open(levels.uri, search), levels, True


# -- the table is what it claims to be ----------------------------------------------------------


def test_levels_cover_every_case(levels: LevelTable) -> None:
    """The fixture holds every case the tests below rely on (checked from files, not the reader)."""
    for r in levels.regions():
        gens = dict(levels.flushed(r))
        assert sorted(gens) == [1, 2, 3]
        assert os.path.isdir(f"{levels.uri}/_mem_wal/{r}/{gens[1]}")  # merged, not collected
    assert levels.writers, "round 4 must stay in open writers (WAL tail)"
    # keys updated in generations 2 and 3 and nowhere newer: the newest generation must win
    assert levels.model[(105,)]["v"] // 1000 == 3 and levels.last_write[105] == 3
    assert (130,) not in levels.flushed_model and levels.model[(130,)]["v"] // 1000 == 4


# -- lookups ----------------------------------------------------------------------------------


def test_lookup_every_key_ever_written(levels: LevelTable) -> None:
    table = mq.open_table(levels.uri)
    keys = sorted(levels.last_write) + [-1, 10**9]
    got = table.lookup(keys).to_pylist()
    by_id = {r["id"]: r for r in got}
    assert len(by_id) == len(got), "a key returned twice"
    for k in keys:
        assert by_id.get(k) == levels.model.get((k,)), f"key {k}, last written in round {levels.last_write.get(k)}"
    # one key at a time (a single key takes no batch shortcut), every key a later round touched
    for k in sorted(k for k, rnd in levels.last_write.items() if rnd > 0):
        one = table.lookup(k).to_pylist()
        assert one == ([levels.model[(k,)]] if (k,) in levels.model else []), k
    # a projection returns the same versions
    got = table.lookup(keys, columns=["v"]).column("v").to_pylist()
    assert sorted(got) == sorted(r["v"] for r in levels.model.values() if r["id"] in set(keys))


def test_stable_row_ids_lookups_and_sql(stable: LevelTable) -> None:
    table = mq.open_table(stable.uri)
    keys = sorted(stable.last_write) + [-1, 10**9]
    by_id = {r["id"]: r for r in table.lookup(keys).to_pylist()}
    assert by_id == {k: stable.model[(k,)] for k in keys if (k,) in stable.model}
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    rows = ctx.sql("SELECT * FROM t ORDER BY id").to_pylist()
    assert rows == [stable.model[k] for k in sorted(stable.model)]
    got = ctx.sql("SELECT * FROM t WHERE v >= 1000 AND v < 2000 ORDER BY id").to_pylist()
    assert got == [r for _, r in sorted(stable.model.items()) if 1000 <= r["v"] < 2000]
    for sql in ["SELECT count(*) AS n FROM t", "SELECT count(*) AS n FROM t WHERE v >= 0"]:
        assert ctx.sql(sql).to_pylist() == [{"n": len(stable.model)}], sql


def test_lookup_eventual_reads_flushed_generations_only(levels: LevelTable) -> None:
    table = mq.open_table(levels.uri, consistency="eventual")
    keys = sorted(levels.last_write)
    by_id = {r["id"]: r for r in table.lookup(keys).to_pylist()}
    for k in keys:
        assert by_id.get(k) == levels.flushed_model.get((k,)), k


def test_lookup_sql_function(levels: LevelTable) -> None:
    table = mq.open_table(levels.uri)
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    keys = [0, 5, 7, 15, 25, 65, 105, 130, 135, 142, 205, 433, 1234]
    got = ctx.sql(f"SELECT * FROM memwal_lookup('t', {keys}) ORDER BY id").to_pylist()
    assert got == [levels.model[(k,)] for k in keys if (k,) in levels.model]


# -- vector search ------------------------------------------------------------------------------


@pytest.mark.parametrize("search", SEARCHES)
def test_nearest_exact_against_stale_versions(search: str, request: pytest.FixtureRequest) -> None:
    """Aimed at stale versions: a query equal to an old vector, filters only the old version matches."""
    table, levels, exact = _table_for(search, request)
    stale = _stale_versions(levels)
    rng = np.random.default_rng(7)
    aimed = [r for r in stale if r["id"] in (5, 20, 105, 130, 200)]  # superseded twice, deleted, re-inserted
    picks = aimed + [stale[i] for i in rng.choice(len(stale), 8, replace=False)]
    for s in picks:
        q = np.asarray(s["vec"], dtype=np.float32)
        what = f"{search}: query at version v={s['v']} of key {s['id']}"
        got = table.nearest("vec", q, k=5, nprobes=NUM_PARTITIONS)
        assert_knn(got, levels.model, q, 5, lambda r: True, what, exact=exact)
        cat = s["cat"]
        got = table.nearest("vec", q, k=5, filter=f"cat = '{cat}'", nprobes=NUM_PARTITIONS)
        assert_knn(got, levels.model, q, 5, lambda r, c=cat: r["cat"] == c, f"{what}, cat = {cat!r}", exact=exact)
        # only the stale version has this v: nothing may match
        got = table.nearest("vec", q, k=5, filter=f"v = {s['v']}", nprobes=NUM_PARTITIONS)
        assert got.num_rows == 0, f"{what}: a superseded version matched v = {s['v']}"


@pytest.mark.parametrize("search", SEARCHES)
def test_nearest_filtered_exact(search: str, request: pytest.FixtureRequest) -> None:
    """Filters on current values, k larger and smaller than the number of matching rows."""
    table, levels, exact = _table_for(search, request)
    rng = np.random.default_rng(8)
    cases: list[tuple[str, Callable[[Row], bool], int]] = [
        ("id < 12", lambda r: r["id"] < 12, 20),  # fewer live rows than k: all of them
        ("id >= 100 AND id < 150", lambda r: 100 <= r["id"] < 150, 30),
        ("cat = 'y' AND v >= 2000", lambda r: r["cat"] == "y" and r["v"] >= 2000, 10),
        ("v >= 1000 AND v < 2000", lambda r: 1000 <= r["v"] < 2000, 10),  # live rows of merged generation 1
        ("cat = 'x'", lambda r: r["cat"] == "x", 500),  # k above the table size
        ("id IN (5, 6, 7, 8, 9, 103, 104, 433)", lambda r: r["id"] in {5, 6, 7, 8, 9, 103, 104, 433}, 5),
    ]
    for sql, where, k in cases:
        q = rng.standard_normal(DIM).astype(np.float32)
        got = table.nearest("vec", q, k=k, filter=sql, nprobes=NUM_PARTITIONS)
        assert_knn(got, levels.model, q, k, where, f"{search}: {sql}, k={k}", exact=exact)
    got = table.nearest("vec", rng.standard_normal(DIM), k=3, filter="cat = 'nope'", nprobes=NUM_PARTITIONS)
    assert got.num_rows == 0


def test_segmented_indexes_cover_the_union_of_their_segments(segmented: LevelTable) -> None:
    """An index Lance lists once per segment is one index over all their fragments: the catch-up
    plan leaves out only the fragments no segment covers, and explain names each index once."""
    ds = lance.dataset(segmented.uri)
    want = {d.name: {int(f) for s in d.segments for f in s.fragment_ids} for d in ds.describe_indices()}
    table = _open(segmented.uri, "always")
    assert {i.name: set(i.fragment_ids) for i in table.base_indexes()} == {
        "vec_idx": want["vec_idx"],
        "v_idx": want["v_idx"],
    }
    assert len(table.base_indexes()) == 2
    uncovered = [f.fragment_id for f in ds.get_fragments() if f.fragment_id not in want["vec_idx"]]
    table.nearest("vec", np.zeros(DIM, dtype=np.float32), k=5, nprobes=NUM_PARTITIONS)
    coverage = table.last_nearest_stats.coverage  # type: ignore[union-attr]
    assert coverage is not None and list(coverage.unindexed_fragments) == uncovered and coverage.plan_used
    assert table.explain().count("index v_idx") == 1


def _lance_distance(vecs: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    """Lance's distances: squared L2, 1 - cosine similarity, 1 - dot product."""
    if metric == "cosine":
        return 1.0 - (vecs @ q) / (np.linalg.norm(vecs, axis=1) * np.linalg.norm(q))
    return 1.0 - vecs @ q


@pytest.mark.parametrize("metric", ["cosine", "dot"])
@pytest.mark.parametrize("search", SEARCHES)
def test_nearest_with_a_distance_the_index_was_not_built_for(
    search: str, metric: str, request: pytest.FixtureRequest
) -> None:
    """The base index (and the generations' own) are built for L2: Lance searches them flat for
    another distance, so every search is exact, with catch-up generations or without."""
    table, levels, _ = _table_for(search, request)
    rows = list(levels.model.values())
    vecs = np.array([r["vec"] for r in rows], dtype=np.float64)
    rng = np.random.default_rng(11)
    for _ in range(6):
        q = rng.standard_normal(DIM)
        d = _lance_distance(vecs, q, metric)
        order = np.argsort(d, kind="stable")[:8]
        got = table.nearest("vec", q, k=8, nprobes=NUM_PARTITIONS, distance=metric)
        what = f"{search}, {metric}"
        assert got.column("id").to_pylist() == [rows[i]["id"] for i in order], what
        np.testing.assert_allclose(got.column("_distance").to_numpy(), d[order], rtol=1e-4, atol=1e-5, err_msg=what)
    coverage = table.last_nearest_stats.coverage  # type: ignore[union-attr]
    assert coverage is None or not coverage.plan_used


def test_memwal_knn_sql_exact(levels: LevelTable) -> None:
    """The SQL table function against numpy over the model (not against Table.nearest)."""
    table = _open(levels.uri, "never")
    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    for s in [r for r in _stale_versions(levels) if r["id"] in (105, 130, 200)]:
        q = np.asarray(s["vec"], dtype=np.float32)
        lit = "[" + ", ".join(repr(float(x)) for x in q) + "]"
        got = ctx.sql(f"SELECT * FROM memwal_knn('t', 'vec', {lit}, 6, NULL, {NUM_PARTITIONS})").to_arrow_table()
        assert_knn(got.sort_by("_distance"), levels.model, q, 6, lambda r: True, f"memwal_knn at v={s['v']}")
        cat = s["cat"]
        sql = f"SELECT * FROM memwal_knn('t', 'vec', {lit}, 6, 'cat = ''{cat}''', {NUM_PARTITIONS})"
        got = ctx.sql(sql).to_arrow_table()
        assert_knn(got.sort_by("_distance"), levels.model, q, 6, lambda r, c=cat: r["cat"] == c, sql)
        sql = f"SELECT count(*) AS n FROM memwal_knn('t', 'vec', {lit}, 6, 'v = {s['v']}', {NUM_PARTITIONS})"
        assert ctx.sql(sql).to_pylist() == [{"n": 0}]


# -- merged, not garbage-collected generations ----------------------------------------------------


@pytest.mark.parametrize("mode", ["never", "always"])
def test_merged_generations_never_serve_rows(levels: LevelTable, mode: str) -> None:
    """Generation 1 is merged but still on storage: no access path may read it as a level again."""
    table = _open(levels.uri, mode)
    merged_only = sorted(k for k, rnd in levels.last_write.items() if rnd == 1 and (k,) in levels.model)
    assert len(merged_only) >= 40
    # SQL: every live row exactly once; none from a generation at or below its region's merged one
    ctx = datafusion.SessionContext()
    table.register(ctx, "t", hidden_columns=True)
    rows = ctx.sql("SELECT id, cat, v, vec, _gen, _region FROM t").to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(k for (k,) in levels.model)
    for r in rows:
        assert {c: r[c] for c in COLS} == levels.model[(r["id"],)]
        assert r["_gen"] == 0 or r["_gen"] > levels.merged[r["_region"]], r
    gen_of = {r["id"]: r["_gen"] for r in rows}
    assert {gen_of[k] for k in merged_only} == {0}
    # SQL through the BTREE index on v (catch-up generations serve the unindexed base rows when
    # used; a table with hidden columns never uses them)
    table.register(ctx, "p")
    got = ctx.sql("SELECT * FROM p WHERE v >= 1000 AND v < 2000 ORDER BY id").to_pylist()
    assert got == [levels.model[(k,)] for k in merged_only]
    assert (table.dataset().last_catchup is not None) == (mode == "always")
    assert ctx.sql("SELECT count(*) AS n FROM p WHERE v >= 0").to_pylist() == [{"n": len(levels.model)}]
    # lookup: found in the base, not in a generation
    got = table.lookup(merged_only).to_pylist()
    assert sorted(got, key=lambda r: r["id"]) == [levels.model[(k,)] for k in merged_only]
    stats = table.last_lookup_stats
    assert stats.generation_hits == 0 and stats.base_hits == len(merged_only), stats  # type: ignore[attr-defined]
    # KNN: aimed at rows that came from generation 1, each returned once and live
    for k in merged_only[::10]:
        q = np.asarray(levels.model[(k,)]["vec"], dtype=np.float32)
        got = table.nearest("vec", q, k=4, nprobes=NUM_PARTITIONS)
        assert_knn(got, levels.model, q, 4, lambda r: True, f"{mode}: at key {k}")
        sources = table.last_nearest_stats.sources  # type: ignore[attr-defined]
        levels_read = [s for s in sources if " generation 1" in s and "catch-up" not in s]
        assert not levels_read, sources
        catchup = [s for s in sources if "catch-up generation 1" in s]
        assert len(catchup) == (2 if mode == "always" else 0), sources


def test_plain_live_rows_equals_model(tmp_path: Path) -> None:
    """The plain-Lance oracle other tests count with agrees with the model."""
    t = build_events(str(tmp_path / "e"), seed=3, keep_open=False)
    assert sort_table(plain_live_rows(t.uri), ["id"]).equals(sort_table(t.expected(), ["id"]))


@pytest.mark.parametrize("path", ["register(cache=False)", "to_reader(filter not pushed)"])
def test_uncached_scans_of_a_base_with_stable_row_ids(stable: Any, path: str) -> None:
    """An unfiltered uncached scan leaves superseded base rows out with Lance's
    ``row_addr_blocklist``, which Lance takes as row ids on such a base: every superseded and
    deleted base row outside fragment 0 came back (also ``to_reader`` with a filter DataFusion
    answers itself)."""
    table = mq.open_table(stable.uri)
    if path == "register(cache=False)":
        ctx = datafusion.SessionContext()
        table.register(ctx, "t", cache=False)
        got = ctx.sql("SELECT id, v FROM t").to_arrow_table()
    else:
        got = table.to_reader(columns=["id", "v"], filter="v + 1 > 0").read_all()
    want = sorted((r["id"], r["v"]) for r in stable.model.values())
    assert sorted((r["id"], r["v"]) for r in got.to_pylist()) == want
