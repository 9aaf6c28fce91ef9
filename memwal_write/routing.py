"""Region routing for writes: spec values per row -> deterministic region ids, and the checks
of a routed writer's arguments (a key must stay in one region).

Uses the same spec evaluation as the reader's pruning
(:mod:`memwal_query.regionspec`). Region ids follow the naming convention the
reader also knows (:data:`memwal_query.planner.plan.REGION_NAMESPACE`):

* single ``bucket`` field, bucket ``n``: ``uuid5(NS, "bucket-{n}")``
* single ``identity`` field, value ``v``: ``uuid5(NS, b"identity-" + raw bytes of v)``
* ``unsharded``: ``uuid5(NS, "unsharded")``
* any other spec: ``uuid5(NS, "spec-{id}/" + field=hex(raw bytes) ...)``

and each new region's first manifest records its spec values as field entries,
so every region written this way can be pruned.
"""

from __future__ import annotations

import hashlib
import inspect
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import lance

from memwal_query.errors import InvalidArgumentError, positive_int
from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
from memwal_query.planner.plan import REGION_NAMESPACE
from memwal_query.regionspec.spec import encode_field_value, parse_result_type

__all__ = ["check_open", "check_spec_on_key", "region_id_for", "field_entries", "uuid5_bytes"]


def uuid5_bytes(namespace: uuid.UUID, name: bytes) -> uuid.UUID:
    """RFC 4122 version-5 UUID of a byte string (``uuid.uuid5`` takes text only before 3.12).

    Example:
        >>> uuid5_bytes(uuid.NAMESPACE_DNS, b"python.org") == uuid.uuid5(uuid.NAMESPACE_DNS, "python.org")
        True
    """
    digest = hashlib.sha1(namespace.bytes + name, usedforsecurity=False).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def _type_of(field: ShardingFieldSpec, source_type: Any) -> Any:
    if field.transform in ("bucket", "multi_bucket", "unsharded", "year", "month", "day", "hour"):
        import pyarrow as pa

        return pa.int32()
    if field.transform in ("identity", "truncate"):
        return source_type
    return parse_result_type(field.result_type) or source_type


def field_entries(spec: RegionSpec, values: Sequence[Any], value_types: Sequence[Any]) -> list[tuple[str, bytes]]:
    """``(field_id, raw bytes)`` entries for a region manifest (NULL values are left out)."""
    out = []
    for f, v, t in zip(spec.fields, values, value_types, strict=True):
        if v is not None:
            out.append((f.field_id, encode_field_value(v, t)))
    return out


def region_id_for(spec: RegionSpec, values: Sequence[Any], value_types: Sequence[Any]) -> str:
    """The deterministic region UUID string for one tuple of spec values.

    Example:
        >>> import pyarrow as pa
        >>> f = ShardingFieldSpec("bucket", (0,), "bucket", None, "int32", {"num_buckets": "4"})
        >>> region_id_for(RegionSpec(1, (f,)), [3], [pa.int32()]) == str(uuid.uuid5(REGION_NAMESPACE, "bucket-3"))
        True
    """
    if len(spec.fields) == 1:
        f = spec.fields[0]
        if f.transform == "bucket":
            return str(uuid.uuid5(REGION_NAMESPACE, f"bucket-{int(values[0])}"))
        if f.transform == "unsharded":
            return str(uuid.uuid5(REGION_NAMESPACE, "unsharded"))
        if f.transform == "identity":
            raw = b"" if values[0] is None else encode_field_value(values[0], value_types[0])
            tag = b"identity-null" if values[0] is None else b"identity-" + raw
            return str(uuid5_bytes(REGION_NAMESPACE, tag))
    parts = []
    for f, v, t in zip(spec.fields, values, value_types, strict=True):
        parts.append(f"{f.field_id}={'null' if v is None else encode_field_value(v, t).hex()}")
    return str(uuid5_bytes(REGION_NAMESPACE, f"spec-{spec.spec_id}/{'/'.join(parts)}".encode()))


def check_open(
    uri: str, spec: RegionSpec | None, region_id: str | None, options: Mapping[str, Any], max_rows_per_put: int | None
) -> None:
    """Refuse arguments of ``RoutedWriter.open`` that cannot be written with, before any write."""
    if spec is None and region_id is None:
        msg = f"{uri} has no region spec: pass region_id= to choose the region to write"
        raise InvalidArgumentError(msg)
    if spec is not None and region_id is not None and any(f.source_ids for f in spec.fields):
        msg = (
            f"{uri} routes rows by its region spec {spec.spec_id}: region_id= is for tables without one "
            "(rows written to another region than their spec value's would be missed by queries that prune regions)"
        )
        raise InvalidArgumentError(msg)
    params = inspect.signature(lance.LanceDataset.mem_wal_writer).parameters
    takes = [k for k in params if k not in ("self", "shard_id")]
    unknown = sorted(k for k in options if k not in takes)
    if unknown:
        msg = f"unknown writer option(s) {unknown} for {uri} (mem_wal_writer takes {sorted(takes)})"
        raise InvalidArgumentError(msg)
    positive_int(max_rows_per_put, f"max_rows_per_put for {uri}", optional=True)


def check_spec_on_key(spec: RegionSpec, names: Mapping[int, str], pk: tuple[str, ...], uri: str) -> None:
    """Refuse specs over non-key columns: a key must stay in one region.

    If a spec reads a column outside the primary key, updating that column moves
    the key to another region, and a delete (keys only) cannot be routed at all;
    the merge never orders rows of different regions, so both versions would stay.
    """
    for f in spec.fields:
        cols = [names.get(int(i), f"field {i}") for i in f.source_ids]
        outside = [c for c in cols if c not in pk]
        if outside:
            msg = (
                f"{uri}: region spec {spec.spec_id} field {f.field_id!r} reads {outside}, which are not part of "
                f"the primary key {list(pk)}; routed writes need specs over key columns only (an update of "
                "such a column would move its key to another region)"
            )
            raise InvalidArgumentError(msg)
