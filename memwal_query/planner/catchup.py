"""The spec's Indexed Read Plan: serve rows a base index does not cover yet from generations.

When flushed generations are merged into the base, the merge writes new base
fragments that the base table's indexes do not cover until they are rebuilt or
optimized ("index catch-up"). A query that needs index *I* would otherwise search
those fragments without an index (a flat scan). Their rows, however, are exactly
the live rows of the generations merged since *I* last caught up (the *catch-up
generations*), and each flushed generation carries its own copy of the maintained
indexes. So the plan is:

* the base, restricted to the fragments *I* covers (:mod:`memwal_query.format.index_restriction`);
* each catch-up generation (its own index), minus the rows that are not the live
  version of their key: older versions inside the catch-up generations,
  tombstones, and keys that have a newer version in an unmerged generation or
  the MemTable (those come from the newer level, as always);
* the unmerged generations and MemTables as usual.

Catch-up progress comes from the MemWAL index's ``index_catchup`` entry for *I*
(pylance's ``create_index`` writes one); a region missing from the entry has caught
up with nothing. For an index with no entry, progress is inferred from the base
manifest of the version the index was last built at (its fragment bitmap says which
fragments it covers): the generations merged since then are the catch-up generations.
(The spec counts an index missing from a non-empty list as caught up; an index built
before the MemWAL existed stays missing once pylance records another index's progress,
and its unindexed fragments would match no generation.)

Whether a usable plan is *chosen* is :attr:`memwal_query.Table.index_catchup`'s call
(:meth:`memwal_query.view.TableView.uses_catchup`)
(by default a cost rule: many small generations cost more as indexed searches than a
few thousand rows searched flat). The plan is checked before it is used: every catch-up generation must still be
readable (a merger may garbage-collect merged generations), their live rows
must number exactly the rows of the uncovered base fragments, and no commit since the
index was built may have written rows other than by merging generations (an
``update()`` or an append straight on the base; read from the versions' transaction
files, :mod:`memwal_query.planner.base_history`). Otherwise the query
falls back to searching the uncovered fragments flat, and :attr:`CatchupPlan.reason`
says why.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_query.errors import MemWalError
from memwal_query.format.memwal_index import read_memwal_index
from memwal_query.format.paths import generation_rel
from memwal_query.format.storage import Storage
from memwal_query.planner.base_history import edited_directly
from memwal_query.region_rank import rank_levels
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.generations import BaseColumns, generation_damage, open_generation
from memwal_query.snapshot.model import GenerationSource, Snapshot

__all__ = [
    "CATCHUP_MIN_ROWS_PER_SOURCE",
    "BaseIndex",
    "CatchupSource",
    "CatchupPlan",
    "base_indexes",
    "catchup_size",
    "plan_catchup",
    "still_readable",
]

log = logging.getLogger("memwal_query")

#: ``Table.index_catchup == "auto"`` uses a usable plan when the unindexed base rows
#: number at least this many per catch-up generation. Measured (64-d IVF_PQ base,
#: IVF_HNSW_SQ generations, 2 cores): one indexed search of a small generation costs
#: ~2 ms, a flat search ~0.12 ms per 1,000 rows, so they break even near 16k rows.
CATCHUP_MIN_ROWS_PER_SOURCE = 20_000


@dataclass(frozen=True)
class BaseIndex:
    """An index of the base table (from the manifest's index section)."""

    name: str
    columns: tuple[str, ...]
    index_type: str
    dataset_version: int
    fragment_ids: frozenset[int]


def base_indexes(snapshot: Snapshot) -> list[BaseIndex]:
    """The user indexes of the snapshot's base version (the MemWAL index left out)."""
    try:
        # describe_indices() (the successor) does not expose fragment coverage yet.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            raw = snapshot.base.list_indices()
    except Exception:  # noqa: BLE001 - no index metadata at all
        return []
    out: dict[str, BaseIndex] = {}
    for idx in raw:
        info: dict[str, Any] = dict(idx) if isinstance(idx, dict) else dict(getattr(idx, "__dict__", {}))
        name = str(info.get("name", ""))
        if not name or name.startswith("__"):
            continue
        segment = BaseIndex(
            name=name,
            columns=tuple(str(c) for c in info.get("fields", [])),
            index_type=str(info.get("type", info.get("index_type", ""))),
            dataset_version=int(info.get("version", 0) or 0),
            fragment_ids=frozenset(int(f) for f in (info.get("fragment_ids") or [])),
        )
        first = out.get(name)
        # an index built in segments (Lance's distributed build) is listed once per segment:
        # it covers their fragments together; its oldest segment says how far it caught up
        out[name] = (
            segment
            if first is None
            else dataclasses.replace(
                first,
                dataset_version=min(first.dataset_version, segment.dataset_version),
                fragment_ids=first.fragment_ids | segment.fragment_ids,
            )
        )
    return list(out.values())


@dataclass(frozen=True)
class CatchupSource:
    """A catch-up generation and the row addresses it must not return."""

    generation: GenerationSource
    drop: np.ndarray = field(repr=False)
    path: str = ""  # relative to the table root


@dataclass(frozen=True)
class CatchupPlan:
    """How a query that needs one base index reads the rows that index does not cover."""

    index: BaseIndex
    uncovered_fragments: tuple[int, ...]
    uncovered_rows: int
    sources: tuple[CatchupSource, ...]
    usable: bool
    reason: str

    def generations_text(self) -> str:
        """The catch-up generations as ``region-prefix:generation``, comma-separated."""
        return ", ".join(f"{s.generation.region_id[:8]}:{s.generation.generation}" for s in self.sources)

    def describe(self, flat_because: str = "") -> str:
        """One line for ``explain`` and search statistics (``flat_because``: why reads serve
        the unindexed rows flat although the plan is usable, e.g. ``index_catchup='never'``)."""
        if not self.uncovered_fragments:
            return f"index {self.index.name}: covers every base fragment"
        frags = f"{len(self.uncovered_fragments)} base fragment(s) ({self.uncovered_rows:,} rows) not indexed yet"
        if self.usable and flat_because:
            return f"index {self.index.name}: {frags}, searched flat ({flat_because})"
        if self.usable:
            return (
                f"index {self.index.name}: {frags}, served by catch-up generations [{self.generations_text()}] "
                f"({self.reason})"
            )
        return f"index {self.index.name}: {frags}, searched flat ({self.reason})"


def _caught_up(snap: Snapshot, storage: Storage, index: BaseIndex) -> tuple[dict[str, int], str] | str:
    """Per region, the generation the index has caught up with, and where that came from."""
    for c in snap.index.index_catchup:
        if c.index_name == index.name:
            return {m.region_id: int(m.generation) for m in c.caught_up}, "MemWAL index catch-up progress"
    # Missing from the list (the list is empty, or pylance's create_index recorded
    # another index only): inferred from where the index was built. The spec counts an
    # index missing from a non-empty list as caught up, but an index built before the
    # MemWAL existed is missing from it for good once any other index records progress,
    # and its unindexed fragments would then match no generation (the plan is checked
    # against them either way).
    if index.dataset_version <= 0:
        return "the index records no dataset version"
    if index.dataset_version == snap.base_version:
        return {r.region_id: r.merged_generation for r in snap.regions}, "index built at this version"
    try:
        then = read_memwal_index(storage, index.dataset_version)
    except MemWalError as err:
        if "no MemWAL index" in str(err):
            return {}, f"index built at version {index.dataset_version}, before the MemWAL index existed"
        return f"the base manifest of version {index.dataset_version}, where the index was built, is unreadable"
    return (
        {r.region_id: then.merged_generation(r.region_id) for r in snap.regions},
        f"merge progress at version {index.dataset_version}, where the index was built",
    )


def catchup_size(snap: Snapshot, storage: Storage, index: BaseIndex) -> tuple[int, int]:
    """(unindexed base rows, catch-up generations) of ``index``, opening no generation.

    What ``index_catchup="auto"`` weighs, known before the plan is worked out (which
    opens the catch-up generations and ranks their keys against the newer levels).
    """
    uncovered = [f for f in snap.base.get_fragments() if f.fragment_id not in index.fragment_ids]
    if not uncovered:
        return 0, 0
    rows = sum(int(f.count_rows()) for f in uncovered)
    progress = _caught_up(snap, storage, index)
    if isinstance(progress, str):
        return rows, 0
    caught, _ = progress
    return rows, sum(max(0, r.merged_generation - caught.get(r.region_id, 0)) for r in snap.regions)


def plan_catchup(snap: Snapshot, storage: Storage, cache: SnapshotCache, index: BaseIndex) -> CatchupPlan:
    """Work out (and check) the Indexed Read Plan of ``index`` for snapshot ``snap``."""
    frags = snap.base.get_fragments()
    uncovered = [f for f in frags if f.fragment_id not in index.fragment_ids]
    uncovered_rows = sum(int(f.count_rows()) for f in uncovered)
    ids = tuple(f.fragment_id for f in uncovered)

    def plan(sources: tuple[CatchupSource, ...], usable: bool, reason: str) -> CatchupPlan:
        return CatchupPlan(index, ids, uncovered_rows, sources, usable, reason)

    if not uncovered:
        return plan((), False, "nothing to catch up")
    progress = _caught_up(snap, storage, index)
    if isinstance(progress, str):
        return plan((), False, progress)
    caught, origin = progress
    pk = list(snap.primary_key)
    key_schema = pa.schema([snap.schema.field(k) for k in pk])
    columns = BaseColumns.of(snap.base, pk)
    sources: list[CatchupSource] = []
    live_total = 0
    for region in snap.regions:
        lo = caught.get(region.region_id, 0)
        hi = region.merged_generation
        if hi <= lo:
            continue
        listed = {g.generation: g.path for g in (region.manifest.flushed_generations if region.manifest else ())}
        gens: list[GenerationSource] = []
        paths: list[str] = []
        for g in range(lo + 1, hi + 1):
            path = listed.get(g)
            if path is None:
                return plan((), False, f"generation {g} of region {region.region_id} is not listed any more")
            rel = generation_rel(storage, region.region_id, path, what=f"flushed generation {g}")
            if not storage.exists(f"{rel}/_versions"):
                return plan((), False, f"generation {g} of region {region.region_id} was garbage-collected")
            got = open_generation(storage, region.region_id, g, path, cache, columns)
            if not isinstance(got, GenerationSource):
                return plan((), False, f"generation {g} of region {region.region_id}: {got.reason}")
            gens.append(got)
            paths.append(rel)
        alone = rank_levels(gens, None, pk, key_schema, cache)
        if alone is None:
            continue
        live_total += int((alone.first & ~alone.tombstone).sum())
        ranked = rank_levels([*gens, *region.generations], region.memtable, pk, key_schema, cache)
        assert ranked is not None
        keep = ranked.first & ~ranked.tombstone
        for i, source in enumerate(gens):
            drop = ranked.seq[(ranked.level == i) & ~keep]
            sources.append(CatchupSource(source, np.sort(drop.astype(np.uint64)), paths[i]))
    if live_total != uncovered_rows:
        return plan(
            (),
            False,
            f"catch-up generations hold {live_total} live rows but the uncovered fragments {uncovered_rows} "
            f"(progress from {origin})",
        )
    # equal counts do not prove the uncovered rows are the generations' (an update() or a
    # delete() on the base next to an append keeps them): only merges may have changed rows
    edited = edited_directly(snap.base, storage, index.dataset_version, snap.base_version, cache)
    if edited is not None:
        return plan((), False, f"{edited} since the index was built at version {index.dataset_version}")
    return plan(tuple(sources), True, f"progress from {origin}")


def still_readable(storage: Storage, plan: CatchupPlan) -> CatchupPlan:
    """``plan``, or an unusable copy if a merger has garbage-collected one of its generations.

    Catch-up generations are merged already, so a merger may delete them at any time;
    each query that uses the plan probes them first (a few existence checks) and falls
    back to the base fragments if one is gone.
    """
    for src in plan.sources:
        if generation_damage(storage, src.path, src.generation.dataset, manifest_checked=False) is not None:
            g = src.generation
            why = f"generation {g.generation} of region {g.region_id} was garbage-collected after the plan was made"
            log.info("%s: %s; reading the unindexed base fragments instead", storage.uri, why)
            return dataclasses.replace(plan, sources=(), usable=False, reason=why)
    return plan
