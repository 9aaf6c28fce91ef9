"""Region snapshots stored inline in the MemWAL index (``inline_snapshots``).

Per the MemWAL spec (lance-table 12+), the bytes are a Lance file with one row per
region: ``shard_id`` (utf8 UUID), ``shard_spec_id`` (uint32) and one
``shard_field_{field_id}`` column per spec field (typed by the field's
``result_type``). They are a point-in-time aid for discovery and spec values;
the region manifests stay authoritative for everything else. pylance 14.0.2
does not write them; readers use them when present.

Region ids name folders (``_mem_wal/{region_id}/``), so an id that is not a UUID
is corruption, never a path.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from memwal_query.errors import MemWalCorruptionError, one_line
from memwal_query.format.isolated import read_isolated
from memwal_query.format.paths import shown

__all__ = ["InlineRegion", "decode_inline_snapshots", "MAX_INLINE_REGIONS"]

_FIELD_PREFIX = "shard_field_"
MAX_INLINE_REGIONS: Final = 1 << 16
"""Most rows (regions) an inline snapshot may hold; more is treated as damage."""


@dataclass(frozen=True)
class InlineRegion:
    """One region as the MemWAL index's inline snapshot records it."""

    region_id: str
    spec_id: int
    values: dict[str, Any]


def _region_id(raw: object) -> str:
    try:
        if isinstance(raw, bytes) and len(raw) == 16:
            return str(uuid.UUID(bytes=raw))
        if isinstance(raw, str) and len(raw) <= 64:
            return str(uuid.UUID(raw))
    except ValueError:
        pass
    msg = f"hold region id {shown(raw)}, which is not a UUID"
    raise ValueError(msg)


def _spec_id(raw: object) -> int:
    if raw is None:
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 1 << 32:
        return raw
    msg = f"hold region spec id {shown(raw)}, which is not a uint32"
    raise ValueError(msg)


def _regions(table: pa.Table) -> list[InlineRegion]:
    if "shard_id" not in table.column_names:
        msg = f"lack a shard_id column (columns: {shown(table.column_names)})"
        raise ValueError(msg)
    fields = [c for c in table.column_names if c.startswith(_FIELD_PREFIX)]
    out = []
    for row in table.to_pylist():
        values = {c[len(_FIELD_PREFIX) :]: row[c] for c in fields if row[c] is not None}
        out.append(InlineRegion(_region_id(row["shard_id"]), _spec_id(row.get("shard_spec_id")), values))
    return out


def decode_inline_snapshots(data: bytes, *, where: str = "MemWAL index") -> list[InlineRegion]:
    """Decode the inline snapshot Lance file.

    Args:
        data: The ``inline_snapshots`` bytes.
        where: The file (or index) they were read from, for error messages.

    Returns:
        One :class:`InlineRegion` per row.

    Raises:
        MemWalCorruptionError: The bytes are not a Lance file of the expected shape,
            or a region id is not a UUID (one line naming ``where``).
    """
    try:  # by a helper process: Lance aborts the process on some damaged files (its panics stay there too)
        table = read_isolated(data, max_rows=MAX_INLINE_REGIONS)
    except Exception as err:  # noqa: BLE001 - Lance raises several kinds
        msg = f"{where}: inline region snapshots are not a readable Lance file: {one_line(err)}"
        raise MemWalCorruptionError(msg) from err
    try:
        return _regions(table)
    except ValueError as err:
        msg = f"{where}: inline region snapshots {err}"
        raise MemWalCorruptionError(msg) from err
