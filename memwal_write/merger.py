"""Merge flushed generations into the base table, safely under reruns and concurrency.

Per region, flushed generations newer than the region's merged generation (as
recorded in the MemWAL index) are folded into the base in ascending order. Each
generation takes two commits:

1. **Deletes** of its tombstoned keys: a ``merge_insert(...).when_matched_delete()``
   transaction computed at base version ``V`` (where the index says the
   generation is not merged yet) and committed with ``read_version=V``. It only
   removes rows that existed at ``V`` (rows a concurrent merger inserts later are
   never touched), so a stale merger cannot delete a newer value.
2. **Upserts** plus ``mark_sstables_as_compacted([CompactedSsTable(region, gen)])``
   in one commit. Lance refuses to record a generation that is not greater than
   the recorded one ("Stale SSTable compaction"), which makes a rerun or a
   concurrent merger of the same generation a no-op: it is reported as
   ``skipped``.

A reader between the two commits still sees the generation (not marked merged),
whose tombstones hide the deleted keys, so every intermediate state reads the
same rows. Writes straight on the base while a generation merges can add rows of keys
it deletes (Lance sees no conflict): :mod:`memwal_write.merge_deletes` says how the
merge keeps those keys deleted.

Example:
    >>> import lance, tempfile, pyarrow as pa, memwal_query as mq
    >>> from memwal_write import write_arrow
    >>> pk = {"lance-schema:unenforced-primary-key": "true"}
    >>> schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=pk), pa.field("v", pa.string())])
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> lance.write_dataset(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=schema), uri).initialize_mem_wal(
    ...     bucket_column="id", num_buckets=2)
    >>> _ = write_arrow(uri, pa.table({"id": [3], "v": ["c"]}), deletes=pa.table({"id": [1]}))
    >>> stats = merge_generations(uri)
    >>> sorted(stats.column("status").to_pylist())
    ['merged', 'merged']
    >>> sorted(lance.dataset(uri).to_table().column("v").to_pylist())
    ['b', 'c']
    >>> merge_generations(uri).num_rows  # nothing left to merge
    0
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable

from memwal_query.conform import is_list_like
from memwal_query.errors import GenerationLostError, InvalidArgumentError, MemWalError, positive_int
from memwal_query.format.lance_open import lance_message, open_lance, require_table
from memwal_query.format.memwal_index import read_memwal_index
from memwal_query.format.model import FlushedGeneration, MemWalIndex
from memwal_query.format.nested import as_schema
from memwal_query.format.paths import generation_rel
from memwal_query.format.storage import Storage
from memwal_query.format.wal import TOMBSTONE
from memwal_query.snapshot.evolution import conformed_rows, field_paths, stale_columns, tagged_schema
from memwal_query.snapshot.generations import lacking_columns, not_a_generation
from memwal_query.snapshot.manifests import latest_region_manifest, list_regions
from memwal_query.snapshot.model import primary_key_of
from memwal_query.snapshot.recovery import wal_generation_rows
from memwal_write.backoff import backoff
from memwal_write.merge_deletes import commit_deletes, delete_reappeared, wrote_beside

__all__ = ["merge_generations", "merge_generations_spark", "MERGE_STATS_SCHEMA", "GenerationMergeStats"]

log = logging.getLogger("memwal_write")

MERGE_STATS_SCHEMA = pa.schema(
    [
        ("region_id", pa.string()),
        ("generation", pa.int64()),
        ("status", pa.string()),
        ("rows_upserted", pa.int64()),
        ("rows_deleted", pa.int64()),
        ("base_version", pa.int64()),
        ("seconds", pa.float64()),
    ]
)
#: Commits one generation's merge tries before giving up: merges of other regions (a Spark
#: job merges every region at once) update the same base fragments, and each conflict
#: waits a little longer (doubling from :data:`_FIRST_WAIT` seconds, jittered, at most 2 s).
_MAX_ATTEMPTS = 12
_FIRST_WAIT = 0.02


@dataclass
class GenerationMergeStats:
    """What merging one generation did (``status``: ``merged`` or ``skipped``)."""

    region_id: str
    generation: int
    status: str
    rows_upserted: int = 0
    #: the generation's deletes applied (tombstones: a key the base did not hold counts too),
    #: plus rows of deleted keys written straight to the base while it merged and removed after
    rows_deleted: int = 0
    base_version: int = 0
    seconds: float = 0.0


def _open_latest(storage: Storage, given: str | None = None) -> tuple[lance.LanceDataset, MemWalIndex]:
    ds = open_lance(storage, given or storage.uri, " to merge generations")
    return ds, read_memwal_index(storage, ds.version)


def _is_stale(err: BaseException) -> bool:
    return "Stale SSTable compaction" in str(err) or "not greater than the recorded generation" in str(err)


def _is_conflict(err: BaseException) -> bool:
    text = str(err).lower()
    return "conflict" in text or "retryable" in text or "concurrent" in text


def _generation_rows(
    storage: Storage, region_id: str, gen: FlushedGeneration, pk: tuple[str, ...], base: lance.LanceDataset
) -> pa.Table:
    """The generation's rows with the columns of ``base`` (the version the merge commits against)."""
    path = storage.child_uri(generation_rel(storage, region_id, gen.path, what=f"flushed generation {gen.generation}"))
    try:
        # deletion vectors hide rows superseded inside the generation: one row per key
        data = lance.dataset(path, storage_options=dict(storage.storage_options) or None)
        lacking = lacking_columns(data.schema.names, pk)
        if lacking is not None:  # not a generation pylance wrote (the reader rebuilds it from the WAL too)
            raise ValueError(lacking)
        if stale_columns(field_paths(data), field_paths(base)):  # written before the base's columns changed
            what = f"region {region_id} flushed generation {gen.generation} ({path})"
            rows = conformed_rows(data, tagged_schema(base), base.schema, pk, what)
        else:
            rows = data.to_table()
        odd = not_a_generation(rows, pk)
        if odd is not None:  # a NULL tombstone would neither delete nor put: the key kept
            raise ValueError(odd)
        return rows
    except (ValueError, OSError) as err:
        return _rows_from_wal(storage, region_id, gen, pk, path, err, base)


def _rows_from_wal(
    storage: Storage,
    region_id: str,
    gen: FlushedGeneration,
    pk: tuple[str, ...],
    path: str,
    err: Exception,
    ds: lance.LanceDataset,
) -> pa.Table:
    """A lost generation (missing, damaged, partly deleted; not merged) from its WAL entries.

    The spec keeps them until the generation is merged; merging them repairs the table.
    """
    first = lance_message(err)
    try:
        rows = wal_generation_rows(storage, region_id, gen, ds.schema, pk, tagged_schema(ds))
    except MemWalError as lost:
        msg = f"cannot read generation {gen.generation} of region {region_id} ({path}): {first}; {lost}"
        raise GenerationLostError(msg) from err
    log.warning(
        "generation %s of region %s (%s) cannot be read (%s); merging its rows rebuilt from the WAL",
        gen.generation,
        region_id,
        path,
        first,
    )
    return rows


def _check_not_null(rows: pa.Table, schema: pa.Schema, uri: str, region_id: str, generation: int) -> None:
    """Refuse NULLs in a column (or struct child, list item) the base declares NOT NULL (Lance's
    and pyarrow's own errors name no column's origin): a generation written while it was
    nullable, before a restore()."""
    for f in schema:
        if f.name not in rows.column_names or not _declares_not_null(f):
            continue
        found = _nulls_where_not_null(rows.column(f.name).combine_chunks(), f, f.name)
        if found:
            path, nulls = found
            msg = (
                f"cannot merge generation {generation} of region {region_id} into {uri}: {path!r} is NOT NULL "
                f"in the base, but {nulls} of the generation's values hold NULL in it (written while it was nullable, "
                f"before the base was restored?); make it nullable again "
                f"(alter_columns({{'path': {path!r}, 'nullable': True}})) and merge again"
            )
            raise MemWalError(msg)


def _declares_not_null(f: pa.Field) -> bool:
    """Whether ``f``, or a struct child or list item under it, is declared NOT NULL."""
    if not f.nullable:
        return True
    if pa.types.is_struct(f.type):
        return any(_declares_not_null(c) for c in f.type)
    return is_list_like(f.type) and _declares_not_null(f.type.value_field)


def _nulls_where_not_null(arr: pa.Array, f: pa.Field, path: str) -> tuple[str, int] | None:
    """The first field at or under ``f`` declared NOT NULL whose values in ``arr`` hold NULLs
    (its Lance path, e.g. ``s.item.p``, and their count), checked as pyarrow's cast checks them."""
    if arr.null_count and not f.nullable:
        return path, arr.null_count
    if pa.types.is_struct(f.type):
        present = arr.filter(arr.is_valid()) if arr.null_count else arr  # a NULL struct's children may be NULL
        kids = (_nulls_where_not_null(present.field(k), c, f"{path}.{c.name}") for k, c in enumerate(f.type))
        return next((found for found in kids if found), None)
    if is_list_like(f.type):  # the items of lists that are not NULL
        return _nulls_where_not_null(arr.flatten(), f.type.value_field, f"{path}.{f.type.value_field.name}")
    return None


def _merge_one(storage: Storage, region_id: str, gen: FlushedGeneration, pk: tuple[str, ...]) -> GenerationMergeStats:
    t0 = time.perf_counter()
    for attempt in range(_MAX_ATTEMPTS):
        ds, index = _open_latest(storage)
        if index.merged_generation(region_id) >= gen.generation:
            return GenerationMergeStats(region_id, gen.generation, "skipped", base_version=ds.version)
        try:
            # read again each attempt: the base's columns may have changed since the last one
            data = _generation_rows(storage, region_id, gen, pk, ds)
        except GenerationLostError:
            ds, index = _open_latest(storage)
            if index.merged_generation(region_id) < gen.generation:
                raise
            # merged by another merger, then collected, since this one read the index
            return GenerationMergeStats(region_id, gen.generation, "skipped", base_version=ds.version)
        try:
            upserted, deleted = _commit_generation(storage, ds, region_id, gen, pk, data)
        except OSError as err:
            if _is_stale(err):
                ds, _ = _open_latest(storage)
                log.info("generation %s of region %s was merged concurrently", gen.generation, region_id)
                return GenerationMergeStats(region_id, gen.generation, "skipped", base_version=ds.version)
            what = f"merging generation {gen.generation} of region {region_id} into {storage.uri}"
            if _is_conflict(err):
                if attempt + 1 < _MAX_ATTEMPTS:
                    log.info("commit conflict merging %s/gen%s, retrying: %s", region_id, gen.generation, err)
                    time.sleep(backoff(attempt, first=_FIRST_WAIT, cap=2.0))
                    continue
                msg = (
                    f"{what} gave up after {_MAX_ATTEMPTS} commit conflicts with concurrent writers of the base "
                    f"(run it again: what was merged stays merged): {lance_message(err)}"
                )
                raise MemWalError(msg) from err
            msg = f"{what} failed: {lance_message(err)}"
            raise MemWalError(msg) from err
        ds, _ = _open_latest(storage)
        return GenerationMergeStats(
            region_id,
            gen.generation,
            "merged",
            rows_upserted=upserted,
            rows_deleted=deleted,
            base_version=ds.version,
            seconds=time.perf_counter() - t0,
        )
    raise AssertionError("unreachable")


def _unmerged(storage: Storage, region_id: str, generation: int, version: int) -> bool:
    return read_memwal_index(storage, version).merged_generation(region_id) < generation


def _commit_generation(
    storage: Storage,
    ds: lance.LanceDataset,
    region_id: str,
    gen: FlushedGeneration,
    pk: tuple[str, ...],
    data: pa.Table,
) -> tuple[int, int]:
    """Commit one generation's deletes, then its upserts with the mark: (rows upserted, deleted)."""
    on: str | list[str] = pk[0] if len(pk) == 1 else list(pk)
    deletes = data.filter(data.column(TOMBSTONE)).select(list(pk))
    clean = True
    if deletes.num_rows:
        paths = field_paths(ds)
        ds, clean = commit_deletes(ds, storage, deletes, on, partial(_unmerged, storage, region_id, gen.generation))
        if field_paths(ds) != paths:  # a column change committed beside the deletes (no conflict)
            data = _generation_rows(storage, region_id, gen, pk, ds)
    before = ds.version
    upserts = data.filter(pc.invert(data.column(TOMBSTONE))).drop_columns([TOMBSTONE])
    schema = ds.schema
    _check_not_null(upserts, schema, storage.uri, region_id, gen.generation)
    (
        ds.merge_insert(on)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted([CompactedSsTable(region_id, gen.generation)])
        .execute(as_schema(upserts.select(schema.names), schema))
    )
    reappeared = 0
    if deletes.num_rows and (not clean or wrote_beside(ds, storage, before)):  # rows written meanwhile?
        what = f"generation {gen.generation} of region {region_id}"
        last = partial(_unmerged, storage, region_id, gen.generation + 1)
        reappeared = delete_reappeared(ds, storage, deletes, list(pk), what, last)
    return upserts.num_rows, deletes.num_rows + reappeared


def _stats_table(stats: Sequence[GenerationMergeStats]) -> pa.Table:
    return pa.Table.from_pylist([s.__dict__ for s in stats], schema=MERGE_STATS_SCHEMA)


def merge_generations(
    uri: str,
    regions: Sequence[str] | None = None,
    max_generations: int | None = None,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """Merge flushed generations into the base table, oldest first per region.

    Safe to run twice or concurrently (with itself or :func:`merge_generations_spark`):
    generations at or below the merged generation recorded in the MemWAL index are
    skipped, and a generation merged concurrently is reported as ``skipped``.

    Args:
        uri: Table URI.
        regions: Region UUID strings to merge (default: every region under ``_mem_wal/``).
        max_generations: Merge at most this many generations per region (default: all).
        storage_options: Object store options, as pylance takes them.

    Returns:
        One row per generation considered (:data:`MERGE_STATS_SCHEMA`): ``region_id``,
        ``generation``, ``status`` (``merged``/``skipped``), ``rows_upserted``,
        ``rows_deleted`` (the deletes applied: a tombstone of a key the base did not hold
        counts too), ``base_version`` (after the merge), ``seconds``.

    Raises:
        NotAMemWalTableError: The table has no MemWAL index.
        MemWalError: A generation cannot be read or committed.

    Example:
        >>> # merge_generations("s3://bucket/events", max_generations=1)
    """
    storage = Storage.open(uri, storage_options)
    ds, index = _open_latest(storage, str(uri))
    pk = primary_key_of(ds.schema)
    stats: list[GenerationMergeStats] = []
    for region_id in _regions_to_merge(storage, regions, max_generations):
        manifest = latest_region_manifest(storage, region_id)
        if manifest is None:
            continue
        merged = index.merged_generation(region_id)
        pending = sorted((g for g in manifest.flushed_generations if g.generation > merged), key=lambda g: g.generation)
        if max_generations is not None:
            pending = pending[:max_generations]
        for gen in pending:
            stats.append(_merge_one(storage, region_id, gen, pk))
    return _stats_table(stats)


def _regions_to_merge(storage: Storage, regions: Sequence[str] | None, max_generations: int | None) -> list[str]:
    """The regions a merge call names (default: all), checked with its ``max_generations``."""
    positive_int(max_generations, f"max_generations for {storage.uri}", optional=True)
    present = list_regions(storage)
    if regions is None:
        return present
    if isinstance(regions, (str, bytes)):
        msg = f"regions for {storage.uri} takes a list of region ids, got the string {regions!r}"
        raise InvalidArgumentError(msg)
    known = set(present)
    out: dict[str, None] = {}
    for r in regions:
        try:
            rid = str(uuid.UUID(str(r)))
        except ValueError:
            rid = None
        if rid is None or rid not in known:
            msg = f"{storage.uri} has no region {r!r} (regions: {present})"
            raise InvalidArgumentError(msg)
        out[rid] = None
    return list(out)


def _merge_task(uri: str, storage_options: Mapping[str, str] | None, max_generations: int | None) -> Any:
    def run(batches: Any) -> Any:
        for batch in batches:
            regions = [str(r) for r in batch.column("region_id").to_pylist()]
            if regions:
                yield from merge_generations(
                    uri, regions, max_generations, storage_options=storage_options
                ).to_batches()

    return run


def merge_generations_spark(
    spark: Any,
    uri: str,
    *,
    regions: Sequence[str] | None = None,
    max_generations: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Any:
    """Run :func:`merge_generations` with one region per Spark task.

    Regions commit to the same base table concurrently; Lance resolves (or
    retries) the commit conflicts, and a rerun task skips what it merged before.

    Args:
        spark: A ``pyspark.sql.SparkSession``.
        uri: Table URI (reachable from the executors).
        regions: Regions to merge (default: all).
        max_generations: Per-region limit.
        storage_options: Object store options.

    Returns:
        A Spark DataFrame of the per-generation stats (already computed).

    Example:
        >>> # merge_generations_spark(spark, "s3://bucket/events").show()
    """
    storage = Storage.open(uri, storage_options)
    require_table(storage, str(uri), " to merge generations")
    todo = _regions_to_merge(storage, regions, max_generations)
    from pyspark.sql.pandas.types import from_arrow_schema

    out_schema = from_arrow_schema(MERGE_STATS_SCHEMA)
    if not todo:
        return spark.createDataFrame([], out_schema)
    rdd = spark.sparkContext.parallelize([(r,) for r in todo], len(todo))
    units = spark.createDataFrame(rdd, "region_id string")
    result = units.mapInArrow(_merge_task(storage.uri, storage_options, max_generations), out_schema)
    return spark.createDataFrame(result.toArrow())
