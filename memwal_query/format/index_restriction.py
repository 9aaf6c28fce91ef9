"""The scanner options that restrict a Lance index search to the fragments its index covers.

memwal serves the rows an index does not cover from elsewhere (catch-up generations, a flat
search of the unindexed fragments), so a search through the index must leave them out.
Lance's ``fast_search`` does, but with a filter (pylance 14) it also leaves out the
fragments that the *filter's* scalar index does not cover: with a BTREE on ``cat`` older
than the vector index, ``filter="cat = 'c2'"`` lost the matching rows of every fragment the
vector index covers and the BTREE does not. A filtered search is given the covered fragments
instead (Lance then applies the filter to every one of them, by index where it has one).

Example:
    >>> import lance, pyarrow as pa, tempfile
    >>> ds = lance.write_dataset(pa.table({"x": [1, 2]}), tempfile.mkdtemp(), max_rows_per_file=1)
    >>> indexed_only(ds, None, filtered=True)
    {}
    >>> indexed_only(ds, frozenset({0}), filtered=False)
    {'fast_search': True}
    >>> indexed_only(ds, frozenset({1}), filtered=True)  # no index could serve a filter
    {'fast_search': True}
    >>> ds.create_scalar_index("x", "BTREE")
    >>> ds = lance.write_dataset(pa.table({"x": [3]}), ds.uri, mode="append")  # fragment 2: not in the BTREE
    >>> [f.fragment_id for f in indexed_only(ds, frozenset({1, 2}), filtered=True)["fragments"]]
    [1, 2]
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import lance

__all__ = ["indexed_only"]


def indexed_only(ds: lance.LanceDataset, fragments: Collection[int] | None, filtered: bool) -> dict[str, Any]:
    """Scanner options searching only ``fragments`` of ``ds`` (None: every fragment, no option)."""
    if fragments is None:
        return {}
    if not filtered or _others_cover(ds, fragments):
        return {"fast_search": True}  # 2-4 ms cheaper than naming 8 fragments (400k rows, measured)
    return {"fragments": [f for f in ds.get_fragments() if f.fragment_id in fragments]}


def _others_cover(ds: lance.LanceDataset, fragments: Collection[int]) -> bool:
    """Whether every index a filter may use covers ``fragments`` (vector indexes serve no filter)."""
    try:
        indexes = ds.describe_indices()
    except (OSError, ValueError, RuntimeError):
        return False
    for index in indexes:
        kind = str(index.index_type).upper()
        if not index.fields or "IVF" in kind or "HNSW" in kind:
            continue
        covered = {int(f) for s in index.segments for f in s.fragment_ids}
        if not covered.issuperset(fragments):
            return False
    return True
