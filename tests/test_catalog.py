"""register_catalog: every MemWAL table under a root, fresh per query unless pinned."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import datafusion
import lance
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.errors import InvalidArgumentError, NotAMemWalTableError
from memwal_write import write_arrow

from lsm_model import PK

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.string())])


def memwal_table(uri: str, n: int = 10) -> str:
    ds = lance.write_dataset(pa.table({"id": list(range(n)), "v": ["base"] * n}, schema=SCHEMA), uri)
    ds.initialize_mem_wal(bucket_column="id", num_buckets=2)
    return uri


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    memwal_table(str(tmp_path / "events"), 10)
    memwal_table(str(tmp_path / "users"), 3)
    lance.write_dataset(pa.table({"a": [1, 2]}), str(tmp_path / "plain"))  # a Lance table, no MemWAL index
    (tmp_path / "notes").mkdir()  # not a table
    (tmp_path / "readme.txt").write_text("not a table")
    return tmp_path


def count(ctx: datafusion.SessionContext, table: str) -> int:
    return int(ctx.sql(f"SELECT count(*) AS n FROM {table}").to_pydict()["n"][0])


def test_lists_memwal_tables_only(root: Path) -> None:
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, str(root))
    assert catalog.table_names() == ["events", "users"]
    listed = ctx.sql(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'memwal' "
        "AND table_schema = 'public' ORDER BY table_name"
    ).to_pydict()["table_name"]
    assert listed == ["events", "users"]
    assert count(ctx, "memwal.public.events") == 10 and count(ctx, "memwal.public.users") == 3


def test_a_plain_lance_table_is_named_as_such(root: Path) -> None:
    ctx = datafusion.SessionContext()
    mq.register_catalog(ctx, str(root), name="wh")
    with pytest.raises(Exception, match="without a MemWAL index: the memwal catalog serves MemWAL tables only"):
        ctx.sql("SELECT * FROM wh.public.plain")
    with pytest.raises(Exception, match="not found"):
        ctx.sql("SELECT * FROM wh.public.nope")
    with pytest.raises(NotAMemWalTableError):
        mq.MemWalCatalog(str(root)).table("plain")


def test_an_unreadable_lance_table_is_named_as_such(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A table folder whose manifests are gone is not listed, with one warning naming it (it
    was an INFO line: an object store without credentials listed no table, silently); naming
    it says it cannot be read."""
    for manifest in (root / "users" / "_versions").iterdir():
        manifest.unlink()
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, str(root))
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        assert catalog.table_names() == ["events"]
        assert catalog.table_names() == ["events"]  # listed again: not warned again
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "users" in warned[0] and "not readable as a Lance table" in warned[0], warned
    with pytest.raises(Exception, match="users cannot be read as a Lance table"):
        ctx.sql("SELECT * FROM memwal.public.users")
    with pytest.raises(mq.ManifestError, match="cannot be read as a Lance table"):
        mq.MemWalCatalog(str(root)).table("users")


def test_queries_see_writes_made_after_registration(root: Path) -> None:
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, str(root))
    assert count(ctx, "memwal.public.events") == 10
    first = catalog.table("events")
    write_arrow(str(root / "events"), pa.table({"id": [100, 101], "v": ["new", "new"]}), deletes=pa.table({"id": [0]}))
    assert count(ctx, "memwal.public.events") == 11
    got = ctx.sql("SELECT v FROM memwal.public.events WHERE id = 100").to_pydict()
    assert got == {"v": ["new"]}
    assert catalog.table("events") is not first  # a refreshed snapshot
    # a table created after registration
    memwal_table(str(root / "later"), 4)
    assert "later" in catalog.table_names() and count(ctx, "memwal.public.later") == 4


def test_one_snapshot_per_query_even_when_named_twice(root: Path) -> None:
    ctx = datafusion.SessionContext()
    mq.register_catalog(ctx, str(root))
    q = "SELECT count(*) AS n FROM memwal.public.events a JOIN memwal.public.events b ON a.id = b.id"
    assert ctx.sql(q).to_pydict()["n"] == [10]


def test_pin_and_unpin(root: Path) -> None:
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, str(root))
    pinned = catalog.pin("events")
    write_arrow(str(root / "events"), pa.table({"id": [200], "v": ["x"]}))
    assert count(ctx, "memwal.public.events") == 10
    assert catalog.table("events") is pinned
    catalog.unpin("events")
    assert count(ctx, "memwal.public.events") == 11
    # pin a snapshot kept from earlier
    catalog.pin("events", pinned)
    assert count(ctx, "memwal.public.events") == 10


def test_sql_functions_find_catalog_tables(root: Path) -> None:
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, str(root))
    token = catalog.table("events").change_token
    write_arrow(str(root / "events"), pa.table({"id": [300], "v": ["y"]}), deletes=pa.table({"id": [1]}))
    for name in ("events", "public.events", "memwal.public.events"):
        got = ctx.sql(f"SELECT id, _change FROM memwal_changes('{name}', '{token}') ORDER BY id").to_pydict()
        assert got == {"id": [1, 300], "_change": ["delete", "upsert"]}
    regions = ctx.sql("SELECT count(*) AS n FROM memwal_regions('users')").to_pydict()["n"]
    assert regions == [0]  # nothing written to users yet: no region
    assert ctx.sql("SELECT count(*) AS n FROM memwal_generations('events')").to_pydict()["n"][0] >= 1
    known = re.escape("(known: ['memwal.public.events', 'memwal.public.users'])")
    with pytest.raises(Exception, match=f"no memwal table named 'other.public.events' is registered {known}"):
        ctx.sql("SELECT * FROM memwal_regions('other.public.events')").collect()
    memwal_table(str(root / "a\\b"), 2)  # a backslash cannot be named: not listed (it was, then refused)
    assert "a\\b" not in catalog.table_names()
    memwal_table(str(root / "v1.2"), 4)  # a folder name with a dot: every part before the last was a prefix
    for name in ("v1.2", "public.v1.2", "memwal.public.v1.2"):
        assert ctx.sql(f"SELECT count(*) AS n FROM memwal_lookup('{name}', [1, 2, 9])").to_pydict()["n"] == [2]


def test_default_catalog_lets_queries_use_folder_names(root: Path) -> None:
    config = datafusion.SessionConfig().with_default_catalog_and_schema("memwal", "public")
    ctx = datafusion.SessionContext(config)
    mq.register_catalog(ctx, str(root))
    assert count(ctx, "events") == 10


def test_sql_functions_name_tables_as_sql_does(root: Path, tmp_path: Path) -> None:
    """Registered names are case-insensitive (DataFusion lowercases unquoted names) with an
    optional ``public.``; a name two catalogs hold is ambiguous (the first catalog answered);
    a table cannot be registered into a memwal catalog (a clear error, not DataFusion's)."""
    config = datafusion.SessionConfig().with_default_catalog_and_schema("memwal", "public")
    ctx = datafusion.SessionContext(config)
    mq.register_catalog(ctx, str(root))
    with pytest.raises(InvalidArgumentError, match="its default catalog is a memwal catalog"):
        mq.open_table(str(root / "users")).register(ctx, "extra")
    other = tmp_path / "other"
    memwal_table(str(other / "events"), 4)
    mq.register_catalog(ctx, str(other), name="other")
    with pytest.raises(Exception, match="'events' names a table in 2 catalogs: give its full name"):
        ctx.sql("SELECT count(*) AS n FROM memwal_regions('events')").collect()
    n = ctx.sql("SELECT count(*) AS n FROM memwal_lookup('other.public.events', [1, 2, 3, 9])").to_pydict()["n"]
    assert n == [3]
    plain = datafusion.SessionContext()
    mq.open_table(str(root / "users")).register(plain, "Users")
    for name in ("Users", "users", "public.users", "datafusion.public.USERS"):
        assert plain.sql(f"SELECT count(*) AS n FROM memwal_lookup('{name}', [0, 1, 7])").to_pydict()["n"] == [2]


def test_bad_arguments(root: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="SessionContext"):
        mq.register_catalog("ctx", str(root))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="consistency"):
        mq.register_catalog(datafusion.SessionContext(), str(root), consistency="now")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not a table folder name"):
        mq.MemWalCatalog(str(root)).table("../events")
    for missing in (root / "no-such-folder", root / "readme.txt"):  # a typo listed no table, silently
        with pytest.raises(InvalidArgumentError, match="is not a folder"):
            mq.register_catalog(datafusion.SessionContext(), str(missing))


def test_eventual_catalog(root: Path) -> None:
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, str(root), consistency="eventual")
    assert catalog.table("events").consistency == "eventual"


@pytest.mark.parametrize("flushed", [False, True], ids=["wal-tail", "flushed"])
@pytest.mark.parametrize("how", ["deleted", "overwritten", "restored", "index dropped"])
def test_a_table_written_again_at_the_same_place(tmp_path: Path, flushed: bool, how: str) -> None:
    """A table deleted and written again where the catalog (or a Table) had read one reuses
    region ids, WAL positions and version numbers: refreshed snapshots served the old
    table's cached WAL entries (old rows, no error) or reported its generations lost. A base
    overwritten (``mode="overwrite"``), restored to before its MemWAL index or with that index
    dropped, then its MemWAL layer set up anew, keeps its version history: its old manifests
    still matched, and the cached WAL entries and region manifests were served."""
    from lsm_model import ModelTable

    uri = str(tmp_path / "alpha")

    def write(n: int, tag: str, params: dict[str, str] | None = None) -> ModelTable:
        base = pa.table({"id": list(range(n)), "v": [tag] * n}, schema=SCHEMA)
        t = ModelTable(uri, SCHEMA, base, bucket=("id", 2), write_params=params)
        t.put(pa.table({"id": list(range(n - 3, n + 3)), "v": [tag + "-new"] * 6}, schema=SCHEMA))
        if flushed:
            t.flush()
        return t

    first = write(20, "first")
    ctx = datafusion.SessionContext()
    mq.register_catalog(ctx, str(tmp_path))
    old = mq.open_table(uri)
    assert count(ctx, "memwal.public.alpha") == len(first.model) == old.count_rows()
    first.flush()
    if how == "deleted":
        shutil.rmtree(uri)
        second = write(8, "second")
    elif how == "overwritten":
        shutil.rmtree(Path(uri, "_mem_wal"))
        second = write(8, "second", {"mode": "overwrite"})
    else:
        shutil.rmtree(Path(uri, "_mem_wal"))
        if how == "restored":
            lance.dataset(uri, version=1).restore()  # the base as first written, no MemWAL index
        else:
            lance.dataset(uri).drop_index("__lance_mem_wal")
        lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
        second = ModelTable.attach(uri, SCHEMA)
        second.put(pa.table({"id": [1, 2], "v": ["second-new"] * 2}, schema=SCHEMA))
        if flushed:
            second.flush()
    want = sorted(second.expected().to_pylist(), key=lambda r: r["id"])
    assert sorted(old.refresh().to_arrow().to_pylist(), key=lambda r: r["id"]) == want
    got = ctx.sql("SELECT * FROM memwal.public.alpha ORDER BY id").to_arrow_table().to_pylist()
    assert got == want
    second.flush()


def test_a_folder_replaced_by_a_plain_lance_table(root: Path) -> None:
    """A catalog that read a MemWAL table keeps no belief that the folder holds one: replaced by
    a plain Lance table, it is no longer listed and naming it says what it is (it stayed
    listed, and information_schema failed for every table with NoPrimaryKeyError)."""
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_information_schema(True))
    catalog = mq.register_catalog(ctx, str(root))
    assert count(ctx, "memwal.public.users") == 3
    shutil.rmtree(root / "users")
    lance.write_dataset(pa.table({"a": [1, 2]}), str(root / "users"))
    assert catalog.table_names() == ["events"]
    listed = ctx.sql(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'memwal' AND table_schema = 'public'"
    )
    assert listed.to_pydict()["table_name"] == ["events"]
    with pytest.raises(Exception, match="users is a Lance table without a MemWAL index"):
        ctx.sql("SELECT * FROM memwal.public.users").collect()
    with pytest.raises(Exception, match="users is a Lance table without a MemWAL index"):
        ctx.sql("SELECT * FROM memwal_regions('users')").collect()  # it said "no memwal table named 'users'"


def test_a_table_whose_regions_cannot_be_read_is_listed_and_its_queries_fail(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged region manifest failed SHOW TABLES and information_schema for every table of
    the session (DataFusion opens each table it lists): the table is listed with its base's
    columns, once warned about, and a query reading it fails with the reason."""
    write_arrow(str(root / "users"), pa.table({"id": [7], "v": ["g"]}, schema=SCHEMA))
    manifests = [p for p in (root / "users" / "_mem_wal").rglob("*.binpb") if p.parent.name == "manifest"]
    assert manifests
    for p in manifests:
        p.write_bytes(b"\xff" * 50)
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_information_schema(True))
    mq.register_catalog(ctx, str(root))
    with caplog.at_level(logging.WARNING, logger="memwal_query"):
        for _ in range(2):
            ctx.sql("SHOW TABLES").collect()
            cols = ctx.sql(
                "SELECT table_name, column_name FROM information_schema.columns WHERE table_catalog = 'memwal' "
                "AND table_schema = 'public' ORDER BY table_name, column_name"
            ).to_pydict()
            assert list(zip(cols["table_name"], cols["column_name"], strict=True)) == [
                ("events", "id"),
                ("events", "v"),
                ("users", "id"),
                ("users", "v"),
            ]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "users" in warned[0] and "cannot decode region manifest" in warned[0], warned
    assert count(ctx, "memwal.public.events") == 10
    with pytest.raises(Exception, match="cannot decode region manifest"):
        ctx.sql("SELECT count(*) FROM memwal.public.users").collect()


def test_a_catalog_registered_again_replaces_its_sql_function_names(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A notebook cell run twice registers the catalog again: the SQL functions took each table
    name as held by two catalogs (even in full), and a catalog name moved to another root
    still answered from the old one."""
    ctx = datafusion.SessionContext()
    mq.register_catalog(ctx, str(root))
    mq.register_catalog(ctx, str(root))
    for name in ("events", "memwal.public.events"):
        assert ctx.sql(f"SELECT count(*) AS n FROM memwal_lookup('{name}', [1, 2])").to_pydict()["n"] == [2]
    other = tmp_path_factory.mktemp("other")
    memwal_table(str(other / "logs"), 4)
    mq.register_catalog(ctx, str(other))
    assert ctx.sql("SELECT count(*) AS n FROM memwal_lookup('logs', [1, 2, 3])").to_pydict()["n"] == [3]
    with pytest.raises(Exception, match="no memwal table named 'memwal.public.events'"):
        ctx.sql("SELECT * FROM memwal_lookup('memwal.public.events', [1])").collect()


def test_pin_refuses_a_snapshot_of_another_table(root: Path) -> None:
    catalog = mq.MemWalCatalog(str(root))
    with pytest.raises(InvalidArgumentError, match="cannot pin .*users as 'events'"):
        catalog.pin("events", catalog.table("users"))
    assert catalog.pin("events", mq.open_table(str(root / "events"))).count_rows() == 10


def test_sql_functions_take_a_full_name_of_its_own_catalog_only(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = tmp_path_factory.mktemp("other")
    memwal_table(str(other / "events"), 4)
    memwal_table(str(other / "sales"), 2)
    ctx = datafusion.SessionContext()
    mq.register_catalog(ctx, str(root), name="wa")
    mq.register_catalog(ctx, str(other), name="wb")
    for name, n in (("wa.public.events", 10), ("wb.public.events", 4), ("wb.public.sales", 2), ("sales", 2)):
        assert ctx.sql(f"SELECT count(*) AS n FROM memwal_lookup('{name}', [0, 1, 5])").to_pydict()["n"] == [
            sum(k < n for k in (0, 1, 5))
        ]
    for name in ("wa.public.sales", "zz.public.sales"):
        with pytest.raises(Exception, match=f"no memwal table named '{name}'"):
            ctx.sql(f"SELECT * FROM memwal_lookup('{name}', [1])").collect()
    with pytest.raises(Exception, match="names a table in 2 catalogs"):
        ctx.sql("SELECT * FROM memwal_lookup('events', [1])").collect()
