"""Snapshot: a frozen view of one base table version and every region's sources.

* :mod:`~memwal_query.snapshot.model`: the frozen values (:class:`Snapshot`,
  :class:`RegionSnapshot`, :class:`GenerationSource` ...);
* :mod:`~memwal_query.snapshot.load`: :func:`load_snapshot` reads them from storage
  (``format/``), with :mod:`~memwal_query.snapshot.manifests` (region manifests),
  :mod:`~memwal_query.snapshot.generations` (flushed generations),
  :mod:`~memwal_query.snapshot.memtables` (WAL tail, in-process rows) and
  :mod:`~memwal_query.snapshot.recovery` (lost generations rebuilt from the WAL);
* :mod:`~memwal_query.snapshot.cache`: what a snapshot hands to the next one.

Consumed by the merge (:mod:`memwal_query.merge`), the planner and the view.
"""

from __future__ import annotations

from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.load import load_snapshot
from memwal_query.snapshot.manifests import latest_region_manifest, list_regions
from memwal_query.snapshot.model import (
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
    "latest_region_manifest",
    "list_regions",
]
