"""The base table's files in ``memwal verify``: each one is there and whole.

A data file must be as long as the manifest records (``file_size_bytes``, where the writer
recorded it) and end with a Lance footer (of the file format version the manifest names) whose
offsets point inside the file: a file cut short or grown, or another file in its place, is
found with one read of its last bytes. A deletion file must decode and delete as many rows as
the manifest says. Bytes changed inside a data file are not found: Lance files carry no
checksums; only a read of the rows (a query) meets them.

Example:
    >>> import tempfile, lance, pyarrow as pa
    >>> from memwal_query.format.storage import Storage
    >>> ds = lance.write_dataset(pa.table({"id": [1, 2, 3]}), tempfile.mkdtemp())
    >>> base_file_problems(Storage.open(ds.uri), ds)
    []
    >>> path = f"{ds.uri}/data/{ds.get_fragments()[0].metadata.files[0].path}"
    >>> with open(path, "r+b") as f:
    ...     _ = f.truncate(100)
    >>> [why for _, why, serious in base_file_problems(Storage.open(ds.uri), ds) if serious]  # doctest: +ELLIPSIS
    ['base fragment 0 of version 1 needs this file; it is 100 bytes, the manifest records ...']
"""

from __future__ import annotations

import struct
from typing import Any

import lance

from memwal_query.errors import MemWalCorruptionError, StorageError
from memwal_query.format.deletions import fragment_deletions
from memwal_query.format.lance_open import fragment_file_names
from memwal_query.format.storage import Storage

__all__ = ["base_file_problems"]

_MAGIC = b"LANC"
#: A Lance 2.x footer: column metadata start, its offsets table start, the global buffers'
#: offsets table start (u64 each), global buffers, columns (u32 each), major and minor
#: version (u16 each: 0.3 in a 2.0 file), the magic.
_FOOTER = struct.Struct("<QQQIIHH4s")
_LEGACY_FOOTER = struct.Struct("<QHH4s")  # 0.x: metadata position, version, magic
_LONGER = "longer than the manifest records:"


def base_file_problems(storage: Storage, ds: lance.LanceDataset) -> list[tuple[str, str, bool]]:
    """The data and deletion files of base version ``ds`` that are missing or not whole, as
    (path, problem, serious): one read of a data file's last bytes, a whole read of a deletion
    file. Not serious: a data file longer than the manifest records (Lance reads the bytes it
    records: reads succeed)."""
    out: list[tuple[str, str, bool]] = []
    for frag in ds.get_fragments():
        meta = frag.metadata
        needs = f"base fragment {frag.fragment_id} of version {ds.version} needs this file"
        data = {f"data/{f.path}": f for f in meta.files}
        for rel in fragment_file_names(frag):
            try:
                why = _data_file_problem(storage, rel, data[rel]) if rel in data else _deletion_problem(storage, meta)
            except StorageError as err:
                why = str(err)
            if why is not None:
                out.append((rel, f"{needs}; {why}", _LONGER not in why))
    return out


def _data_file_problem(storage: Storage, rel: str, file: Any) -> str | None:
    got = storage.read_tail(rel, _FOOTER.size)
    if got is None:
        return "it is missing"
    size, tail = got
    recorded = int(getattr(file, "file_size_bytes", 0) or 0)
    if recorded and size < recorded:
        return f"it is {size:,} bytes, the manifest records {recorded:,} (cut short, or another file in its place)"
    if recorded and size > recorded:
        return f"it is {size:,} bytes, {_LONGER} {recorded:,} (readers read those: bytes were added to it)"
    major = int(getattr(file, "file_major_version", 0) or 0)
    footer = _LEGACY_FOOTER if major < 2 else _FOOTER
    if len(tail) < footer.size or tail[-4:] != _MAGIC:
        return "it does not end with a Lance file footer (cut short, or not a Lance file)"
    starts = footer.unpack(tail[-footer.size :])[: 3 if major >= 2 else 1]
    if any(s > size - footer.size for s in starts):
        return "its Lance file footer points outside the file"
    return None


def _deletion_problem(storage: Storage, meta: Any) -> str | None:
    try:
        gone = fragment_deletions(storage, meta)
    except MemWalCorruptionError as err:
        return f"it does not decode: {err}"
    if gone is None:
        return "it is missing"
    deleted, recorded = gone.size, meta.deletion_file.num_deleted_rows
    if recorded and deleted != recorded:  # 0: not recorded (older writers)
        return f"it deletes {deleted:,} rows, the manifest says {recorded:,}"
    return None
