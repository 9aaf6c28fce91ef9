"""The scan: the merged table as fragments DataFusion reads (one way: view -> scan).

* :mod:`~memwal_query.scan.dataset`: :class:`MergedDataset` (what DataFusion scans)
  and the frozen :class:`ScanPlan` of a pushed filter;
* :mod:`~memwal_query.scan.fragment`, :mod:`~memwal_query.scan.lance_fragment`,
  :mod:`~memwal_query.scan.group`: the partitions;
* :mod:`~memwal_query.scan.stream`: a one-shot pass (one Lance scanner over the base,
  masked by key; nothing cached), for :mod:`memwal_query.reader`;
* :mod:`~memwal_query.scan.filters`: the columns a filter reads (predicate IR);
* :mod:`~memwal_query.scan.arrays`: whole-array helpers (drop masks, cache keys).
"""

from __future__ import annotations

from memwal_query.scan.arrays import fragment_cache_key
from memwal_query.scan.dataset import MergedDataset, ScanPlan
from memwal_query.scan.fragment import HIDDEN_COLUMNS, ScanContext, SourceFragment, hidden_fields

__all__ = [
    "HIDDEN_COLUMNS",
    "MergedDataset",
    "ScanContext",
    "ScanPlan",
    "SourceFragment",
    "fragment_cache_key",
    "hidden_fields",
]
