"""Snapshot: a frozen view of one base table version and every region's sources.

Built by :func:`load_snapshot` from storage (``format/``); consumed by the merge
(:mod:`memwal_query.merge`) and the DataFusion sources. Opening reuses what a
:class:`SnapshotCache` already holds (opened generation datasets, decoded WAL
entries, region manifests), so a refresh reads only what changed.
"""

from __future__ import annotations

import logging
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

import lance
import numpy as np
import pyarrow as pa

from memwal_query.conform import conform
from memwal_query.errors import (
    MALFORMED,
    InvalidArgumentError,
    ManifestError,
    NoPrimaryKeyError,
    NotAMemWalTableError,
    TableNotFoundError,
    one_line,
)
from memwal_query.format.decode import (
    MAX_HINT_BYTES,
    MAX_VERSION,
    MemWalIndex,
    RegionManifest,
    bitrev64_name,
    decode_mem_wal_index,
    decode_region_manifest,
    decode_version_hint,
    lance_manifest_file_name,
    parse_bitrev64_name,
)
from memwal_query.format.inline_snapshots import InlineRegion, decode_inline_snapshots
from memwal_query.format.paths import generation_rel
from memwal_query.format.storage import Storage
from memwal_query.format.wal import TOMBSTONE, WalEntry, WalTail, replay_wal_tail, wal_entry_path

__all__ = [
    "Consistency",
    "MissingGenerationPolicy",
    "LiveMemTable",
    "GenerationSource",
    "SkippedGeneration",
    "MemTableSource",
    "RegionSnapshot",
    "Snapshot",
    "SnapshotCache",
    "load_snapshot",
    "check_missing_generation_policy",
    "primary_key_of",
]

log = logging.getLogger("memwal_query")

Consistency = Literal["strong", "eventual"]
#: What opening does with a flushed generation that is not merged but cannot be read
#: (see :func:`memwal_query.open_table`).
MissingGenerationPolicy = Literal["recover", "error", "skip"]
MISSING_GENERATION_POLICIES: tuple[str, ...] = ("recover", "error", "skip")
PK_META = b"lance-schema:unenforced-primary-key"
PK_POS_META = b"lance-schema:unenforced-primary-key:position"
#: Region manifest versions probed one by one past the hint before the folder is listed.
MAX_PROBES = 64
#: Passes that re-read the regions a writer moved while a strong snapshot was being read,
#: before the snapshot settles for regions read at different moments.
MAX_CUT_ROUNDS = 5


@runtime_checkable
class LiveMemTable(Protocol):
    """An in-process MemTable handed to :func:`memwal_query.open_table`.

    A writer in the same process exposes what it has buffered but not yet made
    durable, so it reads its own writes. Rows rank above every stored level of the
    region with a lower or equal generation; later rows win over earlier ones.
    ``_tombstone`` (bool) marks deletes; a missing column means no deletes.

    Example:
        >>> import pyarrow as pa
        >>> class Buffered:
        ...     region_id = "00000000-0000-0000-0000-000000000001"
        ...     generation = 1
        ...     def to_batches(self):
        ...         return [pa.record_batch({"id": [1]})]
        >>> isinstance(Buffered(), LiveMemTable)
        True
    """

    @property
    def region_id(self) -> str: ...

    @property
    def generation(self) -> int: ...

    def to_batches(self) -> Iterable[pa.RecordBatch]: ...


@dataclass(frozen=True)
class GenerationSource:
    """A flushed generation that is not merged into the base yet."""

    region_id: str
    generation: int
    uri: str
    dataset: lance.LanceDataset = field(repr=False, compare=False)
    num_rows: int
    #: Where the generation's directory was, when it is lost and ``dataset`` holds its rows
    #: rebuilt from the region's WAL (:mod:`memwal_query.recovery`); empty otherwise.
    lost_uri: str = ""
    #: First and last WAL position the rebuilt rows come from.
    wal_positions: tuple[int, int] | None = None

    @property
    def rebuilt_from_wal(self) -> bool:
        """True when the rows come from the WAL because the directory is lost."""
        return bool(self.lost_uri)


@dataclass(frozen=True)
class SkippedGeneration:
    """A generation listed by the region manifest that the snapshot does not read."""

    region_id: str
    generation: int
    reason: str
    #: The generation's directory (empty for merged generations, which are not opened).
    uri: str = ""
    #: Not merged, yet unreadable: unless a retry or the WAL restores them, its rows are
    #: missing from the snapshot (:mod:`memwal_query.recovery`).
    missing: bool = False


@dataclass(frozen=True)
class MemTableSource:
    """Rows of live MemTables: the replayed WAL tail and/or in-process batches.

    ``table`` has the base columns plus ``_tombstone``, ``_gen`` (int64) and
    ``_seq`` (uint64, larger = newer inside a generation).
    """

    region_id: str
    table: pa.Table = field(repr=False, compare=False)
    origin: str
    wal_positions: tuple[int, int] | None
    generations: tuple[int, ...]


@dataclass(frozen=True)
class RegionSnapshot:
    """One region as the snapshot sees it."""

    region_id: str
    manifest: RegionManifest | None
    merged_generation: int
    generations: tuple[GenerationSource, ...]
    skipped: tuple[SkippedGeneration, ...]
    memtable: MemTableSource | None
    wal_tail: WalTail | None = field(repr=False, compare=False, default=None)

    @property
    def spec_id(self) -> int:
        """The region spec id (0 = manual region)."""
        return self.manifest.spec_id if self.manifest is not None else 0


@dataclass(frozen=True)
class Snapshot:
    """A frozen view of a MemWAL table: base version + per-region sources."""

    uri: str
    base_version: int
    base: lance.LanceDataset = field(repr=False, compare=False)
    schema: pa.Schema = field(repr=False, compare=False)
    primary_key: tuple[str, ...]
    index: MemWalIndex = field(repr=False, compare=False)
    regions: tuple[RegionSnapshot, ...]
    consistency: Consistency
    consistency_source: str
    inline_regions: tuple[InlineRegion, ...] = ()
    #: True when every region was read as of one instant (strong reads: a pass after
    #: reading found no region's WAL grown and no new region); False for eventual reads
    #: and for strong reads of a table whose writers kept every pass from settling.
    consistent_cut: bool = False
    #: How unmerged generations that cannot be read were handled (``open_table``).
    on_missing_generation: MissingGenerationPolicy = "recover"


@dataclass
class SnapshotCache:
    """What a snapshot opened and can hand to the next one (see ``refresh``)."""

    generations: dict[str, lance.LanceDataset] = field(default_factory=dict)
    wal_entries: dict[tuple[str, int], WalEntry] = field(default_factory=dict)
    manifests: dict[str, RegionManifest] = field(default_factory=dict)
    generation_keys: dict[str, pa.Table] = field(default_factory=dict)
    blooms: dict[str, object] = field(default_factory=dict)
    base_keys: dict[int, pa.Table] = field(default_factory=dict)
    base_runs: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: Decoded columns of Lance fragments (base and generations), by
    #: :func:`memwal_query.sources.fragment_cache_key`: column name -> array, plus
    #: ``_rowaddr``. Fragments never change, so they are decoded once (bounded in size).
    fragment_columns: dict[tuple[object, ...], dict[str, pa.ChunkedArray]] = field(default_factory=dict)
    resident_bytes: int = 0
    #: Fragments whose columns did not fit the budget: scanned through Lance.
    over_budget: set[tuple[object, ...]] = field(default_factory=set)
    #: Lost generations rebuilt from the WAL, by (directory URI, WAL positions).
    rebuilt: dict[tuple[str, tuple[int, ...]], GenerationSource] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keep_generations(self, uris: set[str]) -> None:
        """Forget what was cached for generations a snapshot no longer reads (merged ones)."""
        with self.lock:
            for d in (self.generations, self.generation_keys):
                for uri in [u for u in d if u not in uris]:
                    del d[uri]
            for key in [k for k, g in self.rebuilt.items() if g.uri not in uris]:
                del self.rebuilt[key]

    def keep_fragments(self, keys: set[tuple[object, ...]]) -> None:
        """Forget decoded columns of fragments the newest snapshot does not read."""
        with self.lock:
            for key in [k for k in self.fragment_columns if k not in keys]:
                self.resident_bytes -= sum(a.nbytes for a in self.fragment_columns.pop(key).values())
            self.over_budget &= keys


def primary_key_of(schema: pa.Schema) -> tuple[str, ...]:
    """Primary key columns declared by Lance field metadata, in key order."""
    found: list[tuple[int, int, str]] = []
    for i, f in enumerate(schema):
        meta = f.metadata or {}
        if meta.get(PK_META, b"").lower() == b"true":
            pos = int(meta.get(PK_POS_META, str(i).encode()))
            found.append((pos, i, f.name))
    return tuple(name for _, _, name in sorted(found))


def _open_base(uri: str, version: int | None, options: Mapping[str, str], cache: SnapshotCache) -> lance.LanceDataset:
    try:
        ds = lance.dataset(uri, version=version, storage_options=dict(options) or None)
    except (ValueError, OSError, RuntimeError) as err:
        text = str(err).lower()
        if "not found" in text or "does not exist" in text or "no such" in text:
            msg = f"no Lance table at {uri}" + (f" (version {version})" if version else "")
            raise TableNotFoundError(msg) from err
        msg = f"cannot open Lance table at {uri}: {err}"
        raise ManifestError(msg) from err
    return ds


def _read_index(storage: Storage, version: int) -> MemWalIndex:
    candidates = [f"_versions/{lance_manifest_file_name(version)}", f"_versions/{version}.manifest"]
    for rel in candidates:
        data = storage.read_bytes(rel)
        if data is None:
            continue
        try:
            index = decode_mem_wal_index(data)
        except MALFORMED as err:
            msg = f"cannot decode Lance manifest {storage.child_uri(rel)}: {one_line(err)}"
            raise ManifestError(msg) from err
        if index is None:
            msg = (
                f"{storage.uri} has no MemWAL index at version {version} (run LanceDataset.initialize_mem_wal() first)"
            )
            raise NotAMemWalTableError(msg)
        return index
    msg = f"manifest of version {version} not found under {storage.child_uri('_versions')}"
    raise ManifestError(msg)


def _manifest_path(region_id: str, version: int) -> str:
    return f"_mem_wal/{region_id}/manifest/{bitrev64_name(version)}.binpb"


def _read_region_manifest_version(storage: Storage, region_id: str, version: int) -> RegionManifest | None:
    rel = _manifest_path(region_id, version)
    data = storage.read_bytes(rel)
    if data is None:
        return None
    try:
        manifest = decode_region_manifest(data)
    except MALFORMED as err:
        msg = f"region {region_id}: cannot decode region manifest {storage.child_uri(rel)}: {one_line(err)}"
        raise ManifestError(msg) from err
    if manifest.version != version:
        msg = f"region {region_id}: region manifest {storage.child_uri(rel)} says version {manifest.version}"
        raise ManifestError(msg)
    return manifest


def _version_hint(storage: Storage, region_id: str) -> int:
    """The region's version hint, or 1 when it is missing or unreadable (a warning)."""
    rel = f"_mem_wal/{region_id}/manifest/version_hint.json"
    data = storage.read_bytes(rel, limit=MAX_HINT_BYTES + 1)
    if data is None:
        return 1
    try:
        return max(1, decode_version_hint(data))
    except ValueError as err:
        log.warning("region %s: unreadable %s (%s); probing from 1", region_id, storage.child_uri(rel), err)
        return 1


def _probe_newer(storage: Storage, region_id: str, current: RegionManifest) -> RegionManifest | None:
    """The newest manifest at most :data:`MAX_PROBES` versions after ``current``; None past that."""
    for _ in range(MAX_PROBES):
        if current.version >= MAX_VERSION:
            return current
        nxt = _read_region_manifest_version(storage, region_id, current.version + 1)
        if nxt is None:
            return current
        current = nxt
    return None


def _highest_listed(storage: Storage, region_id: str) -> RegionManifest | None:
    names = storage.list_dir(f"_mem_wal/{region_id}/manifest")
    versions = [parse_bitrev64_name(n) for n, is_dir in names if n.endswith(".binpb") and not is_dir]
    top = max((v for v in versions if v is not None and 1 <= v <= MAX_VERSION), default=None)
    return None if top is None else _read_region_manifest_version(storage, region_id, top)


def latest_region_manifest(
    storage: Storage, region_id: str, known: RegionManifest | None = None
) -> RegionManifest | None:
    """The newest region manifest: version hint (or a known version), then probing.

    Probing is bounded: more than :data:`MAX_PROBES` versions past the start (a stale
    hint), the manifest folder is listed once and probing resumes at its highest version.

    Returns ``None`` when the region has no manifest at all.
    """
    start = known.version if known is not None else _version_hint(storage, region_id)
    current = known if known is not None else _read_region_manifest_version(storage, region_id, start)
    if current is None and start != 1:
        log.warning("region %s: version hint %d points at a missing manifest; probing from 1", region_id, start)
        current = _read_region_manifest_version(storage, region_id, 1)
    if current is None:
        return None
    for _ in range(2):
        newest = _probe_newer(storage, region_id, current)
        if newest is not None:
            return newest
        current = _highest_listed(storage, region_id) or current
    msg = f"region {region_id}: region manifests of {storage.uri} keep appearing faster than they can be probed"
    raise ManifestError(msg)


def list_regions(storage: Storage) -> list[str]:
    """The table's region ids: the UUID-named directories under ``_mem_wal/``."""
    out = []
    for name, is_dir in storage.list_dir("_mem_wal"):
        if not is_dir:
            continue
        try:
            out.append(str(uuidlib.UUID(name)))
        except ValueError:
            log.debug("ignoring non-region entry _mem_wal/%s", name)
    return sorted(out)


def _conform(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    return conform(table, schema, what=what, strict=False, error=ManifestError)


def _memtable_from_wal(region_id: str, tail: WalTail, data_schema: pa.Schema) -> pa.Table | None:
    parts = []
    for e in tail.entries:
        if e.num_rows == 0:
            continue
        t = _conform(e.table, data_schema, f"region {region_id} WAL position {e.position}")
        n = t.num_rows
        seq = pa.array(range(n), pa.uint64())
        seq = pa.compute.add(seq, pa.scalar(e.position << 32, pa.uint64()))
        t = t.append_column("_gen", pa.array([e.generation] * n, pa.int64()))
        t = t.append_column("_seq", seq)
        parts.append(t)
    return pa.concat_tables(parts) if parts else None


def _memtable_from_live(live: Sequence[LiveMemTable], data_schema: pa.Schema) -> pa.Table | None:
    parts = []
    for i, m in enumerate(live):
        batches = list(m.to_batches())
        if not batches:
            continue
        t = pa.Table.from_batches(batches)
        if TOMBSTONE not in t.column_names:
            t = t.append_column(TOMBSTONE, pa.array([False] * t.num_rows, pa.bool_()))
        t = _conform(t, data_schema, f"live MemTable of region {m.region_id}")
        n = t.num_rows
        # Live rows rank above WAL rows of the same generation: high bit set.
        base = (1 << 63) | (i << 40)
        seq = pa.compute.add(pa.array(range(n), pa.uint64()), pa.scalar(base, pa.uint64()))
        t = t.append_column("_gen", pa.array([int(m.generation)] * n, pa.int64()))
        t = t.append_column("_seq", seq)
        parts.append(t)
    return pa.concat_tables(parts) if parts else None


def _open_generation(
    storage: Storage, region_id: str, gen: int, path: str, cache: SnapshotCache
) -> GenerationSource | SkippedGeneration:
    rel = generation_rel(storage, region_id, path, what=f"flushed generation {gen}")
    uri = storage.child_uri(rel)
    gone = SkippedGeneration(region_id, gen, "directory missing", uri, missing=True)
    with cache.lock:
        ds = cache.generations.get(uri)
    fresh = ds is None
    if ds is None:
        if not storage.exists(f"{rel}/_versions"):
            # Merged and garbage-collected since the base version was read, or lost:
            # load_snapshot retries with the newest base version, then decides.
            log.info("region %s: flushed generation %d directory %s is missing", region_id, gen, uri)
            return gone
        try:
            ds = lance.dataset(uri, storage_options=dict(storage.storage_options) or None)
        except (ValueError, OSError, RuntimeError) as err:
            if not storage.exists(f"{rel}/_versions"):
                return gone
            # Possibly being deleted right now (merged + GC): retried with the newest
            # base; still unreadable and unmerged after that, it is lost (memwal_query.recovery).
            return SkippedGeneration(region_id, gen, f"unreadable: {err}", uri, missing=True)
        with cache.lock:
            cache.generations[uri] = ds
    # A merger may have merged and garbage-collected it since it was opened (a cached
    # dataset) or be deleting it right now (manifest still there, data files gone).
    if not _generation_intact(storage, rel, ds, manifest_checked=fresh):
        with cache.lock:
            cache.generations.pop(uri, None)
            cache.generation_keys.pop(uri, None)
        log.info("region %s: flushed generation %d at %s is (partly) deleted", region_id, gen, uri)
        return replace(gone, reason="partly deleted (data files missing)")
    return GenerationSource(region_id, gen, uri, ds, ds.count_rows())


def _generation_intact(storage: Storage, rel: str, ds: lance.LanceDataset, *, manifest_checked: bool) -> bool:
    """Its manifest and every data file still exist (a handful of existence probes)."""
    if not manifest_checked and not storage.exists(f"{rel}/_versions"):
        return False
    for frag in ds.get_fragments():
        for f in frag.data_files():
            if not storage.exists(f"{rel}/data/{f.path}"):
                return False
    return True


def _load_region(
    storage: Storage,
    region_id: str,
    index: MemWalIndex,
    data_schema: pa.Schema,
    consistency: Consistency,
    live: Sequence[LiveMemTable],
    cache: SnapshotCache,
) -> RegionSnapshot:
    with cache.lock:
        known = cache.manifests.get(region_id)
    manifest = latest_region_manifest(storage, region_id, known)
    if manifest is not None:
        with cache.lock:
            cache.manifests[region_id] = manifest
    merged = index.merged_generation(region_id)
    gens: list[GenerationSource] = []
    skipped: list[SkippedGeneration] = []
    tail: WalTail | None = None
    memtable: MemTableSource | None = None
    if manifest is not None:
        for fg in sorted(manifest.flushed_generations, key=lambda g: g.generation):
            if fg.generation <= merged:
                skipped.append(
                    SkippedGeneration(region_id, fg.generation, f"merged into base (merged generation {merged})")
                )
                continue
            got = _open_generation(storage, region_id, fg.generation, fg.path, cache)
            (gens if isinstance(got, GenerationSource) else skipped).append(got)  # type: ignore[arg-type]
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
        wal_t = _memtable_from_wal(region_id, tail, data_schema)
        if wal_t is not None:
            parts.append(wal_t)
            origin.append("WAL tail")
            positions = (tail.entries[0].position, tail.entries[-1].position)
    mine = [m for m in live if str(m.region_id) == region_id]
    if mine:
        live_t = _memtable_from_live(mine, data_schema)
        if live_t is not None:
            parts.append(live_t)
            origin.append("in-process")
    if parts:
        table = pa.concat_tables(parts)
        gens_in = tuple(sorted(set(table.column("_gen").to_pylist())))
        memtable = MemTableSource(region_id, table, " + ".join(origin), positions, gens_in)
    return RegionSnapshot(region_id, manifest, merged, tuple(gens), tuple(skipped), memtable, tail)


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
    attempts = 3 if version is None else 1
    for attempt in range(attempts):
        snap = _load_once(storage, version, consistency, live, cache, max_workers)
        gone = [s for r in snap.regions for s in r.skipped if s.missing]
        if not gone or attempt == attempts - 1:
            # Still unreadable and not merged by the newest base version: lost.
            from memwal_query.recovery import resolve_missing_generations  # imports this module

            return resolve_missing_generations(
                snap, storage, cache, on_missing_generation, pinned_version=version is not None
            )
        # A generation disappears when a merger merged it and GC removed it after this
        # snapshot's base version was read: the newest base version holds its rows.
        log.info("generation(s) %s vanished while opening %s; retrying with the newest base version", gone, storage.uri)
    raise AssertionError("unreachable")


def check_missing_generation_policy(value: object) -> None:
    """Raise :class:`InvalidArgumentError` unless ``value`` is a :data:`MissingGenerationPolicy`."""
    if value not in MISSING_GENERATION_POLICIES:
        msg = f"on_missing_generation must be 'recover', 'error' or 'skip', got {value!r}"
        raise InvalidArgumentError(msg)


def _load_once(
    storage: Storage,
    version: int | None,
    consistency: Consistency,
    live: Sequence[LiveMemTable],
    cache: SnapshotCache,
    max_workers: int,
) -> Snapshot:
    base = _open_base(storage.uri, version, storage.storage_options, cache)
    schema = base.schema
    pk = primary_key_of(schema)
    if not pk:
        msg = (
            f"table {storage.uri} declares no primary key: mark the key column(s) with field "
            "metadata {'lance-schema:unenforced-primary-key': 'true'}"
        )
        raise NoPrimaryKeyError(msg)
    index = _read_index(storage, base.version)
    data_schema = pa.schema(list(schema) + [pa.field(TOMBSTONE, pa.bool_())])
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
        return _load_region(storage, region_id, index, data_schema, consistency, live, cache)

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
    )


def _region_moved(storage: Storage, r: RegionSnapshot) -> bool:
    """Whether the region's writer logged anything after ``r`` was read (one existence probe).

    Region state only changes by WAL entries (flushes and merges move rows between levels
    without changing what a reader sees), and positions are written in order, so the
    position after the last one replayed tells. A region without a manifest yet moved
    once its first manifest exists.
    """
    if r.manifest is None:
        return storage.exists(_manifest_path(r.region_id, 1))
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
