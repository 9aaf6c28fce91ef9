"""A generation's deletes against writes straight on the base while it merges.

A merge deletes the generation's tombstoned keys from the base, then commits its upserts with
the mark that records it merged. Another writer's commit straight on the base in between (a
user's append or ``merge_insert``) can add a row for a key the generation deletes: the deletes,
computed before it, do not see it, and Lance finds no conflict between the two. Readers show
the key deleted (the unmerged generation is newer than the base) until the mark, and the row
would come back for good after it. So:

* :func:`commit_deletes` computes and commits the deletes again while a commit lands beside
  them (deleting a key twice is harmless), so the upserts start from a base where the deletes
  hold;
* if a commit still lands between the deletes and the mark (during the upserts' own commit),
  :func:`delete_reappeared` deletes, right after the mark, the rows of the deleted keys found at
  the mark's version: by address, and by content where a compaction moved them since (while
  no newer generation is merged). A newer generation's row of such a key, merged in between,
  is another row and stays. Readers see the
  key in that short window; a crash inside it leaves the row (the generation counts as merged).

Example:
    >>> import lance, tempfile, pyarrow as pa
    >>> ds = lance.write_dataset(pa.table({"id": [1, 2, 3]}), tempfile.mkdtemp())
    >>> ds, clean = commit_deletes(ds, Storage.open(ds.uri), pa.table({"id": [2]}), "id", lambda version: True)
    >>> clean, sorted(ds.to_table().column("id").to_pylist())
    (True, [1, 3])
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import lance
import pyarrow as pa

from memwal_query.errors import MemWalError
from memwal_query.format.lance_open import lance_message
from memwal_query.format.storage import Storage
from memwal_query.planner.base_history import edited_directly
from memwal_query.planner.key_match import rows_of_keys
from memwal_write.backoff import backoff

__all__ = ["commit_deletes", "delete_reappeared", "wrote_beside"]

log = logging.getLogger("memwal_write")

#: Rounds of either step before it gives up (deletes: commits beside them every time; the
#: clean-up: conflicts), and its first wait between conflicts (doubling, at most 2 s).
_ATTEMPTS = 12
_FIRST_WAIT = 0.02


def commit_deletes(
    ds: lance.LanceDataset,
    storage: Storage,
    deletes: pa.Table,
    on: str | list[str],
    unmerged: Callable[[int], bool],
) -> tuple[lance.LanceDataset, bool]:
    """Delete the rows of ``deletes``' keys: (the base after it, whether no commit that may have
    written rows landed beside the last round). Each round is computed at the base's version and
    committed against it, so it only removes rows that existed there; a round after the first
    runs only while ``unmerged(version)`` (the generation is not merged at that version: once
    another merger has merged it, a newer generation's row of a key may be there, and the mark
    fails as stale anyway).
    """
    for attempt in range(_ATTEMPTS):
        read = ds.version
        if attempt and not unmerged(read):
            return ds, True
        txn, _ = ds.merge_insert(on).when_matched_delete().execute_uncommitted(deletes)
        ds = lance.LanceDataset.commit(ds.uri, txn, read_version=read, storage_options=_options(storage))
        if not wrote_beside(ds, storage, read):
            return ds, True
    return ds, False


def wrote_beside(ds: lance.LanceDataset, storage: Storage, read: int) -> bool:
    """Whether commits between ``read`` and ``ds``'s version, besides ``ds``'s own, may have written
    rows: anything but merges (other regions' mergers commit beside each other all the time),
    deletions and commits that keep rows (an unreadable one counts as a write)."""
    if ds.version <= read + 1:
        return False
    return edited_directly(ds, storage, read, ds.version) is not None


def _options(storage: Storage) -> dict[str, str] | None:
    return dict(storage.storage_options) or None


def delete_reappeared(
    ds: lance.LanceDataset,
    storage: Storage,
    deletes: pa.Table,
    pk: list[str],
    what: str,
    last_merged: Callable[[int], bool],
) -> int:
    """Delete the base rows of ``deletes``' keys found at version ``ds`` (the mark's), which another
    commit wrote while ``what`` merged; returns how many were deleted.

    Rows a compaction moved since are found again by content only while ``last_merged(version)``
    (no newer generation of the region is merged at that version: one could have written a row
    of the same content, which must stay)."""
    found = _rows_of(ds, deletes, pk)
    count = int(found.num_rows)
    if not count:
        return 0
    log.info("%s: %d deleted keys were written to %s while it merged; deleting them", what, count, ds.uri)
    identity = {_content(r) for r in found.drop_columns(["_rowaddr"]).to_pylist()}
    target = found
    for attempt in range(_ATTEMPTS):
        try:
            # an address names one stored row (a compaction gives its rows new ones: found by content below)
            ds.delete(f"_rowaddr IN ({', '.join(str(a) for a in target.column('_rowaddr').to_pylist())})")
        except OSError as err:
            if "conflict" not in str(err).lower() or attempt + 1 == _ATTEMPTS:
                msg = (
                    f"merging {what} into {ds.uri}: {count} keys it deletes were written to the base while "
                    f"it merged and could not be deleted ({lance_message(err)})"
                )
                raise MemWalError(msg) from err
            time.sleep(backoff(attempt, first=_FIRST_WAIT, cap=2.0))
        ds = lance.dataset(ds.uri, storage_options=_options(storage))
        now = _rows_of(ds, deletes, pk)
        moved = [i for i, r in enumerate(now.drop_columns(["_rowaddr"]).to_pylist()) if _content(r) in identity]
        if not moved:
            return count
        if not last_merged(ds.version):
            log.warning("%s: %d rows of keys it deletes moved and a newer generation merged: left", what, len(moved))
            return count - len(moved)
        target = now.take(pa.array(moved, pa.int64()))
    msg = f"merging {what} into {ds.uri}: {count} keys it deletes were written to the base while it merged and stay"
    raise MemWalError(msg)


def _rows_of(ds: lance.LanceDataset, deletes: pa.Table, pk: list[str]) -> pa.Table:
    """The rows of ``ds`` whose key is one of ``deletes``', with their addresses."""
    return rows_of_keys(ds, deletes, pk, with_row_address=True)


def _content(row: dict[str, Any]) -> str:
    """A row's values as one comparable value (rows hold lists and structs)."""
    return repr(sorted(row.items()))
