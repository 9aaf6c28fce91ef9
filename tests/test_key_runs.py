"""Key runs kept on this machine (``memwal_query.key_runs``): a base fragment of consecutive
integer keys is decided by a new process without reading its keys, with the answers of a
read of its keys.

Runs are checked against numpy membership on generated keys of every integer type; the
tables are written by pylance's MemWAL writer and every count is compared with the dict
model (``lsm_model.ModelTable``); run files damaged in every way are ignored.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memwal_query as mq
import memwal_query.base_reads as base_reads_module
from memwal_query import kept_masks, key_runs
from memwal_query.format import machine_cache
from memwal_query.key_runs import SMALL_ROWS, KeyRuns, most_runs

from builders import counted_in_a_new_process, events_schema, refuses_every_cut_and_flip, rows
from lsm_model import ModelTable

_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@st.composite
def _runs_and_probes(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Keys made of runs of consecutive values (some across the type's largest value, some
    repeating earlier keys), and probe keys in and around them."""
    dtype = np.dtype(draw(st.sampled_from(_TYPES)))
    info = np.iinfo(dtype)
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 3000))
        first = draw(st.one_of(st.integers(int(info.min), int(info.max)), st.just(int(info.max) - n // 2)))
        first = max(int(info.min), min(first, int(info.max)))
        with np.errstate(over="ignore"):  # consecutive in the type's arithmetic: wraps past its end
            parts.append(np.arange(n, dtype=np.uint64).astype(dtype) + np.array(first, dtype=dtype))
    keys = np.concatenate(parts)
    near = np.concatenate([keys, keys.astype(object) + 1, keys.astype(object) - 1])
    near = np.array([v for v in near if info.min <= v <= info.max], dtype=object).astype(dtype)
    pick = draw(st.lists(st.integers(0, near.size - 1), max_size=200))
    return keys, np.unique(near[pick]) if pick else np.empty(0, dtype=dtype)


@settings(max_examples=200, deadline=None)
@given(_runs_and_probes())
def test_runs_answer_which_rows_hold_a_key_as_numpy_does(case: tuple[np.ndarray, np.ndarray]) -> None:
    """Rows found through runs are exactly the rows whose key numpy finds among the probes,
    for keys of every integer type and keys repeated across runs; keys with a run across
    the type's largest value, or more than one run per 128 rows, have none; a file of the
    runs decodes to the same answers."""
    big, probes = case
    runs = KeyRuns.of(big)
    step_one = (big[1:] - big[:-1]) == 1  # in the type: a step from its largest value wraps
    wraps = step_one & (big[1:] < big[:-1])
    breaks = int((~step_one).sum() + wraps.sum())
    if runs is None:
        assert breaks + 1 > most_runs(big.size) or wraps.any()
        return
    assert len(runs) == breaks + 1 <= most_runs(big.size) and not wraps.any()
    assert runs.keys().tolist() == big.tolist()
    want = np.flatnonzero(np.isin(big, probes))
    assert runs.hits(probes).tolist() == want.tolist()
    ident = b"i" * 32
    again = KeyRuns.decode(runs.encode(ident), ident, big.dtype)
    assert again is not None and again.hits(probes).tolist() == want.tolist()


def test_keys_that_do_not_compress_are_not_kept() -> None:
    """Shuffled keys of a large fragment (more than one run per 128 rows) have no runs: it is
    read; a small fragment's are kept whatever they are, and give its keys back."""
    rng = np.random.default_rng(0)
    assert KeyRuns.of(rng.permutation(SMALL_ROWS + 1).astype(np.int64)) is None
    assert KeyRuns.of(np.arange(SMALL_ROWS * 4, dtype=np.int64)) is not None
    small = rng.permutation(SMALL_ROWS).astype(np.int64)
    runs = KeyRuns.of(small)
    assert runs is not None and runs.scattered and runs.keys().tolist() == small.tolist()
    assert KeyRuns.of(np.array([0.5, 1.5])) is None
    rows = SMALL_ROWS * 2  # at most rows / 128 runs: 256
    for runs_wanted, kept in [(rows // 128, True), (rows // 128 + 1, False)]:
        starts = np.linspace(0, rows, runs_wanted, endpoint=False).astype(np.int64)
        keys = np.arange(rows, dtype=np.int64) + np.repeat(np.arange(runs_wanted) * 10, np.diff([*starts, rows]))
        got = KeyRuns.of(keys)
        assert (got is not None) == kept and (got is None or len(got) == runs_wanted)


def test_damaged_run_files_are_ignored() -> None:
    """A run file cut short, with any byte changed, of another data file or key type, or
    whose runs do not tile the rows, decodes to nothing."""
    runs = KeyRuns.of(np.concatenate([np.arange(5000), np.arange(100, 2000)]).astype(np.int64))
    assert runs is not None
    ident = bytes(range(32))
    data = runs.encode(ident)
    assert KeyRuns.decode(data, ident, np.dtype(np.int64)) is not None
    refuses_every_cut_and_flip(data, lambda d: KeyRuns.decode(d, ident, np.dtype(np.int64)))
    assert KeyRuns.decode(data, bytes(32), np.dtype(np.int64)) is None
    assert KeyRuns.decode(data, ident, np.dtype(np.uint64)) is None
    bad = KeyRuns(np.array([0, 4000]), np.array([0, 7]), np.array([3999, 2905]), 6900)  # 2nd run one short
    assert not bad.well_formed()
    assert KeyRuns.decode(bad.encode(ident), ident, np.dtype(np.int64)) is None


def test_a_cache_directory_removed_meanwhile_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs kept after the cache directory was removed by hand are kept again, and found."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "a.lance"
    data.write_bytes(b"rows")
    runs = KeyRuns.of(np.arange(1000, dtype=np.int64))
    assert runs is not None and key_runs.store(str(data), 3, runs)
    shutil.rmtree(tmp_path / "cache")
    assert key_runs.load(str(data), 3, np.dtype(np.int64), 1000) is None
    assert key_runs.store(str(data), 3, runs)
    again = key_runs.load(str(data), 3, np.dtype(np.int64), 1000)
    assert again is not None and again.hits(np.array([5, 999, 1000])).tolist() == [5, 999]
    assert key_runs.load(str(data), 4, np.dtype(np.int64), 1000) is None  # another field's


def test_a_pipe_or_an_oversized_file_in_its_place_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A named pipe where a run file should be is not waited on, a file larger than the most
    runs a fragment can have is not read (a later store puts a good file back)."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "a.lance"
    data.write_bytes(b"rows")
    runs = KeyRuns.of(np.arange(1000, dtype=np.int64))
    assert runs is not None and key_runs.store(str(data), 3, runs)
    (kept,) = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    kept.unlink()
    os.mkfifo(kept)
    answers: list[object] = []
    reader = threading.Thread(
        target=lambda: answers.append(key_runs.load(str(data), 3, np.dtype(np.int64), 1000)), daemon=True
    )
    reader.start()
    reader.join(20)
    assert not reader.is_alive() and answers == [None]
    kept.unlink()
    with kept.open("wb") as f:  # sparse: larger than a 1,000-row fragment's runs can be
        f.truncate(1 << 30)
    assert key_runs.load(str(data), 3, np.dtype(np.int64), 1000) is None
    assert key_runs.store(str(data), 3, runs) and key_runs.load(str(data), 3, np.dtype(np.int64), 1000) is not None


@pytest.mark.parametrize(("max_files", "max_bytes", "left"), [(8, 1 << 30, 4), (1000, 5 * 100, 2), (1000, 1 << 30, 10)])
def test_the_oldest_run_files_are_removed_beyond_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_files: int, max_bytes: int, left: int
) -> None:
    """Beyond the most files or bytes kept, the oldest files are removed down to half of both."""
    monkeypatch.setattr(machine_cache, "MAX_FILES", max_files)
    monkeypatch.setattr(machine_cache, "MAX_BYTES", max_bytes)
    for i in range(10):
        f = tmp_path / f"{i:02x}" / f"{i:02x}{'0' * 62}"
        f.parent.mkdir()
        f.write_bytes(b"x" * 100)
        os.utime(f, ns=(10**18 + i, 10**18 + i))  # file i is the i-th oldest
    machine_cache.trim(tmp_path)
    kept = sorted(p.name[:2] for p in tmp_path.glob("*/*"))
    assert kept == [f"{i:02x}" for i in range(10 - left, 10)]


def test_the_cache_directory_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEMWAL_CACHE_DIR first, then XDG_CACHE_HOME, then ~/.cache; off (or empty), or no home, keeps nothing."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "mine"))
    assert machine_cache.cache_dir(key_runs.KIND) == tmp_path / "mine" / "key-runs"
    for off in ("off", "OFF", "", "0", "none"):
        monkeypatch.setenv("MEMWAL_CACHE_DIR", off)
        assert machine_cache.cache_dir(key_runs.KIND) is None
    monkeypatch.delenv("MEMWAL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine_cache.cache_dir(key_runs.KIND) == tmp_path / "xdg" / "memwal" / "key-runs"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored (XDG's rule)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert machine_cache.cache_dir(key_runs.KIND) == tmp_path / "home" / ".cache" / "memwal" / "key-runs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert machine_cache.cache_dir(key_runs.KIND) == tmp_path / "home" / ".cache" / "memwal" / "key-runs"
    monkeypatch.setattr(os.path, "expanduser", lambda p: p)  # no home directory known
    assert machine_cache.cache_dir(key_runs.KIND) is None


_CONSECUTIVE = 20_000  # above key_runs.SMALL_ROWS: runs kept only as runs


def _build(path: str, seed: int = 5) -> ModelTable:
    """A base of two fragments: 20,000 consecutive keys (one run), 20,000 shuffled ones (too
    many runs to keep); two merges (deletion files, small base fragments of scattered keys,
    kept whole); unmerged generations and a WAL tail."""
    rng = np.random.default_rng(seed)
    n = _CONSECUTIVE
    ids = np.concatenate([np.arange(n), rng.permutation(np.arange(n, 2 * n))])
    base = pa.Table.from_pylist(rows(ids, 0, rng), schema=events_schema())
    t = ModelTable(
        path, events_schema(), base, bucket=("id", 4), max_memtable_rows=200, write_params={"max_rows_per_file": n}
    )
    t.put(rows(rng.choice(2 * n + 400, 500, replace=False), 1, rng))
    t.delete([(int(k),) for k in rng.choice(2 * n, 50, replace=False)])
    t.flush()
    for r in t.regions()[:2]:
        t.merge(r, t.flushed(r)[0][0])
    t.put(rows(rng.choice(2 * n + 400, 400, replace=False), 2, rng))
    t.delete([(int(k),) for k in rng.choice(2 * n, 30, replace=False)])
    t.flush()
    t.put(rows(rng.choice(2 * n + 400, 80, replace=False), 3, rng))  # left open: WAL tail
    return t


@pytest.fixture(autouse=True)
def _no_kept_masks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fragments decided one by one, from their key runs, when no whole mask is kept for the
    snapshot (those are taken whole: tests/test_kept_masks.py)."""
    monkeypatch.setattr(kept_masks, "keeping", lambda: False)


def _fresh_process(uri: str, cache_dir: str) -> dict[str, Any]:
    shutil.rmtree(Path(cache_dir, kept_masks.KIND), ignore_errors=True)  # the earlier process's whole mask
    return counted_in_a_new_process(uri, cache_dir)


def test_a_new_process_decides_consecutive_keys_from_kept_runs(tmp_path: Path) -> None:
    """The first process reads every base fragment's keys and keeps the runs of the one of
    consecutive keys and of the small ones; the next process decides those from them (no read
    of their keys), with the same mask and the model's count, also after a merge changed
    their deletion files. The large fragment of shuffled keys is read each time."""
    table = _build(str(tmp_path / "t"))
    cache_dir = str(tmp_path / "cache")
    first = _fresh_process(table.uri, cache_dir)
    frags = lance.dataset(table.uri).get_fragments()
    assert sorted(f.metadata.physical_rows for f in frags)[-2:] == [_CONSECUTIVE] * 2
    assert first["n"] == len(table.model) and first["sources"] == {"data files": len(frags)}
    kept = [p for p in Path(cache_dir, key_runs.KIND).rglob("*") if p.is_file()]
    assert len(kept) == len(frags) - 1  # not the shuffled keys
    assert {p.stat().st_mode & 0o777 for p in kept} == {0o600}  # key ranges are the user's: private
    folders = [kept[0].parent, *kept[0].parent.parents][:3]  # <prefix>/, key-runs/, the cache directory
    assert [p.stat().st_mode & 0o777 for p in folders] == [0o700] * 3 and folders[2] == Path(cache_dir)
    second = _fresh_process(table.uri, cache_dir)
    assert second == {**first, "sources": {"key runs": len(frags) - 1, "data files": 1}}
    region = table.regions()[2]
    table.merge(region, table.flushed(region)[0][0])  # deletes base rows: new deletion files
    third = _fresh_process(table.uri, cache_dir)
    assert third["n"] == len(table.model)
    assert third["sources"] == {"key runs": len(frags) - 1, "data files": 2}  # + the merge's new fragment
    assert third["mask"] == _fresh_process(table.uri, str(tmp_path / "empty"))["mask"]


def test_runs_in_process_equal_a_read_of_the_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot deciding from runs drops the rows one reading the keys drops; with the
    cache off, nothing is kept; an unwritable cache directory keeps nothing and answers alike."""
    table = _build(str(tmp_path / "t"), seed=8)
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    read = mq.open_table(table.uri)
    assert read.count_rows() == len(table.model)
    want = read.merge_state.base_mask.all().tolist()
    read.view.cache.reset()
    calls: list[object] = []
    real = base_reads_module.read_columns
    monkeypatch.setattr(base_reads_module, "read_columns", lambda *a, **k: calls.append(a) or real(*a, **k))
    runs = mq.open_table(table.uri)
    assert runs.count_rows() == len(table.model) and runs.merge_state.base_mask.all().tolist() == want
    frags = lance.dataset(table.uri).get_fragments()
    assert dict(runs.merge_state.base_mask.status().key_sources) == {"key runs": len(frags) - 1, "data files": 1}
    assert f"key runs: {len(frags) - 1}" in runs.explain()
    assert len(calls) == 1  # the shuffled keys
    first = next(f for f in frags if f.metadata.physical_rows == _CONSECUTIVE)
    data_file = Path(table.uri) / "data" / first.metadata.files[0].path
    st_ = data_file.stat()
    os.utime(data_file, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))  # a file changed since: not trusted
    runs.view.cache.reset()
    touched = mq.open_table(table.uri)
    assert touched.count_rows() == len(table.model) and touched.merge_state.base_mask.all().tolist() == want
    assert dict(touched.merge_state.base_mask.status().key_sources)["data files"] == 2  # + the touched one
    for setting in ("off", str(tmp_path / "a-file")):
        (tmp_path / "a-file").write_text("not a directory")
        monkeypatch.setenv("MEMWAL_CACHE_DIR", setting)
        runs.view.cache.reset()
        again = mq.open_table(table.uri)
        assert again.count_rows() == len(table.model) and again.merge_state.base_mask.all().tolist() == want
        assert "key runs" not in dict(again.merge_state.base_mask.status().key_sources)
        assert machine_cache.cache_dir(key_runs.KIND) is None or not machine_cache.cache_dir(key_runs.KIND).exists()  # type: ignore[union-attr]
