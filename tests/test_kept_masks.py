"""Whole base masks kept on this machine (``memwal_query.kept_masks``): a new process reading
the same snapshot takes every base fragment's drop list from the file an earlier process
kept, and a snapshot that differs in any way (a write, a merge, a file changed) does not.

Tables are written by pylance's MemWAL writer; every count and mask is compared with the
dict model (``lsm_model.ModelTable``) and with a process that keeps nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query import kept_masks
from memwal_query.format import machine_cache
from memwal_query.kept_masks import KeptMask, KeptName, Layout, changes, decode, encode, taken
from memwal_query.key_runs import KeyRuns

from builders import counted_in_a_new_process, events_schema, refuses_every_cut_and_flip, rows
from lsm_model import ModelTable


def _layout(keys: list[int], deleted: list[int] | None = None) -> Layout:
    runs = KeyRuns.of(np.array(keys, dtype=np.int64))
    assert runs is not None
    return Layout(runs, np.array(deleted or [], dtype=np.uint32))


def test_damaged_or_foreign_mask_files_are_ignored() -> None:
    """A mask file cut short, with any byte changed, of another name, key type or fragments,
    or whose keys are unsorted, whose lists are unsorted, repeat a row, name another fragment
    or a row past the fragment's end, or whose runs do not tile their fragment, decodes to
    nothing; a whole one decodes to what was encoded."""
    name = KeptName(bytes(range(32)), {0: 100, 3: 40}, keys=np.array([2, 9, 70], dtype=np.int64))
    fragment_3 = (np.uint64(3) << np.uint64(32)) | np.array([0, 39], dtype=np.uint64)
    good = KeptMask(
        name.keys, {0: np.array([1, 5, 99], dtype=np.uint64), 3: fragment_3}, {3: _layout(list(range(40)), [7])}
    )
    data = encode(name, good)
    got = decode(data, name)
    assert got is not None and got.keys.tolist() == [2, 9, 70] and got.keys.dtype == np.int64
    assert {f: d.tolist() for f, d in got.drops.items()} == {f: d.tolist() for f, d in good.drops.items()}
    assert list(got.layouts) == [3] and got.layouts[3].runs.keys().tolist() == list(range(40))
    assert got.layouts[3].deleted.tolist() == [7]
    refuses_every_cut_and_flip(data, lambda d: decode(d, name), bit=0x04)
    assert decode(data, KeptName(bytes(32), name.rows, keys=name.keys)) is None
    assert decode(data, KeptName(name.name, {0: 100, 3: 40, 4: 1}, keys=name.keys)) is None
    assert decode(data, KeptName(name.name, {0: 100, 2: 40}, keys=name.keys)) is None
    assert decode(data, KeptName(name.name, name.rows, keys=name.keys.astype(np.int32))) is None
    bad_lists = [
        {0: np.array([5, 1], dtype=np.uint64)},  # unsorted
        {0: np.array([5, 5], dtype=np.uint64)},  # a row twice
        {0: np.array([100], dtype=np.uint64)},  # past the fragment's 100 rows
        {0: np.array([(1 << 32) | 2], dtype=np.uint64)},  # fragment 1's row
    ]
    for bad in bad_lists:
        assert decode(encode(name, KeptMask(good.keys, {**good.drops, **bad}, good.layouts)), name) is None, bad
    unsorted_keys = KeptMask(np.array([9, 2, 70], dtype=np.int64), good.drops, good.layouts)
    other_rows = KeptMask(good.keys, good.drops, {3: _layout(list(range(41)))})  # 41 rows: the fragment has 40
    deleted_past = KeptMask(good.keys, good.drops, {3: _layout(list(range(40)), [40])})
    deleted_twice = KeptMask(good.keys, good.drops, {3: _layout(list(range(40)), [7, 7])})
    for bad_mask in (unsorted_keys, other_rows, deleted_past, deleted_twice):
        assert decode(encode(name, bad_mask), name) is None


def _brute_drops(keys: np.ndarray, deleted: np.ndarray, newer: np.ndarray, fid: int) -> np.ndarray:
    live = ~np.isin(np.arange(keys.size), deleted)
    hit = np.flatnonzero(live & np.isin(keys, newer)).astype(np.uint64)
    return hit | (np.uint64(fid) << np.uint64(32))


def test_a_mask_taken_for_other_keys_equals_one_decided_for_them() -> None:
    """Random fragments (runs of keys, duplicates, deleted rows) and random newer key sets:
    a mask kept for one set and taken for another (keys added, removed, both, none) equals the
    drop lists decided from scratch for the other; a fragment without a layout (runs and
    deleted rows) is left out unless nothing changed."""
    rng = np.random.default_rng(11)
    for _ in range(60):
        frags: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for fid in rng.choice(50, int(rng.integers(1, 5)), replace=False).tolist():
            parts = [np.arange(s, s + int(rng.integers(1, 40))) for s in rng.integers(0, 300, int(rng.integers(1, 5)))]
            keys = np.concatenate(parts).astype(np.int64)
            frags[fid] = (keys, np.sort(rng.choice(keys.size, min(keys.size, int(rng.integers(0, 4))), replace=False)))
        old = np.unique(rng.integers(0, 340, int(rng.integers(0, 80)))).astype(np.int64)
        new = np.unique(
            np.concatenate([old[rng.random(old.size) < 0.8], rng.integers(0, 340, int(rng.integers(0, 30)))])
        )
        new = new.astype(np.int64) if rng.random() < 0.8 else old
        drops = {f: _brute_drops(k, d, old, f) for f, (k, d) in frags.items()}
        no_runs = int(rng.choice(list(frags)))
        laid = {f: _layout(k.tolist(), d.tolist()) for f, (k, d) in frags.items() if f != no_runs}
        mask = KeptMask(old, drops, laid)

        added, removed = changes(old, new)
        assert added.tolist() == sorted(set(new.tolist()) - set(old.tolist()))
        assert removed.tolist() == sorted(set(old.tolist()) - set(new.tolist()))
        got = taken(mask, added, removed)
        if not added.size and not removed.size:
            assert set(got) == set(frags)
        else:
            assert set(got) == set(frags) - {no_runs}
        for fid, drop in got.items():
            assert drop.tolist() == _brute_drops(*frags[fid], new, fid).tolist(), fid


def _build(path: str, seed: int = 3) -> ModelTable:
    """A base of three fragments, a merge (deletion files), unmerged generations, a WAL tail."""
    rng = np.random.default_rng(seed)
    base = rows(np.arange(6000), 0, rng)
    t = ModelTable(
        path,
        events_schema(),
        pa.Table.from_pylist(base, schema=events_schema()),
        bucket=("id", 4),
        max_memtable_rows=150,
        write_params={"max_rows_per_file": 2000},
    )
    t.put(rows(rng.choice(6400, 500, replace=False), 1, rng))
    t.delete([(int(k),) for k in rng.choice(6000, 40, replace=False)])
    t.flush()
    region = t.regions()[0]
    t.merge(region, t.flushed(region)[0][0])
    t.put(rows(rng.choice(6400, 300, replace=False), 2, rng))
    t.flush()
    t.put(rows(rng.choice(6400, 60, replace=False), 3, rng))  # left open: WAL tail
    return t


def _deleted_base_keys(table: ModelTable) -> list[int]:
    """Keys of base rows deleted (deletion files), that no newer level holds."""
    ds = lance.dataset(table.uri)
    live = set(ds.to_table(columns=["id"]).column("id").to_pylist())
    gone = [k for k in range(6000) if k not in live and table.key({"id": k}) not in table.model]
    assert gone  # the merge in _build deleted some
    return gone


def _fresh_process(uri: str, cache_dir: str) -> dict[str, Any]:
    return counted_in_a_new_process(uri, cache_dir, "WHERE id >= 0")


def _kept_files(cache_dir: str) -> list[Path]:
    return sorted(p for p in Path(cache_dir, kept_masks.KIND).rglob("*") if p.is_file())


def test_a_new_process_takes_the_mask_of_the_same_base(tmp_path: Path) -> None:
    """The first process decides every fragment (a scan) and keeps the mask; the next one takes
    it (no key read) with the same mask and the model's count. After writes to the WAL (keys
    added, tombstones) or a flush, the base is the same: the next process takes the mask
    brought up to its keys, equal to the one a process keeping nothing decides, and keeps no
    other. After a merge (the base changed) it decides again and keeps its own, which the
    process after it takes."""
    table = _build(str(tmp_path / "t"))
    cache_dir = str(tmp_path / "cache")
    frags = len(lance.dataset(table.uri).get_fragments())
    elsewhere = lambda: _fresh_process(table.uri, "off")  # noqa: E731  (keeps nothing: decides every fragment)
    first = _fresh_process(table.uri, cache_dir)
    assert first["n"] == len(table.model) and "kept mask" not in first["sources"]  # type: ignore[operator]
    (kept,) = _kept_files(cache_dir)
    assert kept.stat().st_mode & 0o777 == 0o600
    second = _fresh_process(table.uri, cache_dir)
    assert second == {**first, "sources": {"kept mask": frags}}
    rng = np.random.default_rng(9)
    changes = [  # (a change, whether the base changes with it)
        (lambda: table.put(rows(rng.choice(np.arange(5000, 8000), 30, replace=False), 4, rng)), False),
        (lambda: table.put(rows(_deleted_base_keys(table), 5, rng)), False),  # over base rows deleted
        (lambda: table.delete([(int(k),) for k in rng.choice(np.arange(0, 9000), 25, replace=False)]), False),
        (table.flush, False),  # the same keys, moved from the WAL tail to a generation
        (lambda: table.merge(table.regions()[1], table.flushed(table.regions()[1])[0][0]), True),
    ]
    for change, base_changed in changes:
        change()
        before = {p: p.read_bytes() for p in _kept_files(cache_dir)}
        got = _fresh_process(table.uri, cache_dir)
        frags = len(lance.dataset(table.uri).get_fragments())
        assert got["n"] == len(table.model) and got["mask"] == elsewhere()["mask"]
        if not base_changed:
            assert got["sources"] == {"kept mask": frags}
            assert {p: p.read_bytes() for p in _kept_files(cache_dir)} == before
            continue
        assert "kept mask" not in got["sources"]  # type: ignore[operator]
        assert len(set(_kept_files(cache_dir)) - set(before)) == 1  # its own, for the next process
        assert _fresh_process(table.uri, cache_dir) == {**got, "sources": {"kept mask": frags}}


def test_a_mask_far_behind_is_kept_again_and_an_eventual_snapshot_takes_a_strong_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose newer keys differ from the kept mask's by more than REKEEP_KEYS keeps
    its own (the next process then takes it unchanged); an eventual snapshot (no WAL tail: keys
    removed) takes a strong one's mask; a fragment without key runs (scattered keys) is decided
    from its keys. Every count and mask equals the model's and a process keeping nothing."""
    rng = np.random.default_rng(12)
    scattered = rng.permutation(np.arange(20_000, 40_000))  # over SMALL_ROWS, a run per row: no runs kept
    ids = np.concatenate([np.arange(20_000), scattered])
    base = pa.Table.from_pylist(rows(ids, 0, rng), schema=events_schema())
    table = ModelTable(
        str(tmp_path / "t"), events_schema(), base, bucket=("id", 2), write_params={"max_rows_per_file": 20_000}
    )
    table.put(rows(rng.choice(40_000, 600, replace=False), 1, rng))
    table.flush()
    table.put(rows(rng.choice(40_000, 40, replace=False), 2, rng))  # WAL tail
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kept_masks, "REKEEP_KEYS", 45)

    def opened(
        consistency: str = "strong", cache: str = str(tmp_path / "cache")
    ) -> tuple[int, list[int], dict[str, int]]:
        monkeypatch.setenv("MEMWAL_CACHE_DIR", cache)
        monkeypatch.setattr(kept_masks, "_kept_tables", set())  # as a new process
        t = mq.open_table(table.uri, consistency=consistency)  # type: ignore[arg-type]
        t.view.cache.reset()  # nothing decided in memory
        t = mq.open_table(table.uri, consistency=consistency)  # type: ignore[arg-type]
        n = t.count_rows()
        mask = t.merge_state.base_mask
        got = n, mask.all().tolist(), dict(mask.status().key_sources)
        machine_cache.settle()  # what a process keeps off its queries' path, kept at its exit
        return got

    n, want, sources = opened()
    assert n == len(table.model) and "kept mask" not in sources
    assert opened() == (n, want, {"kept mask": 2})
    (kept,) = _kept_files(str(tmp_path / "cache"))
    before = kept.read_bytes()
    alone = opened("eventual", "off")
    assert alone[:2] != (n, want)  # the WAL tail matters
    got = opened("eventual")  # the WAL tail's keys removed (within REKEEP_KEYS): taken
    assert got == (*alone[:2], {"kept mask": 1, "data files": 1})
    assert kept.read_bytes() == before
    table.put(rows(rng.choice(40_000, 100, replace=False), 3, rng))  # ~100 keys more: over REKEEP_KEYS
    got = opened()
    assert got[0] == len(table.model) and got[1] == opened(cache="off")[1]
    assert got[2] == {"kept mask": 1, "data files": 1}
    assert kept.read_bytes() != before  # kept again, for these keys
    assert opened() == (*got[:2], {"kept mask": 2})
    table.put(rows(rng.choice(20_000, 5, replace=False), 4, rng))  # the mask kept again has the runs too
    got = opened()
    assert got[0] == len(table.model) and got[1] == opened(cache="off")[1]
    assert got[2] == {"kept mask": 1, "data files": 1}


def test_a_mask_is_not_taken_when_a_file_changed_or_it_is_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion file or data file touched since, or a kept file damaged, is not trusted: the
    mask is decided again, equal to the model's; with keeping off nothing is kept."""
    table = _build(str(tmp_path / "t"), seed=4)
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kept_masks, "_kept_tables", set())  # this process has kept no mask yet

    def opened() -> tuple[int, list[int], dict[str, int]]:
        t = mq.open_table(table.uri)
        t.view.cache.reset()  # as a new process: nothing decided in memory
        t = mq.open_table(table.uri)
        n = t.count_rows()
        mask = t.merge_state.base_mask
        monkeypatch.setattr(kept_masks, "_kept_tables", set())  # the next open keeps a mask as a new process would
        got = n, mask.all().tolist(), dict(mask.status().key_sources)
        machine_cache.settle()  # kept off the queries' path: at the exit of a process
        return got

    n, want, sources = opened()
    assert n == len(table.model) and "kept mask" not in sources
    assert opened() == (n, want, {"kept mask": len(lance.dataset(table.uri).get_fragments())})
    frag = next(f for f in lance.dataset(table.uri).get_fragments() if f.metadata.deletion_file is not None)
    touched = [
        Path(table.uri) / frag.metadata.deletion_file.path(frag.fragment_id),
        Path(table.uri) / "data" / frag.metadata.files[0].path,
    ]
    for path in touched:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        got = opened()
        assert got[:2] == (n, want) and "kept mask" not in got[2], path
        assert opened()[2] == {"kept mask": len(lance.dataset(table.uri).get_fragments())}  # kept again
    for kept in _kept_files(str(tmp_path / "cache")):
        data = bytearray(kept.read_bytes())
        data[len(data) // 2] ^= 0x01
        kept.write_bytes(bytes(data))
    got = opened()
    assert got[:2] == (n, want) and "kept mask" not in got[2]
    shutil.rmtree(tmp_path / "cache")
    monkeypatch.setenv("MEMWAL_CACHE_DIR", "off")
    got = opened()
    assert got[:2] == (n, want) and "kept mask" not in got[2]
    assert not (tmp_path / "cache").exists()


def test_a_process_keeps_one_mask_per_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived reader refreshing a table written to keeps the mask of its first whole
    snapshot only (one file, not one per refresh); its answers follow the model."""
    table = _build(str(tmp_path / "t"), seed=5)
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kept_masks, "_kept_tables", set())
    rng = np.random.default_rng(1)
    t = mq.open_table(table.uri)
    for i in range(4):
        assert t.count_rows() == len(table.model)
        table.put(rows(rng.choice(6000, 20, replace=False), 10 + i, rng))
        t = t.refresh()
    machine_cache.settle()
    assert len(_kept_files(str(tmp_path / "cache"))) == 1


def test_fragments_decided_from_a_kept_mask_are_first_read_through_lance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh process whose base fragments are all decided from a kept mask reads a large
    fragment through Lance on its first filtered query (filter pushed down, nothing decoded
    into the column cache: decoding first cost 2x) and decodes it on the second; both answer
    the model."""
    rng = np.random.default_rng(6)
    base = pa.Table.from_pylist(rows(np.arange(210_000), 0, rng), schema=events_schema())
    table = ModelTable(str(tmp_path / "t"), events_schema(), base, bucket=("id", 2), max_memtable_rows=500)
    table.put(rows(rng.choice(210_000, 800, replace=False), 1, rng))
    table.flush()
    table.put(rows(rng.choice(210_000, 50, replace=False), 2, rng))  # WAL tail
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kept_masks, "_kept_tables", set())
    first = mq.open_table(table.uri)
    assert first.count_rows() == len(table.model)
    machine_cache.settle()
    first.view.cache.reset()  # a new process: only what this machine kept
    t = mq.open_table(table.uri)
    e = table.expected()
    want = sum(a for a in e.column("amount").to_pylist() if a < 10)
    decoded = lambda: [k for k in t.view.cache.fragment_columns if k[0] == t.snapshot.cache_source]  # noqa: E731
    for n in range(2):
        got = t.sql("SELECT sum(amount) AS s FROM t WHERE amount < 10").to_pydict()["s"][0]
        assert got == pytest.approx(want)
        assert (decoded() == []) == (n == 0)
    assert dict(t.merge_state.base_mask.status().key_sources) == {"kept mask": 1}


def test_masks_over_the_budget_or_of_some_fragments_are_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mask of more rows than MAX_ROWS, against more keys than MAX_KEYS, or lacking a
    fragment, is not written; one within is, with the runs of its fragments only."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path))
    name = KeptName(bytes(range(32)), {0: 100, 1: 100}, keys=np.arange(7, dtype=np.int64))
    drops = {0: np.arange(10, dtype=np.uint64), 1: (np.uint64(1) << np.uint64(32)) | np.arange(5, dtype=np.uint64)}
    runs = {1: _layout(list(range(100))), 2: _layout(list(range(100)))}
    monkeypatch.setattr(kept_masks, "MAX_ROWS", 14)
    assert not kept_masks.keep(name, KeptMask(name.keys, drops, runs))
    assert not kept_masks.keep(name, KeptMask(name.keys, {0: drops[0]}))
    monkeypatch.setattr(kept_masks, "MAX_ROWS", 15)
    monkeypatch.setattr(kept_masks, "MAX_KEYS", 6)
    assert not kept_masks.keep(name, KeptMask(name.keys, drops, runs))
    assert kept_masks.load(name) is None
    monkeypatch.setattr(kept_masks, "MAX_KEYS", 7)
    assert kept_masks.keep(name, KeptMask(name.keys, drops, runs))
    got = kept_masks.load(name)
    assert got is not None and {f: d.tolist() for f, d in got.drops.items()} == {
        f: d.tolist() for f, d in drops.items()
    }
    assert got.keys.tolist() == list(range(7)) and got.layouts == {}  # its own keys: no layout read
    other = kept_masks.load(KeptName(name.name, name.rows, keys=np.arange(8, dtype=np.int64)))
    assert other is not None and other.keys.tolist() == list(range(7)) and list(other.layouts) == [1]


def _holds_bytes(a: np.ndarray) -> bool:
    """Whether ``a`` is a view whose memory is a ``bytes`` object (a kept file read whole)."""
    base = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, (bytes, memoryview))


def test_a_keeper_holds_no_view_of_the_file_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a keeper gives and keeps after reading a mask (drop lists; layouts, read when the
    keys differ), for the same keys and for other keys, are arrays of their own, not views
    holding the whole file's bytes."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path))
    keys = np.array([3, 40, 77], dtype=np.int64)
    name = KeptName(bytes(range(32)), {0: 100, 1: 100}, keys=keys)
    drops = {
        0: np.array([3], dtype=np.uint64),
        1: (np.uint64(1) << np.uint64(32)) | np.array([40, 77], dtype=np.uint64),
    }
    assert kept_masks.keep(
        name, KeptMask(keys, drops, {0: _layout(list(range(100)), [5]), 1: _layout(list(range(100)))})
    )
    for newer in (keys, np.array([3, 40, 77, 90], dtype=np.int64)):
        keeper = kept_masks.MaskKeeper()
        got = keeper.drops(lambda newer=newer: KeptName(name.name, name.rows, keys=newer))  # type: ignore[misc]
        assert got is not None and set(got) == {0, 1}
        assert got[1].tolist() == [(1 << 32) | k for k in newer[1:].tolist()]
        found = kept_masks.load(KeptName(name.name, name.rows, keys=newer))  # what the keeper read
        assert found is not None and (list(found.layouts) == [0, 1]) == (len(newer) != len(keys))
        laid = [a for x in found.layouts.values() for a in (x.runs.firsts, x.runs.lasts, x.runs.starts, x.deleted)]
        assert not any(_holds_bytes(a) for a in [*got.values(), *laid])
