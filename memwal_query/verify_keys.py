"""The base table's key check in ``memwal verify --keys``: no primary key is stored more
than once.

The primary key of a Lance table is unenforced: a base written with ``write_dataset``
before ``initialize_mem_wal()`` (or appended to outside the MemWAL) can hold one key on
several live rows. The MemWAL merger keeps keys unique, and readers rely on it: memwal
(and pylance's own LSM readers) show every copy, and ``count(*)`` counts them. Finding
copies means reading every base key, so :func:`verify_table` does it only when asked.

Example:
    >>> import tempfile, lance, pyarrow as pa
    >>> pk = {"lance-schema:unenforced-primary-key": "true"}
    >>> schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=pk)])
    >>> ds = lance.write_dataset(pa.table({"id": [1, 2, 2, 3, 2]}, schema=schema), tempfile.mkdtemp())
    >>> found = repeated_keys(ds, ["id"])
    >>> found.keys, found.rows, found.examples[0].key, len(found.examples[0].row_addresses)
    (1, 3, {'id': 2}, 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.snapshot.model import primary_key_of

__all__ = ["RepeatedKey", "RepeatedKeys", "repeated_key_problem", "repeated_keys"]

_EXAMPLES = 3
_COUNT = "_copies"


@dataclass(frozen=True)
class RepeatedKey:
    """One key stored on several live base rows, and where."""

    key: dict[str, object]
    row_addresses: tuple[int, ...]


@dataclass(frozen=True)
class RepeatedKeys:
    """Keys of the base stored more than once: how many, on how many rows, a few examples."""

    keys: int
    rows: int
    examples: tuple[RepeatedKey, ...]

    def message(self) -> str:
        """One line for a verify report (empty when no key repeats)."""
        if not self.keys:
            return ""
        shown = "; ".join(
            f"{_key_text(e.key)} on {len(e.row_addresses)} rows (row addresses "
            f"{', '.join(str(a) for a in e.row_addresses[:4])}{', ...' if len(e.row_addresses) > 4 else ''})"
            for e in self.examples
        )
        return (
            f"{self.keys:,} primary key{'s are' if self.keys != 1 else ' is'} stored on more than one live "
            f"base row ({self.rows:,} rows), e.g. {shown}: readers show every copy and count(*) counts "
            "them; deduplicate the base (the MemWAL merger keeps keys unique)"
        )


def _key_text(key: dict[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in key.items())


def repeated_key_problem(ds: lance.LanceDataset) -> str | None:
    """The verify problem of ``ds``'s repeated primary keys (None when every key is unique)."""
    pk = primary_key_of(ds.schema)
    if not pk:
        return "the base declares no primary key: its keys cannot be checked"
    return repeated_keys(ds, pk).message() or None


def repeated_keys(ds: lance.LanceDataset, primary_key: Sequence[str]) -> RepeatedKeys:
    """Keys on more than one live row of ``ds`` (reads every row's key columns once).

    Args:
        ds: The base table at the version to check.
        primary_key: Its primary key columns.

    Returns:
        How many keys repeat, the rows they cover and up to three examples with their row
        addresses.
    """
    pk = list(primary_key)
    keys = ds.to_table(columns=pk, with_row_address=True)
    if keys.num_rows == 0:
        return RepeatedKeys(0, 0, ())
    counts = keys.select(pk).group_by(pk).aggregate([([], "count_all")]).rename_columns([*pk, _COUNT])
    repeated = counts.filter(pc.greater(counts.column(_COUNT), 1))
    if repeated.num_rows == 0:
        return RepeatedKeys(0, 0, ())
    rows = int(pc.sum(repeated.column(_COUNT)).as_py())
    shown = repeated.slice(0, _EXAMPLES).select(pk)
    return RepeatedKeys(repeated.num_rows, rows, _examples(keys, shown))


def _examples(rows: pa.Table, shown: pa.Table) -> tuple[RepeatedKey, ...]:
    """The row addresses (``rows``: key columns and ``_rowaddr``) of each key of ``shown``."""
    out = []
    for key in shown.to_pylist():
        mask = None
        for k, v in key.items():
            eq = pc.is_null(rows.column(k)) if v is None else pc.fill_null(pc.equal(rows.column(k), v), False)
            mask = eq if mask is None else pc.and_(mask, eq)
        addrs = sorted(rows.filter(mask).column("_rowaddr").to_pylist())
        out.append(RepeatedKey(key, tuple(addrs)))
    return tuple(out)
