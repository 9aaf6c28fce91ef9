"""The lazy base mask: opening reads no base key; base shadowing is decided per fragment
when a query first needs it, and stays right across refresh, merge and garbage collection.

Tables are written by pylance's MemWAL writer; every answer is compared with the dict
model (``lsm_model.ModelTable``), counts also with plain Lance reads of the live rows.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lance
import lance.fragment
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq
import memwal_query.base_reads as base_reads_module
import memwal_query.snapshot.cache as snapshot_cache
from memwal_query import kept_masks
from memwal_query.base_mask import BaseMask
from memwal_query.describe import describe_table
from memwal_query.scan.balance import ChainFragment
from memwal_query.scan.group import SMALL_SOURCE_ROWS
from memwal_query.scan.indexed_base import IndexedBaseFragment

from builders import events_schema, rows
from lsm_model import PK, ModelTable, sort_table


def _build(path: str, *, key_index: bool, seed: int = 3) -> ModelTable:
    """4 regions, a base of 3,000 rows (BTREE on ``id`` or not), merged and unmerged
    generations that update and delete base keys, and an open writer (WAL tail)."""
    rng = np.random.default_rng(seed)
    base = pa.Table.from_pylist(rows(range(3000), 0, rng), schema=events_schema())

    def prepare(ds: lance.LanceDataset) -> None:
        if key_index:
            ds.create_scalar_index("id", "BTREE")

    t = ModelTable(path, events_schema(), base, bucket=("id", 4), max_memtable_rows=200, prepare=prepare)
    t.put(rows(rng.choice(3400, 500, replace=False), 1, rng))
    t.delete([(int(k),) for k in rng.choice(3000, 50, replace=False)])
    t.flush()
    for r in t.regions()[:2]:  # two regions merged: new base fragments and deletion files
        t.merge(r, t.flushed(r)[0][0])
    t.put(rows(rng.choice(3400, 400, replace=False), 2, rng))
    t.delete([(int(k),) for k in rng.choice(3400, 30, replace=False)])
    t.flush()
    t.put(rows(rng.choice(3400, 80, replace=False), 3, rng))  # left open: WAL tail
    t.delete([(int(k),) for k in rng.choice(3000, 10, replace=False)])
    return t


@pytest.fixture(autouse=True)
def _no_kept_masks(monkeypatch: pytest.MonkeyPatch) -> None:
    """How a mask is decided when none is kept on this machine for the snapshot (those are
    taken whole: tests/test_kept_masks.py)."""
    monkeypatch.setattr(kept_masks, "keeping", lambda: False)


@pytest.fixture(scope="module", params=[False, True], ids=["no-key-index", "btree-on-key"])
def table(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelTable]:
    t = _build(str(tmp_path_factory.mktemp("lazy") / "t"), key_index=request.param)
    yield t
    t.flush()


class _BaseReads:
    """Records every Lance read of the base table (dataset or fragment level) and its columns."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, uri: str) -> None:
        self.uri = str(Path(uri).resolve())
        self.reads: list[tuple[str, list[str] | None]] = []
        self.filters: list[str] = []  # the filters handed to Lance, as text
        for cls, name in [
            (lance.LanceDataset, "to_table"),
            (lance.LanceDataset, "scanner"),
            (lance.fragment.LanceFragment, "to_table"),
            (lance.fragment.LanceFragment, "scanner"),
            (lance.fragment.LanceFragment, "take"),
        ]:
            monkeypatch.setattr(cls, name, self._spy(getattr(cls, name), name))

    def _is_base(self, obj: Any) -> bool:
        ds = obj if isinstance(obj, lance.LanceDataset) else getattr(obj, "_ds", None)
        uri = getattr(ds, "uri", None)
        return uri is not None and str(Path(str(uri).removeprefix("file://")).resolve()) == self.uri

    def _spy(self, real: Any, name: str) -> Any:
        def spy(obj: Any, *a: Any, **k: Any) -> Any:
            if self._is_base(obj):
                cols = k.get("columns")
                self.reads.append((name, list(cols) if cols is not None else None))
                if k.get("filter") is not None:
                    self.filters.append(str(k["filter"]))
            return real(obj, *a, **k)

        return spy


def _model_sum(t: ModelTable, below: float) -> float:
    e = t.expected()
    return float(pc.sum(e.filter(pc.less(e.column("amount"), below)).column("amount")).as_py() or 0.0)


def test_open_reads_no_base_key(table: ModelTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening (and describing what is decided) reads nothing from the base's columns."""
    spy = _BaseReads(monkeypatch, table.uri)
    t = mq.open_table(table.uri)
    assert spy.reads == []
    cache = t.view.cache
    assert cache.base_runs == {} and cache.fragment_columns == {}
    status = t.merge_state.base_mask.status()
    assert status.decided == 0 and status.fragments == len(lance.dataset(table.uri).get_fragments()) > 1
    assert t.merge_state.newer is not None and len(t.merge_state.newer) > 0


def test_first_queries_decide_lazily_and_match_the_model(table: ModelTable, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _BaseReads(monkeypatch, table.uri)
    t = mq.open_table(table.uri)
    want = _model_sum(table, 40.0)
    q = "SELECT sum(amount) AS s, count(*) AS n FROM t WHERE amount < 40"
    got = t.sql(q).to_arrow_table()
    assert got.column("s")[0].as_py() == pytest.approx(want)
    # the first scan read through Lance with the filter pushed down: no fragment decided
    assert t.merge_state.base_mask.status().decided == 0
    assert all(name == "scanner" for name, _ in spy.reads)
    # the second decodes the fragments (key column included) into the cache and decides them
    again = t.sql(q).to_arrow_table()
    assert again.equals(got)
    assert t.merge_state.base_mask.status().complete
    full = sort_table(t.sql("SELECT * FROM t").to_arrow_table(), ["id"])
    assert full.equals(sort_table(table.expected(), ["id"]))
    assert t.count_rows() == table.expected().num_rows


def _shadowed_by_lance(t: Any, uri: str) -> pa.Table:
    """Base rows (``id``, ``_rowaddr``) whose key a newer level holds, found with plain Lance reads."""
    base = lance.dataset(uri).to_table(columns=["id"], with_row_address=True)
    newer = set()
    for r in t.snapshot.regions:
        for g in r.generations:
            newer |= set(g.dataset.to_table(columns=["id"]).column("id").to_pylist())
        if r.memtable is not None:
            newer |= set(r.memtable.table.column("id").to_pylist())
    return base.filter(pa.array([k in newer for k in base.column("id").to_pylist()]))


def test_first_full_scan_settles_masks_from_the_rows_it_left_out(table: ModelTable) -> None:
    """An unfiltered first scan checks keys as it streams; the rows it left out become the masks."""
    t = mq.open_table(table.uri)
    full = sort_table(t.sql("SELECT id, amount FROM t").to_arrow_table(), ["id"])
    assert full.equals(sort_table(table.expected().select(["id", "amount"]), ["id"]))
    mask = t.merge_state.base_mask
    assert mask.status().complete
    assert mask.all().tolist() == sorted(_shadowed_by_lance(t, table.uri).column("_rowaddr").to_pylist())


def test_count_then_mask_equals_plain_lance(table: ModelTable) -> None:
    """count(*) decides every fragment; the full mask equals the base rows whose key is newer."""
    t = mq.open_table(table.uri)
    assert t.sql("SELECT count(*) AS n FROM t").to_arrow_table().column("n")[0].as_py() == len(table.model)
    mask = t.merge_state.base_mask
    assert mask.status().complete
    shadowed = _shadowed_by_lance(t, table.uri)
    assert mask.all().tolist() == sorted(shadowed.column("_rowaddr").to_pylist())
    assert t.merge_state.base_shadowed_rows == shadowed.num_rows


def test_count_reads_base_keys_from_the_data_files(
    table: ModelTable, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """count(*) reads each base fragment's key column from its data file and deletion file,
    not through Lance's scanner; the answer and mask equal Lance's way and the model."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path))  # no key runs kept yet (memwal_query.key_runs)
    fragments = lance.dataset(table.uri).get_fragments()
    assert any(f.metadata.deletion_file is not None for f in fragments)  # merges deleted base rows
    spy = _BaseReads(monkeypatch, table.uri)
    t = mq.open_table(table.uri)
    assert t.sql("SELECT count(*) AS n FROM t").to_arrow_table().column("n")[0].as_py() == len(table.model)
    assert spy.reads == []
    direct = t.merge_state.base_mask.all().tolist()
    assert t.merge_state.base_mask.status().key_sources == (("data files", len(fragments)),)
    # each fragment's keys compress into runs: decided from them, no table over the newer keys' span
    assert t.merge_state.base_mask.lookup_table_bytes == 0
    assert describe_table(t)["newer_keys_bytes"] == t.merge_state.newer.nbytes
    assert f"keys from data files: {len(fragments)}" in t.explain()
    again = t.refresh()
    assert again.count_rows() == len(table.model)  # a refresh reuses the keys read
    assert again.merge_state.base_mask.status().key_sources == (("earlier snapshot", len(fragments)),)
    monkeypatch.setattr(base_reads_module, "read_columns", lambda *a, **k: None)  # Lance's way
    monkeypatch.setenv("MEMWAL_CACHE_DIR", "off")
    t = mq.open_table(table.uri)
    t.view.cache.keep_base_runs(set())
    assert t.count_rows() == len(table.model)
    assert spy.reads and all(cols == ["id"] for _, cols in spy.reads)
    assert t.merge_state.base_mask.all().tolist() == direct
    assert t.merge_state.base_mask.status().key_sources == (("Lance scanner", len(fragments)),)
    table_bytes = t.merge_state.base_mask.lookup_table_bytes  # a lookup per row: the newer keys' span, a byte per value
    newer = t.merge_state.newer.sorted_numeric()
    assert newer is not None and table_bytes == int(newer[-1]) - int(newer[0]) + 1
    assert describe_table(t)["newer_keys_bytes"] == t.merge_state.newer.nbytes + table_bytes


def test_key_runs_kept_for_refresh_stay_within_their_budget(table: ModelTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Base key runs are kept for refreshed snapshots only up to a byte budget; the ones left
    out are read again by the refreshed snapshot, with the same answers."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", "off")  # every fragment's keys read (none from key runs)
    t = mq.open_table(table.uri)
    assert t.count_rows() == len(table.model)
    cache = t.view.cache
    sizes = sorted(snapshot_cache.run_bytes(r) for r in cache.base_runs.values())
    assert len(sizes) > 2 and cache.base_runs_bytes == sum(sizes)
    fresh = mq.open_table(table.uri)
    budget = sizes[0] + sizes[1]  # room for the two smallest runs at most
    monkeypatch.setattr(snapshot_cache, "BASE_RUNS_MAX_BYTES", budget)
    assert fresh.count_rows() == len(table.model)
    kept = fresh.view.cache
    assert 0 < len(kept.base_runs) < len(sizes) and kept.base_runs_bytes <= budget
    again = fresh.refresh()
    assert again.count_rows() == len(table.model)
    sources = dict(again.merge_state.base_mask.status().key_sources)
    assert sources["earlier snapshot"] == len(kept.base_runs) and sources["data files"] == len(sizes) - len(
        kept.base_runs
    )
    assert again.merge_state.base_mask.all().tolist() == t.merge_state.base_mask.all().tolist()


class _Keys:
    """Newer keys for a bare BaseMask (the KeySet protocol), checked against numpy."""

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = np.unique(keys)

    def __len__(self) -> int:
        return int(self.keys.size)

    def contains(self, keys: pa.Table) -> np.ndarray:
        return np.isin(keys.column("id").to_numpy(), self.keys)

    def sorted_numeric(self) -> np.ndarray:
        return self.keys


@pytest.mark.parametrize(
    ("newer", "table_kind"),
    [
        (np.arange(1000, 50_000, 7), "bytes"),  # a dense span: one table lookup per key
        (np.array([-(2**40), -5, 0, 3, 2**40]), None),  # sparse: binary search
        (np.arange(-3000, 3000, 3), "bytes"),  # negative keys in a table
        (np.array([2**62 + 1, 2**62 + 9]), None),  # beyond the table's int64 arithmetic
        (np.arange(-(2**25), 2**25, 1021), "bits"),  # too wide for bytes: a bitmap
        (np.arange(5, 2**27, 5003), None),  # too sparse for a bitmap
    ],
    ids=["dense", "sparse", "negative", "huge", "wide", "wide-sparse"],
)
def test_base_rows_shadowed_by_newer_keys_in_any_order(newer: np.ndarray, table_kind: str | None) -> None:
    rng = np.random.default_rng(int(newer.size))
    lo, hi = int(newer.min()) - 100, int(newer.max()) + 100
    keys = np.concatenate([rng.choice(newer, newer.size // 2), rng.integers(lo, hi, 20_000), [lo, hi, 0]])
    for order in ("sorted", "shuffled", "unique"):  # base keys repeat in the first two
        k = np.unique(keys) if order == "unique" else np.sort(keys) if order == "sorted" else rng.permutation(keys)
        want = np.isin(k, newer)
        mask = BaseMask("t", None, ["id"], _Keys(newer), None)
        cut = [0, k.size // 3, k.size // 2, k.size]  # read keys arrive in chunks
        ids = pa.chunked_array([pa.array(k[a:b], pa.int64()) for a, b in zip(cut, cut[1:], strict=False)])
        table = pa.table({"id": ids, "_rowaddr": pa.array(np.arange(k.size, dtype=np.uint64))})
        assert (~mask.live(table)).tolist() == want.tolist(), order
        frag = SimpleNamespace(fragment_id=0)
        assert mask.decide(frag, table).tolist() == np.flatnonzero(want).tolist(), order  # type: ignore[arg-type]
        kt = mask.key_table()
        assert (None if kt is None else "bits" if kt.packed else "bytes") == table_kind
        assert mask.lookup_table_bytes == (0 if kt is None else kt.table.nbytes)


@pytest.mark.parametrize("low", [2**54, 2**60], ids=["2^54", "2^60"])
def test_uint64_keys_beyond_float_precision(tmp_path: Path, low: int) -> None:
    """uint64 keys over 2^53 in the key table: their offsets are computed in uint64 (in float64
    a key rounded to a neighbour's offset, so base rows were shown beside their newer version)."""
    schema = pa.schema([pa.field("id", pa.uint64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    ids = [low + i for i in range(3000)]
    base = pa.table({"id": pa.array(ids, pa.uint64()), "v": range(3000)}, schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, unsharded=True, max_memtable_rows=500)
    t.put([{"id": low + i, "v": -i} for i in range(0, 3300, 3)])  # every third key, and new ones
    t.flush()
    t.delete([(low + 1,), (low + 3299,)])
    table = mq.open_table(t.uri)
    mask = table.merge_state.base_mask
    assert table.count_rows() == len(t.model)
    assert sort_table(table.to_arrow(), ["id"]).to_pylist() == sort_table(t.expected(), ["id"]).to_pylist()
    assert mask.key_table() is not None  # the path under test
    keys = [low + 1, low + 2, low + 3, low + 3299, low + 3300]
    assert sorted(table.lookup(keys).to_pylist(), key=lambda r: r["id"]) == [
        t.model[(k,)] for k in keys if (k,) in t.model
    ]


def test_selective_query_uses_the_key_index_and_decodes_nothing(
    table: ModelTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WHERE id = X: Lance filters each base fragment (its scalar index when there is one);
    no base column is decoded into the cache and no fragment's mask is decided."""
    t = mq.open_table(table.uri)
    spy = _BaseReads(monkeypatch, table.uri)
    e = table.expected()
    indexed = any(i.columns == ("id",) for i in t.view.scalar_indexes())
    for n, key in enumerate([int(e.column("id")[0].as_py()), int(e.column("id")[e.num_rows - 1].as_py()), 5, 999_999]):
        got = t.sql(f"SELECT * FROM t WHERE id = {key}").to_arrow_table()
        want = e.filter(pc.equal(e.column("id"), key))
        assert sort_table(got.select(e.column_names), ["id"]).equals(sort_table(want, ["id"]))
        if n == 0 or indexed:  # without an index, a second scan decodes the fragments into the cache
            base_keys = [k for k in t.view.cache.fragment_columns if k[0] == t.snapshot.cache_source]
            assert base_keys == [] and t.merge_state.base_mask.status().decided == 0
            assert spy.reads and all(name == "scanner" for name, _ in spy.reads)
    if indexed:
        assert "base mask decided lazily: 0 of" in t.explain()  # (explain decides the rest for its count)


def test_indexed_filter_searches_every_base_fragment_in_one_lance_scan(
    table: ModelTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a BTREE on the key, the base fragments are one partition and one Lance scan;
    answers (points, ranges, keys updated or deleted since) equal the model, before and after
    the fragments' masks are decided."""
    t = mq.open_table(table.uri)
    e = table.expected()
    indexed = any(i.columns == ("id",) for i in t.view.scalar_indexes())
    nbase = len(lance.dataset(table.uri).get_fragments())
    assert nbase > 2
    spy = _BaseReads(monkeypatch, table.uri)
    newer = sorted(set(t.merge_state.newer.sorted_numeric().tolist()))  # type: ignore[union-attr]
    filters = [f"id = {newer[0]}", f"id IN ({newer[1]}, {newer[-1]}, 7, 2999)", "id >= 100 AND id < 900"]
    for when in ("undecided", "decided"):
        for f in filters:
            spy.reads.clear()
            got = t.sql(f"SELECT id, amount FROM t WHERE {f}").to_arrow_table()
            model = e.select(["id", "amount"])
            model = model.filter(pa.array([_matches(f, k) for k in model.column("id").to_pylist()]))
            assert sort_table(got, ["id"]).equals(sort_table(model, ["id"])), (when, f)
            frags = _leaves(t.dataset().get_fragments(pc.field("id") < 900))
            parts = [type(p).__name__ for p in frags]
            if indexed and when == "undecided":
                assert parts.count("IndexedBaseFragment") == 1 and "base" not in str(parts)
                assert len([r for r in spy.reads if r[0] == "scanner"]) == 1, spy.reads
                # Lance gets the IN list as written: rewritten for pyarrow's NULLs (an if_else), the
                # index served it no more (a 1,000-key IN read every key: 80 ms for 22)
                assert spy.filters and not any("if_else" in f for f in spy.filters), spy.filters
            elif not indexed:  # no index: at most the small base fragments share a first read
                assert all(p.first_touch for p in frags if isinstance(p, IndexedBaseFragment))
        t.count_rows()  # decides every fragment
        assert t.merge_state.base_mask.status().complete


def _leaves(frags: list[Any]) -> list[Any]:
    """The partitions of a scan with the chains (one per CPU) opened."""
    return [leaf for f in frags for leaf in (_leaves(f.parts) if isinstance(f, ChainFragment) else [f])]


def test_small_base_fragments_first_read_by_one_lance_scan(table: ModelTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a key index, a first filtered query reads the small base fragments (merges leave
    them) by one Lance scan; answers equal the model then, and once decoded into the cache."""
    t = mq.open_table(table.uri)
    if any(i.columns == ("id",) for i in t.view.scalar_indexes()):
        pytest.skip("a key index serves the filter: one Lance scan of every base fragment (test above)")
    small = [f for f in lance.dataset(table.uri).get_fragments() if f.physical_rows <= SMALL_SOURCE_ROWS]
    assert len(small) > 2
    spy = _BaseReads(monkeypatch, table.uri)
    e = table.expected()
    for when in ("first", "cached", "again"):
        spy.reads.clear()
        got = t.sql("SELECT id, amount FROM t WHERE amount < 1050").to_arrow_table()
        model = e.select(["id", "amount"]).filter(pc.less(e.column("amount"), 1050))
        assert sort_table(got, ["id"]).equals(sort_table(model, ["id"])), when
        if when == "first":
            scans = [r for r in spy.reads if r[0] == "scanner"]
            assert len(scans) == 1 + len(lance.dataset(table.uri).get_fragments()) - len(small), spy.reads
            assert t.merge_state.base_mask.status().decided == 0
    t.count_rows()
    assert t.merge_state.base_mask.status().complete


def _matches(f: str, key: int) -> bool:
    """The test's SQL filters on ``id``, evaluated in Python."""
    if f.startswith("id = "):
        return key == int(f.split("=")[1])
    if f.startswith("id IN"):
        return key in {int(x) for x in f[f.index("(") + 1 : -1].split(",")}
    return 100 <= key < 900


def test_lazy_mask_across_refresh_merge_and_gc(tmp_path: Path) -> None:
    """Decisions made for one snapshot never leak into the next: after new writes, a merge
    (new base fragments, deletion files) and garbage collection, refreshed answers equal
    the model, and unchanged fragments reuse the keys read before."""
    t = _build(str(tmp_path / "t"), key_index=False, seed=8)
    rng = np.random.default_rng(8)
    table = mq.open_table(t.uri)

    def check(tb: mq.Table) -> None:
        assert tb.sql("SELECT count(*) AS n FROM t").to_arrow_table().column("n")[0].as_py() == len(t.model)
        got = tb.sql("SELECT sum(amount) AS s FROM t WHERE amount < 30").to_arrow_table().column("s")[0].as_py()
        assert got == pytest.approx(_model_sum(t, 30.0))
        full = sort_table(tb.to_arrow(), ["id"])
        assert full.equals(sort_table(t.expected(), ["id"]))

    check(table)  # decides every base fragment of the first snapshot
    t.put(rows(rng.choice(3000, 200, replace=False), 7, rng))  # updates of base keys: new shadowing
    t.delete([(int(k),) for k in rng.choice(3000, 20, replace=False)])
    t.flush()
    table = table.refresh()
    assert table.merge_state.base_mask.status().decided == 0
    check(table)
    for r in t.regions():  # merge the oldest unmerged generation everywhere, then GC it
        unmerged = [g for g, _ in t.flushed(r) if g > table.snapshot.index.merged_generation(r)]
        if unmerged:
            path = dict(t.flushed(r))[unmerged[0]]
            t.merge(r, unmerged[0])
            shutil.rmtree(f"{t.uri}/_mem_wal/{r}/{path}")
    table = table.refresh()
    check(table)
    t.flush()  # the WAL tail becomes a generation
    final = table.refresh()
    check(final)


def test_refreshed_snapshot_reuses_columns_without_superseded_rows(tmp_path: Path) -> None:
    """A snapshot copies each cached column of a fragment without its superseded rows; a
    refreshed snapshot copied them all again, also where nothing changed (the first query
    after a refresh cost about a cold one). The copies are kept per fragment and drop list."""
    t = _build(str(tmp_path / "t"), key_index=False, seed=5)
    table = mq.open_table(t.uri)
    q = "SELECT sum(amount) AS s FROM t WHERE amount < 40"
    for _ in range(3):  # decoded, then served from the cache
        assert table.sql(q).to_pydict()["s"][0] == pytest.approx(_model_sum(t, 40.0))
    cache = table.view.cache
    before = {k: (digest, dict(cols)) for k, (digest, _, cols, _) in cache.survivors.items()}
    assert before and all(cols for _, cols in before.values())
    again = table.refresh()  # nothing written: the same drop lists
    assert again.sql(q).to_pydict()["s"][0] == pytest.approx(_model_sum(t, 40.0))
    for key, (digest, cols) in before.items():
        assert cache.survivors[key][0] == digest
        assert all(cache.survivors[key][2][c] is col for c, col in cols.items())  # not copied again
    t.put(rows(range(0, 3000, 7), 9, np.random.default_rng(1)))  # supersedes rows of every base fragment
    newer = again.refresh()
    assert newer.sql(q).to_pydict()["s"][0] == pytest.approx(_model_sum(t, 40.0))
    assert all(cache.survivors[key][0] != digest for key, (digest, _) in before.items() if key in cache.survivors)
    t.flush()
