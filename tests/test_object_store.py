"""The read path against a local S3-compatible server (moto, on 127.0.0.1)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import memwal_query as mq

from lsm_model import PK, sort_table

BUCKET = "memwal-test"


@pytest.fixture(scope="module")
def s3_options() -> Iterator[dict[str, str]]:
    pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
        ).create_bucket(Bucket=BUCKET)
        yield {
            "aws_access_key_id": "k",
            "aws_secret_access_key": "s",
            "aws_endpoint": endpoint,
            "allow_http": "true",
            "aws_region": "us-east-1",
        }
    finally:
        proc.terminate()
        proc.wait(10)


def test_s3_table_written_by_pylance(s3_options: dict[str, str]) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    uri = f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}"
    ds = lance.write_dataset(
        pa.table({"id": list(range(100)), "v": [0] * 100}, schema=schema), uri, storage_options=s3_options
    )
    ds.initialize_mem_wal(unsharded=True, max_memtable_rows=30)
    ds = lance.dataset(uri, storage_options=s3_options)
    model = {i: 0 for i in range(100)}
    with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=30) as w:  # flushed generation
        w.put(pa.table({"id": list(range(10)), "v": [1] * 10}, schema=schema))
        model.update({i: 1 for i in range(10)})
    w = ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=30)  # left open: WAL tail
    w.put(pa.table({"id": [50, 51], "v": [2, 2]}, schema=schema))
    w.delete(pa.table({"id": [99]}))  # keys 0..9 belong to the other region: not touched here
    model.update({50: 2, 51: 2})
    del model[99]
    try:
        table = mq.open_table(uri, storage_options=s3_options)
        expected = pa.table({"id": list(model), "v": list(model.values())}, schema=schema)
        got = sort_table(table.to_arrow(), ["id"])
        assert got.to_pylist() == sort_table(expected, ["id"]).to_pylist(), table.explain()
        assert table.count_rows() == len(model)
        assert "WAL tail" in table.explain()
        assert table.io_stats.requests > 0  # type: ignore[attr-defined]
        eventual = mq.open_table(uri, storage_options=s3_options, consistency="eventual")
        assert eventual.count_rows() == 100
    finally:
        w.close()


def test_s3_missing_table_is_clear(s3_options: dict[str, str]) -> None:
    with pytest.raises(mq.TableNotFoundError, match=f"s3://{BUCKET}/nothing-here"):
        mq.open_table(f"s3://{BUCKET}/nothing-here", storage_options=s3_options)


def test_s3_options_pylance_takes_are_taken(s3_options: dict[str, str]) -> None:
    """Keys pylance accepts were "unknown storage option" to memwal (timeouts, proxies, public
    buckets, the region under its environment name); a misspelt key still is."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    uri = f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}"
    ds = lance.write_dataset(pa.table({"id": [1, 2], "v": [0, 0]}, schema=schema), uri, storage_options=s3_options)
    ds.initialize_mem_wal(unsharded=True)
    extra = {"request_timeout": "30s", "pool_idle_timeout": "60s", "aws_checksum_algorithm": "sha256"}
    region = {k: v for k, v in s3_options.items() if k != "aws_region"} | {"aws_default_region": "us-east-1"}
    for options in (s3_options | extra, region, s3_options | {"aws_unsigned_payload": "true"}):
        assert mq.open_table(uri, storage_options=options).count_rows() == 2
    # unsigned requests, for a public bucket: memwal's own reads pass (moto lets them list and
    # read), Lance's GET of this private bucket's manifest is refused
    with pytest.raises(mq.ManifestError, match="403 Forbidden"):
        mq.open_table(uri, storage_options=s3_options | {"aws_skip_signature": "true"})
    with pytest.raises(mq.InvalidArgumentError, match="unknown storage option 'aws_endpont'"):
        mq.open_table(uri, storage_options=s3_options | {"aws_endpont": "x"})


def test_s3_refresh_lookup_and_routed_writes(s3_options: dict[str, str]) -> None:
    from memwal_write import write_arrow

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    uri = f"s3://{BUCKET}/r-{uuid.uuid4().hex[:8]}"
    lance.write_dataset(
        pa.table({"id": list(range(50)), "v": [0] * 50}, schema=schema), uri, storage_options=s3_options
    ).initialize_mem_wal(bucket_column="id", num_buckets=4, max_memtable_rows=100)
    model = {i: 0 for i in range(50)}
    stats = write_arrow(uri, pa.table({"id": [1, 2, 60], "v": [1, 1, 1]}), storage_options=s3_options)
    assert sum(stats.column("rows_put").to_pylist()) == 3
    model.update({1: 1, 2: 1, 60: 1})
    table = mq.open_table(uri, storage_options=s3_options)
    assert table.count_rows() == len(model)
    write_arrow(uri, None, deletes=pa.table({"id": [2]}), storage_options=s3_options)
    del model[2]
    newer = table.refresh()
    assert dict(zip(*newer.to_arrow().to_pydict().values(), strict=True)) == model
    assert newer.lookup([1, 2, 60]).sort_by("id").to_pydict() == {"id": [1, 60], "v": [1, 1]}
    assert len(newer.plan("id = 60").regions) == 1


def test_s3_catalog_and_change_feed(s3_options: dict[str, str]) -> None:
    """A catalog over an S3 prefix: lists MemWAL tables, sees later writes; changes since a token."""
    import datafusion

    from memwal_write import merge_generations, write_arrow

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    root = f"s3://{BUCKET}/wh-{uuid.uuid4().hex[:8]}"
    for name, n in (("events", 20), ("users", 5)):
        lance.write_dataset(
            pa.table({"id": list(range(n)), "v": [0] * n}, schema=schema), f"{root}/{name}", storage_options=s3_options
        ).initialize_mem_wal(bucket_column="id", num_buckets=2)
    lance.write_dataset(pa.table({"a": [1]}), f"{root}/plain", storage_options=s3_options)
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, root, storage_options=s3_options)
    assert catalog.table_names() == ["events", "users"]
    token = catalog.table("events").change_token
    write_arrow(f"{root}/events", pa.table({"id": [3, 99], "v": [1, 1]}), storage_options=s3_options)
    assert ctx.sql("SELECT count(*) AS n FROM memwal.public.events").to_pydict()["n"] == [21]
    merge_generations(f"{root}/events", storage_options=s3_options)
    write_arrow(f"{root}/events", None, deletes=pa.table({"id": [4]}), storage_options=s3_options)
    got = ctx.sql(f"SELECT id, v, _change FROM memwal_changes('events', '{token}') ORDER BY id").to_pydict()
    assert got == {"id": [3, 4, 99], "v": [1, None, 1], "_change": ["upsert", "delete", "upsert"]}
    # garbage collection on S3: the merged generations' directories and WAL entries go, rows stay
    from memwal_write import collect_garbage

    write_arrow(f"{root}/events", pa.table({"id": [50, 51], "v": [2, 2]}), storage_options=s3_options)
    merge_generations(f"{root}/events", storage_options=s3_options)
    removed = collect_garbage(f"{root}/events", older_than=0, storage_options=s3_options)
    assert set(removed.column("kind").to_pylist()) == {"generation", "wal"}  # each region's newest WAL file stays
    assert collect_garbage(f"{root}/events", older_than=0, storage_options=s3_options).num_rows == 0
    assert ctx.sql("SELECT count(*) AS n FROM memwal.public.events").to_pydict()["n"] == [22]


def test_s3_base_keys_are_read_through_lance(s3_options: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On an object store the base mask reads key columns through Lance's scanner (the data
    files are read directly on local disk only); counts after a merge (deletion files on the
    base) equal the model."""
    import memwal_query.base_reads as base_reads_module
    from memwal_write import merge_generations, write_arrow

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    uri = f"s3://{BUCKET}/d-{uuid.uuid4().hex[:8]}"
    lance.write_dataset(
        pa.table({"id": list(range(3000)), "v": [0] * 3000}, schema=schema), uri, storage_options=s3_options
    ).initialize_mem_wal(bucket_column="id", num_buckets=2, max_memtable_rows=100_000)
    model = dict.fromkeys(range(3000), 0)
    write_arrow(uri, pa.table({"id": list(range(0, 3000, 3)), "v": [1] * 1000}), storage_options=s3_options)
    model.update(dict.fromkeys(range(0, 3000, 3), 1))
    merge_generations(uri, storage_options=s3_options)  # base rows rewritten: deletion files
    write_arrow(uri, pa.table({"id": [*range(1, 3000, 5), 5000], "v": [2] * 601}), storage_options=s3_options)
    model.update(dict.fromkeys([*range(1, 3000, 5), 5000], 2))
    base = lance.dataset(uri, storage_options=s3_options)
    assert any(f.metadata.deletion_file is not None for f in base.get_fragments())
    direct: list[object] = []
    real = base_reads_module.read_columns
    monkeypatch.setattr(base_reads_module, "read_columns", lambda *a, **k: direct.append(a) or real(*a, **k))
    table = mq.open_table(uri, storage_options=s3_options)
    assert table.sql("SELECT count(*) AS n FROM t").to_pydict()["n"] == [len(model)]
    assert direct == []
    assert dict(table.merge_state.base_mask.status().key_sources) == {"Lance scanner": len(base.get_fragments())}
    assert dict(zip(*table.to_arrow().to_pydict().values(), strict=True)) == model


def test_s3_full_text_search_scores_as_one_index(s3_options: dict[str, str], tmp_path: Path) -> None:
    """Index files, posting lists and non-live rows' texts read from S3; the oracle is one local
    INVERTED index over the live rows."""
    from lance.query import MatchQuery

    from memwal_query.fts.corpus import corpus_of
    from memwal_query.vector_background import wait_warm
    from memwal_write import write_arrow

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("text", pa.string())])
    words = ["apple", "banana", "cherry", "date", "elder", "fig"]
    texts = {i: " ".join(words[j % 6] for j in range(i % 5, i % 5 + 1 + i % 4)) for i in range(300)}
    uri = f"s3://{BUCKET}/fts-{uuid.uuid4().hex[:8]}"
    base = pa.table({"id": list(texts), "text": list(texts.values())}, schema=schema)
    ds = lance.write_dataset(base, uri, storage_options=s3_options)
    ds.create_scalar_index("text", "INVERTED")
    lance.dataset(uri, storage_options=s3_options).initialize_mem_wal(bucket_column="id", num_buckets=2)
    newer = {i: "fig fig banana" for i in range(0, 300, 7)}  # supersedes indexed base rows
    write_arrow(
        uri, pa.table({"id": list(newer), "text": list(newer.values())}, schema=schema), storage_options=s3_options
    )
    texts.update(newer)
    oracle = lance.write_dataset(
        pa.table({"id": list(texts), "text": list(texts.values())}, schema=schema), str(tmp_path / "o")
    )
    oracle.create_scalar_index("text", "INVERTED")
    table = mq.open_table(uri, storage_options=s3_options)
    for query in ("banana", "apple fig", "cherry date"):
        got = table.search_text("text", query, k=300, columns=["id"])
        want = oracle.scanner(columns=["id", "_score"], full_text_query=MatchQuery(query, "text"), limit=300).to_table()
        g = dict(zip(got["id"].to_pylist(), got["_score"].to_pylist(), strict=True))
        w = dict(zip(want["id"].to_pylist(), want["_score"].to_pylist(), strict=True))
        assert g.keys() == w.keys() and all(abs(g[i] - w[i]) <= 1e-3 * w[i] for i in w), query
    base_source = corpus_of(table.view, "text").indexed[0]
    assert base_source.files[0].postings_decodable and base_source.nonlive.rows == len(newer)
    files = base_source.files[0]
    assert files.partitions[0].posting_rowids("banana").size == files.doc_freq("banana") > 0  # read from S3
    wait_warm()
    assert base_source.nonlive.from_text  # the non-live rows' texts were read from S3 too


def test_s3_locations_name_the_keys_lance_reads(s3_options: dict[str, str]) -> None:
    """Lance percent-decodes an s3:// URI's path and resolves ``.``/``..`` segments; memwal's
    own reads used the key as written: ``a%20b`` opened nothing (Lance wrote ``a b``), or with
    both folders present mixed two tables. Catalog names with such characters too."""
    import datafusion

    from memwal_write import merge_generations, write_arrow

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    root = f"s3://{BUCKET}/loc-{uuid.uuid4().hex[:8]}"
    lance.write_dataset(
        pa.table({"id": [1, 2, 3], "v": [0, 0, 0]}, schema=schema), f"{root}/a%20b", storage_options=s3_options
    ).initialize_mem_wal(unsharded=True)  # Lance's folder: "a b"
    write_arrow(f"{root}/a b", pa.table({"id": [4], "v": [1]}), storage_options=s3_options)
    for uri in (f"{root}/a%20b", f"{root}/a b", f"{root}/x/../a b", f"{root}/./a%20b/"):
        assert sorted(mq.open_table(uri, storage_options=s3_options).to_arrow().column("id").to_pylist()) == [
            1,
            2,
            3,
            4,
        ]
    merge_generations(f"{root}/a%20b", storage_options=s3_options)
    assert lance.dataset(f"{root}/a%20b", storage_options=s3_options).count_rows() == 4
    ctx = datafusion.SessionContext()
    catalog = mq.register_catalog(ctx, root, storage_options=s3_options)
    assert catalog.table_names() == ["a b"]
    assert ctx.sql('SELECT count(*) AS n FROM memwal.public."a b"').to_pydict()["n"] == [4]
    for bad in ("s3://", f"{root}//a b"):
        with pytest.raises(mq.InvalidArgumentError, match="names no bucket|empty path segment"):
            mq.open_table(bad, storage_options=s3_options)


def test_gcs_table_without_credentials_fails_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``gs://`` table unreachable (no credentials, no network here) was retried by pyarrow
    for 15 minutes: a call that looked hung. memwal's reads retry for ``GCS_RETRY_SECONDS``."""
    import threading

    import memwal_query.format.storage as storage

    monkeypatch.setattr(storage, "GCS_RETRY_SECONDS", 1.0)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            mq.open_table("gs://memwal-no-such-bucket/t")
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - inspected below
            outcome.append(err)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(120)  # a hang detector, not a timing claim: the default retried for 15 minutes
    assert outcome, "open_table('gs://...') still running after 120 s"
    err = outcome[0]
    assert isinstance(err, mq.MemWalError) and "gs://memwal-no-such-bucket/t" in str(err)
