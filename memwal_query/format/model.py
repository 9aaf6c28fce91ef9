"""The MemWAL format's values: region specs, region manifests, the MemWAL index.

Plain, frozen values that the decoders (:mod:`memwal_query.format.decode`) return and
the rest of the project (reader and writer alike) passes around. No I/O, no decoding.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

__all__ = [
    "MEM_WAL_INDEX_NAME",
    "MAX_VERSION",
    "MAX_WAL_POSITION",
    "MAX_HINT_BYTES",
    "ShardingFieldSpec",
    "RegionSpec",
    "FlushedGeneration",
    "RegionManifest",
    "MergedGeneration",
    "IndexCatchup",
    "MemWalIndex",
    "LanceField",
    "LanceManifestInfo",
    "IndexEntry",
    "frozen_map",
    "normalize_uuid",
]

MEM_WAL_INDEX_NAME: Final = "__lance_mem_wal"
"""Name of the Lance index entry that holds the MemWAL index details."""

_EMPTY_MAP: Final[Mapping[str, str]] = MappingProxyType({})
MAX_VERSION: Final = (1 << 63) - 2
"""Highest region manifest version and generation memwal accepts (they feed int64 columns)."""
MAX_WAL_POSITION: Final = (1 << 32) - 2
"""Highest WAL position memwal accepts (a position is the high half of a 64-bit sequence)."""
MAX_HINT_BYTES: Final = 4096
"""Largest ``version_hint.json`` memwal reads."""


def frozen_map(items: Mapping[str, str]) -> Mapping[str, str]:
    """``items`` as a read-only mapping in key order."""
    return MappingProxyType(dict(sorted(items.items())))


def normalize_uuid(text: str) -> str:
    """A UUID string in its canonical form (``text`` unchanged when it is not a UUID)."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


# --------------------------------------------------------------------------- #
# Data classes
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ShardingFieldSpec:
    """One field of a region (sharding) spec.

    Attributes:
        field_id: Name of the spec field (pylance uses ``"bucket"`` for every
            transform).
        source_ids: Lance field ids of the source columns.
        transform: ``"bucket"``, ``"identity"``, ``"unsharded"``, ... or None
            when the field is defined by ``expression``.
        expression: A DataFusion SQL expression, or None.
        result_type: Arrow type name of the field value (e.g. ``"int32"``).
        parameters: Transform parameters, e.g. ``{"num_buckets": "4"}``.
    """

    field_id: str
    source_ids: tuple[int, ...]
    transform: str | None
    expression: str | None
    result_type: str
    parameters: Mapping[str, str] = field(default_factory=lambda: _EMPTY_MAP)


@dataclass(frozen=True)
class RegionSpec:
    """A region (sharding) spec of the MemWAL index.

    Attributes:
        spec_id: Id referenced by :attr:`RegionManifest.spec_id` (0 is reserved
            for manually managed regions).
        fields: The spec fields, in order.
    """

    spec_id: int
    fields: tuple[ShardingFieldSpec, ...]


@dataclass(frozen=True)
class FlushedGeneration:
    """A flushed generation of a region: an ordinary Lance dataset.

    Attributes:
        generation: Generation number (1-based; the base table is generation 0).
        path: Directory of the dataset, relative to ``_mem_wal/{region_id}/``.
        in_memory_bytes: Size of the MemTable it was flushed from.
        physical_rows: Rows in the dataset, tombstones included.
        primary_key_bytes: Bytes of primary-key data.
    """

    generation: int
    path: str
    in_memory_bytes: int
    physical_rows: int
    primary_key_bytes: int


@dataclass(frozen=True)
class RegionManifest:
    """One version of a region manifest (``ShardManifest``).

    Attributes:
        region_id: Region UUID as a lowercase string with dashes.
        version: Manifest version (equals the version in the file name).
        writer_epoch: Fencing token, bumped by every writer claim.
        replay_after_wal_position: Last WAL position covered by a flushed
            generation; WAL replay starts after it (it can lag a flush).
        wal_position_last_seen: Hint of the last WAL position written.
        current_generation: Generation of the active MemTable.
        flushed_generations: Flushed generations, as listed in the manifest.
        spec_id: Region spec id; 0 for a manually managed region.
        field_values: ``(field_id, raw little-endian Arrow scalar)`` pairs;
            empty for regions written by pylance.
        sealed: True when the region is not active (writers refuse to claim it).
    """

    region_id: str
    version: int
    writer_epoch: int
    replay_after_wal_position: int
    wal_position_last_seen: int
    current_generation: int
    flushed_generations: tuple[FlushedGeneration, ...]
    spec_id: int
    field_values: tuple[tuple[str, bytes], ...]
    sealed: bool


@dataclass(frozen=True)
class MergedGeneration:
    """A generation of a region that has been merged into the base table.

    Attributes:
        region_id: Region UUID as a lowercase string with dashes.
        generation: The merged generation.
    """

    region_id: str
    generation: int


@dataclass(frozen=True)
class IndexCatchup:
    """How far one base-table index has caught up with merged generations.

    Attributes:
        index_name: Name of the base-table index.
        caught_up: Per region, the generation the index has caught up to.
    """

    index_name: str
    caught_up: tuple[MergedGeneration, ...]


@dataclass(frozen=True)
class MemWalIndex:
    """The MemWAL index (``MemWalIndexDetails``) of one base-table version.

    Attributes:
        snapshot_ts_millis: Snapshot timestamp (0 when not set; pylance leaves
            it unset).
        num_regions: Number of regions the spec implies (``num_buckets`` for a
            bucket spec, 0 otherwise).
        inline_snapshots: Inline region snapshots (Lance file bytes), or None.
        specs: Region specs.
        maintained_indexes: Names of base-table indexes the writers maintain.
        merged_generations: Per region, the generation merged into the base.
        index_catchup: Index catch-up progress.
        writer_config_defaults: Default writer configuration.
        maintain_all_indexes: Whether every base-table index is maintained.
    """

    snapshot_ts_millis: int
    num_regions: int
    inline_snapshots: bytes | None
    specs: tuple[RegionSpec, ...]
    maintained_indexes: tuple[str, ...]
    merged_generations: tuple[MergedGeneration, ...]
    index_catchup: tuple[IndexCatchup, ...]
    writer_config_defaults: Mapping[str, str]
    maintain_all_indexes: bool

    def merged_generation(self, region_id: str) -> int:
        """Return the highest generation of ``region_id`` merged into the base.

        Args:
            region_id: Region UUID string (any case, with or without dashes).

        Returns:
            The merged generation, or 0 when none of the region is merged.
        """
        key = normalize_uuid(region_id)
        return max(
            (m.generation for m in self.merged_generations if m.region_id == key),
            default=0,
        )

    def spec(self, spec_id: int) -> RegionSpec | None:
        """Return the region spec with ``spec_id``, or None if there is none."""
        for s in self.specs:
            if s.spec_id == spec_id:
                return s
        return None


@dataclass(frozen=True)
class LanceField:
    """One field of a Lance dataset schema, as stored in its manifest.

    Attributes:
        name: Field name.
        id: Lance field id (what ``source_ids`` and index ``fields`` refer to).
        parent_id: Parent field id; -1 for a top-level field.
        logical_type: Lance logical type name, e.g. ``"int64"``, ``"string"``.
        nullable: Whether the field is nullable.
        primary_key: Whether the field is part of the unenforced primary key.
    """

    name: str
    id: int
    parent_id: int
    logical_type: str
    nullable: bool
    primary_key: bool


@dataclass(frozen=True)
class LanceManifestInfo:
    """What memwal needs from a Lance manifest file.

    Attributes:
        version: Dataset version of the manifest.
        index_section_offset: File offset of the index section, or None when
            the version has no indexes. 0 is a valid offset.
        fields: Schema fields, in manifest order.
        writer_library: Library that wrote the manifest (e.g. ``"lance"``).
        writer_version: Its version (e.g. ``"14.0.2"``).
        format_major: Major version from the file footer.
        format_minor: Minor version from the file footer.
    """

    version: int
    index_section_offset: int | None
    fields: tuple[LanceField, ...]
    writer_library: str
    writer_version: str
    format_major: int
    format_minor: int


@dataclass(frozen=True)
class IndexEntry:
    """One entry of a Lance manifest's index section.

    Attributes:
        name: Index name (``"__lance_mem_wal"`` for the MemWAL index).
        uuid: Index UUID string with dashes.
        fields: Lance field ids of the indexed columns.
        dataset_version: Dataset version the index was last updated at.
        fragment_bitmap: Covered fragment ids as a serialized 32-bit Roaring
            bitmap (empty bytes when not recorded).
        type_url: ``index_details`` type URL, e.g. ``"/lance.table.BTreeIndexDetails"``.
        details: ``index_details`` payload bytes.
    """

    name: str
    uuid: str
    fields: tuple[int, ...]
    dataset_version: int
    fragment_bitmap: bytes
    type_url: str = ""
    details: bytes = b""
