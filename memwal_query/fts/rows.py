"""Rows of a Lance dataset by row address, in the order asked.

A text search knows its candidates by row address (``_rowaddr``). Lance's row-id
take reads exactly those rows; on a dataset without stable row ids a row id *is*
its address. With stable row ids the two differ, so the rows are found by a scan
filtered on ``_rowaddr`` instead (slower, the same rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import lance
import numpy as np
import pyarrow as pa

__all__ = ["take_rows"]

_ADDR = "_rowaddr"


def take_rows(
    ds: lance.LanceDataset, addrs: np.ndarray, columns: Sequence[str], fragments: Sequence[int] | None = None
) -> pa.Table:
    """``columns`` of the live rows at ``addrs`` of ``ds``, in that order.

    Args:
        ds: The dataset.
        addrs: Row addresses (each a live row of ``ds``).
        columns: The columns to read.
        fragments: The fragments holding ``addrs`` (narrows the fallback scan).

    Returns:
        One row per address, in the order of ``addrs``.
    """
    wanted = np.asarray(addrs, dtype=np.uint64)
    if not wanted.size:
        return ds.schema.empty_table().select(list(columns))
    if not ds.has_stable_row_ids:
        return ds._take_rows(wanted.tolist(), columns=list(columns))
    frags = None if fragments is None else [f for f in (ds.get_fragment(i) for i in fragments) if f is not None]
    listed = ", ".join(str(a) for a in wanted.tolist())
    found = ds.scanner(
        columns=list(columns), filter=f"{_ADDR} IN ({listed})", with_row_address=True, fragments=frags
    ).to_table()
    order = {a: i for i, a in enumerate(found.column(_ADDR).to_numpy().tolist())}
    return found.take(pa.array([order[a] for a in wanted.tolist()])).select(list(columns))
