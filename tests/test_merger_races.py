"""The merger against commits that land while it merges one generation: a user's writes and
column changes straight on the base, and another merger plus the garbage collector. Each race
is forced at a chosen point of the merge (a hook runs the other party's commit there)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.dataset import MergeInsertBuilder

import memwal_query as mq
import memwal_write.merger as merger
from memwal_write import collect_garbage, merge_generations, write_arrow

from lsm_model import PK

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])


def _table(tmp_path: Path, base: int = 10) -> str:
    uri = str(tmp_path / "t")
    rows = pa.table({"id": list(range(base)), "v": [f"b{i}" for i in range(base)]}, schema=SCHEMA)
    lance.write_dataset(rows, uri).initialize_mem_wal(bucket_column="id", num_buckets=1)
    return uri


def _rows(pairs: list[tuple[int, str]]) -> pa.Table:
    return pa.table({"id": [p[0] for p in pairs], "v": [p[1] for p in pairs]}, schema=SCHEMA)


def _keys(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def _read(uri: str) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for r in mq.open_table(uri).to_arrow().to_pylist())


def _base(uri: str) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for r in lance.dataset(uri).to_table().to_pylist())


def _once(action: Any) -> Any:
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            action()

    return run


def _before_execute(monkeypatch: pytest.MonkeyPatch, action: Any) -> Any:
    """Run ``action`` before every ``merge_insert`` execute (the merge's upserts); returns the
    original ``execute``."""
    execute = MergeInsertBuilder.execute

    def hooked_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        action()
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(MergeInsertBuilder, "execute", hooked_execute)
    return execute


@pytest.mark.parametrize("window", ["before the deletes", "before the mark"])
@pytest.mark.parametrize("how", ["append", "merge_insert"])
def test_a_key_written_to_the_base_while_its_tombstone_merges_stays_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: str, how: str
) -> None:
    """A generation deletes keys 5 (in the base) and 50 (not); a user writes 50 straight to the
    base meanwhile. Readers show 50 deleted (the unmerged generation is newer than the base);
    Lance finds no conflict between the merge's deletes and an insert, so the merge used to
    leave the user's row in the base and 50 came back for good."""
    uri = _table(tmp_path)
    write_arrow(uri, _rows([(20, "g20"), (3, "g3")]), deletes=_keys([5, 50]))
    want = [(i, f"b{i}") for i in range(10) if i not in (3, 5)] + [(3, "g3"), (20, "g20")]
    seen: list[list[tuple[int, str]]] = []

    def user_writes() -> None:
        row = _rows([(50, "user50")])
        if how == "append":
            lance.write_dataset(row, uri, mode="append")
        else:
            lance.dataset(uri).merge_insert("id").when_not_matched_insert_all().execute(row)
        seen.append(_read(uri))

    race = _once(user_writes)
    if window == "before the deletes":
        commit = lance.LanceDataset.commit

        def hooked_commit(*args: Any, **kwargs: Any) -> Any:
            race()
            return commit(*args, **kwargs)

        monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(hooked_commit))
    else:
        _before_execute(monkeypatch, race)

    stats = merge_generations(uri).to_pylist()
    monkeypatch.undo()
    assert seen == [sorted(want)]  # the race ran, and readers showed 50 deleted
    # before the deletes: computed again over the user's row; before the mark: deleted after it
    deleted = 2 if window == "before the deletes" else 3
    assert [(s["status"], s["rows_deleted"]) for s in stats] == [("merged", deleted)]
    assert _read(uri) == sorted(want)
    assert _base(uri) == sorted(want)


@pytest.mark.parametrize("typ", [pa.uint64(), pa.large_string()], ids=str)
def test_a_reappeared_key_of_a_type_substrait_lacks_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typ: pa.DataType
) -> None:
    """The clean-up after the mark reads the reappeared keys' rows with a filter Lance runs:
    an expression filter over a uint64 (above 2^63) or large_string key failed in Lance's
    Substrait conversion, the merge raised it and the user's row stayed."""

    def key(i: int) -> object:
        return 2**63 + i if pa.types.is_uint64(typ) else f"k{i}"

    schema = pa.schema([pa.field("id", typ, nullable=False, metadata=PK), pa.field("v", pa.string())])
    uri = str(tmp_path / "t")
    base = pa.table({"id": [key(i) for i in range(10)], "v": [f"b{i}" for i in range(10)]}, schema=schema)
    lance.write_dataset(base, uri).initialize_mem_wal(bucket_column="id", num_buckets=1)
    upsert = pa.table({"id": [key(20)], "v": ["g20"]}, schema=schema)
    write_arrow(uri, upsert, deletes=pa.table({"id": pa.array([key(5), key(50)], typ)}))
    user_row = pa.table({"id": [key(50)], "v": ["user50"]}, schema=schema)
    race = _once(lambda: lance.write_dataset(user_row, uri, mode="append"))
    _before_execute(monkeypatch, race)

    stats = merge_generations(uri).to_pylist()
    monkeypatch.undo()
    assert [(s["status"], s["rows_deleted"]) for s in stats] == [("merged", 3)]
    want = sorted([key(i) for i in range(10) if i != 5] + [key(20)])  # type: ignore[type-var]
    assert sorted(lance.dataset(uri).to_table().column("id").to_pylist()) == want
    assert sorted(mq.open_table(uri).to_arrow().column("id").to_pylist()) == want


@pytest.mark.parametrize("other", ["compact_files", "cleanup_old_versions"])
def test_a_reappeared_key_moved_by_a_compaction_is_still_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """A compaction between the mark and the clean-up gives the user's row a new address: the
    delete by address removed nothing (Lance re-ran it on the newer version) and 50 stayed."""
    uri = _table(tmp_path)
    write_arrow(uri, _rows([(20, "g20"), (3, "g3")]), deletes=_keys([5, 50]))
    user = _once(lambda: lance.write_dataset(_rows([(50, "user50")]), uri, mode="append"))
    _before_execute(monkeypatch, user)

    def maintain() -> None:
        ds = lance.dataset(uri)
        if other == "compact_files":
            ds.optimize.compact_files(materialize_deletions_threshold=0.0)
        else:
            ds.cleanup_old_versions(older_than=datetime.timedelta(0))

    maintenance = _once(maintain)
    delete = lance.LanceDataset.delete

    def hooked_delete(self: Any, *args: Any, **kwargs: Any) -> Any:
        maintenance()
        return delete(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "delete", hooked_delete)
    merge_generations(uri)
    monkeypatch.undo()
    want = sorted([(i, f"b{i}") for i in range(10) if i not in (3, 5)] + [(3, "g3"), (20, "g20")])
    assert _base(uri) == want and _read(uri) == want


def test_a_newer_generation_of_a_deleted_key_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows removed after the mark are the ones found at the mark's version: a newer
    generation merged before they are removed writes its own row of the key, which stays."""
    uri = _table(tmp_path)
    write_arrow(uri, _rows([(20, "g20")]), deletes=_keys([50]))  # generation 1
    write_arrow(uri, _rows([(50, "g2")]))  # generation 2 puts 50 back
    find = merger.delete_reappeared
    user = _once(lambda: lance.write_dataset(_rows([(50, "user50")]), uri, mode="append"))
    execute = _before_execute(monkeypatch, user)

    later = _once(lambda: merge_generations(uri))  # generation 2, between the mark and the clean-up

    def hooked_find(ds: lance.LanceDataset, *args: Any) -> int:
        monkeypatch.setattr(MergeInsertBuilder, "execute", execute)
        later()
        return find(ds, *args)

    monkeypatch.setattr(merger, "delete_reappeared", hooked_find)
    merge_generations(uri, max_generations=1)
    monkeypatch.undo()
    want = sorted([(i, f"b{i}") for i in range(10)] + [(20, "g20"), (50, "g2")])
    assert _read(uri) == want
    assert _base(uri) == want


def test_a_column_renamed_beside_the_deletes_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rename commits beside the merge's deletes without a conflict: the upserts were then
    selected by the old names (pyarrow's KeyError). They are read again with the new columns."""
    uri = _table(tmp_path)
    write_arrow(uri, _rows([(3, "g3")]), deletes=_keys([5]))
    rename = _once(lambda: lance.dataset(uri).alter_columns({"path": "v", "name": "w"}))
    commit = lance.LanceDataset.commit

    def hooked_commit(*args: Any, **kwargs: Any) -> Any:
        rename()
        return commit(*args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(hooked_commit))
    assert merge_generations(uri).column("status").to_pylist() == ["merged"]
    monkeypatch.undo()
    want = sorted([(i, "g3" if i == 3 else f"b{i}") for i in range(10) if i != 5])
    assert sorted((r["id"], r["w"]) for r in lance.dataset(uri).to_table().to_pylist()) == want


def test_a_generation_merged_and_collected_by_another_merger_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This merger read the index (generations 1 and 2 unmerged); another merged both and the
    collector removed their files before this one read them: it said the generation was lost."""
    uri = _table(tmp_path)
    write_arrow(uri, _rows([(3, "g1"), (70, "g1")]), deletes=_keys([4]))
    write_arrow(uri, _rows([(3, "g2")]))
    write_arrow(uri, _rows([(3, "g3")]))  # the newest WAL file stays

    def other_merger() -> None:
        assert merge_generations(uri, max_generations=2).column("status").to_pylist() == ["merged", "merged"]
        assert collect_garbage(uri, older_than=0).num_rows

    other = _once(other_merger)
    read = merger._generation_rows

    def hooked(*args: Any) -> pa.Table:
        other()
        return read(*args)

    monkeypatch.setattr(merger, "_generation_rows", hooked)
    stats = merge_generations(uri).to_pylist()
    monkeypatch.undo()
    assert [(s["generation"], s["status"]) for s in stats] == [(1, "skipped"), (2, "skipped"), (3, "merged")]
    want = sorted([(i, f"b{i}") for i in range(10) if i not in (3, 4)] + [(3, "g3"), (70, "g1")])
    assert _base(uri) == want and _read(uri) == want


def test_deletes_computed_again_never_remove_a_newer_generations_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While this merger commits generation 1's deletes (key 50, not in the base), another
    merger merges generations 1 and 2 (which puts 50 back). A commit landed beside the deletes,
    but computing them again at the newer version would delete generation 2's row: the
    generation is merged there, so this merger stops (its mark is refused: skipped)."""
    uri = _table(tmp_path)
    write_arrow(uri, _rows([(20, "g20")]), deletes=_keys([50]))  # generation 1
    write_arrow(uri, _rows([(50, "g2")]))  # generation 2
    other = _once(lambda: merge_generations(uri))
    commit = lance.LanceDataset.commit

    def hooked_commit(*args: Any, **kwargs: Any) -> Any:
        other()
        return commit(*args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(hooked_commit))
    stats = merge_generations(uri).to_pylist()
    monkeypatch.undo()
    assert [s["status"] for s in stats] == ["skipped", "skipped"]
    want = sorted([(i, f"b{i}") for i in range(10)] + [(20, "g20"), (50, "g2")])
    assert _base(uri) == want and _read(uri) == want


def test_other_regions_merging_beside_cost_no_extra_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mergers of other regions commit beside each other all the time (a Spark job merges every
    region at once): their merges write rows of their own keys only, so they neither make this
    merger compute its deletes again nor look for reappeared keys."""
    uri = str(tmp_path / "t")
    rows = pa.table({"id": list(range(40)), "v": [f"b{i}" for i in range(40)]}, schema=SCHEMA)
    lance.write_dataset(rows, uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
    write_arrow(uri, _rows([(100 + i, "new") for i in range(10)]), deletes=_keys(list(range(0, 40, 3))))
    mine, other = mq.open_table(uri).region_ids
    merge_generations(uri, regions=[other])
    write_arrow(uri, _rows([(200 + i, "newer") for i in range(10)]))  # the other region's next: inserts only
    others = _once(lambda: merge_generations(uri, regions=[other]))
    commit, rounds = lance.LanceDataset.commit, []

    def hooked_commit(*args: Any, **kwargs: Any) -> Any:
        rounds.append(1)
        others()  # merges beside this merger's deletes (no conflict: new fragments only)
        return commit(*args, **kwargs)

    def no_cleanup(*args: Any) -> int:
        raise AssertionError("no row could have reappeared")

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(hooked_commit))
    monkeypatch.setattr(merger, "delete_reappeared", no_cleanup)
    stats = merge_generations(uri, regions=[mine], max_generations=1).to_pylist()
    monkeypatch.undo()
    assert [s["status"] for s in stats] == ["merged"] and len(rounds) == 1  # one round of deletes
    assert mq.open_table(uri).snapshot.index.merged_generation(other) == 2  # it did merge beside
    want = sorted(
        [(i, f"b{i}") for i in range(40) if i % 3]
        + [(100 + i, "new") for i in range(10)]
        + [(200 + i, "newer") for i in range(10)]
    )
    assert _read(uri) == want
    base = _base(uri)  # this region's newer inserts are not merged yet
    assert set(base) <= set(want) and {r for r in want if r[0] < 200} <= set(base)
