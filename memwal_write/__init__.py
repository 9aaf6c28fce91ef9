"""memwal_write: feed MemWAL tables through pylance's own writer, routed by region spec.

Example:
    >>> from memwal_write import write_arrow, RoutedWriter
"""

from __future__ import annotations

from memwal_write.arrow_writer import RegionWriteStats, RoutedWriter, conform, write_arrow
from memwal_write.routing import region_id_for

__all__ = ["write_arrow", "RoutedWriter", "RegionWriteStats", "conform", "region_id_for"]
