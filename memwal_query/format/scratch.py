"""Names of the columns added beside a table's key columns for a join or a group-by (a row
number, say): never one of the key's own names, whatever the user called them (a key column
named ``_row`` made lookups fail).

Example:
    >>> scratch("_row", ["id"]), scratch("_row", ["_row", "__row"])
    ('_row', '___row')
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["scratch"]


def scratch(name: str, taken: Iterable[str]) -> str:
    """``name``, with underscores in front until no name of ``taken`` is the same."""
    used = set(taken)
    while name in used:
        name = f"_{name}"
    return name
