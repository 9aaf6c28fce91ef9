"""Unmerged generations that cannot be read: rebuilt from the WAL, an error, or skipped.

A flushed generation's rows reach the base table only when a merger merges it; until
then its directory and the region's WAL hold the only copies (the spec keeps WAL
entries until their generation is merged). A generation at or below the region's
merged generation that is gone was garbage-collected after its merge: the base holds
its rows and the snapshot skips it silently (it is never opened). A generation *above*
the merged generation whose directory is missing, unreadable or partly deleted, still
after :func:`memwal_query.snapshot.load_snapshot` retried with the newest base version
(a merger may merge and garbage-collect it while a snapshot opens), is *lost*, and
``on_missing_generation`` decides:

* ``"recover"`` (default): its rows are rebuilt from the WAL entries of its generation
  when they hold every row it had (the region manifest records the count), served with
  its generation number (newest-wins order unchanged); one warning, and ``explain()``
  says so and how to repair. When the WAL cannot rebuild it: :class:`GenerationLostError`.
* ``"error"``: :class:`GenerationLostError` without trying the WAL.
* ``"skip"``: as ``"recover"``, but a generation the WAL cannot rebuild is left out
  (a warning; ``explain()`` says which rows are missing) instead of an error.

Repair: :func:`memwal_write.merge_generations` merges a lost generation from the same
WAL entries into the base (then no reader needs them), or restore the directory.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import replace

import lance
import numpy as np
import pyarrow as pa

from memwal_query.conform import conform
from memwal_query.errors import GenerationLostError, MemWalCorruptionError
from memwal_query.format.model import FlushedGeneration
from memwal_query.format.scratch import scratch
from memwal_query.format.storage import Storage
from memwal_query.format.wal import GenerationWal, scan_generations
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.evolution import generation_schema, tagged_schema
from memwal_query.snapshot.model import (
    GenerationSource,
    MissingGenerationPolicy,
    RegionSnapshot,
    SkippedGeneration,
    Snapshot,
)

__all__ = [
    "REPAIR_HINT",
    "resolve_missing_generations",
    "rebuild_rows",
    "lost_generation_message",
    "wal_generation_rows",
]

log = logging.getLogger("memwal_query")

#: How to make a generation rebuilt from the WAL durable again.
REPAIR_HINT = (
    "repair: run memwal_write.merge_generations (it merges the WAL's rows into the base) or restore the directory"
)


def lost_generation_message(table_uri: str, region: RegionSnapshot, lost: SkippedGeneration, why: str) -> str:
    """The one-line message of a lost generation: table, region, generation, path, what and why."""
    return (
        f"{table_uri}: region {region.region_id}: flushed generation {lost.generation} ({lost.uri}) is lost: "
        f"{_one_line(lost.reason)}, and it is not merged (the region's merged generation is "
        f"{region.merged_generation}); {why}"
    )


def collected_after_merge_message(
    snap: Snapshot, region: RegionSnapshot, gone: SkippedGeneration, newest: int, why: str
) -> str:
    """The one-line message of a generation a pinned base version has not merged and a newer
    one has (its directory garbage-collected since): not lost, but gone for this version."""
    return (
        f"{snap.uri}: region {region.region_id}: flushed generation {gone.generation} ({gone.uri}) is gone "
        f"({_one_line(gone.reason)}): base version {snap.base_version}, which was asked for, has not merged it "
        f"(its merged generation is {region.merged_generation}), base version {newest} has, and its directory "
        f"was garbage-collected after that merge; {why}"
    )


def _one_line(text: str) -> str:
    """``text`` without line breaks (storage errors can span lines)."""
    return " ".join(text.split())


def resolve_missing_generations(
    snap: Snapshot,
    storage: Storage,
    cache: SnapshotCache,
    policy: MissingGenerationPolicy,
    *,
    pinned_version: bool = False,
    merged_since: tuple[int, Mapping[str, int]] | None = None,
) -> Snapshot:
    """Apply ``policy`` to every lost generation of ``snap`` (see the module docstring).

    Args:
        snap: A snapshot whose ``skipped`` generations marked ``missing`` stayed
            unreadable after the retry with the newest base version.
        storage: The table's storage (the WAL is read from it).
        cache: Holds decoded WAL entries and generations rebuilt earlier.
        policy: ``"recover"``, ``"error"`` or ``"skip"``.
        pinned_version: The caller asked for a base version (an older one may not
            merge a generation that a newer one merged before its directory was removed).
        merged_since: For a pinned version, the newest base version and its merged
            generation per region: a generation it merged is not lost but collected
            after its merge, which the messages say (no repair is needed).

    Returns:
        ``snap`` with rebuilt generations among its sources (and, with ``"skip"``, the
        generations left out explained in ``skipped``).

    Raises:
        GenerationLostError: A lost generation cannot be rebuilt (or ``policy`` is ``"error"``).
    """
    regions = tuple(
        _resolve_region(snap, r, storage, cache, policy, pinned_version, merged_since)
        if any(s.missing for s in r.skipped)
        else r
        for r in snap.regions
    )
    return replace(snap, regions=regions, on_missing_generation=policy)


def _resolve_region(
    snap: Snapshot,
    region: RegionSnapshot,
    storage: Storage,
    cache: SnapshotCache,
    policy: MissingGenerationPolicy,
    pinned_version: bool,
    merged_since: tuple[int, Mapping[str, int]] | None,
) -> RegionSnapshot:
    lost = [s for s in region.skipped if s.missing]
    pinned = f" (base version {snap.base_version} was asked for: open the latest version)" if pinned_version else ""

    def collected(s: SkippedGeneration) -> bool:
        """Merged by the newest base version (then garbage-collected), not lost."""
        return merged_since is not None and s.generation <= merged_since[1].get(region.region_id, 0)

    def message(s: SkippedGeneration, why: str) -> str:
        if merged_since is not None and collected(s):
            return collected_after_merge_message(snap, region, s, merged_since[0], why)
        return lost_generation_message(snap.uri, region, s, why + pinned)

    if policy == "error":
        raise GenerationLostError(message(lost[0], "on_missing_generation='error' does not rebuild it from the WAL"))
    expected = {g.generation: g.physical_rows for g in region.manifest.flushed_generations} if region.manifest else {}
    wal = scan_generations(
        storage, region.region_id, {s.generation: expected.get(s.generation, 0) for s in lost}, cache.wal_entries
    )
    generations = list(region.generations)
    skipped = [s for s in region.skipped if not s.missing]
    for s in lost:
        found = wal[s.generation]
        if found.complete and collected(s):
            generations.append(_rebuilt_source(snap, s, found, cache))
            log.info("%s", message(s, f"its rows are served from the WAL ({found.describe()})"))
        elif found.complete:
            generations.append(_rebuilt_source(snap, s, found, cache))
            why = f"its rows are served from the WAL ({found.describe()}); {REPAIR_HINT}"
            with cache.lock:
                first = s.uri not in cache.lost_warned
                cache.lost_warned.add(s.uri)
            # once per table lineage: a reader refreshing every second logged it every second
            log.log(logging.WARNING if first else logging.INFO, "%s", lost_generation_message(snap.uri, region, s, why))
        elif policy == "skip":
            state = "GONE (merged by a newer base version; " if collected(s) else "LOST ("
            reason = (
                f"{state}{_one_line(s.reason)}: {s.uri}), not merged, and {found.describe()}: "
                "its rows are missing from this snapshot (on_missing_generation='skip')"
            )
            skipped.append(replace(s, reason=reason))
            log.warning(
                "%s; on_missing_generation='skip': left out",
                message(s, f"the WAL cannot rebuild it: {found.describe()}"),
            )
        elif collected(s):
            why = (
                f"the WAL cannot rebuild it: {found.describe()}; open the latest version, or open with "
                "on_missing_generation='skip' to read this version without its rows"
            )
            raise GenerationLostError(message(s, why))
        else:
            why = (
                f"the WAL cannot rebuild it: {found.describe()}; restore the directory, or open with "
                f"on_missing_generation='skip' to read the table without its rows"
            )
            raise GenerationLostError(message(s, why))
    return replace(
        region,
        generations=tuple(sorted(generations, key=lambda g: g.generation)),
        skipped=tuple(sorted(skipped, key=lambda g: g.generation)),
    )


def rebuild_rows(
    found: GenerationWal,
    region_id: str,
    schema: pa.Schema,
    primary_key: tuple[str, ...],
    field_ids: pa.Schema | None = None,
) -> pa.Table:
    """The rows of a flushed generation from its WAL entries, oldest first (duplicates kept).

    Args:
        found: The generation's WAL entries (:func:`memwal_query.format.wal.scan_generations`).
        region_id: Region UUID string (for error messages).
        schema: The base table schema.
        primary_key: The primary key columns.
        field_ids: The base's schema with Lance field ids in its fields' metadata
            (entries' columns are matched by field id: renamed, added or dropped since
            they were logged).

    Returns:
        The base columns plus ``_tombstone``, in WAL order (a later row of a key wins).
    """
    target = generation_schema(schema, primary_key)
    parts = [
        conform(
            e.table,
            target,
            what=f"region {region_id} WAL position {e.position}",
            strict=False,
            error=MemWalCorruptionError,
            field_ids=field_ids,
        )
        for e in found.entries
    ]
    return pa.concat_tables(parts) if parts else target.empty_table()


def _rebuilt_source(
    snap: Snapshot, lost: SkippedGeneration, found: GenerationWal, cache: SnapshotCache
) -> GenerationSource:
    """An in-memory Lance dataset of the generation's WAL rows (reused while it stays lost).

    Its row addresses follow WAL order, so the merge ranks its rows as it ranks a flushed
    generation's (later position wins inside the generation).
    """
    key = (lost.uri, tuple(e.position for e in found.entries), snap.columns_mark)  # rows conformed to these columns
    with cache.lock:
        hit = cache.rebuilt.get(key)
    if hit is not None:
        return hit
    rows = rebuild_rows(found, lost.region_id, snap.schema, snap.primary_key, tagged_schema(snap.base))
    uri = f"memory://memwal-rebuilt-{uuid.uuid4().hex}"
    ds = lance.write_dataset(rows, uri)
    src = GenerationSource(
        lost.region_id, lost.generation, uri, ds, rows.num_rows, lost_uri=lost.uri, wal_positions=found.positions
    )
    with cache.lock:
        cache.rebuilt[key] = src
    return src


def wal_generation_rows(
    storage: Storage,
    region_id: str,
    gen: FlushedGeneration,
    schema: pa.Schema,
    primary_key: tuple[str, ...],
    field_ids: pa.Schema | None = None,
) -> pa.Table:
    """A flushed generation's live rows rebuilt from the WAL: what its dataset would read.

    One row per key, the newest (a flushed generation's deletion vector hides the rows
    superseded inside it), tombstones included. For a merger of a lost generation.

    Args:
        storage: The table's storage.
        region_id: Region UUID string.
        gen: The flushed generation as the region manifest lists it.
        schema: The base table schema.
        primary_key: The primary key columns.
        field_ids: The base's schema with Lance field ids (see :func:`rebuild_rows`).

    Returns:
        The base columns plus ``_tombstone``.

    Raises:
        GenerationLostError: The WAL does not hold every row of the generation.
    """
    found = scan_generations(storage, region_id, {gen.generation: gen.physical_rows})[gen.generation]
    if not found.complete:
        path = storage.child_uri(f"_mem_wal/{region_id}/{gen.path.strip('/')}")
        msg = (
            f"{storage.uri}: region {region_id}: flushed generation {gen.generation} ({path}) cannot be read "
            f"and the WAL cannot rebuild it: {found.describe()}"
        )
        raise GenerationLostError(msg)
    rows = rebuild_rows(found, region_id, schema, primary_key, field_ids)
    order = pa.array(np.arange(rows.num_rows, dtype=np.int64))
    i = scratch("_i", primary_key, ["_max"])
    newest = rows.select(list(primary_key)).append_column(i, order).group_by(list(primary_key)).aggregate([(i, "max")])
    return rows.take(pa.array(np.sort(newest.column(f"{i}_max").to_numpy())))
