"""The operations of a Lance table's versions, read from their transaction files.

Lance writes one transaction file per version naming its operation (``Append``, ``Delete``,
``Update`` for a ``merge_insert`` or an ``update()``, ``Rewrite`` for compaction,
``CreateIndex``, ``Overwrite`` ...). pylance reads a range of them at once or fails as a
whole (a cleaned-up transaction file; a ``TypeError`` on a compaction that remapped an
index, whose ``RewrittenIndex`` pylance 14 cannot build): :func:`read_operations` reads a
failing range again in halves, so one unreadable version leaves only its own operation
unknown. pylance's ``get_transactions`` holds its dataset object exclusively while it reads:
any other call on that object meanwhile, from another thread (a query on the same snapshot),
fails with "Already mutably borrowed". They are read through a dataset object of their own.

Example:
    >>> import lance, tempfile, pyarrow as pa
    >>> ds = lance.write_dataset(pa.table({"id": [1, 2]}), tempfile.mkdtemp())
    >>> _ = ds.delete("id = 1")
    >>> {v: type(op).__name__ for v, op in read_operations(lance.dataset(ds.uri), 2, 2).items()}
    {2: 'Delete', 1: 'Overwrite'}
"""

from __future__ import annotations

import lance

__all__ = ["MAX_READS", "Rewrite", "read_operations"]

#: Most reads of transactions one call of :func:`read_operations` makes (a table whose
#: every version fails would otherwise cost two per version).
MAX_READS = 64


class Rewrite:
    """The operation of a compaction that remapped an index (pylance 14 cannot build its
    transaction; only a ``Rewrite`` holds a ``RewrittenIndex``): it keeps every row."""


def read_operations(
    base: lance.LanceDataset, top: int, count: int, budget: list[int] | None = None
) -> dict[int, object]:
    """The operation objects of versions ``top``, ``top - 1``, ... (``count`` of them), by number.

    A version whose transaction cannot be read is missing from the result (at most
    :data:`MAX_READS` reads in all, shared through ``budget``; then the rest is missing);
    one pylance fails on for a compaction's rewritten index is a :class:`Rewrite`.
    """
    budget = [MAX_READS] if budget is None else budget
    if budget[0] <= 0 or count <= 0:
        return {}
    budget[0] -= 1
    try:
        at = base.checkout_version(top)  # its own object: never the one other threads read
        return {top - i: tx.operation for i, tx in enumerate(at.get_transactions(count)) if tx}
    except (OSError, ValueError, RuntimeError, TypeError) as err:
        if count <= 1:
            return {top: Rewrite()} if isinstance(err, TypeError) and "RewrittenIndex" in str(err) else {}
        half = count // 2
        return read_operations(base, top, half, budget) | read_operations(base, top - half, count - half, budget)
