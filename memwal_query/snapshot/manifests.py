"""Region manifests: the newest one per region (version hint, then bounded probing), and
the list of regions.

Shared by the reader (:mod:`memwal_query.snapshot.load`) and the writer side
(:mod:`memwal_write.merger`).
"""

from __future__ import annotations

import logging
import re
import uuid as uuidlib

from memwal_query.errors import MALFORMED, ManifestError, one_line
from memwal_query.format.decode import decode_region_manifest, decode_version_hint
from memwal_query.format.model import MAX_HINT_BYTES, MAX_VERSION, FlushedGeneration, RegionManifest
from memwal_query.format.names import bitrev64_name, parse_bitrev64_name
from memwal_query.format.paths import check_unlinked
from memwal_query.format.storage import Storage

__all__ = [
    "MAX_PROBES",
    "contradiction",
    "folder_generation",
    "manifest_path",
    "misnamed",
    "latest_region_manifest",
    "list_regions",
]

log = logging.getLogger("memwal_query")

#: Region manifest versions probed one by one past the hint before the folder is listed.
MAX_PROBES = 64


def manifest_path(region_id: str, version: int) -> str:
    """Where version ``version`` of a region manifest is, relative to the table root."""
    return f"_mem_wal/{region_id}/manifest/{bitrev64_name(version)}.binpb"


def _read_region_manifest_version(storage: Storage, region_id: str, version: int) -> RegionManifest | None:
    rel = manifest_path(region_id, version)
    check_unlinked(storage, region_id, rel, "region manifest")
    data = storage.read_bytes(rel)
    if data is None:
        return None
    try:
        manifest = decode_region_manifest(data)
    except MALFORMED as err:
        msg = f"region {region_id}: cannot decode region manifest {storage.child_uri(rel)}: {one_line(err)}"
        raise ManifestError(msg) from err
    if manifest.version != version:
        msg = f"region {region_id}: region manifest {storage.child_uri(rel)} says version {manifest.version}"
        raise ManifestError(msg)
    return manifest


def _version_hint(storage: Storage, region_id: str) -> int:
    """The region's version hint, or 1 when it is missing or unreadable (a warning)."""
    rel = f"_mem_wal/{region_id}/manifest/version_hint.json"
    check_unlinked(storage, region_id, rel, "version hint")
    data = storage.read_bytes(rel, limit=MAX_HINT_BYTES + 1)
    if data is None:
        return 1
    try:
        return max(1, decode_version_hint(data))
    except ValueError as err:
        log.warning("region %s: unreadable %s (%s); probing from 1", region_id, storage.child_uri(rel), err)
        return 1


def _probe_newer(storage: Storage, region_id: str, current: RegionManifest) -> RegionManifest | None:
    """The newest manifest at most :data:`MAX_PROBES` versions after ``current``; None past that."""
    for _ in range(MAX_PROBES):
        if current.version >= MAX_VERSION:
            return current
        nxt = _read_region_manifest_version(storage, region_id, current.version + 1)
        if nxt is None:
            return current
        current = nxt
    return None


def _highest_listed(storage: Storage, region_id: str) -> RegionManifest | None:
    names = storage.list_dir(f"_mem_wal/{region_id}/manifest")
    versions = [parse_bitrev64_name(n) for n, is_dir in names if n.endswith(".binpb") and not is_dir]
    top = max((v for v in versions if v is not None and 1 <= v <= MAX_VERSION), default=None)
    return None if top is None else _read_region_manifest_version(storage, region_id, top)


def latest_region_manifest(
    storage: Storage, region_id: str, known: RegionManifest | None = None
) -> RegionManifest | None:
    """The newest region manifest: version hint (or a known version), then probing.

    Probing is bounded: more than :data:`MAX_PROBES` versions past the start (a stale
    hint), the manifest folder is listed once and probing resumes at its highest version;
    when even that falls behind a writer, the highest listed one is read.

    Without a hint, or with one at a missing version, and no version 1, the manifest folder
    is listed. Returns ``None`` when the region has no manifest at all.
    """
    start = known.version if known is not None else _version_hint(storage, region_id)
    current = known if known is not None else _read_region_manifest_version(storage, region_id, start)
    if current is None and start != 1:
        log.warning("region %s: version hint %d points at a missing manifest; probing from 1", region_id, start)
        current = _read_region_manifest_version(storage, region_id, 1)
    if current is None:  # no version 1 either (cleaned up, or lost): what the folder holds
        current = _highest_listed(storage, region_id)
    if current is None:
        return None
    for _ in range(2):
        newest = _probe_newer(storage, region_id, current)
        if newest is not None:
            return newest
        current = _highest_listed(storage, region_id) or current
    # a writer committing manifests faster than they are probed: the highest one listed was
    # the newest while this read ran (what came after it came after the read began)
    log.info("region %s: region manifests keep appearing; reading v%d, the newest listed", region_id, current.version)
    return current


_GENERATION_FOLDER = re.compile(r"[0-9a-f]{8}_gen_(\d+)")


def folder_generation(path: str) -> int | None:
    """The generation a folder is named for (``{8 hex}_gen_{g}``), or None (another name).

    Example:
        >>> folder_generation("0a1b2c3d_gen_12/"), folder_generation("elsewhere")
        (12, None)
    """
    named = _GENERATION_FOLDER.fullmatch(path.strip("/").rsplit("/", 1)[-1])
    return int(named.group(1)) if named else None


def misnamed(g: FlushedGeneration) -> str:
    """The contradiction of flushed generation ``g`` kept in a folder named for another."""
    return f"its manifest lists flushed generation {g.generation} in folder {g.path!r}, named for another"


def contradiction(manifest: RegionManifest, merged: int) -> str | None:
    """How a region's manifest contradicts itself or the MemWAL index (``merged``: the
    region's merged generation there), as ``memwal verify`` reports it, or None: a flushed
    generation not below the current one (it would outrank the newer WAL tail), one kept in
    a folder named for another generation (pylance names them ``{8 hex}_gen_{g}``: their
    ranking would be swapped, and a collector removes merged ones by that name), or a merged
    generation above every flushed one (the unmerged ones would be taken for merged)."""
    flushed = [g.generation for g in manifest.flushed_generations]
    late = [g for g in flushed if g >= manifest.current_generation]
    if late:
        return (
            f"its manifest lists flushed generation {late[0]}, not below its current generation "
            f"{manifest.current_generation}"
        )
    for g in manifest.flushed_generations:
        if folder_generation(g.path) not in (None, g.generation):
            return misnamed(g)
    top = max(flushed, default=manifest.current_generation - 1)
    if merged > top:
        return f"the MemWAL index says generation {merged} is merged, but it flushed only up to generation {top}"
    return None


def list_regions(storage: Storage) -> list[str]:
    """The table's region ids: the UUID-named directories under ``_mem_wal/``."""
    out = []
    for name, is_dir in storage.list_dir("_mem_wal"):
        if not is_dir:
            continue
        try:
            out.append(str(uuidlib.UUID(name)))
        except ValueError:
            log.debug("ignoring non-region entry _mem_wal/%s", name)
    return sorted(out)
