"""Region routing for writes: spec values per row -> deterministic region ids.

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
import uuid
from collections.abc import Sequence
from typing import Any

from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
from memwal_query.planner.plan import REGION_NAMESPACE
from memwal_query.regionspec.spec import encode_field_value, parse_result_type

__all__ = ["region_id_for", "field_entries", "uuid5_bytes"]


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
