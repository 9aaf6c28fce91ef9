"""Whether the base table was overwritten (Lance's ``Overwrite``) between two of its versions.

A reader keeps what it read of a table's newer levels (region manifests, WAL entries) from
one snapshot to the next: they only grow. A base written again with ``mode="overwrite"``
and its MemWAL layer set up anew (``_mem_wal`` removed, ``initialize_mem_wal()``) keeps its
version history, but its regions start over, at the same region ids and WAL positions: what
was kept must be forgotten. The base's transaction files name each version's operation.

Example:
    >>> import lance, pyarrow as pa, tempfile
    >>> ds = lance.write_dataset(pa.table({"id": [1, 2]}), tempfile.mkdtemp())
    >>> ds = lance.write_dataset(pa.table({"id": [3]}), ds.uri, mode="append")
    >>> overwritten(ds, 1, 2)
    False
    >>> ds = lance.write_dataset(pa.table({"id": [4]}), ds.uri, mode="overwrite")
    >>> overwritten(ds, 1, 3), overwritten(ds, 2, 3)
    (True, True)
"""

from __future__ import annotations

import lance

__all__ = ["overwritten"]

#: Versions read at most; a longer range counts as overwritten (what was kept is read again).
MAX_VERSIONS = 64


def overwritten(base: lance.LanceDataset, since: int, until: int) -> bool:
    """Whether a version in ``(since, until]`` of ``base`` overwrote the table (or cannot be
    told: a transaction file that cannot be read counts as one)."""
    count = until - since
    if count <= 0:
        return False
    if count > MAX_VERSIONS:
        return True
    try:
        at = base if until == base.version else base.checkout_version(until)
        names = [type(tx.operation).__name__ if tx else None for tx in at.get_transactions(count)]
    except (OSError, ValueError, RuntimeError, TypeError):
        names = [_one(base, v) for v in range(since + 1, until + 1)]
    return any(name in (None, "Overwrite") for name in names)


def _one(base: lance.LanceDataset, version: int) -> str | None:
    try:
        txs = base.checkout_version(version).get_transactions(1)
    except TypeError as err:  # pylance 14 cannot build a compaction's RewrittenIndex: a Rewrite
        return "Rewrite" if "RewrittenIndex" in str(err) else None
    except (OSError, ValueError, RuntimeError):
        return None
    return type(txs[0].operation).__name__ if txs and txs[0] else None
