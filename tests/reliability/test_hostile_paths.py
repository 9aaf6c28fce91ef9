"""Hostile tables: paths read from a table's own metadata never leave the table.

A real "secret" Lance dataset sits next to the table; each test points a piece of the
table's metadata at it (one protobuf field of a pylance-written file) and checks that
reading fails with a one-line :class:`MemWalCorruptionError` naming the table, region and
value, that ``memwal verify`` reports it (exit 2), and that the secret never comes back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.cli import main
from memwal_query.format.paths import normalise_relative

from hostile import SECRET_ROW, Hostile, build_hostile, edit_mem_wal_details, inline_snapshot_bytes, set_generation_path


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return build_hostile(tmp_path_factory.mktemp("hostile"))


@pytest.fixture
def copy(pristine: Hostile, tmp_path: Path) -> Hostile:
    shutil.copytree(pristine.root, tmp_path / "c", symlinks=True)
    return Hostile(tmp_path / "c", pristine.region)


def _assert_refused(h: Hostile, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(mq.MemWalCorruptionError) as e:
        mq.open_table(str(h.table)).to_arrow()
    msg = str(e.value)
    assert "\n" not in msg and str(h.table) in msg and h.region in msg and repr(value)[:40] in msg, msg
    with pytest.raises(mq.MemWalCorruptionError):
        mq.open_table(str(h.table), consistency="eventual")
    code = main(["verify", str(h.table)])
    out = capsys.readouterr().out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert code == 2 and len(problems) == 1 and "leaves the region folder" in problems[0], out
    assert str(h.latest_manifest()) in problems[0]


def test_the_secret_is_reachable_by_a_naive_reader(copy: Hostile) -> None:
    """The attack is real: the naive join of region folder and path opens the secret."""
    naive = lance.dataset(f"{copy.region_dir}/../../../secret").to_table().to_pylist()
    assert naive == [{"id": 999, "v": "SECRET"}]
    assert mq.open_table(str(copy.table)).count_rows() == 25  # ids 0..24 (the base's 1 and 2 among them)
    assert main(["verify", str(copy.table)]) == 0


@pytest.mark.parametrize(
    "value",
    [
        "../../../secret",
        "x_gen_1/../../../../secret",
        "%2e%2e/%2e%2e/%2e%2e/secret",
        "%252e%252e/%252e%252e/%252e%252e/secret",
        "..%2f..%2f..%2fsecret",
        "..\\..\\..\\secret",
        "s3://memwal-test/secret",
        "file:///etc",
        "gen\x00/../../../secret",
        "~/secret",
    ],
)
def test_generation_path_escapes_are_refused(copy: Hostile, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    set_generation_path(copy.latest_manifest(), value)
    _assert_refused(copy, value, capsys)


def test_absolute_and_file_url_paths_are_refused(copy: Hostile, capsys: pytest.CaptureFixture[str]) -> None:
    for value in (str(copy.secret), f"file://{copy.secret}"):
        set_generation_path(copy.latest_manifest(), value)
        _assert_refused(copy, value, capsys)


def test_symlinked_generation_pointing_outside_is_refused(copy: Hostile, capsys: pytest.CaptureFixture[str]) -> None:
    os.symlink(copy.secret, copy.region_dir / "evil_gen_1")
    set_generation_path(copy.latest_manifest(), "evil_gen_1")
    _assert_refused(copy, "evil_gen_1", capsys)


def test_symlinked_region_folder_pointing_outside_is_refused(copy: Hostile, capsys: pytest.CaptureFixture[str]) -> None:
    outside = copy.root / "elsewhere"
    shutil.move(copy.region_dir, outside)
    os.symlink(outside, copy.region_dir)
    with pytest.raises(mq.MemWalCorruptionError, match="region folder is a symlink|is not read: .* is a symlink"):
        mq.open_table(str(copy.table)).to_arrow()
    assert main(["verify", str(copy.table)]) == 2
    capsys.readouterr()


def test_paths_inside_the_region_still_read(copy: Hostile) -> None:
    """Normalisation keeps legitimate spellings working: ./x, x/, a/../x."""
    real = copy.latest_manifest()
    from memwal_query.format.decode import decode_region_manifest

    name = decode_region_manifest(real.read_bytes()).flushed_generations[0].path
    for value in (f"./{name}", f"{name}/", f"zz/../{name}"):
        set_generation_path(real, value)
        assert mq.open_table(str(copy.table)).count_rows() == 25


def test_merger_refuses_an_escaping_generation(copy: Hostile) -> None:
    from memwal_write import merge_generations

    set_generation_path(copy.latest_manifest(), "../../../secret")
    with pytest.raises(mq.MemWalCorruptionError, match="leaves the region folder"):
        merge_generations(str(copy.table))
    assert {"id": 999, "v": "SECRET"} not in lance.dataset(str(copy.table)).to_table().to_pylist()


@pytest.mark.parametrize("region_id", ["../../secret_region", "/tmp", "%2e%2e", "not-a-uuid"])
def test_inline_snapshot_region_ids_are_refused(
    copy: Hostile, region_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(copy.region_dir, copy.root / "secret_region")
    data = inline_snapshot_bytes(copy.root, [copy.region, region_id])

    def edit(details: object) -> None:
        details.inline_snapshots = data  # type: ignore[attr-defined]

    edit_mem_wal_details(copy.base_manifest(), edit)
    with pytest.raises(mq.MemWalCorruptionError) as e:
        mq.open_table(str(copy.table), consistency="eventual")
    msg = str(e.value)
    assert "\n" not in msg and str(copy.table) in msg and repr(region_id) in msg and "not a UUID" in msg
    code = main(["verify", str(copy.table)])
    out = capsys.readouterr().out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert code == 2 and len(problems) == 1 and str(copy.base_manifest()) in problems[0], out


def test_valid_inline_snapshot_in_a_rewritten_manifest_is_read(copy: Hostile) -> None:
    data = inline_snapshot_bytes(copy.root, [copy.region])

    def edit(details: object) -> None:
        details.inline_snapshots = data  # type: ignore[attr-defined]

    edit_mem_wal_details(copy.base_manifest(), edit)
    table = mq.open_table(str(copy.table), consistency="eventual")
    assert table.region_ids == [copy.region]
    assert "inline region snapshots" in table.explain()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("..", "climbs out"),
        ("a/../..", "climbs out"),
        ("/abs", "absolute"),
        ("C:/x", "URL or drive"),
        ("http://h/x", "URL or drive"),
        ("a\\b", "backslash"),
        ("a\nb", "control character"),
        ("%2e%2e", "after percent-decoding"),
        ("%25252525252e", "percent-encoded more than"),
        (".", "region folder itself"),
        ("", "empty"),
        ("a" * 2000, "longer than"),
    ],
)
def test_normalise_relative_says_why(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        normalise_relative(value)


# --------------------------------------------------------------------------- #
# The same rule on an object store (moto's S3 server)
# --------------------------------------------------------------------------- #

from test_object_store import BUCKET, s3_options  # noqa: E402,F401 - the moto fixture


def _put_s3(options: dict[str, str], key: str, data: bytes) -> None:
    import boto3

    boto3.client(
        "s3",
        endpoint_url=options["aws_endpoint"],
        aws_access_key_id=options["aws_access_key_id"],
        aws_secret_access_key=options["aws_secret_access_key"],
        region_name=options["aws_region"],
    ).put_object(Bucket=BUCKET, Key=key, Body=data)


@pytest.fixture(scope="module")
def s3_hostile(pristine: Hostile, s3_options: dict[str, str]) -> tuple[str, str]:  # noqa: F811
    """The pristine table uploaded to ``s3://bucket/h/t`` and the secret to ``s3://bucket/h/secret``."""
    prefix = "h"
    for path in pristine.root.rglob("*"):
        if path.is_file():
            _put_s3(s3_options, f"{prefix}/{path.relative_to(pristine.root).as_posix()}", path.read_bytes())
    return f"s3://{BUCKET}/{prefix}/t", pristine.latest_manifest().relative_to(pristine.table).as_posix()


@pytest.mark.parametrize(
    "value",
    ["../../../secret", "%2e%2e/%2e%2e/%2e%2e/secret", f"s3://{BUCKET}/h/secret", f"/{BUCKET}/h/secret"],
)
def test_s3_generation_path_escapes_are_refused(
    pristine: Hostile,
    s3_hostile: tuple[str, str],
    s3_options: dict[str, str],  # noqa: F811
    value: str,
    tmp_path: Path,
) -> None:
    uri, manifest_rel = s3_hostile
    local = tmp_path / "m.binpb"
    shutil.copy(pristine.table / manifest_rel, local)
    set_generation_path(local, value)
    if not value.startswith(("s3:", "/")):  # a naive join of region folder and path reads the secret
        naive = lance.dataset(f"{uri}/_mem_wal/{pristine.region}/{value}", storage_options=s3_options)
        assert naive.to_table().to_pylist() == [{"id": 999, "v": "SECRET"}]
    _put_s3(s3_options, f"h/t/{manifest_rel}", local.read_bytes())
    try:
        with pytest.raises(mq.MemWalCorruptionError) as e:
            mq.open_table(uri, storage_options=s3_options).to_arrow()
        msg = str(e.value)
        assert uri in msg and pristine.region in msg and repr(value) in msg and "\n" not in msg
        from memwal_query.verify import verify_table

        report = verify_table(uri, storage_options=s3_options)
        assert len(report.problems) == 1 and "leaves the region folder" in str(report.problems[0])
    finally:
        _put_s3(s3_options, f"h/t/{manifest_rel}", (pristine.table / manifest_rel).read_bytes())
    assert mq.open_table(uri, storage_options=s3_options).count_rows() == 25


def _generations(h: Hostile) -> list[Path]:
    """The region's generation folders, oldest first (``{random}_gen_{n}``)."""
    return sorted((p for p in h.region_dir.iterdir() if "_gen_" in p.name), key=lambda p: int(p.name.split("_")[-1]))


def test_symlinks_inside_a_generation_pointing_outside_are_refused(copy: Hostile) -> None:
    """The generation folder is real but its ``data`` and ``_versions`` link to another dataset:
    readers returned its row and the merger committed it into the base for good."""
    from memwal_write import merge_generations

    gen = _generations(copy)[0]
    for sub in ("data", "_versions"):
        shutil.rmtree(gen / sub)
        os.symlink(copy.secret / sub, gen / sub)
    for act in (lambda: mq.open_table(str(copy.table)).to_arrow(), lambda: merge_generations(str(copy.table))):
        with pytest.raises(mq.MemWalCorruptionError, match="leaves the region folder: a symlink in it"):
            act()
    assert SECRET_ROW not in lance.dataset(str(copy.table)).to_table().to_pylist()


def test_garbage_collection_never_deletes_through_a_symlink(copy: Hostile, tmp_path: Path) -> None:
    """A region folder linked to another table's region: collect_garbage deleted that table's
    unmerged generations and WAL entries; a merged generation's folder that links to an
    unmerged one would have deleted it. Refused before anything is removed."""
    from memwal_write import collect_garbage, merge_generations

    victim = build_hostile(tmp_path / "victim")
    before = mq.open_table(str(victim.table)).to_arrow()
    files = sorted(p for p in victim.region_dir.rglob("*"))
    merge_generations(str(copy.table))  # the hostile table's generations are merged ...
    shutil.rmtree(copy.region_dir)
    os.symlink(victim.region_dir, copy.region_dir)  # ... and its region folder is the victim's
    with pytest.raises(mq.MemWalCorruptionError, match="is a symlink"):
        collect_garbage(str(copy.table), older_than=0)
    assert sorted(p for p in victim.region_dir.rglob("*")) == files
    assert mq.open_table(str(victim.table)).to_arrow().equals(before)


def test_garbage_collection_keeps_a_generation_a_merged_one_links_to(copy: Hostile) -> None:
    from memwal_write import collect_garbage, merge_generations

    first, second = _generations(copy)[:2]
    merge_generations(str(copy.table), max_generations=1)  # generation 1 merged, 2 not
    shutil.rmtree(first)
    os.symlink(second, first)
    with pytest.raises(mq.MemWalCorruptionError, match="is a symlink"):
        collect_garbage(str(copy.table), older_than=0)
    assert second.is_dir() and any(second.iterdir())


def test_garbage_collection_never_deletes_through_a_region_linked_to_a_sibling(tmp_path: Path) -> None:
    """Region B's folder linked to region A's (inside the same table): GC took A's unmerged
    generations and WAL entries for B's merged ones and deleted them."""
    from memwal_write import collect_garbage, merge_generations

    from lsm_model import PK, ModelTable, sort_table  # noqa: I001

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.int64())])
    base = pa.Table.from_pylist([{"id": -1, "v": 0}], schema=schema)
    t = ModelTable(str(tmp_path / "t"), schema, base, unsharded=True, max_memtable_rows=10)
    a, b = "aaaaaaaa-0000-4000-8000-000000000000", "bbbbbbbb-0000-4000-8000-000000000000"
    for g in range(3):
        t.put([{"id": 100 + g * 10 + i, "v": g} for i in range(10)], region=a)
        t.put([{"id": 200 + g * 10 + i, "v": g} for i in range(10)], region=b)
    t.flush()
    merge_generations(t.uri, regions=[b])
    folders = Path(t.uri, "_mem_wal")
    files = sorted((folders / a).rglob("*"))
    shutil.rmtree(folders / b)
    os.symlink(folders / a, folders / b)
    with pytest.raises(mq.MemWalCorruptionError, match="is a symlink"):
        collect_garbage(t.uri, older_than=0)
    os.unlink(folders / b)
    assert sorted((folders / a).rglob("*")) == files
    assert sort_table(mq.open_table(t.uri).to_arrow(), ["id"]).equals(sort_table(t.expected(), ["id"]))


def test_wal_files_and_region_folders_are_not_read_through_symlinks(copy: Hostile, tmp_path: Path) -> None:
    """WAL entries linked to another table's: readers returned its rows, and the merger, for a
    lost generation rebuilt from the WAL, committed them into the base."""
    from memwal_write import merge_generations

    other = build_hostile(tmp_path / "other")
    wal = copy.region_dir / "wal"
    for mine in copy.wal_files():
        theirs = other.region_dir / "wal" / mine.name
        if theirs.exists():
            mine.unlink()
            os.symlink(theirs, mine)
    shutil.rmtree(_generations(copy)[0])  # lost: rebuilt from the WAL by readers and the merger
    for act in (lambda: mq.open_table(str(copy.table)).to_arrow(), lambda: merge_generations(str(copy.table))):
        with pytest.raises(mq.MemWalError, match="WAL entry .* is not read: .* is a symlink"):
            act()
    assert SECRET_ROW not in lance.dataset(str(copy.table)).to_table().to_pylist()
    assert all(r["v"] in ("a", "b") for r in lance.dataset(str(copy.table)).to_table().to_pylist())
    assert wal.is_dir()


def test_a_region_folder_linked_to_another_tables_region_is_refused(copy: Hostile, tmp_path: Path) -> None:
    other = build_hostile(tmp_path / "other")
    region = copy.table / "_mem_wal" / other.region
    os.symlink(other.region_dir, region)  # a region of its own, linked: WAL tail and all
    with pytest.raises(mq.MemWalCorruptionError, match="is not read: .* is a symlink"):
        mq.open_table(str(copy.table)).to_arrow()


def test_a_generation_folder_linked_outside_after_it_was_opened_is_refused_on_refresh(copy: Hostile) -> None:
    """A refresh keeps generations it opened: the symlink check of their folders ran only on
    the first open, so a folder moved outside the table and linked back was read through."""
    table = mq.open_table(str(copy.table))
    gen = sorted(p for p in copy.region_dir.iterdir() if "_gen_" in p.name)[0]
    outside = copy.root / "outside_gen"
    shutil.move(gen, outside)
    os.symlink(outside, gen)
    for opened in (lambda: mq.open_table(str(copy.table)), table.refresh):
        with pytest.raises(mq.MemWalCorruptionError, match="leaves the region folder"):
            opened().to_arrow()
