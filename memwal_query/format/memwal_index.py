"""Read the MemWAL index of one base table version: the one reader, for reads and writes.

The index lives in the Lance manifest of the version (its index section); reading it
takes one storage read (two for tables that still use V1 manifest names).
"""

from __future__ import annotations

import hashlib

from memwal_query.errors import MALFORMED, ManifestError, NotAMemWalTableError, one_line
from memwal_query.format.decode import decode_mem_wal_index
from memwal_query.format.model import MemWalIndex
from memwal_query.format.names import lance_manifest_file_name
from memwal_query.format.storage import Storage

__all__ = ["manifest_digest", "read_memwal_index", "read_version"]


def read_memwal_index(storage: Storage, version: int) -> MemWalIndex:
    """The MemWAL index of base table version ``version``.

    Raises:
        ManifestError: The manifest of that version is missing or cannot be decoded.
        NotAMemWalTableError: The version has no MemWAL index.
    """
    return read_version(storage, version)[0]


def read_version(storage: Storage, version: int) -> tuple[MemWalIndex, str]:
    """The MemWAL index of base table version ``version`` and a digest of its manifest
    (:func:`manifest_digest`); raises as :func:`read_memwal_index`."""
    found = _manifest(storage, version)
    if found is None:
        msg = f"manifest of version {version} not found under {storage.child_uri('_versions')}"
        raise ManifestError(msg)
    rel, data = found
    try:
        index = decode_mem_wal_index(data)
    except MALFORMED as err:
        msg = f"cannot decode Lance manifest {storage.child_uri(rel)}: {one_line(err)}"
        raise ManifestError(msg) from err
    if index is None:
        msg = f"{storage.uri} has no MemWAL index at version {version} (run LanceDataset.initialize_mem_wal() first)"
        raise NotAMemWalTableError(msg)
    return index, _digest(data)


def manifest_digest(storage: Storage, version: int) -> str | None:
    """A digest of the Lance manifest of ``version`` (None: no such manifest, e.g. cleaned up)."""
    found = _manifest(storage, version)
    return None if found is None else _digest(found[1])


def _manifest(storage: Storage, version: int) -> tuple[str, bytes] | None:
    for rel in (f"_versions/{lance_manifest_file_name(version)}", f"_versions/{version}.manifest"):
        data = storage.read_bytes(rel)
        if data is not None:
            return rel, data
    return None


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()
