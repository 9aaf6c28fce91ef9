"""Loading a snapshot from storage: base version, MemWAL index, every region's sources.

Opening reuses what a :class:`~memwal_query.snapshot.cache.SnapshotCache` already holds
(opened generation datasets, decoded WAL entries, region manifests), so a refresh reads
only what changed. Strong reads settle on a consistent cut across regions.
"""

from __future__ import annotations

import hashlib
import logging
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import lance
import pyarrow as pa

from memwal_query.errors import (
    InvalidArgumentError,
    MemWalCorruptionError,
    MemWalError,
    NoPrimaryKeyError,
    TableNotFoundError,
)
from memwal_query.format.inline_snapshots import InlineRegion, decode_inline_snapshots
from memwal_query.format.lance_open import lance_dataset
from memwal_query.format.layer_restart import restarted
from memwal_query.format.memwal_index import manifest_digest, read_memwal_index, read_version
from memwal_query.format.model import MemWalIndex
from memwal_query.format.names import lance_manifest_file_name
from memwal_query.format.storage import Storage
from memwal_query.format.wal import (
    GEN_COLUMN,
    LEVEL_COLUMN,
    SEQ_COLUMN,
    TOMBSTONE,
    WalTail,
    gap_error,
    replay_wal_tail,
    wal_entry_path,
)
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.evolution import merged_schema
from memwal_query.snapshot.generations import BaseColumns, open_generation, prefetch_generation_keys
from memwal_query.snapshot.kept_ranks import KeptRanksName, held, ranks_name
from memwal_query.snapshot.kept_ranks import load as load_ranks
from memwal_query.snapshot.manifests import contradiction, latest_region_manifest, list_regions, manifest_path
from memwal_query.snapshot.memtables import memtable_from_live, memtable_from_wal
from memwal_query.snapshot.model import (
    IN_PROCESS,
    Consistency,
    GenerationSource,
    LiveMemTable,
    MemTableSource,
    MissingGenerationPolicy,
    RegionSnapshot,
    SkippedGeneration,
    Snapshot,
    check_missing_generation_policy,
    primary_key_of,
)
from memwal_query.snapshot.recovery import resolve_missing_generations

__all__ = ["MAX_CUT_ROUNDS", "load_snapshot"]

log = logging.getLogger("memwal_query")

#: Reads of a snapshot whose generations vanished (merged and collected meanwhile), while the
#: base version keeps moving: a generation still missing from a read of an unmoved base is lost.
_OPEN_ATTEMPTS = 10

#: Passes that re-read the regions a writer moved while a strong snapshot was being read,
#: before the snapshot settles for regions read at different moments.
MAX_CUT_ROUNDS = 5
_REGION_READS = 5  # reads of one region while its manifest keeps moving (see _settled_region)


def _settled_region(read: Callable[[], RegionSnapshot], storage: Storage, consistency: Consistency) -> RegionSnapshot:
    """``read()`` of one region (:func:`_load_region`), again while its manifest moved under it.

    A collector (``memwal_write.collect_garbage``) removes WAL entries once a flush recorded
    in a newer manifest covers them and their generation is merged: a strong read that took
    its manifest before that flush and replays the WAL after the removal would end its tail
    early and miss acknowledged rows. So a strong read that finds a newer manifest after
    replaying its tail reads the region again (one existence probe)."""
    for _ in range(_REGION_READS - 1):
        r = read()
        if consistency != "strong" or r.manifest is None or not _manifest_moved(storage, r):
            gap = r.wal_tail.gap_position if r.wal_tail is not None else None
            if gap is not None:  # no newer manifest explains it: not a collector's removal
                raise gap_error(storage, r.region_id, gap)
            return r
    r = read()
    log.info("%s: region %s kept moving while it was read; reading it as of its last read", storage.uri, r.region_id)
    return r


def _manifest_moved(storage: Storage, r: RegionSnapshot) -> bool:
    """Whether a newer manifest of the region exists than the one ``r`` was read from."""
    return r.manifest is not None and storage.exists(manifest_path(r.region_id, r.manifest.version + 1))


def _load_region(
    storage: Storage,
    region_id: str,
    index: MemWalIndex,
    data_schema: pa.Schema,
    consistency: Consistency,
    live: Sequence[LiveMemTable],
    cache: SnapshotCache,
    pk: Sequence[str] = (),
    columns: BaseColumns | None = None,
) -> RegionSnapshot:
    with cache.lock:
        known = cache.manifests.get(region_id)
    manifest = latest_region_manifest(storage, region_id, known)
    if manifest is not None:
        with cache.lock:
            cache.manifests[region_id] = manifest
    merged = index.merged_generation(region_id)
    why = contradiction(manifest, merged) if manifest is not None else None
    if why is not None:
        msg = f"{storage.uri}: region {region_id}: {why} (memwal verify reports it)"
        raise MemWalCorruptionError(msg)
    gens: list[GenerationSource] = []
    skipped: list[SkippedGeneration] = []
    tail: WalTail | None = None
    memtable: MemTableSource | None = None
    ranks_name: KeptRanksName | None = None
    if manifest is not None:
        for fg in sorted(manifest.flushed_generations, key=lambda g: g.generation):
            if fg.generation <= merged:
                skipped.append(
                    SkippedGeneration(region_id, fg.generation, f"merged into base (merged generation {merged})")
                )
                continue
            got = open_generation(storage, region_id, fg.generation, fg.path, cache, columns)
            (gens if isinstance(got, GenerationSource) else skipped).append(got)  # type: ignore[arg-type]
        ranks_name = _kept_ranking(storage, region_id, gens, pk, data_schema, cache)
        if pk and held(cache, region_id, gens) is None:  # the merge ranks these keys next: read them here
            failed = prefetch_generation_keys(gens, pk, cache)
            skipped += [
                SkippedGeneration(region_id, g.generation, f"unreadable: {failed[g.uri]}", g.uri, missing=True)
                for g in gens
                if g.uri in failed
            ]
            gens = [g for g in gens if g.uri not in failed]
        if consistency == "strong":
            tail = replay_wal_tail(
                storage,
                region_id,
                manifest.replay_after_wal_position,
                manifest.current_generation,
                cache.wal_entries,
            )
    parts = []
    origin = []
    positions = None
    if tail is not None and tail.entries:
        wal_t = memtable_from_wal(region_id, tail, data_schema, columns.tagged if columns else None, cache.wal_rows)
        if wal_t is not None:
            parts.append(wal_t)
            origin.append("WAL tail")
            positions = (tail.entries[0].position, tail.entries[-1].position)
    mine = [m for m in live if str(m.region_id) == region_id]
    if mine:
        live_t = memtable_from_live(mine, data_schema)
        if live_t is not None:
            parts.append(live_t)
            origin.append(IN_PROCESS)
    if parts:
        table = pa.concat_tables(parts)
        gens_in = tuple(sorted(set(table.column(GEN_COLUMN).to_pylist())))
        memtable = MemTableSource(region_id, table, " + ".join(origin), positions, gens_in)
    return RegionSnapshot(region_id, manifest, merged, tuple(gens), tuple(skipped), memtable, tail, ranks_name)


def _kept_ranking(
    storage: Storage,
    region_id: str,
    gens: Sequence[GenerationSource],
    pk: Sequence[str],
    data_schema: pa.Schema,
    cache: SnapshotCache,
) -> KeptRanksName | None:
    """The name the ranking of a region's generations ``gens`` is kept under, unless ``cache``
    holds it already (None also when it is not kept:
    :func:`~memwal_query.snapshot.kept_ranks.ranks_name`); a ranking found kept under it goes
    into ``cache``, and the region's generation keys need not be read."""
    if len(pk) != 1 or not gens or held(cache, region_id, gens) is not None:
        return None
    name = ranks_name(storage, region_id, gens, pk[0], data_schema.field(pk[0]).type)
    found = load_ranks(name) if name is not None else None
    if name is not None and found is not None:
        with cache.lock:
            cache.generation_ranks[region_id] = (name.uris, found)
    return name


def load_snapshot(
    uri: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    version: int | None = None,
    consistency: Consistency = "strong",
    live: Sequence[LiveMemTable] = (),
    cache: SnapshotCache | None = None,
    storage: Storage | None = None,
    max_workers: int = 8,
    on_missing_generation: MissingGenerationPolicy = "recover",
) -> Snapshot:
    """Read a consistent snapshot of a MemWAL table.

    Args:
        uri: Table URI (local path or object store).
        storage_options: Object store options, as pylance takes them.
        version: Base table version (default: latest).
        consistency: ``"strong"`` replays WAL tails (other writers' live MemTables);
            ``"eventual"`` reads flushed generations only.
        live: In-process MemTables to include (read-your-writes).
        cache: Reused state from an earlier snapshot of the same table.
        storage: A :class:`Storage` to reuse (keeps request counters).
        max_workers: Threads that load regions in parallel.
        on_missing_generation: ``"recover"``, ``"error"`` or ``"skip"``: what to do with
            an unmerged generation that stays unreadable after the retry with the newest
            base version (:func:`memwal_query.open_table` explains them).

    Returns:
        The frozen :class:`Snapshot`.

    Raises:
        GenerationLostError: An unmerged generation cannot be read nor rebuilt (see
            ``on_missing_generation``).
    """
    if consistency not in ("strong", "eventual"):
        msg = f"consistency must be 'strong' or 'eventual', got {consistency!r}"
        raise InvalidArgumentError(msg)
    check_missing_generation_policy(on_missing_generation)
    for m in live:
        if not isinstance(m, LiveMemTable):
            msg = f"live MemTables must have region_id, generation and to_batches(); got {type(m).__name__}"
            raise InvalidArgumentError(msg)
        try:
            uuidlib.UUID(str(m.region_id))
        except ValueError as err:
            msg = f"invalid region id {m.region_id!r} for a live MemTable of {uri}"
            raise InvalidArgumentError(msg) from err
    storage = storage or Storage.open(uri, storage_options)
    cache = cache or SnapshotCache()
    if storage.read_bytes("_versions/latest_version_hint.json") is None and not storage.exists("_versions"):
        msg = f"no Lance table at {storage.uri} (no _versions directory)"
        raise TableNotFoundError(msg)
    attempts = _OPEN_ATTEMPTS if version is None else 1
    before: int | None = None
    warm = bool(cache.manifests)  # a refresh: what it knows may be of a table since replaced
    for attempt in range(attempts + 1):
        snap = _load_once(storage, version, consistency, live, cache, max_workers)
        gone = [s for r in snap.regions for s in r.skipped if s.missing]
        # again while merges move the base on (a busy merger and collector can outrun a few reads)
        final = not gone or attempt >= attempts - 1 or snap.base_version == before
        if gone and final and warm and _went_back(storage, cache, {s.region_id for s in gone}):
            # the region manifests known are newer than the table's (restored from an older
            # copy): a generation they list is not lost; read everything afresh once
            log.info("%s: region manifests older than those read before; reading the table afresh", storage.uri)
            cache.reset()
            warm = False
            continue
        if final:
            # Still unreadable and not merged by the newest base version: lost.
            pinned = version is not None
            since = _merged_since(storage, snap) if gone and pinned else None
            return resolve_missing_generations(
                snap, storage, cache, on_missing_generation, pinned_version=pinned, merged_since=since
            )
        # A generation disappears when a merger merged it and GC removed it after this
        # snapshot's base version was read: the newest base version holds its rows.
        log.info("generation(s) %s vanished while opening %s; retrying with the newest base version", gone, storage.uri)
        before = snap.base_version
    raise AssertionError("unreachable")


def _went_back(storage: Storage, cache: SnapshotCache, region_ids: set[str]) -> bool:
    """Whether one of ``region_ids`` has no region manifest as new as the one ``cache`` holds
    (the table was replaced by an older copy of itself), read afresh from its version hint."""
    for rid in region_ids:
        with cache.lock:
            known = cache.manifests.get(rid)
        if known is None:
            continue
        now = latest_region_manifest(storage, rid)
        if now is None or now.version < known.version:
            return True
    return False


def _check_column_names(uri: str, schema: pa.Schema) -> None:
    """Refuse names memwal gives its own columns, and names Lance cannot read (a backtick:
    Lance quotes names with backticks, and finds no such column when it reads)."""
    clash = sorted({GEN_COLUMN, SEQ_COLUMN, LEVEL_COLUMN} & set(schema.names))
    if clash:
        msg = f"table {uri} has column(s) {clash}, the names memwal gives its own columns: rename them"
        raise MemWalError(msg)
    if TOMBSTONE in schema.names:
        msg = (
            f"table {uri} has a column {TOMBSTONE!r}, the column pylance's MemWAL writer adds to mark "
            "deletes (its values and the delete flags would share one column): rename it"
        )
        raise MemWalError(msg)
    ticked = [f.name for f in schema if "`" in f.name]
    if ticked:
        msg = f"table {uri} has column(s) {ticked} whose name holds a backtick (`), which Lance cannot read"
        raise MemWalError(msg)


def _merged_since(storage: Storage, snap: Snapshot) -> tuple[int, dict[str, int]] | None:
    """The newest base version and its merged generation per region of ``snap``'s regions, when
    it is newer than ``snap``'s (a pinned version whose missing generations it may have merged)."""
    newest = lance_dataset(storage, storage.uri).version
    if newest <= snap.base_version:
        return None
    index = read_memwal_index(storage, newest)
    return newest, {r.region_id: index.merged_generation(r.region_id) for r in snap.regions}


def _same_table(storage: Storage, cache: SnapshotCache, base: lance.LanceDataset, digest: str) -> None:
    """Forget what ``cache`` holds when the table it was filled from is not the one here now
    (deleted and written again at the same place): the manifest of the version it was last
    loaded at must still be the same file, and no version since may have started its MemWAL
    layer over (:func:`~memwal_query.format.layer_restart.restarted`: the base overwritten,
    the MemWAL index created or dropped). A version cleaned up since cannot be compared:
    the cache is forgotten too (a refresh then reads what it needs again)."""
    version = base.version
    with cache.lock:
        mark = cache.table_mark
    if mark is not None:
        seen_version, seen = mark
        now = digest if seen_version == version else manifest_digest(storage, seen_version)
        if now != seen or restarted(base, seen_version, version):
            log.info("%s: the table at this place is not the one read before; reading it afresh", storage.uri)
            cache.reset()
    with cache.lock:
        cache.table_mark = (version, digest)


def _load_once(
    storage: Storage,
    version: int | None,
    consistency: Consistency,
    live: Sequence[LiveMemTable],
    cache: SnapshotCache,
    max_workers: int,
) -> Snapshot:
    base = lance_dataset(storage, storage.uri, version=version)
    index, digest = read_version(storage, base.version)  # a plain Lance table: said first
    pk = primary_key_of(base.schema)
    schema = merged_schema(base.schema, pk)
    if not pk:
        msg = (
            f"table {storage.uri} declares no primary key: mark the key column(s) with field "
            "metadata {'lance-schema:unenforced-primary-key': 'true'}"
        )
        raise NoPrimaryKeyError(msg)
    _check_column_names(storage.uri, schema)
    _same_table(storage, cache, base, digest)
    data_schema = pa.schema(list(schema) + [pa.field(TOMBSTONE, pa.bool_())])
    columns = BaseColumns.of(base, pk)
    inline = _inline_regions(index, storage, base.version)
    if consistency == "eventual" and inline is not None:
        # Eventual reads discover regions from the index's point-in-time snapshot
        # (no listing); strong reads list storage, which also finds newer regions.
        region_ids = [r.region_id for r in inline]
    else:
        region_ids = list_regions(storage)
    known = {str(m.region_id) for m in live}
    region_ids = sorted(set(region_ids) | known)
    workers = max(1, min(max_workers, len(region_ids)))

    def load(region_id: str) -> RegionSnapshot:
        def read() -> RegionSnapshot:
            return _load_region(storage, region_id, index, data_schema, consistency, live, cache, pk, columns)

        return _settled_region(read, storage, consistency)

    with ThreadPoolExecutor(workers) as pool:
        by_id = {r.region_id: r for r in pool.map(load, region_ids)}
        cut = False
        if consistency == "strong":
            by_id, cut = _consistent_cut(storage, by_id, known, load, pool)
    regions = [by_id[r] for r in sorted(by_id)]
    source = "region manifests + WAL tails" if consistency == "strong" else "region manifests (no WAL tail)"
    if consistency == "eventual" and inline is not None:
        source = "MemWAL index inline region snapshots + region manifests (no WAL tail)"
    return Snapshot(
        uri=storage.uri,
        base_version=base.version,
        base=base,
        schema=schema,
        primary_key=pk,
        index=index,
        regions=tuple(regions),
        consistency=consistency,
        consistency_source=source,
        inline_regions=tuple(inline or ()),
        consistent_cut=cut,
        fields_tag=hashlib.sha1(repr(sorted(columns.paths.items())).encode(), usedforsecurity=False).hexdigest()[:16],
    )


def _region_moved(storage: Storage, r: RegionSnapshot) -> bool:
    """Whether the region's writer logged anything after ``r`` was read (existence probes).

    Region state only changes by WAL entries (flushes and merges move rows between levels
    without changing what a reader sees), and positions are written in order, so the
    position after the last one replayed tells, unless a collector removed it after a flush
    covered it: a newer manifest tells then (a second probe). A region without a manifest
    yet moved once its first manifest exists.
    """
    if r.manifest is None:
        return storage.exists(manifest_path(r.region_id, 1))
    if _manifest_moved(storage, r):
        return True
    tail = r.wal_tail
    if tail is None:
        nxt = r.manifest.replay_after_wal_position + 1
    else:
        nxt = (tail.torn_position if tail.torn_position is not None else tail.last_position) + 1
    return storage.exists(wal_entry_path(r.region_id, nxt))


def _consistent_cut(
    storage: Storage,
    by_id: dict[str, RegionSnapshot],
    known: set[str],
    load: Callable[[str], RegionSnapshot],
    pool: ThreadPoolExecutor,
) -> tuple[dict[str, RegionSnapshot], bool]:
    """Re-read regions until one pass finds none moved: the regions then show one instant.

    Regions are read one after another (or in parallel, but not atomically), so without
    this a reader could see a later write to one region and miss an earlier write to
    another (a writer's order across regions). Each region is unchanged from the moment it
    was read until the check after all reads; so at the last read's moment every region
    looked as read (a double collect). Bounded by :data:`MAX_CUT_ROUNDS`.
    """
    for _ in range(MAX_CUT_ROUNDS):
        regions = list(by_id.values())
        probes = pool.map(lambda r: _region_moved(storage, r), regions)
        moved = [r.region_id for r, m in zip(regions, probes, strict=True) if m]
        moved += sorted((set(list_regions(storage)) | known) - by_id.keys())
        if not moved:
            return by_id, True
        log.debug("%s: regions %s moved while the snapshot was read; reading them again", storage.uri, moved)
        by_id = {**by_id, **{r.region_id: r for r in pool.map(load, moved)}}
    log.info(
        "%s: writers kept moving regions during %d passes; the snapshot shows each region as of its own read",
        storage.uri,
        MAX_CUT_ROUNDS,
    )
    return by_id, False


def _inline_regions(index: MemWalIndex, storage: Storage, version: int) -> list[InlineRegion] | None:
    """The index's inline region snapshots; damaged ones are a :class:`MemWalCorruptionError`."""
    if not index.inline_snapshots:
        return None
    where = f"MemWAL index of {storage.child_uri(f'_versions/{lance_manifest_file_name(version)}')}"
    return decode_inline_snapshots(index.inline_snapshots, where=where)
