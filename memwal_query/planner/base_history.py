"""What the base table's commits did, read from their transaction files.

Lance writes one transaction file per version naming its operation (``Append``,
``Delete``, ``Update`` for a ``merge_insert`` or an ``update()``, ``Rewrite`` for
compaction, ``CreateIndex`` ...). :func:`operations` reads them for a range of versions;
:func:`edited_directly` tells whether rows were written to the base in a range other than
by LSM merges (a merge advances a region's merged generation in the MemWAL index of the
version it commits): what the Indexed Read Plan (:mod:`memwal_query.planner.catchup`)
must rule out, as it serves rows the base index does not cover from the generations
merged into them.

Example:
    >>> import lance, tempfile, pyarrow as pa
    >>> ds = lance.write_dataset(pa.table({"id": [1, 2]}), tempfile.mkdtemp())
    >>> _ = ds.delete("id = 1")
    >>> [op.name for op in operations(lance.dataset(ds.uri), 2, 2).values()]
    ['Delete', 'Overwrite']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lance

from memwal_query.errors import MemWalError
from memwal_query.format.memwal_index import read_memwal_index
from memwal_query.format.storage import Storage
from memwal_query.format.transactions import read_operations
from memwal_query.snapshot.cache import SnapshotCache

__all__ = ["Operation", "edited_directly", "operations"]

#: Operations that change no row of the table. pylance 14 gives the operations it has no
#: class for (``ReserveFragments``, ``UpdateMemWalState``, ``UpdateBases``: none writes rows)
#: as a bare ``BaseOperation``.
_ROWS_KEPT = {"CreateIndex", "Project", "UpdateConfig", "Rewrite", "BaseOperation"}


@dataclass(frozen=True)
class Operation:
    """The operation of one version: its name, and whether it only deleted rows (a
    ``Delete``, or an ``Update`` that wrote no fragment and rewrote no column)."""

    name: str
    deletes_only: bool


def operations(base: lance.LanceDataset, top: int, count: int) -> dict[int, Operation]:
    """The operations of versions ``top``, ``top - 1``, ... (``count`` of them), by number
    (:func:`memwal_query.format.transactions.read_operations`: an unreadable version is
    missing)."""
    return {v: _operation(op) for v, op in read_operations(base, top, count).items()}


def _operation(op: Any) -> Operation:
    name = type(op).__name__
    wrote = getattr(op, "new_fragments", None) or getattr(op, "fields_modified", None)
    rewrote = getattr(op, "update_mode", None) not in (None, "rewrite_rows")  # e.g. "rewrite_columns"
    return Operation(name, name in ("Delete", "Update") and not wrote and not rewrote)


def edited_directly(
    base: lance.LanceDataset, storage: Storage, since: int, until: int, cache: SnapshotCache | None = None
) -> str | None:
    """Why rows of the base may have been written in versions ``since`` (exclusive) to
    ``until`` other than by LSM merges, or None when every commit there was a merge, kept
    the rows, or only deleted rows.

    A merge commits its upserts in a version that advances a merged generation (an
    ``Update``). Deletions alone (``Delete``, an ``Update`` that wrote no fragment and
    rewrote no column: a merge's tombstones, or a user's) are let through: a row deleted from the fragments an index
    does not cover leaves fewer rows there than the generations merged into them hold,
    which the plan's row count check sees, unless a newer merged generation put its key
    back (then the base holds what that generation holds). A version whose operation
    cannot be read counts as a write. ``cache``: what earlier calls read (versions never
    change; a refreshed snapshot reads only the newer ones).
    """
    cache = SnapshotCache() if cache is None else cache
    ops = cache.base_operations
    missing = [v for v in range(since + 1, until + 1) if v not in ops]
    if missing:
        # only what was read is kept: a version that could not be read (a transient
        # object-store error) is read again by the next snapshot
        ops.update(operations(base, missing[-1], missing[-1] - missing[0] + 1))
    known = cache.merged_at
    unreadable: set[int] = set()

    def merged(version: int) -> tuple[tuple[str, int], ...] | None:
        if version not in known and version not in unreadable:
            try:
                index = read_memwal_index(storage, version)
                known[version] = tuple(sorted((m.region_id, m.generation) for m in index.merged_generations))
            except MemWalError:
                unreadable.add(version)
        return known.get(version)

    def merges_at(version: int) -> bool:
        now, before = merged(version), merged(version - 1)
        return now is not None and (before is None or now != before)

    for v in range(since + 1, until + 1):
        op = ops.get(v)
        if not isinstance(op, Operation):
            return f"the operation of base version {v} cannot be read"
        if op.name in _ROWS_KEPT:
            continue
        if op.deletes_only:
            continue
        if op.name == "Update" and merges_at(v):
            continue
        return f"base version {v} wrote rows other than by merging generations ({op.name})"
    return None
