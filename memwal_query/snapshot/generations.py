"""Opening flushed generations, and checking that one is still whole (a merger may
garbage-collect a merged generation at any time)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import lance
import pyarrow as pa

from memwal_query.errors import MemWalError, says_missing
from memwal_query.format.lance_open import lance_message, no_longer_readable
from memwal_query.format.paths import generation_rel, linked
from memwal_query.format.storage import Storage
from memwal_query.format.wal import TOMBSTONE
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.evolution import conformed_copy, conformed_uri, field_paths, stale_columns, tagged_schema
from memwal_query.snapshot.model import GenerationSource, SkippedGeneration

__all__ = [
    "lacking_columns",
    "not_a_generation",
    "BaseColumns",
    "open_generation",
    "generation_damage",
    "generation_keys",
    "missing_data_file",
    "generation_read_error",
    "prefetch_generation_keys",
]

log = logging.getLogger("memwal_query")


@dataclass(frozen=True)
class BaseColumns:
    """The base's columns as a generation must present them (see :mod:`.evolution`)."""

    paths: Mapping[int, tuple[str, ...]]  # Lance field id -> path of names
    tagged: pa.Schema  # the Arrow schema with field ids in its fields' metadata
    schema: pa.Schema
    primary_key: tuple[str, ...]

    @classmethod
    def of(cls, base: lance.LanceDataset, primary_key: Sequence[str]) -> BaseColumns:
        """The columns of base dataset ``base``."""
        return cls(field_paths(base), tagged_schema(base), base.schema, tuple(primary_key))


def open_generation(
    storage: Storage, region_id: str, gen: int, path: str, cache: SnapshotCache, columns: BaseColumns | None = None
) -> GenerationSource | SkippedGeneration:
    """Generation ``gen`` of a region, or why it cannot be read (cached datasets are re-checked).

    ``columns``: when the generation was written with other columns than these (the base's
    changed since), its rows are read into a copy with these columns (:mod:`.evolution`)."""
    what = f"flushed generation {gen}"
    rel = generation_rel(storage, region_id, path, what=what, links=False)
    uri = storage.child_uri(rel)
    gone = SkippedGeneration(region_id, gen, "directory missing", uri, missing=True)
    with cache.lock:
        ds = cache.generations.get(uri)
    fresh = ds is None
    if ds is None or linked(storage, rel) is not None:
        # its symlinks are checked before Lance opens it; kept open, a folder on its path
        # that became a symlink since (a few lstat calls) is checked again
        generation_rel(storage, region_id, path, what=what)
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
            # base; still unreadable and unmerged after that, it is lost (memwal_query.snapshot.recovery).
            return SkippedGeneration(region_id, gen, f"unreadable: {err}", uri, missing=True)
        with cache.lock:
            cache.generations[uri] = ds
    # A merger may have merged and garbage-collected it since it was opened (a cached
    # dataset) or be deleting it right now (manifest still there, data files gone).
    damage = generation_damage(storage, rel, ds, manifest_checked=fresh)
    if damage is not None:
        with cache.lock:
            cache.generations.pop(uri, None)
            cache.generation_keys.pop(uri, None)
            cache.generation_shapes.pop(uri, None)
        log.info("region %s: flushed generation %d at %s is %s", region_id, gen, uri, damage)
        return replace(gone, reason=damage)
    with cache.lock:
        shape = cache.generation_shapes.get(uri)
    if shape is None:  # a generation never changes: its columns and rows are read once
        shape = (field_paths(ds), ds.count_rows())
        with cache.lock:
            cache.generation_shapes[uri] = shape
    if columns is not None and stale_columns(shape[0], columns.paths):
        return _conformed(region_id, gen, uri, ds, columns, cache)
    return GenerationSource(region_id, gen, uri, ds, shape[1])


def _conformed(
    region_id: str, gen: int, uri: str, ds: lance.LanceDataset, columns: BaseColumns, cache: SnapshotCache
) -> GenerationSource | SkippedGeneration:
    """The generation read into a copy with the base's columns (kept while snapshots read it),
    or why its rows cannot be read (a data file cut short: lost unless merged meanwhile, as
    :func:`prefetch_generation_keys` finds for generations read in place)."""
    name = conformed_uri(uri, columns.paths)
    with cache.lock:
        copy = cache.generations.get(name)
    if copy is None:
        what = f"region {region_id} flushed generation {gen} ({uri})"
        try:
            copy = conformed_copy(ds, columns.tagged, columns.schema, columns.primary_key, what)
        except (OSError, ValueError, RuntimeError) as err:
            with cache.lock:
                cache.generations.pop(uri, None)
            return SkippedGeneration(region_id, gen, f"unreadable: {lance_message(err)}", uri, missing=True)
        log.info("%s predates a change of the base's columns: read into memory with the current ones", what)
        with cache.lock:
            cache.generations[name] = copy
    return GenerationSource(region_id, gen, name, copy, copy.count_rows(), conformed_from=uri)


def generation_damage(storage: Storage, rel: str, ds: lance.LanceDataset, *, manifest_checked: bool) -> str | None:
    """Why a generation's manifest or data files are no longer whole (a SkippedGeneration's
    reason), None when they are (a handful of probes)."""
    if not manifest_checked and not storage.exists(f"{rel}/_versions"):
        return "partly deleted (its manifest is gone)"
    if str(ds.uri).startswith("memory://"):
        return None  # its rows were read into memory (a conformed copy)
    why = missing_data_file(storage, rel, ds)
    if why is None:
        return None
    return f"partly deleted ({why})" if why.endswith(" missing") else f"unreadable: {why}"


def missing_data_file(storage: Storage, rel: str, ds: lance.LanceDataset) -> str | None:
    """What is wrong with the first data file of generation ``ds`` (directory ``rel``) that does
    not exist or is not the size its manifest records; None: all are there whole. One probe
    per file (a file cut short after its dataset was kept open read as rows until a lookup
    failed, where a fresh open rebuilt the generation from the WAL)."""
    for frag in ds.get_fragments():
        for f in frag.data_files():
            size = storage.size(f"{rel}/data/{f.path}")
            if size is None:
                return f"data file data/{f.path} missing"
            want = int(f.file_size_bytes or 0)
            if want and size != want:
                return f"data file data/{f.path} is {size:,} bytes, its manifest says {want:,}"
    return None


def generation_read_error(g: GenerationSource | str, err: BaseException) -> MemWalError:
    """The error for a failed read of generation ``g`` (or of what ``g`` names): its files
    missing were merged and garbage-collected since the snapshot opened (refresh and retry);
    else what Lance says."""
    where = g if isinstance(g, str) else f"generation {g.generation} of region {g.region_id} of {g.uri}"
    if says_missing(err):
        return no_longer_readable(f"{where} is no longer readable", "merged and garbage-collected", lance_message(err))
    return MemWalError(f"{where} cannot be read: {lance_message(err)}")


def generation_keys(ds: lance.LanceDataset, pk: Sequence[str], cache: SnapshotCache, uri: str) -> pa.Table:
    """A flushed generation's key columns, tombstone flags and ``_rowaddr`` (read once, cached by URI)."""
    with cache.lock:
        hit = cache.generation_keys.get(uri)
    if hit is not None:
        return hit
    t = ds.to_table(columns=[*pk, TOMBSTONE], with_row_address=True)
    odd = not_a_generation(t, pk)
    if odd is not None:
        raise ValueError(odd)
    with cache.lock:
        cache.generation_keys[uri] = t
    return t


def lacking_columns(names: Sequence[str], pk: Sequence[str]) -> str | None:
    """Why a flushed generation with columns ``names`` is not one pylance wrote (it lacks a key
    column or ``_tombstone``), or None: checked before its rows are read."""
    lacking = [c for c in [*pk, TOMBSTONE] if c not in names]
    return f"it has no column(s) {lacking}" if lacking else None


def not_a_generation(rows: pa.Table, pk: Sequence[str]) -> str | None:
    """Why ``rows`` (a flushed generation's, with its key and ``_tombstone`` columns) are not
    rows pylance writes (a column lacking, a NULL key; a ``_tombstone`` NULL, or not boolean),
    or None. Such a generation is lost: rebuilt from the WAL, or an error."""
    lacking = lacking_columns(rows.column_names, pk)
    if lacking is not None:
        return lacking
    flags = rows.schema.field(TOMBSTONE).type
    if not pa.types.is_boolean(flags):
        return f"its {TOMBSTONE} column is {flags}, not boolean"
    nulls = [c for c in [*pk, TOMBSTONE] if rows.column(c).null_count]
    return f"its column(s) {nulls} hold NULLs (pylance writes none there)" if nulls else None


def prefetch_generation_keys(
    gens: Sequence[GenerationSource], pk: Sequence[str], cache: SnapshotCache
) -> dict[str, str]:
    """Read the keys the merge will rank while the region's loader thread is at hand.

    Returns:
        Why, by URI, the generations whose rows cannot be read (a data file cut short,
        a deletion file missing: the dataset opens, its rows do not). They are lost
        unless merged meanwhile (:mod:`memwal_query.snapshot.recovery` decides).
    """
    failed: dict[str, str] = {}
    for g in gens:
        try:
            generation_keys(g.dataset, pk, cache, g.uri)
        except (OSError, ValueError, RuntimeError) as err:
            failed[g.uri] = lance_message(err)
            with cache.lock:
                cache.generations.pop(g.uri, None)
                cache.generation_keys.pop(g.uri, None)
    return failed
