"""memwal_write: feed MemWAL tables through pylance's own writer, routed by region spec.

Example:
    >>> from memwal_write import write_arrow, RoutedWriter
"""

from __future__ import annotations

from memwal_query.spark_read import read_spark  # the read side; kept here for compatibility
from memwal_write.arrow_writer import RegionWriteStats, RoutedWriter, conform, write_arrow
from memwal_write.gc import collect_garbage
from memwal_write.merger import merge_generations, merge_generations_spark
from memwal_write.routing import region_id_for
from memwal_write.spark import delete, to_datafusion, write
from memwal_write.spark_sink import committed_batches, sink_id_for


def register_data_source(spark: object) -> None:
    """Register the ``memwal`` Spark data source (:mod:`memwal_write.spark_source`) with ``spark``."""
    from memwal_write.spark_source import register_data_source as register

    register(spark)


__all__ = ["write_arrow", "RoutedWriter", "RegionWriteStats", "conform", "region_id_for"]
__all__ += ["write", "delete", "read_spark", "to_datafusion", "merge_generations", "merge_generations_spark"]
__all__ += ["register_data_source", "committed_batches", "sink_id_for", "collect_garbage"]
