"""Names of the columns added beside a table's key columns for a join or a group-by (a row
number, say): never one of the key's own names, whatever the user called them (a key column
named ``_row`` made lookups fail).

Example:
    >>> scratch("_row", ["id"]), scratch("_row", ["_row", "__row"]), scratch("_i", ["_i_min"], ["_min"])
    ('_row', '___row', '__i')
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["scratch"]


def scratch(name: str, taken: Iterable[str], derived: Iterable[str] = ()) -> str:
    """``name``, with underscores in front until no name of ``taken`` is the same, nor one
    of the names an aggregation derives from it (``derived``: suffixes, e.g. ``"_min"``)."""
    used = set(taken)
    suffixes = ["", *derived]
    while any(name + s in used for s in suffixes):
        name = f"_{name}"
    return name
