"""Pure decoders for the MemWAL on-storage format (no I/O).

The values they return live in :mod:`memwal_query.format.model`, the file names in
:mod:`memwal_query.format.names`; both are re-exported here.

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
from collections.abc import Iterable
from typing import Final

from google.protobuf.message import DecodeError, Message

from memwal_proto import lance_manifest_pb2, mem_wal_pb2
from memwal_query.format.model import (
    MAX_HINT_BYTES,
    MAX_VERSION,
    MAX_WAL_POSITION,
    MEM_WAL_INDEX_NAME,
    FlushedGeneration,
    IndexCatchup,
    IndexEntry,
    LanceField,
    LanceManifestInfo,
    MemWalIndex,
    MergedGeneration,
    RegionManifest,
    RegionSpec,
    ShardingFieldSpec,
    frozen_map,
)
from memwal_query.format.names import (
    bitrev64_name,
    lance_manifest_file_name,
    parse_bitrev64_name,
    parse_lance_manifest_file_name,
)

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

_MEM_WAL_TYPE_SUFFIX: Final = ".memwalindexdetails"
_LANCE_MAGIC: Final = b"LANC"
_FOOTER_LEN: Final = 16

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
            no 16-byte region UUID, a field out of range, a flushed generation listed twice).
    """
    pb = mem_wal_pb2.ShardManifest()
    _parse(pb, data, "region manifest")
    if not pb.HasField("shard_id"):
        raise ValueError("region manifest has no region id (field 11)")
    _check_range("version", pb.version, 1, MAX_VERSION)
    _check_range("current generation", pb.current_generation, 0, MAX_VERSION)
    _check_range("replay-after WAL position", pb.replay_after_wal_entry_position, 0, MAX_WAL_POSITION)
    seen: set[int] = set()
    for s in pb.sstables:
        _check_range("flushed generation", s.generation, 1, MAX_VERSION)
        if s.generation in seen:  # newest-wins ranks by generation: a repeat would be a coin toss
            raise ValueError(f"region manifest lists flushed generation {s.generation} twice")
        seen.add(s.generation)
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
                        parameters=frozen_map(f.parameters),
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
        writer_config_defaults=frozen_map(pb.writer_config_defaults),
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
