"""What a snapshot is (URI, version, schema, key, regions ...): read-only facts of a view.

The facet :class:`memwal_query.Table` shows of its :class:`~memwal_query.view.TableView`.
"""

from __future__ import annotations

import pyarrow as pa

from memwal_query.merge import MergeState
from memwal_query.snapshot.model import Consistency, Snapshot
from memwal_query.view.table_view import OpenTimings, TableView

__all__ = ["ViewFacts"]


class ViewFacts:
    """Read-only facts of :attr:`view` (subclasses provide the view)."""

    __slots__ = ()

    @property
    def view(self) -> TableView:
        """The frozen merged view."""
        raise NotImplementedError

    @property
    def uri(self) -> str:
        """The table URI."""
        return self.view.uri

    @property
    def snapshot(self) -> Snapshot:
        """The frozen snapshot (base version, regions, sources)."""
        return self.view.snapshot

    @property
    def merge_state(self) -> MergeState:
        """The dedup decision of this snapshot."""
        return self.view.merge

    @property
    def timings(self) -> OpenTimings:
        """Seconds spent opening this snapshot."""
        return self.view.timings

    @property
    def version(self) -> int:
        """The base table version this snapshot reads."""
        return self.view.snapshot.base_version

    @property
    def schema(self) -> pa.Schema:
        """The merged table's schema (without hidden columns)."""
        return self.view.snapshot.schema

    @property
    def primary_key(self) -> tuple[str, ...]:
        """The primary key column(s)."""
        return self.view.snapshot.primary_key

    @property
    def consistency(self) -> Consistency:
        """``"strong"`` or ``"eventual"``."""
        return self.view.snapshot.consistency

    @property
    def io_stats(self) -> object:
        """Storage requests made through memwal's own metadata reads so far."""
        return self.view.storage.stats

    @property
    def region_ids(self) -> list[str]:
        """UUID strings of the regions in this snapshot."""
        return [r.region_id for r in self.view.snapshot.regions]
