"""Whether a table's MemWAL layer may have started over between two versions of its base.

A reader keeps what it read of a table's newer levels (region manifests, WAL entries) from
one snapshot to the next: they only grow. A MemWAL layer set up anew (``_mem_wal`` removed,
``initialize_mem_wal()`` again) keeps the base's version history, but its regions start over
at the same region ids and WAL positions: what was kept must be forgotten. The base's
transaction files name each version's operation; the layer can start over only at one that
overwrote the base or created or dropped the MemWAL index (``initialize_mem_wal()`` after a
``restore()`` to before it, say): merges update that index in place, and a ``restore()``
alone keeps the regions as they are.

Example:
    >>> import lance, pyarrow as pa, tempfile
    >>> ds = lance.write_dataset(pa.table({"id": [1, 2]}), tempfile.mkdtemp())
    >>> ds = lance.write_dataset(pa.table({"id": [3]}), ds.uri, mode="append")
    >>> restarted(ds, 1, 2)
    False
    >>> ds = lance.write_dataset(pa.table({"id": [4]}), ds.uri, mode="overwrite")
    >>> restarted(ds, 1, 3), restarted(ds, 2, 3)
    (True, True)
"""

from __future__ import annotations

from typing import Any

import lance

from memwal_query.format.transactions import read_operations

__all__ = ["restarted"]

#: Versions read at most by default (a longer range is ``unknown``).
MAX_VERSIONS = 64

_MEMWAL_INDEX = "__lance_mem_wal"


def restarted(
    base: lance.LanceDataset, since: int, until: int, *, unknown: bool = True, limit: int = MAX_VERSIONS
) -> bool:
    """Whether the MemWAL layer of ``base`` may have started over in versions ``(since, until]``.

    Args:
        base: The base table (any version at or after ``until``'s history).
        since: The version read before (excluded).
        until: The version read now.
        unknown: What a version whose transaction cannot be read (cleaned up) counts as, and
            a range longer than ``limit`` (whose older versions are not read then).
        limit: Versions read at most (the newest ones).
    """
    count = until - since
    if count <= 0:
        return False
    if count > limit:
        if unknown:
            return True
        count = limit
    ops = read_operations(base, until, count)
    return any(_restarts(ops[v]) if v in ops else unknown for v in range(until - count + 1, until + 1))


def _restarts(op: Any) -> bool:
    name = type(op).__name__
    if name == "Overwrite":
        return True
    if name == "CreateIndex":
        changed = [*(getattr(op, "new_indices", None) or ()), *(getattr(op, "removed_indices", None) or ())]
        return any(getattr(i, "name", None) == _MEMWAL_INDEX for i in changed)
    return False
