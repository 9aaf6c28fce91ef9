"""What one snapshot opened and hands to the next (``Table.refresh``), shared by a table lineage."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa

from memwal_query.format.fragment_files import FragmentColumns
from memwal_query.format.model import RegionManifest
from memwal_query.format.wal import WalEntry
from memwal_query.snapshot.model import GenerationSource

__all__ = ["SnapshotCache", "Decision", "DECISION_KEY_SETS", "fragment_cache_key", "BASE_RUNS_MAX_BYTES", "run_bytes"]


def fragment_cache_key(source_uri: str, frag: lance.fragment.LanceFragment) -> tuple[object, ...]:
    """What identifies a Lance fragment's rows: its dataset, id, data files and deletion file."""
    meta = frag.metadata
    d = meta.deletion_file
    deletion = None if d is None else (d.read_version, d.id, d.num_deleted_rows)
    return (source_uri, int(frag.fragment_id), tuple(f.path for f in frag.data_files()), deletion)


BASE_RUNS_MAX_BYTES = 256 * 1024 * 1024
"""Memory for base key runs kept across refreshes (~28M int64 keys; reading them again costs
~8 ms per million keys)."""


def run_bytes(run: pa.Table | FragmentColumns) -> int:
    """Memory a base key run holds."""
    if isinstance(run, FragmentColumns):
        return int(run.table.nbytes) + (int(run.live.nbytes) if run.live is not None else 0)
    return int(run.nbytes)


DECISION_KEY_SETS = 3
"""Newer key sets (one per snapshot that decided base fragments) the kept decisions may hold."""


@dataclass(frozen=True)
class Decision:
    """A base fragment's drop list and the sorted integer newer keys it was decided against.

    Attributes:
        newer: The newer levels' keys (sorted, unique), shared by a snapshot's decisions.
        drop: The sorted row addresses of the fragment whose key is in ``newer``.
        key_sorted: Whether the fragment's keys were in ascending order (None: not checked;
            False lets a later snapshot skip the check: stored rows include the live ones).
    """

    newer: np.ndarray
    drop: np.ndarray
    key_sorted: bool | None = None


@dataclass
class SnapshotCache:
    """What a snapshot opened and can hand to the next one (see ``refresh``)."""

    generations: dict[str, lance.LanceDataset] = field(default_factory=dict)
    wal_entries: dict[tuple[str, int], WalEntry] = field(default_factory=dict)
    #: Those entries' rows as MemTable rows, by (region, position): (the schemas they were
    #: conformed to, the rows). A refresh conformed every entry of a tail again (~0.7 s for 1,000).
    wal_rows: dict[tuple[str, int], tuple[bytes, pa.Table]] = field(default_factory=dict)
    manifests: dict[str, RegionManifest] = field(default_factory=dict)
    generation_keys: dict[str, pa.Table] = field(default_factory=dict)
    #: Each opened generation's Lance field paths and row count, by URI (read once).
    generation_shapes: dict[str, tuple[Mapping[int, tuple[str, ...]], int]] = field(default_factory=dict)
    #: Key columns and ``_rowaddr`` of base fragments the lazy base mask read (or the key
    #: columns of every stored row and which are deleted, read from the data files), by
    #: fragment identity (``base_mask.fragment_identity``): a refresh reuses them.
    base_runs: dict[tuple[object, ...], pa.Table | FragmentColumns] = field(default_factory=dict)
    base_runs_bytes: int = 0
    #: The last drop list decided per base fragment identity and the newer keys it was
    #: decided against (:class:`Decision`): a refresh after a small write decides the
    #: fragment again from it (integer keys).
    decisions: dict[tuple[object, ...], Decision] = field(default_factory=dict)
    #: The newer key sets those decisions hold, most recently used last (at most
    #: :data:`DECISION_KEY_SETS`: each can be as large as every unmerged key).
    decision_key_sets: list[np.ndarray] = field(default_factory=list)
    #: Decoded columns of Lance fragments (base and generations), by
    #: :func:`memwal_query.scan.arrays.fragment_cache_key`: column name -> array, plus
    #: ``_rowaddr``. Fragments never change, so they are decoded once (bounded in size).
    fragment_columns: dict[tuple[object, ...], dict[str, pa.ChunkedArray]] = field(default_factory=dict)
    resident_bytes: int = 0
    #: Whether a decoded float column of a fragment holds a NaN with its sign bit set, by
    #: (fragment key, column): filters over it are then run by Lance (``scan.lance_eval``).
    negative_nans: dict[tuple[tuple[object, ...], str], bool] = field(default_factory=dict)
    #: Fragments whose columns did not fit the budget: scanned through Lance.
    over_budget: set[tuple[object, ...]] = field(default_factory=set)
    #: Fragments a filtered scan has read through Lance once (the next scan decodes them).
    touched: set[tuple[object, ...]] = field(default_factory=set)
    #: Lost generations rebuilt from the WAL, by (directory URI, WAL positions, columns mark).
    rebuilt: dict[tuple[str, tuple[int, ...], bytes], GenerationSource] = field(default_factory=dict)
    #: Each region's last merge (``memwal_query.region_merge``), by region id: (what it was
    #: computed from, the merge); a refresh reuses it when the region did not change.
    region_merges: dict[str, tuple[object, object]] = field(default_factory=dict)
    #: Each region's unmerged generations ranked without its MemTable, by region id: (their
    #: URIs, the ``kept_ranks.RankedGenerations``); a refresh after a write ranks only the MemTable.
    generation_ranks: dict[str, tuple[tuple[str, ...], object]] = field(default_factory=dict)
    #: How many rows of a flushed generation its region's spec values exclude, by (generation
    #: URI, spec id, values and source columns): a region holding any is never pruned
    #: (``planner.routing``).
    routing_checks: dict[tuple[str, int, str], int] = field(default_factory=dict)
    #: Regions already reported for holding rows their spec values exclude (warned once).
    misrouted_regions: set[str] = field(default_factory=set)
    #: Whole rows (with ``_rowaddr``) of small unmerged generations, for point lookups
    #: (``memwal_query.lookup``), bounded by ``LOOKUP_ROWS_BUDGET`` bytes in all.
    generation_rows: dict[str, pa.Table] = field(default_factory=dict)
    #: Those rows laid end to end per region (``memwal_query.lookup_rows.RegionRows``).
    region_rows: dict[str, object] = field(default_factory=dict)
    #: Vector search's in-memory rows of small generations (``("part", uri, column, partitioning)``)
    #: and base index centroids (``("centroids", ...)``): see :mod:`memwal_query.vector_pool`.
    vector_parts: dict[tuple[object, ...], object] = field(default_factory=dict)
    #: Per cached fragment with superseded rows: a digest of its drop list, that list as a
    #: mask over the cached rows, the cached columns without those rows, and the list (one
    #: entry per fragment: a refreshed snapshot whose drop list for it is the same reuses them).
    survivors: dict[tuple[object, ...], tuple[bytes, pa.Array, dict[str, pa.ChunkedArray], np.ndarray]] = field(
        default_factory=dict
    )
    #: What each base version's commit did (``memwal_query.planner.base_history``: an
    #: ``Operation``, None when unreadable) and the merged generations its MemWAL index
    #: records, by version: a version never changes, so a refresh reads only newer ones.
    base_operations: dict[int, object] = field(default_factory=dict)
    merged_at: dict[int, tuple[tuple[str, int], ...] | None] = field(default_factory=dict)
    #: Lost generations served from the WAL that a warning was logged for (once per lineage,
    #: not on every refresh), by directory.
    lost_warned: set[str] = field(default_factory=set)
    #: The base version the cache was last loaded at and a digest of its Lance manifest: a
    #: table deleted and written again at the same place reuses region ids, WAL positions
    #: and version numbers, so only the manifest tells it from the table cached.
    table_mark: tuple[int, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        """Forget everything (the table at this place was replaced)."""
        with self.lock:
            for f in dataclasses.fields(self):
                if f.name != "lock":
                    value = getattr(self, f.name)
                    if isinstance(value, dict | set | list):
                        value.clear()
            self.base_runs_bytes = self.resident_bytes = 0
            self.table_mark = None

    @property
    def generation_rows_bytes(self) -> int:
        """Memory held by :attr:`generation_rows`."""
        with self.lock:
            return sum(t.nbytes for t in self.generation_rows.values())

    def keep_generations(self, uris: set[str]) -> None:
        """Forget what was cached for generations a snapshot no longer reads (merged ones)."""
        with self.lock:
            for d in (self.generations, self.generation_keys, self.generation_rows, self.generation_shapes):
                for uri in [u for u in d if u not in uris]:
                    del d[uri]
            for key in [k for k, g in self.rebuilt.items() if g.uri not in uris]:
                del self.rebuilt[key]
            for check in [k for k in self.routing_checks if k[0] not in uris]:
                del self.routing_checks[check]
            for part in [k for k in self.vector_parts if k[0] == "part" and k[1] not in uris]:
                del self.vector_parts[part]
            for region in [r for r, m in self.region_rows.items() if not set(getattr(m, "uris", ())) <= uris]:
                del self.region_rows[region]

    def keep_wal_entries(self, needed: Mapping[str, tuple[int, int]]) -> None:
        """Forget decoded WAL entries no later snapshot replays: per region, ``needed`` holds
        (replay position, merged generation); an entry at or before that position belongs to a
        flushed generation, and once that generation is merged nothing rebuilds it from the WAL."""
        with self.lock:
            for key in [
                (region, pos)
                for (region, pos), e in self.wal_entries.items()
                if region in needed and pos <= needed[region][0] and e.generation <= needed[region][1]
            ]:
                del self.wal_entries[key]
                self.wal_rows.pop(key, None)

    def remember_decision(self, ident: tuple[object, ...], decision: Decision) -> None:
        """Keep a base fragment's drop list; decisions against key sets older than the last
        :data:`DECISION_KEY_SETS` used are forgotten (their fragments are decided whole again)."""
        with self.lock:
            self.decisions[ident] = decision
            sets = self.decision_key_sets
            if sets and sets[-1] is decision.newer:
                return
            sets[:] = [k for k in sets if k is not decision.newer] + [decision.newer]
            while len(sets) > DECISION_KEY_SETS:
                old = sets.pop(0)
                for i in [i for i, d in self.decisions.items() if d.newer is old]:
                    del self.decisions[i]

    def keep_base_runs(self, identities: set[tuple[object, ...]]) -> None:
        """Forget the key runs of base fragments the newest snapshot does not have."""
        with self.lock:
            for ident in [i for i in self.base_runs if i not in identities]:
                self.base_runs_bytes -= run_bytes(self.base_runs.pop(ident))
            for ident in [i for i in self.decisions if i not in identities]:
                del self.decisions[ident]

    def store_base_run(self, ident: tuple[object, ...], run: pa.Table | FragmentColumns) -> bool:
        """Keep a base fragment's key run for refreshed snapshots, within :data:`BASE_RUNS_MAX_BYTES`
        (beyond it a refresh reads the fragment's keys again). Returns whether it was kept."""
        nbytes = run_bytes(run)
        with self.lock:
            if ident in self.base_runs:
                return True
            if self.base_runs_bytes + nbytes > BASE_RUNS_MAX_BYTES:
                return False
            self.base_runs[ident] = run
            self.base_runs_bytes += nbytes
            return True

    def keep_fragments(self, keys: set[tuple[object, ...]]) -> None:
        """Forget decoded columns of fragments the newest snapshot does not read."""
        with self.lock:
            for key in [k for k in self.fragment_columns if k not in keys]:
                self.resident_bytes -= sum(a.nbytes for a in self.fragment_columns.pop(key).values())
            for key in [k for k in self.survivors if k not in keys]:
                del self.survivors[key]
            for known in [k for k in self.negative_nans if k[0] not in keys]:
                del self.negative_nans[known]
            self.over_budget &= keys
            self.touched &= keys
