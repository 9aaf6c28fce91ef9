"""The merged table as one ``pyarrow.dataset.Dataset`` that DataFusion scans.

The merged table is the union of:

* the masked base: each base Lance fragment minus the rows whose key has a newer
  version (``MergeState.base_mask``, decided per fragment when a scan first needs it:
  from the key column decoded with the scan's columns, or row by row from the keys a
  filtered Lance read returns);
* each unmerged flushed generation minus its superseded and tombstone rows;
* each region's surviving MemTable rows (in memory).

Because the masks depend only on keys, every filter is pushed into every source.
``count(*)`` (``columns=[]`` and no filter) is answered from fragment metadata and the
base mask (which reads a base fragment's key column once).

DataFusion calls ``get_fragments(filter)`` once per scan: the dataset asks its planner
(:meth:`memwal_query.view.TableView.plan_scan`) for a frozen :class:`ScanPlan` of that
filter (its predicate IR, the regions it prunes, the index catch-up it uses) and picks
the fragments the plan names. Data goes one way: the dataset never calls back into a
table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from memwal_query.engine_errors import raised_in_engine
from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.forked import check_engine
from memwal_query.format.wal import GEN_COLUMN, SEQ_COLUMN
from memwal_query.merge import MergeState
from memwal_query.planner.catchup import CatchupPlan
from memwal_query.planner.plan import Plan
from memwal_query.planner.predicates import Predicate
from memwal_query.scan.arrays import constant_filter, in_fragment
from memwal_query.scan.balance import balance, workers
from memwal_query.scan.filters import applying, expression_filter
from memwal_query.scan.fragment import (
    HIDDEN_COLUMNS,
    MemoryFragment,
    Scan,
    ScanContext,
    SourceFragment,
    decoded_row_bytes,
    hidden_fields,
    rebuilt_rows,
)
from memwal_query.scan.group import pack_small
from memwal_query.scan.indexed_base import join_indexed_base
from memwal_query.scan.lance_fragment import LanceFragment
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import GenerationSource, Snapshot

__all__ = ["MergedDataset", "ScanPlan", "ScanPlanner"]


@dataclass(frozen=True)
class ScanPlan:
    """What one pushed filter reads, decoded and planned once.

    Attributes:
        predicate: The filter as the predicate IR.
        columns: The columns it reads (``None``: the IR cannot tell, any column).
        regions: The region pruning decision (``None``: pruning is off).
        catchup: The Indexed Read Plan it uses (``None``: base fragments as they are).
    """

    predicate: Predicate
    columns: frozenset[str] | None
    regions: Plan | None = None
    catchup: CatchupPlan | None = field(default=None)

    @property
    def pruned_regions(self) -> frozenset[str]:
        """Regions the filter cannot match."""
        return frozenset(self.regions.pruned_regions) if self.regions is not None else frozenset()


#: Plans a pushed filter (``memwal_query.view.TableView.plan_scan`` with the dataset's options).
ScanPlanner = Callable[[pc.Expression], ScanPlan]


class MergedDataset(pds.Dataset):  # type: ignore[misc]
    """The merged (deduplicated) table of one snapshot, as DataFusion reads it.

    Register it with ``ctx.register_dataset(name, dataset)``; normally through
    :meth:`memwal_query.Table.register`. ``last_scan`` is the :class:`ScanPlan` of the
    last ``get_fragments`` / ``source_fragments`` call (``None`` without a filter): a
    record for ``explain`` and tests, never read by the scan itself.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        merge: MergeState,
        *,
        with_hidden: bool = False,
        planner: ScanPlanner | None = None,
        resident: SnapshotCache | None = None,
        indexed: frozenset[str] = frozenset(),
    ) -> None:
        self.snapshot = snapshot
        self.merge = merge
        self.with_hidden = with_hidden
        self._planner = planner
        self._resident = resident
        self._catchup_frags: dict[str, list[SourceFragment]] = {}
        self._group_memo: dict[object, pa.Table] = {}  # combined small sources (see GroupFragment)
        self.last_scan: ScanPlan | None = None
        self._last_regions: Plan | None = None
        self.data_schema = snapshot.schema
        fields = list(snapshot.schema)
        if with_hidden:
            fields += hidden_fields()
            clash = sorted(set(HIDDEN_COLUMNS) & set(snapshot.schema.names))
            if clash:
                msg = (
                    f"{snapshot.uri} has its own column(s) {clash}, named like the debugging columns "
                    f"hidden_columns=True adds ({', '.join(HIDDEN_COLUMNS)}): register it without them"
                )
                raise InvalidArgumentError(msg)
        # no table-level metadata: DataFusion checks a plan's physical schema against the logical one
        # and aggregates over a scan lose it (replace_schema_metadata() on the base failed them)
        self._schema = pa.schema(fields)
        rows = sum(f.metadata.physical_rows or 0 for f in snapshot.base.get_fragments())
        full = rows * decoded_row_bytes(snapshot.schema)
        self.context = ScanContext(snapshot.uri, snapshot.schema, self._schema, with_hidden, indexed, full)
        self._fragments: list[SourceFragment] = self._build_fragments()

    @property
    def schema(self) -> pa.Schema:
        """The merged table's schema (hidden columns included when requested)."""
        return self._schema

    @property
    def last_plan(self) -> Plan | None:
        """The region pruning decision of the last filtered scan."""
        return self._last_regions

    @property
    def last_catchup(self) -> CatchupPlan | None:
        """The Indexed Read Plan the last scan used (``None``: none)."""
        return self.last_scan.catchup if self.last_scan is not None else None

    def projected(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of a projection; raises on unknown columns."""
        return self.context.projected(columns)

    def _build_fragments(self) -> list[SourceFragment]:
        frags: list[SourceFragment] = []
        mask = self.merge.base_mask
        base = self.snapshot.base
        for f in base.get_fragments():
            frag = LanceFragment(self.context, base, f, None, 0, None, f"base/{f.fragment_id}", mask)
            frag.resident, frag.source_uri = self._resident, self.snapshot.cache_source
            frags.append(frag)
        for region in self.snapshot.regions:
            for g in region.generations:
                gdrop = self.merge.generation_drop.get(g.uri, np.empty(0, dtype=np.uint64))
                if g.rebuilt_from_wal:
                    frags.append(MemoryFragment(self.context, rebuilt_rows(g, gdrop), region.region_id))
                else:
                    frags += self._generation_fragments(g, gdrop, "gen", self._resident)
            mem = self.merge.memtables.get(region.region_id)
            if mem is not None and mem.num_rows:
                frags.append(MemoryFragment(self.context, mem, region.region_id))
        return frags

    def get_fragments(self, filter: pc.Expression | None = None) -> list[SourceFragment]:
        """One fragment per partition; the filter is applied inside each scan.

        With a filter, regions that cannot hold a matching row (region pruning,
        :mod:`memwal_query.planner.pruning`) contribute no fragment; the plan is
        recorded in :attr:`last_scan`.
        """
        check_engine(self.context.uri)  # DataFusion runs this process's queries: a fork cannot
        filt = expression_filter(filter)
        filt = None if constant_filter(filt) is not None else filt  # a constant: each scan applies it
        try:
            sources = self.source_fragments(filt)
        except MemWalError as err:  # planning read a file (a generation's keys): kept for the caller
            raise raised_in_engine(err) from None
        frags = pack_small(sources, self._group_memo if self._resident is not None else None)
        frags = balance(join_indexed_base(frags, filt, self.context), workers())
        # DataFusion needs at least one partition (an empty table, or every source pruned).
        return frags or [MemoryFragment(self.context, self._empty_rows(), "")]

    def _empty_rows(self) -> pa.Table:
        extra = {GEN_COLUMN: pa.int64(), SEQ_COLUMN: pa.uint64()}
        return pa.schema(list(self.data_schema) + [pa.field(k, t) for k, t in extra.items()]).empty_table()

    def scan_plan(self, filter: pc.Expression | None) -> ScanPlan | None:
        """The frozen plan of a pushed filter (``None`` without a filter or a planner)."""
        if filter is None or self._planner is None:
            return None
        return self._planner(filter)

    def source_fragments(self, filter: pc.Expression | None = None) -> list[SourceFragment]:
        """Every source fragment the filter may need, one per Lance fragment / MemTable.

        Each has ``.region`` (``None`` for the base) and ``.label``; ``get_fragments``
        packs the small ones into shared partitions. Region pruning applies.
        """
        plan = self.scan_plan(filter)
        self.last_scan = plan
        if plan is None:
            return list(self._fragments)
        if plan.regions is not None:
            self._last_regions = plan.regions
        return self.fragments_of(plan)

    def fragments_of(self, plan: ScanPlan) -> list[SourceFragment]:
        """The source fragments ``plan`` reads (a pure function of the plan)."""
        pruned = plan.pruned_regions
        frags = [f for f in self._fragments if f.region is None or f.region not in pruned]
        catchup = plan.catchup
        if catchup is not None:
            # Index catch-up: base fragments the filter's index does not cover yet are
            # served by the catch-up generations (and their own indexes) instead.
            uncovered = set(catchup.uncovered_fragments)
            frags = [
                f
                for f in frags
                if not (isinstance(f, LanceFragment) and f.gen == 0 and f.fragment.fragment_id in uncovered)
            ]
            frags += [f for f in self._catchup_fragments(catchup) if f.region not in pruned]
        return frags

    def _catchup_fragments(self, plan: CatchupPlan) -> list[SourceFragment]:
        got = self._catchup_frags.get(plan.index.name)
        if got is None:
            # not kept decoded: scanned through Lance so that their own indexes serve the filter
            got = [
                f for src in plan.sources for f in self._generation_fragments(src.generation, src.drop, "catch-up gen")
            ]
            self._catchup_frags[plan.index.name] = got
        return got

    def _generation_fragments(
        self, g: GenerationSource, drop: np.ndarray, kind: str, resident: SnapshotCache | None = None
    ) -> list[SourceFragment]:
        """One fragment per Lance fragment of generation ``g``, each with its part of ``drop``."""
        out: list[SourceFragment] = []
        for f in g.dataset.get_fragments():
            label = f"{g.region_id}/{kind}{g.generation}/{f.fragment_id}"
            frag = LanceFragment(self.context, g.dataset, f, in_fragment(drop, f), g.generation, g.region_id, label)
            frag.resident, frag.source_uri = resident, g.uri
            out.append(frag)
        return out

    def scanner(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None, **_: object) -> Scan:
        """A scan of the whole merged table (used by DataFusion for the schema)."""
        out = self.projected(columns)
        frags = self._fragments

        def batches() -> Iterator[pa.RecordBatch]:
            for fr in frags:
                yield from fr.scanner(columns=columns, filter=filter).to_batches()

        return Scan(out, batches() if filter is None else applying(batches(), filter, self.context.uri))

    def to_table(
        self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None, **_: object
    ) -> pa.Table:
        """Materialise the merged table (optionally projected and filtered)."""
        scan = self.scanner(columns=columns, filter=filter)
        return pa.Table.from_batches(list(scan.to_batches()), schema=scan.projected_schema)

    def count_rows(self, filter: pc.Expression | None = None, **_: object) -> int:
        """Rows of the merged table (metadata and drop lists when there is no filter: every base
        fragment's decided first, on several threads, as a scan's partitions would be)."""
        if filter is None:
            self.merge.base_mask.decide_all()
        return sum(b.num_rows for b in self.scanner(columns=[], filter=filter).to_batches())
