"""Point lookups with a lagging merger: many unmerged generations, keys updated across them,
deletes, re-inserts, a WAL tail; integer and composite string keys. The dict model
(``lsm_model.ModelTable``) is the oracle; Lance calls are counted to show that a lookup reads
one ``take`` per generation it needs, never one query per generation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.describe import describe_table

from lsm_model import PK, ModelTable

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64()), pa.field("s", pa.string())]
)


def _row(k: int, r: int) -> dict[str, Any]:
    return {"id": k, "v": r * 1000 + k, "s": f"r{r}-{k}"}


@pytest.fixture(scope="module")
def lagging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModelTable, set[int]]]:
    """30 rounds x 2 regions of generations (two merged), skewed updates, deletes, re-inserts, a tail."""
    rng = np.random.default_rng(4)
    base = pa.Table.from_pylist([_row(k, 0) for k in range(300)], schema=SCHEMA)
    t = ModelTable(str(tmp_path_factory.mktemp("lag") / "t"), SCHEMA, base, bucket=("id", 2), max_memtable_rows=10_000)
    written: set[int] = set(range(300))
    hot = [1, 2, 3, 150, 299, 310]
    for r in range(1, 31):
        ids = sorted({*hot, *(int(k) for k in rng.choice(360, 25, replace=False))})
        t.put([_row(k, r) for k in ids])
        gone = [int(k) for k in rng.choice(360, 4, replace=False)]
        t.delete([(k,) for k in gone])
        if r % 3 == 0:  # re-insert what the round deleted (a newer version after the tombstone)
            t.put([_row(k, r) for k in gone[:2]])
        if r == 7:
            t.delete([(2,)])  # a hot key deleted, then written again next round
        written |= {*ids, *gone}
        t.flush()
    for region in t.regions():  # the merger caught up on two generations of one region only
        for gen, _ in t.flushed(region)[:2]:
            t.merge(region, gen)
        break
    t.put([_row(k, 99) for k in (1, 5, 400)])  # WAL tail: open writers
    t.delete([(3,), (6,)])
    written |= {400}
    yield t, written
    t.flush()


def test_every_key_equals_the_model(lagging: tuple[ModelTable, set[int]]) -> None:
    t, written = lagging
    table = mq.open_table(t.uri)
    assert sum(len(r.generations) for r in table.view.snapshot.regions) >= 50
    keys = sorted(written | {-1, 10**6})
    got = {r["id"]: r for r in table.lookup(keys).to_pylist()}
    assert got == {k: t.model[(k,)] for k in keys if (k,) in t.model}
    for k in [1, 2, 3, 5, 6, 150, 310, 400, 10**6, *sorted(written)[::17]]:
        want = [t.model[(k,)]] if (k,) in t.model else []
        assert table.lookup(k).to_pylist() == want, k
        assert table.lookup([k], columns=["s"]).to_pylist() == [{"s": r["s"]} for r in want], k


def test_lance_calls_follow_the_keys_not_the_generations(
    lagging: tuple[ModelTable, set[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    t, _ = lagging
    table = mq.open_table(t.uri)
    calls: list[str] = []
    take, to_table = lance.LanceDataset._take_rows, lance.LanceDataset.to_table

    def counted_take(self: lance.LanceDataset, *a: Any, **kw: Any) -> pa.Table:
        calls.append("take")
        return take(self, *a, **kw)

    def counted_to_table(self: lance.LanceDataset, *a: Any, **kw: Any) -> pa.Table:
        calls.append("to_table")
        return to_table(self, *a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "_take_rows", counted_take)
    monkeypatch.setattr(lance.LanceDataset, "to_table", counted_to_table)
    only_base = next(k for k in range(300) if (k,) in t.model and t.model[(k,)]["v"] == k)
    assert table.lookup(only_base).to_pylist() == [t.model[(only_base,)]]
    assert calls == ["to_table"]  # the base only: no generation is read
    calls.clear()
    assert table.lookup(3).num_rows == 0 and calls == []  # deleted in the WAL tail: decided in memory
    assert table.lookup(1).to_pylist() == [t.model[(1,)]] and calls == []  # newest in the MemTable
    hot = [150, 299, 310]  # rewritten every round: each in its newest generation
    got = table.lookup(hot)
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [t.model[(k,)] for k in hot if (k,) in t.model]
    stats = table.last_lookup_stats
    assert stats is not None and stats.generation_hits == 3 and stats.base_keys == 0
    touched = stats.generations_scanned + stats.generations_from_memory
    assert 1 <= touched <= 2 and len(calls) <= touched  # at most one read per generation touched
    calls.clear()
    again = table.lookup(hot)  # small generations are held in memory after their first read
    assert again.sort_by("id").equals(got.sort_by("id")) and calls == []
    assert table.last_lookup_stats.generations_from_memory == touched  # type: ignore[union-attr]


def test_generations_over_the_budget_are_read_by_address(
    lagging: tuple[ModelTable, set[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import memwal_query.lookup_rows as lookup_module

    t, written = lagging
    monkeypatch.setattr(lookup_module, "LOOKUP_ROWS_BUDGET", 0)
    table = mq.open_table(t.uri)
    keys = sorted(written)
    got = {r["id"]: r for r in table.lookup(keys).to_pylist()}
    assert got == {k: t.model[(k,)] for k in keys if (k,) in t.model}
    stats = table.last_lookup_stats
    assert stats is not None and stats.generations_from_memory == 0 and stats.generations_scanned >= 40
    assert table.view.cache.generation_rows == {}


def test_composite_string_keys_lagging(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            pa.field("k", pa.string(), nullable=False, metadata=PK),
            pa.field("n", pa.int32(), nullable=False, metadata=PK),
            pa.field("v", pa.int64()),
        ]
    )
    names = ["", "ä", "x y", "ß" * 5, "k"]
    base = pa.Table.from_pylist([{"k": s, "n": i, "v": 0} for s in names for i in range(5)], schema=schema)
    t = ModelTable(str(tmp_path / "c"), schema, base, unsharded=True, max_memtable_rows=1000)
    rng = np.random.default_rng(8)
    for r in range(1, 13):
        keys = {(names[int(a)], int(b)) for a, b in zip(rng.integers(0, 5, 6), rng.integers(0, 7, 6), strict=True)}
        t.put([{"k": s, "n": n, "v": r} for s, n in sorted(keys)])
        t.delete([(names[int(rng.integers(0, 5))], int(rng.integers(0, 7)))])
        t.flush()
    t.put([{"k": "ä", "n": 1, "v": 99}])
    t.delete([("k", 2)])
    try:
        table = mq.open_table(t.uri)
        every = [(s, n) for s in [*names, "nope"] for n in range(8)]
        got = table.lookup({"k": [s for s, _ in every], "n": [n for _, n in every]}).to_pylist()
        assert sorted(got, key=lambda r: (r["k"], r["n"])) == sorted(
            (t.model[key] for key in every if key in t.model), key=lambda r: (r["k"], r["n"])
        )
    finally:
        t.flush()


def test_key_index_memory_is_reported(lagging: tuple[ModelTable, set[int]]) -> None:
    t, _ = lagging
    table = mq.open_table(t.uri)
    newest = table.view.merge.newer.newest
    keys = len({k for tb in newest.values() for k in tb.column("id").to_pylist()})
    d = describe_table(table)
    assert d["newer_keys"] == keys > 0
    assert d["newer_keys_bytes"] >= sum(tb.nbytes for tb in newest.values()) > 0
    assert f"key index of newer levels: {keys:,} keys" in table.explain()


def test_region_matrix_across_refresh_and_merge(tmp_path: Path) -> None:
    """A lookup touching many generations of a region takes its rows from one table holding
    the region's held generations (rows in memory once); a refresh that adds generations
    rebuilds it, a merge drops it; answers equal the model throughout."""
    from memwal_query.lookup_rows import MATRIX_MIN_GENERATIONS, RegionRows

    base = pa.Table.from_pylist([_row(k, 0) for k in range(100)], schema=SCHEMA)
    t = ModelTable(str(tmp_path / "m"), SCHEMA, base, unsharded=True, max_memtable_rows=10_000)
    rng = np.random.default_rng(12)
    keys = list(range(130))

    def write_rounds(first: int, n: int) -> None:
        for r in range(first, first + n):
            t.put([_row(int(k), r) for k in rng.choice(130, 12, replace=False)])
            t.delete([(int(rng.integers(0, 130)),)])
            t.flush()

    def check(table: mq.Table) -> None:
        got = {r["id"]: r for r in table.lookup(keys).to_pylist()}
        assert got == {k: t.model[(k,)] for k in keys if (k,) in t.model}

    write_rounds(1, MATRIX_MIN_GENERATIONS + 4)
    table = mq.open_table(t.uri)
    check(table)
    stats = table.last_lookup_stats
    assert stats is not None and stats.generations_from_memory >= MATRIX_MIN_GENERATIONS
    assert stats.generations_scanned == 0
    cache = table.view.cache
    (matrix,) = cache.region_rows.values()
    assert isinstance(matrix, RegionRows) and len(matrix.uris) >= MATRIX_MIN_GENERATIONS
    assert cache.generation_rows_bytes <= matrix.table.nbytes * 1.01  # views of the matrix, not copies
    write_rounds(100, 3)
    table = table.refresh()
    check(table)
    (rebuilt,) = cache.region_rows.values()
    assert isinstance(rebuilt, RegionRows) and len(rebuilt.uris) > len(matrix.uris)
    (region,) = t.regions()
    for gen, _ in t.flushed(region)[:3]:
        t.merge(region, gen)
    table = table.refresh()
    assert all(set(getattr(m, "uris", ())) <= set(cache.generation_rows) for m in cache.region_rows.values())
    check(table)


@pytest.mark.parametrize("probe_max", [0, 4096])
def test_newer_keys_find_string_and_composite_keys(probe_max: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``NewerKeys.find`` for non-integer keys: a dict per region for a few keys, a hash join
    for many; both give the positions of the newest version, nulls and unknown keys matching
    nothing (the join is the oracle of the dict and the other way around)."""
    import memwal_query.merge as merge_module

    monkeypatch.setattr(merge_module, "_MAP_PROBE_MAX", probe_max)
    rng = np.random.default_rng(5)
    names = ["", "ä", "x y", "k", "ß" * 3]
    newest = pa.table({"k": [names[i % 5] for i in range(40)], "n": [i // 5 for i in range(40)]})
    newer = merge_module.NewerKeys({"r": newest}, ["k", "n"])
    probe = pa.table(
        {
            "k": [names[int(i)] for i in rng.integers(0, 5, 60)] + [None, "zz"],
            "n": [int(i) for i in rng.integers(0, 10, 60)] + [1, 1],
        }
    )
    rows, at = newer.find("r", probe)
    want = {
        i: j
        for i, (k, n) in enumerate(zip(probe.column("k").to_pylist(), probe.column("n").to_pylist(), strict=True))
        for j, (k2, n2) in enumerate(zip(newest.column("k").to_pylist(), newest.column("n").to_pylist(), strict=True))
        if k is not None and (k, n) == (k2, n2)
    }
    assert dict(zip(rows.tolist(), at.tolist(), strict=True)) == want and len(want) > 20
    single = merge_module.NewerKeys({"r": newest.select(["k"]).slice(0, 5)}, ["k"])
    r1, a1 = single.find("r", pa.table({"k": ["k", None, "nope", ""]}))
    assert dict(zip(r1.tolist(), a1.tolist(), strict=True)) == {0: 3, 3: 0}


@pytest.mark.parametrize("probe_max", [0, 4096])
def test_string_keys_across_refresh_and_merge(probe_max: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """String keys over many generations (the region matrix path), found by the per-snapshot
    key dict or the hash join: answers equal the model after writes, a refresh, a merge of
    some generations and a WAL tail; the dict of one snapshot never answers for the next."""
    import memwal_query.merge as merge_module
    from memwal_query.lookup_rows import MATRIX_MIN_GENERATIONS

    monkeypatch.setattr(merge_module, "_MAP_PROBE_MAX", probe_max)
    schema = pa.schema(
        [pa.field("k", pa.string(), nullable=False, metadata=PK), pa.field("v", pa.int64()), pa.field("s", pa.string())]
    )

    def name(i: int) -> str:
        return f"user-{i:03d}" if i % 7 else f"ü{i}"  # non-ASCII keys too

    base = pa.Table.from_pylist([{"k": name(i), "v": 0, "s": "base"} for i in range(100)], schema=schema)
    t = ModelTable(str(tmp_path / "s"), schema, base, unsharded=True, max_memtable_rows=10_000)
    rng = np.random.default_rng(21)
    every = [name(i) for i in range(140)] + ["", "nope"]

    def write_rounds(first: int, n: int) -> None:
        for r in range(first, first + n):
            t.put([{"k": name(int(i)), "v": r, "s": f"r{r}"} for i in rng.choice(140, 15, replace=False)])
            t.delete([(name(int(rng.integers(0, 140))),)])
            t.flush()

    def check(table: mq.Table) -> None:
        got = {r["k"]: r for r in table.lookup(every).to_pylist()}
        assert got == {k: t.model[(k,)] for k in every if (k,) in t.model}
        for k in every[::9]:
            assert table.lookup(k).to_pylist() == ([t.model[(k,)]] if (k,) in t.model else []), k

    write_rounds(1, MATRIX_MIN_GENERATIONS + 3)
    try:
        table = mq.open_table(t.uri)
        check(table)
        stats = table.last_lookup_stats
        assert stats is not None and stats.generation_hits > 0 and stats.generations_scanned == 0
        assert table.view.cache.region_rows  # many generations touched: one table of the region's rows
        write_rounds(50, 3)
        table = table.refresh()
        check(table)
        (region,) = t.regions()
        for gen, _ in t.flushed(region)[:4]:
            t.merge(region, gen)
        t.put([{"k": name(3), "v": 999, "s": "tail"}])  # a WAL tail over the merged rows
        t.delete([(name(5),)])
        table = table.refresh()
        check(table)
        assert table.lookup(name(3)).to_pylist() == [t.model[(name(3),)]]
    finally:
        t.flush()


def test_single_string_keys_with_quotes_and_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single string key goes to the base as SQL text (``k = '...'``): quotes, backslashes,
    SQL keywords, non-ASCII and control characters must find exactly their own row."""
    import memwal_query.lookup as lookup_module

    schema = pa.schema([pa.field("k", pa.string(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    tricky = [
        "o'neil",
        "''",
        "'",
        "a\\b",
        "\\'",
        "x' OR '1'='1",
        "ü€",
        "",
        "tab\there",
        "line\nbreak",
        "n\x00ul",
        "%",
        "_",
    ]
    names = [*tricky, *(f"k{i}" for i in range(20))]
    base = pa.Table.from_pylist([{"k": s, "v": i} for i, s in enumerate(names)], schema=schema)
    t = ModelTable(str(tmp_path / "q"), schema, base, unsharded=True, max_memtable_rows=1000)
    t.put([{"k": "k3", "v": 100}, {"k": "o'neil", "v": 101}])
    t.flush()
    filters: list[object] = []
    real = lookup_module._base_filter

    def spy(keys: pa.Table, pk: list[str], schema: pa.Schema) -> object:
        filters.append(out := real(keys, pk, schema))
        return out

    monkeypatch.setattr(lookup_module, "_base_filter", spy)
    try:
        table = mq.open_table(t.uri)
        for k in [*names, "O'NEIL", "a\\\\b", "k", "nope'"]:
            assert table.lookup(k).to_pylist() == ([t.model[(k,)]] if (k,) in t.model else []), repr(k)
        assert "`k` = 'x'' OR ''1''=''1'" in [f for f in filters if isinstance(f, str)]  # quoted SQL text
        assert any(not isinstance(f, str) for f in filters)  # backslash / control characters: an expression
    finally:
        t.flush()
