"""A flushed generation's key columns, tombstone flags and row addresses, kept on this machine.

A generation is written once and never changes, and opening a snapshot reads the keys of
every unmerged one (the merge ranks them): ~1 ms a generation through Lance, ~12 ms for the
12 generations of a table of 4 regions. :func:`keep` writes what that read returned to this
machine's cache directory (:mod:`~memwal_query.format.machine_cache`, folder
``generation-keys``), and :func:`load` gives it to a later process in a fraction of that.

A kept file is named by a digest of everything the read depends on: the generation's local
path, the key and tombstone columns' names, Lance field ids and types, and each fragment's id,
rows, data files (real path, size, modification time, fields) and deletion file. A file that
is not whole (CRC-32), not for that name, or not the columns and rows expected, is ignored.
Only local generations are kept (on an object store Lance reads them).
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Sequence

import lance
import pyarrow as pa

from memwal_query.format import machine_cache
from memwal_query.snapshot.evolution import field_paths

__all__ = ["KIND", "MAX_FILE_BYTES", "keep", "load"]

log = logging.getLogger(__name__)

KIND = "generation-keys"
"""The folder of these files in the cache directory."""
MAX_FILE_BYTES = 64 << 20
"""A generation whose keys take more than this is not kept (nor is a larger file read)."""
_MAGIC = b"MWGKEYS1"
_ROWADDR = "_rowaddr"


def _name(ds: lance.LanceDataset, columns: Sequence[str]) -> bytes | None:
    """The name of ``columns`` (and ``_rowaddr``) of generation ``ds``; None when it is not local
    (or not a dataset whose metadata describes them: Lance's read then says what is wrong)."""
    try:
        return _described(ds, columns)
    except (KeyError, ValueError, OSError, RuntimeError) as err:
        log.debug("generation keys of %s not kept: %s", ds.uri, err)
        return None


def _described(ds: lance.LanceDataset, columns: Sequence[str]) -> bytes | None:
    root = str(ds.uri)
    names = set(ds.schema.names)
    if "://" in root or not os.path.isabs(root) or machine_cache.cache_dir(KIND) is None:
        return None
    if any(c not in names for c in columns):  # not a generation pylance wrote: Lance's read says so
        return None
    ids = {path: i for i, path in field_paths(ds).items()}
    parts = [KIND, root]
    for c in columns:
        parts.append(f"column {c} {ids.get((c,))} {ds.schema.field(c).type}")
    for frag in ds.get_fragments():
        meta = frag.metadata
        parts.append(f"fragment {meta.id} {meta.physical_rows}")
        for f in meta.files:
            ident = machine_cache.file_identity(os.path.join(root, "data", f.path))
            if ident is None or getattr(f, "base_id", None) is not None:
                return None
            parts.append(f"{ident} {list(f.fields)} {list(f.column_indices)}")
        d = meta.deletion_file
        if d is not None:
            ident = machine_cache.file_identity(os.path.join(root, d.path(meta.id)))
            if ident is None or getattr(d, "base_id", None) is not None:
                return None
            parts.append(f"deletions {ident}")
    return machine_cache.digest(*parts)


def load(ds: lance.LanceDataset, columns: Sequence[str]) -> pa.Table | None:
    """``columns`` of generation ``ds`` and their ``_rowaddr``, as kept by :func:`keep` for it; None
    when nothing whole is kept for it as it is now."""
    name = _name(ds, columns)
    data = machine_cache.read_kept(KIND, name, MAX_FILE_BYTES) if name is not None else None
    if name is None or data is None:
        return None
    head = len(_MAGIC) + len(name)
    if len(data) < head + 4 or data[:head] != _MAGIC + name:
        return None
    if zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "little"):
        return None
    try:
        t = pa.ipc.open_stream(pa.py_buffer(data[head:-4])).read_all()
        t.validate(full=True)
    except (pa.ArrowException, OSError, ValueError) as err:
        log.debug("generation keys kept for %s not read: %s", ds.uri, err)
        return None
    want = [*((c, ds.schema.field(c).type) for c in columns), (_ROWADDR, pa.uint64())]
    return t if [(f.name, f.type) for f in t.schema] == want and t.num_rows == _live_rows(ds) else None


def _live_rows(ds: lance.LanceDataset) -> int:
    """Rows of ``ds`` by its manifest: stored, less deleted."""
    rows = 0
    for frag in ds.get_fragments():
        meta = frag.metadata
        d = meta.deletion_file
        rows += int(meta.physical_rows) - (int(d.num_deleted_rows or 0) if d is not None else 0)
    return rows


def keep(ds: lance.LanceDataset, columns: Sequence[str], table: pa.Table) -> bool:
    """Keep ``table`` (``columns`` of generation ``ds`` and ``_rowaddr``, as Lance read them) for
    later processes. Returns whether it was kept."""
    name = _name(ds, columns)
    if name is None or table.nbytes > MAX_FILE_BYTES // 2:
        return False
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body = _MAGIC + name + sink.getvalue().to_pybytes()
    return machine_cache.keep(KIND, name, body + zlib.crc32(body).to_bytes(4, "little"))
