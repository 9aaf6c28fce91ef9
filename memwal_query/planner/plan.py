"""Query plans over a snapshot: which regions a predicate touches, and why.

``Table.plan(predicate_sql)`` returns a frozen :class:`Plan`; the DataFusion
dataset builds the same decision from the filter DataFusion pushes into it.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from memwal_query.format.decode import RegionSpec
from memwal_query.planner.predicates import Predicate, Unknown, to_sql
from memwal_query.planner.pruning import RegionValues, Transform, region_might_match
from memwal_query.snapshot.model import Snapshot

__all__ = ["Plan", "PrunedRegion", "plan_regions", "region_values_of", "REGION_NAMESPACE"]

# Region naming convention for regions created from a spec (FORMAT.md / lancedb):
# bucket n -> uuid5(NS, "bucket-{n}"); identity v -> uuid5(NS, b"identity-" + bytes(v)).
REGION_NAMESPACE = uuid.UUID("4c534d57-5249-5445-5f53-484152443031")


@dataclass(frozen=True)
class PrunedRegion:
    """A region the plan does not read, and why."""

    region_id: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """Which regions a predicate needs.

    Attributes:
        predicate: The predicate, as the pruning IR.
        regions: Region UUID strings that might hold matching rows (read).
        pruned_regions: Region UUID strings that cannot (skipped).
        pruned: The pruned regions with reasons.
        unknown_values: Regions read because their spec values are unknown.
        keys_outside: Regions read because they hold keys their spec values exclude.
    """

    predicate: Predicate
    regions: tuple[str, ...]
    pruned_regions: tuple[str, ...]
    pruned: tuple[PrunedRegion, ...]
    unknown_values: tuple[str, ...]
    keys_outside: tuple[str, ...] = ()

    def explain(self) -> str:
        """Readable summary of the pruning decision."""
        lines = [
            f"predicate: {to_sql(self.predicate)}",
            f"regions read: {len(self.regions)}, pruned: {len(self.pruned)}",
        ]
        for r in self.regions:
            note = " (spec values unknown: never pruned)" if r in self.unknown_values else ""
            if r in self.keys_outside:
                note = " (holds keys its spec values exclude: never pruned)"
            lines.append(f"  read   {r}{note}")
        for p in self.pruned:
            lines.append(f"  pruned {p.region_id}: {p.reason}")
        return "\n".join(lines)


def _bucket_convention(region_id: str, spec: RegionSpec) -> RegionValues | None:
    if len(spec.fields) != 1 or spec.fields[0].transform != "bucket":
        return None
    f = spec.fields[0]
    try:
        n = int(f.parameters.get("num_buckets", "0"))
    except ValueError:
        return None
    b = _bucket_of_region(n).get(region_id)
    return None if b is None else RegionValues({f.field_id: b}, "bucket region naming convention")


@functools.lru_cache(maxsize=16)
def _bucket_of_region(num_buckets: int) -> dict[str, int]:
    """The bucket each conventionally named region id stands for (one uuid5 per bucket, once
    per process: per region and snapshot it was regions x buckets of them, 0.65 s at 256 x 256)."""
    return {str(uuid.uuid5(REGION_NAMESPACE, f"bucket-{b}")): b for b in range(max(0, min(num_buckets, _MAX_BUCKETS)))}


#: The most buckets named by the convention that are looked for (a spec's parameter could say anything).
_MAX_BUCKETS = 1 << 16


def region_values_of(snapshot: Snapshot, decode: object) -> dict[str, RegionValues | None]:
    """Each region's spec values: field entries first, then the naming convention.

    ``decode(raw: bytes, result_type: str) -> python value`` decodes a field entry.
    """
    out: dict[str, RegionValues | None] = {}
    for r in snapshot.regions:
        m = r.manifest
        spec = snapshot.index.spec(m.spec_id) if m is not None else None
        if m is None or spec is None:
            out[r.region_id] = None
            continue
        if m.field_values:
            types = {f.field_id: f.result_type for f in spec.fields}
            try:
                vals = {fid: decode(raw, types.get(fid, "")) for fid, raw in m.field_values}  # type: ignore[operator]
                out[r.region_id] = RegionValues(vals, "region manifest field entries")
                continue
            except Exception:  # noqa: BLE001 - undecodable entries: unknown, never pruned
                out[r.region_id] = None
                continue
        inline = next((i for i in snapshot.inline_regions if i.region_id == r.region_id and i.values), None)
        if inline is not None:
            out[r.region_id] = RegionValues(dict(inline.values), "MemWAL index inline region snapshot")
            continue
        out[r.region_id] = _bucket_convention(r.region_id, spec)
    return out


def plan_regions(
    snapshot: Snapshot,
    predicate: Predicate,
    values: Mapping[str, RegionValues | None],
    field_names: Mapping[int, str],
    transform: Transform,
    *,
    allow_expressions: bool = True,
) -> Plan:
    """Split the snapshot's regions into read and pruned for ``predicate``."""
    keep: list[str] = []
    pruned: list[PrunedRegion] = []
    unknown: list[str] = []
    outside: list[str] = []
    schema: pa.Schema = snapshot.schema
    for r in snapshot.regions:
        spec = snapshot.index.spec(r.manifest.spec_id) if r.manifest is not None else None
        rv = values.get(r.region_id)
        if rv is None or rv.outside:
            keep.append(r.region_id)
            (unknown if rv is None else outside).append(r.region_id)
            continue
        if isinstance(predicate, Unknown) or region_might_match(
            spec, rv, predicate, field_names, schema, transform, allow_expressions=allow_expressions
        ):
            keep.append(r.region_id)
        else:
            vals = ", ".join(f"{k}={v!r}" for k, v in rv.values.items())
            pruned.append(PrunedRegion(r.region_id, f"spec values {vals} cannot match (learned from the {rv.source})"))
    return Plan(
        predicate, tuple(keep), tuple(p.region_id for p in pruned), tuple(pruned), tuple(unknown), tuple(outside)
    )
