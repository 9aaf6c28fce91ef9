"""Opening a view: load the snapshot, compute the merge, retry when a merger raced us."""

from __future__ import annotations

import time
from collections.abc import Sequence

from memwal_query.base_mask import fragment_identity
from memwal_query.errors import MemWalError
from memwal_query.format.lance_open import lance_message
from memwal_query.format.storage import Storage
from memwal_query.merge import compute_merge
from memwal_query.scan.arrays import fragment_cache_key
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.load import load_snapshot
from memwal_query.snapshot.model import Consistency, LiveMemTable, MissingGenerationPolicy, Snapshot
from memwal_query.view.table_view import OpenTimings, ReadSettings, TableView

__all__ = ["open_view", "refresh_view"]


def _forget_unread(cache: SnapshotCache, snap: Snapshot) -> None:
    """Drop cached generations, WAL entries and fragment columns the new snapshot no longer reads."""
    cache.keep_generations({g.uri for r in snap.regions for g in r.generations})
    if cache.wal_entries:
        replayed = {
            r.region_id: (r.manifest.replay_after_wal_position, r.merged_generation) for r in snap.regions if r.manifest
        }
        cache.keep_wal_entries(replayed)
    if cache.base_runs:
        cache.keep_base_runs({fragment_identity(f) for f in snap.base.get_fragments()})
    if cache.fragment_columns or cache.over_budget or cache.touched:  # a fresh open has nothing to forget
        cache.keep_fragments(
            {fragment_cache_key(snap.cache_source, f) for f in snap.base.get_fragments()}
            | {
                fragment_cache_key(g.uri, f)
                for r in snap.regions
                for g in r.generations
                for f in g.dataset.get_fragments()
            }
        )


def open_view(
    storage: Storage,
    *,
    consistency: Consistency,
    live: Sequence[LiveMemTable],
    cache: SnapshotCache,
    version: int | None,
    on_missing_generation: MissingGenerationPolicy = "recover",
    settings: ReadSettings | None = None,
) -> TableView:
    """Load a snapshot and its merge into a :class:`TableView` (see ``memwal_query.open_table``)."""
    attempts = 3 if version is None else 1
    for attempt in range(attempts):
        t0 = time.perf_counter()
        snap = load_snapshot(
            storage.uri,
            storage_options=storage.storage_options,
            version=version,
            consistency=consistency,
            live=live,
            cache=cache,
            storage=storage,
            on_missing_generation=on_missing_generation,
        )
        t1 = time.perf_counter()
        try:
            merge = compute_merge(snap, cache, storage)
        except (OSError, ValueError, RuntimeError) as err:
            # A generation vanished between listing and reading its keys (a merger
            # merged it, GC removed it): the newest base version holds its rows.
            with cache.lock:
                for r in snap.regions:
                    for g in r.generations:
                        cache.generations.pop(g.uri, None)
                        cache.generation_keys.pop(g.uri, None)
            if attempt == attempts - 1:
                msg = f"cannot read the flushed generations of {storage.uri}: {lance_message(err)}"
                raise MemWalError(msg) from err
            continue
        t2 = time.perf_counter()
        _forget_unread(cache, snap)
        timings = OpenTimings(t1 - t0, t2 - t1)
        return TableView(snap, merge, storage, cache, tuple(live), timings, settings or ReadSettings())
    raise AssertionError("unreachable")


def refresh_view(view: TableView) -> TableView:
    """A newer snapshot of the same table, reusing ``view``'s caches and keeping its settings.

    Reuses opened generation datasets, decoded WAL entries, known region manifest versions
    (probing starts there), decoded fragment columns and the key runs the lazy base mask
    read, for the base fragments that did not change.
    """
    snap = view.snapshot
    return open_view(
        view.storage,
        consistency=snap.consistency,
        live=view.live,
        cache=view.cache,
        version=None,
        on_missing_generation=snap.on_missing_generation,
        settings=ReadSettings(view.settings.index_catchup),
    )
