"""Whether a table's MemWAL layer may have started over between two versions of its base.

A reader keeps what it read of a table's newer levels (region manifests, WAL entries) from
one snapshot to the next: they only grow. A MemWAL layer set up anew (``_mem_wal`` removed,
``initialize_mem_wal()`` again) keeps the base's version history, but its regions start over
at the same region ids and WAL positions: what was kept must be forgotten. The base's
transaction files name each version's operation; the layer can start over only at one that
overwrote the base, restored an older version, or created or dropped the MemWAL index
(merges update that index in place: they keep what was kept).

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

__all__ = ["restarted"]

#: Versions read at most; a longer range counts as a restart (what was kept is read again).
MAX_VERSIONS = 64

_MEMWAL_INDEX = "__lance_mem_wal"


def restarted(base: lance.LanceDataset, since: int, until: int) -> bool:
    """Whether the MemWAL layer of ``base`` may have started over in versions ``(since, until]``
    (a transaction file that cannot be read counts as such a version)."""
    count = until - since
    if count <= 0:
        return False
    if count > MAX_VERSIONS:
        return True
    try:
        at = base if until == base.version else base.checkout_version(until)
        found = [_restarts(tx.operation) if tx else True for tx in at.get_transactions(count)]
    except (OSError, ValueError, RuntimeError, TypeError):
        found = [_one(base, v) for v in range(since + 1, until + 1)]
    return any(found)


def _restarts(op: Any) -> bool:
    name = type(op).__name__
    if name in ("Overwrite", "Restore"):
        return True
    if name == "CreateIndex":
        changed = [*(getattr(op, "new_indices", None) or ()), *(getattr(op, "removed_indices", None) or ())]
        return any(getattr(i, "name", None) == _MEMWAL_INDEX for i in changed)
    return False


def _one(base: lance.LanceDataset, version: int) -> bool:
    try:
        txs = base.checkout_version(version).get_transactions(1)
    except TypeError as err:  # pylance 14 cannot build a compaction's RewrittenIndex: a Rewrite
        return "RewrittenIndex" not in str(err)
    except (OSError, ValueError, RuntimeError):
        return True
    return not txs or not txs[0] or _restarts(txs[0].operation)
