"""Region snapshots stored inline in the MemWAL index (``inline_snapshots``).

Per the MemWAL spec (lance-table 12+), the bytes are a Lance file with one row per
region: ``shard_id`` (utf8 UUID), ``shard_spec_id`` (uint32) and one
``shard_field_{field_id}`` column per spec field (typed by the field's
``result_type``). They are a point-in-time aid for discovery and spec values;
the region manifests stay authoritative for everything else. pylance 14.0.2
does not write them; readers use them when present.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

from lance.file import LanceFileReader

__all__ = ["InlineRegion", "decode_inline_snapshots"]

_FIELD_PREFIX = "shard_field_"


@dataclass(frozen=True)
class InlineRegion:
    """One region as the MemWAL index's inline snapshot records it."""

    region_id: str
    spec_id: int
    values: dict[str, Any]


def decode_inline_snapshots(data: bytes) -> list[InlineRegion]:
    """Decode the inline snapshot Lance file.

    Raises:
        ValueError: The bytes are not a Lance file of the expected shape.
    """
    fd, path = tempfile.mkstemp(suffix=".lance", prefix="memwal-inline-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            table = LanceFileReader(path).read_all().to_table()
        except Exception as err:  # noqa: BLE001 - Lance raises several kinds
            msg = f"inline region snapshots are not a readable Lance file: {err}"
            raise ValueError(msg) from err
    finally:
        os.unlink(path)
    if "shard_id" not in table.column_names:
        msg = f"inline region snapshots lack a shard_id column (columns: {table.column_names})"
        raise ValueError(msg)
    fields = [c for c in table.column_names if c.startswith(_FIELD_PREFIX)]
    out = []
    for row in table.to_pylist():
        raw = row["shard_id"]
        rid = str(uuid.UUID(bytes=raw) if isinstance(raw, bytes) and len(raw) == 16 else uuid.UUID(str(raw)))
        values = {c[len(_FIELD_PREFIX) :]: row[c] for c in fields if row[c] is not None}
        out.append(InlineRegion(rid, int(row.get("shard_spec_id") or 0), values))
    return out
