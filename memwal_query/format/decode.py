"""Pure decoders for the MemWAL on-storage format (no I/O).

Every function here takes bytes (or names) and returns plain, immutable Python
values; reading the bytes from storage is the caller's job. Malformed input
raises :class:`ValueError` with a message saying what is wrong; callers wrap it
in the project's error type together with the path they read.

The wire format is the one pylance 14.0.2 writes (see ``FORMAT.md``): region
manifests are ``ShardManifest`` protobufs, and the MemWAL index is the
``__lance_mem_wal`` entry of the Lance manifest's index section.

Example:
    >>> bitrev64_name(1)[:4]
    '1000'
    >>> parse_bitrev64_name(bitrev64_name(6) + ".binpb")
    6
    >>> lance_manifest_file_name(1)
    '18446744073709551614.manifest'
    >>> parse_lance_manifest_file_name("18446744073709551614.manifest")
    1
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from google.protobuf.message import DecodeError, Message

from memwal_proto import lance_manifest_pb2, mem_wal_pb2

__all__ = [
    "MEM_WAL_INDEX_NAME",
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
    "decode_region_manifest",
    "decode_version_hint",
    "MAX_VERSION",
    "MAX_WAL_POSITION",
    "MAX_HINT_BYTES",
    "parse_lance_manifest_footer",
    "decode_lance_manifest",
    "decode_index_entries",
    "decode_mem_wal_index",
    "decode_mem_wal_index_details",
    "bitrev64_name",
    "parse_bitrev64_name",
    "lance_manifest_file_name",
    "parse_lance_manifest_file_name",
]

MEM_WAL_INDEX_NAME: Final = "__lance_mem_wal"
"""Name of the Lance index entry that holds the MemWAL index details."""

_MEM_WAL_TYPE_SUFFIX: Final = ".memwalindexdetails"
_LANCE_MAGIC: Final = b"LANC"
_FOOTER_LEN: Final = 16
_U64_MAX: Final = (1 << 64) - 1
_EMPTY_MAP: Final[Mapping[str, str]] = MappingProxyType({})
MAX_VERSION: Final = (1 << 63) - 2
"""Highest region manifest version and generation memwal accepts (they feed int64 columns)."""
MAX_WAL_POSITION: Final = (1 << 32) - 2
"""Highest WAL position memwal accepts (a position is the high half of a 64-bit sequence)."""
MAX_HINT_BYTES: Final = 4096
"""Largest ``version_hint.json`` memwal reads."""


def _frozen_map(items: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(sorted(items.items())))


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
        key = _normalize_uuid(region_id)
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


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def _parse(message: Message, data: bytes, what: str) -> None:
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"cannot decode {what}: {exc}") from exc


def _uuid_str(raw: bytes, what: str) -> str:
    if len(raw) != 16:
        raise ValueError(f"{what}: expected a 16-byte UUID, got {len(raw)} bytes")
    return str(uuid.UUID(bytes=raw))


def _normalize_uuid(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def _merged(entries: Iterable[mem_wal_pb2.CompactedSsTable], what: str) -> tuple[MergedGeneration, ...]:
    return tuple(MergedGeneration(_uuid_str(e.shard_id.uuid, what), e.generation) for e in entries)


def _section(file_bytes: bytes, offset: int, what: str) -> bytes:
    """Return the ``u32 LE length`` + payload section at ``offset``."""
    if offset < 0 or offset + 4 > len(file_bytes):
        raise ValueError(f"{what} offset {offset} is outside the file ({len(file_bytes)} bytes)")
    (length,) = struct.unpack_from("<I", file_bytes, offset)
    end = offset + 4 + length
    if end > len(file_bytes):
        raise ValueError(
            f"{what} at offset {offset} claims {length} bytes, past the end of the file ({len(file_bytes)} bytes)"
        )
    return file_bytes[offset + 4 : end]


def _manifest_proto(file_bytes: bytes) -> tuple[lance_manifest_pb2.Manifest, int, int]:
    manifest_pos, major, minor = parse_lance_manifest_footer(file_bytes)
    if manifest_pos > len(file_bytes) - _FOOTER_LEN:
        raise ValueError(f"Lance manifest position {manifest_pos} is past the footer (file is {len(file_bytes)} bytes)")
    body = _section(file_bytes, manifest_pos, "Lance manifest")
    manifest = lance_manifest_pb2.Manifest()
    _parse(manifest, body, "Lance manifest")
    if manifest.version == 0:
        # Lance versions start at 1; version 0 means an empty or zeroed message.
        raise ValueError("Lance manifest has no version (empty or zeroed manifest)")
    return manifest, major, minor


# --------------------------------------------------------------------------- #
# Region manifests
# --------------------------------------------------------------------------- #


def decode_region_manifest(data: bytes) -> RegionManifest:
    """Decode a region manifest file (``manifest/{bitrev64(v)}.binpb``).

    Args:
        data: The whole file.

    Returns:
        The decoded manifest.

    Raises:
        ValueError: The bytes are not a region manifest (protobuf decode error,
            or no 16-byte region UUID).
    """
    pb = mem_wal_pb2.ShardManifest()
    _parse(pb, data, "region manifest")
    if not pb.HasField("shard_id"):
        raise ValueError("region manifest has no region id (field 11)")
    _check_range("version", pb.version, 1, MAX_VERSION)
    _check_range("current generation", pb.current_generation, 0, MAX_VERSION)
    _check_range("replay-after WAL position", pb.replay_after_wal_entry_position, 0, MAX_WAL_POSITION)
    for s in pb.sstables:
        _check_range("flushed generation", s.generation, 1, MAX_VERSION)
    return RegionManifest(
        region_id=_uuid_str(pb.shard_id.uuid, "region manifest region id"),
        version=pb.version,
        writer_epoch=pb.writer_epoch,
        replay_after_wal_position=pb.replay_after_wal_entry_position,
        wal_position_last_seen=pb.wal_entry_position_last_seen,
        current_generation=pb.current_generation,
        flushed_generations=tuple(
            FlushedGeneration(
                generation=s.generation,
                path=s.path,
                in_memory_bytes=s.in_memory_bytes,
                physical_rows=s.physical_rows,
                primary_key_bytes=s.primary_key_bytes,
            )
            for s in pb.sstables
        ),
        spec_id=pb.shard_spec_id,
        field_values=tuple((e.field_id, bytes(e.value)) for e in pb.shard_field_values),
        sealed=pb.status != mem_wal_pb2.SHARD_STATUS_ACTIVE,
    )


def _check_range(what: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"region manifest {what} {value} is outside {low}..{high}")


def decode_version_hint(data: bytes) -> int:
    """Decode a region's ``manifest/version_hint.json`` (``{"version": N}``).

    Args:
        data: The whole file (at most 4 KiB is accepted).

    Returns:
        The hinted version, in ``0 .. MAX_VERSION``.

    Raises:
        ValueError: Not a small JSON object whose ``version`` is an integer in range.
    """
    if len(data) > MAX_HINT_BYTES:
        raise ValueError(f"version hint is {len(data)} bytes, more than {MAX_HINT_BYTES}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"version hint is not JSON: {err}") from err
    value = doc.get("version") if isinstance(doc, dict) else None
    if isinstance(value, float) and value.is_integer():
        value = int(value) if abs(value) <= MAX_VERSION else value
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_VERSION:
        raise ValueError(f"version hint {str(value)[:40]!r} is not an integer in 0..{MAX_VERSION}")
    return value


# --------------------------------------------------------------------------- #
# Lance manifests and the MemWAL index
# --------------------------------------------------------------------------- #


def parse_lance_manifest_footer(tail: bytes) -> tuple[int, int, int]:
    """Parse the 16-byte footer of a Lance manifest file.

    Args:
        tail: The last bytes of the file (at least 16; only the last 16 are used).

    Returns:
        ``(manifest_pos, major, minor)``.

    Raises:
        ValueError: Fewer than 16 bytes, wrong magic, or negative position.
    """
    if len(tail) < _FOOTER_LEN:
        raise ValueError(f"Lance manifest footer needs {_FOOTER_LEN} bytes, got {len(tail)}")
    pos, major, minor, magic = struct.unpack("<qHH4s", tail[-_FOOTER_LEN:])
    if magic != _LANCE_MAGIC:
        raise ValueError(f"not a Lance manifest: magic is {magic!r}, expected b'LANC'")
    if pos < 0:
        raise ValueError(f"Lance manifest footer has a negative position {pos}")
    return int(pos), int(major), int(minor)


def decode_lance_manifest(file_bytes: bytes) -> LanceManifestInfo:
    """Decode the parts of a Lance manifest file memwal needs.

    Args:
        file_bytes: The whole ``_versions/*.manifest`` file.

    Returns:
        Version, index section offset, schema fields and writer information.

    Raises:
        ValueError: Bad magic, truncated file or protobuf decode error.
    """
    pb, major, minor = _manifest_proto(file_bytes)
    return LanceManifestInfo(
        version=pb.version,
        index_section_offset=pb.index_section if pb.HasField("index_section") else None,
        fields=tuple(
            LanceField(
                name=f.name,
                id=f.id,
                parent_id=f.parent_id,
                logical_type=f.logical_type,
                nullable=f.nullable,
                primary_key=f.unenforced_primary_key,
            )
            for f in pb.fields
        ),
        writer_library=pb.writer_version.library,
        writer_version=pb.writer_version.version,
        format_major=major,
        format_minor=minor,
    )


def _index_section(file_bytes: bytes) -> lance_manifest_pb2.IndexSection:
    pb, _, _ = _manifest_proto(file_bytes)
    section = lance_manifest_pb2.IndexSection()
    if pb.HasField("index_section"):
        body = _section(file_bytes, pb.index_section, "Lance index section")
        _parse(section, body, "Lance index section")
    return section


def decode_index_entries(file_bytes: bytes) -> tuple[IndexEntry, ...]:
    """Decode every entry of a Lance manifest's index section.

    Args:
        file_bytes: The whole ``_versions/*.manifest`` file.

    Returns:
        The entries in manifest order (the MemWAL entry included); empty when
        the version has no index section.

    Raises:
        ValueError: Bad magic, truncated file or protobuf decode error.
    """
    section = _index_section(file_bytes)
    return tuple(
        IndexEntry(
            name=idx.name,
            uuid=_uuid_str(idx.uuid.uuid, f"index {idx.name!r} uuid"),
            fields=tuple(idx.fields),
            dataset_version=idx.dataset_version,
            fragment_bitmap=bytes(idx.fragment_bitmap),
            type_url=idx.index_details.type_url,
            details=bytes(idx.index_details.value),
        )
        for idx in section.indices
    )


def decode_mem_wal_index_details(details: bytes) -> MemWalIndex:
    """Decode a ``MemWalIndexDetails`` payload (the ``Any.value`` bytes).

    Args:
        details: Serialized ``MemWalIndexDetails``.

    Returns:
        The decoded index.

    Raises:
        ValueError: Protobuf decode error or a malformed region UUID.
    """
    pb = mem_wal_pb2.MemWalIndexDetails()
    _parse(pb, details, "MemWAL index details")
    return MemWalIndex(
        snapshot_ts_millis=pb.snapshot_ts_millis,
        num_regions=pb.num_shards,
        inline_snapshots=(bytes(pb.inline_snapshots) if pb.HasField("inline_snapshots") else None),
        specs=tuple(
            RegionSpec(
                spec_id=s.spec_id,
                fields=tuple(
                    ShardingFieldSpec(
                        field_id=f.field_id,
                        source_ids=tuple(f.source_ids),
                        transform=f.transform if f.HasField("transform") else None,
                        expression=f.expression if f.HasField("expression") else None,
                        result_type=f.result_type,
                        parameters=_frozen_map(f.parameters),
                    )
                    for f in s.fields
                ),
            )
            for s in pb.sharding_specs
        ),
        maintained_indexes=tuple(pb.maintained_indexes),
        merged_generations=_merged(pb.compacted_sstables, "merged generation region id"),
        index_catchup=tuple(
            IndexCatchup(
                index_name=c.index_name,
                caught_up=_merged(c.caught_up_generations, "index catch-up region id"),
            )
            for c in pb.index_catchup
        ),
        writer_config_defaults=_frozen_map(pb.writer_config_defaults),
        maintain_all_indexes=pb.maintain_all_indexes,
    )


def decode_mem_wal_index(file_bytes: bytes) -> MemWalIndex | None:
    """Decode the MemWAL index of a Lance manifest file.

    Args:
        file_bytes: The whole ``_versions/*.manifest`` file.

    Returns:
        The MemWAL index, or None when the version has no ``__lance_mem_wal``
        index entry (``initialize_mem_wal`` was not run before this version).

    Raises:
        ValueError: Bad magic, truncated file, protobuf decode error, or an
            ``__lance_mem_wal`` entry whose details are not MemWalIndexDetails.
    """
    for idx in _index_section(file_bytes).indices:
        if idx.name != MEM_WAL_INDEX_NAME:
            continue
        type_url = idx.index_details.type_url
        if not type_url.lower().endswith(_MEM_WAL_TYPE_SUFFIX):
            raise ValueError(
                f"index {MEM_WAL_INDEX_NAME!r} has details of type {type_url!r}, "
                "expected /lance.table.MemWalIndexDetails"
            )
        return decode_mem_wal_index_details(bytes(idx.index_details.value))
    return None


# --------------------------------------------------------------------------- #
# File names
# --------------------------------------------------------------------------- #


def bitrev64_name(n: int) -> str:
    """Return the bit-reversed 64-character binary name of ``n``.

    Used for region manifest versions and WAL positions: ``1 -> "1000…0"``.

    Args:
        n: A value in ``[0, 2**64)``.

    Returns:
        The 64-character name, without extension.

    Raises:
        ValueError: ``n`` is out of range.
    """
    if not 0 <= n <= _U64_MAX:
        raise ValueError(f"bitrev64 value out of range: {n}")
    return format(n, "064b")[::-1]


def parse_bitrev64_name(name: str) -> int | None:
    """Inverse of :func:`bitrev64_name`.

    Args:
        name: A file name; an extension (``.binpb``, ``.arrow``) is ignored.

    Returns:
        The value, or None when the name is not a bitrev64 name.
    """
    stem = name.split(".", 1)[0]
    if len(stem) != 64 or stem.strip("01"):
        return None
    return int(stem[::-1], 2)


def lance_manifest_file_name(version: int) -> str:
    """Return the V2-scheme Lance manifest file name of ``version``.

    Args:
        version: Dataset version in ``[0, 2**64)``.

    Returns:
        ``"{u64::MAX - version:020d}.manifest"``.

    Raises:
        ValueError: ``version`` is out of range.
    """
    if not 0 <= version <= _U64_MAX:
        raise ValueError(f"Lance version out of range: {version}")
    return f"{_U64_MAX - version:020d}.manifest"


def parse_lance_manifest_file_name(name: str) -> int | None:
    """Inverse of :func:`lance_manifest_file_name`.

    A 20-digit stem is read with the V2 scheme; a shorter all-digit stem is
    read as a V1 name (``{version}.manifest``).

    Args:
        name: A file name in ``_versions/``.

    Returns:
        The dataset version, or None when the name is not a manifest name.
    """
    if not name.endswith(".manifest"):
        return None
    stem = name[: -len(".manifest")]
    if not stem.isascii() or not stem.isdigit():
        return None
    value = int(stem)
    if len(stem) == 20:
        return _U64_MAX - value if value <= _U64_MAX else None
    return value
