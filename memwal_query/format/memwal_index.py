"""Read the MemWAL index of one base table version: the one reader, for reads and writes.

The index lives in the Lance manifest of the version (its index section); reading it
takes one storage read (two for tables that still use V1 manifest names).
"""

from __future__ import annotations

from memwal_query.errors import MALFORMED, ManifestError, NotAMemWalTableError, one_line
from memwal_query.format.decode import decode_mem_wal_index
from memwal_query.format.model import MemWalIndex
from memwal_query.format.names import lance_manifest_file_name
from memwal_query.format.storage import Storage

__all__ = ["read_memwal_index"]


def read_memwal_index(storage: Storage, version: int) -> MemWalIndex:
    """The MemWAL index of base table version ``version``.

    Raises:
        ManifestError: The manifest of that version is missing or cannot be decoded.
        NotAMemWalTableError: The version has no MemWAL index.
    """
    candidates = [f"_versions/{lance_manifest_file_name(version)}", f"_versions/{version}.manifest"]
    for rel in candidates:
        data = storage.read_bytes(rel)
        if data is None:
            continue
        try:
            index = decode_mem_wal_index(data)
        except MALFORMED as err:
            msg = f"cannot decode Lance manifest {storage.child_uri(rel)}: {one_line(err)}"
            raise ManifestError(msg) from err
        if index is None:
            msg = (
                f"{storage.uri} has no MemWAL index at version {version} (run LanceDataset.initialize_mem_wal() first)"
            )
            raise NotAMemWalTableError(msg)
        return index
    msg = f"manifest of version {version} not found under {storage.child_uri('_versions')}"
    raise ManifestError(msg)
