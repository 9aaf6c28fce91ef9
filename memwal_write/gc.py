"""Garbage collection: remove the files of generations merged into the base long enough ago.

A flushed generation's directory and the WAL entries written for it are the only copies of
its rows until a merger merges it; after that the base holds them, and nothing needs them
but readers still holding a snapshot from before the merge (a snapshot's query of such a
file fails with a clear "refresh() the table and retry" error, never a wrong answer).
pylance 14 removes neither, so a table written for weeks keeps every generation and WAL
file it ever wrote. :func:`collect_garbage` removes, per region:

* the directory of every flushed generation at or below the region's merged generation
  as recorded by the newest base version at least ``older_than`` seconds old (so every
  reader that refreshed since that long ago reads the merged rows from the base) and by
  the newest version (a base restored to a version before a merge does not hold them);
* every WAL entry at or before the region's replay position (a flushed generation holds
  its rows; neither readers nor pylance's writer, which both replay from the position
  after it, read it again) whose generation is merged by that same version, and the fence
  entries there, but the region's newest WAL file (pylance's writer puts a new writer's
  fence entry after the last file it finds: in an empty WAL it would land before the
  replay position, where readers never see the epoch it claims).

It never removes anything of a generation that is not merged, nor a WAL entry after the
replay position, so an acknowledged write is never lost, whatever runs beside it: a writer
(its new entries are after the replay position), a merger (it only merges more), a reader
(it opens generations a newer base version merged, or retries with that version).

Example:
    >>> import lance, tempfile, pyarrow as pa, memwal_query as mq
    >>> from memwal_write import write_arrow, merge_generations, collect_garbage
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> schema = pa.schema([pa.field("id", pa.int64(), nullable=False,
    ...     metadata={"lance-schema:unenforced-primary-key": "true"}), pa.field("v", pa.string())])
    >>> lance.write_dataset(pa.table({"id": [1], "v": ["a"]}, schema=schema), uri).initialize_mem_wal(
    ...     bucket_column="id", num_buckets=2)
    >>> _ = write_arrow(uri, pa.table({"id": [2, 3], "v": ["b", "c"]}, schema=schema))
    >>> _ = write_arrow(uri, pa.table({"id": [4, 5], "v": ["d", "e"]}, schema=schema))
    >>> _ = merge_generations(uri)
    >>> removed = collect_garbage(uri, older_than=0)
    >>> sorted(set(removed.column("kind").to_pylist()))  # each region's newest WAL file stays
    ['generation', 'wal']
    >>> mq.open_table(uri).count_rows()
    5
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime

import pyarrow as pa

from memwal_query.errors import InvalidArgumentError, MemWalCorruptionError
from memwal_query.format.lance_open import open_lance
from memwal_query.format.memwal_index import read_memwal_index
from memwal_query.format.names import parse_bitrev64_name
from memwal_query.format.paths import removable
from memwal_query.format.storage import Storage
from memwal_query.format.wal import WalEntry, read_wal_entry, wal_entry_path
from memwal_query.snapshot.manifests import contradiction, latest_region_manifest, list_regions

__all__ = ["collect_garbage"]

log = logging.getLogger("memwal_write")

#: ``{8 hex}_gen_{g}``: a flushed generation's directory (FORMAT.md).
_GENERATION_DIR = re.compile(r"[0-9a-f]{8}_gen_([0-9]+)")
_SCHEMA = pa.schema(
    [
        pa.field("region_id", pa.string()),
        pa.field("kind", pa.string()),  # "generation" or "wal"
        pa.field("generation", pa.int64()),
        pa.field("path", pa.string()),
    ]
)


@dataclass(frozen=True)
class _Removed:
    region_id: str
    kind: str
    generation: int
    path: str


def collect_garbage(
    uri: str,
    *,
    older_than: float = 3600.0,
    storage_options: Mapping[str, str] | None = None,
    dry_run: bool = False,
) -> pa.Table:
    """Remove merged generations' directories and WAL entries (see the module docs).

    Args:
        uri: The table.
        older_than: Seconds: only generations merged by a base version committed at
            least this long ago (readers that refreshed since read their rows from the
            base). 0 removes everything merged now.
        storage_options: Object store options, as for ``memwal_query.open_table``.
        dry_run: Report what would be removed, remove nothing.

    Returns:
        One row per removed directory or WAL file: ``region_id``, ``kind``
        (``"generation"`` or ``"wal"``), ``generation`` (0 for a writer's fence entry)
        and ``path`` (relative to the table root).

    Raises:
        InvalidArgumentError: ``older_than`` is negative or not a number.
        TableNotFoundError, NotAMemWalTableError, StorageError: As reading the table does.
    """
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not older_than >= 0:
        msg = f"older_than must be a number of seconds >= 0, got {older_than!r}"
        raise InvalidArgumentError(msg)
    storage = Storage.open(uri, storage_options)
    ds = open_lance(storage, uri, " to collect garbage")
    cutoff = time.time() - float(older_than)
    old_enough = [int(v["version"]) for v in ds.versions() if _committed_at(v["timestamp"]) <= cutoff]
    removed: list[_Removed] = []
    if old_enough:
        # merged by the version old enough and still by the newest (a restore() of the base
        # to a version before a merge un-merges its generations)
        then = read_memwal_index(storage, max(old_enough))
        now = then if max(old_enough) == ds.version else read_memwal_index(storage, ds.version)
        for region_id in list_regions(storage):
            merged = min(then.merged_generation(region_id), now.merged_generation(region_id))
            if merged > 0:
                removed += _region_garbage(storage, region_id, merged)
    unsafe = next(((r, why) for r in removed if (why := removable(storage, r.region_id, r.path))), None)
    if unsafe is not None:  # checked before anything is removed
        msg = f"{storage.uri}: region {unsafe[0].region_id}: {unsafe[0].path} is not removed: {unsafe[1]}"
        raise MemWalCorruptionError(msg)
    if not dry_run:
        for r in removed:
            storage.delete(r.path, directory=r.kind == "generation")
        if removed:
            log.info("%s: removed %d merged generation directories and WAL entries", storage.uri, len(removed))
    return pa.Table.from_pylist([asdict(r) for r in removed], schema=_SCHEMA)


def _committed_at(timestamp: object) -> float:
    """A version's commit time in seconds since the epoch, or later (never earlier): pylance
    gives a naive local datetime, which in the hour a clock falls back names two instants."""
    if not isinstance(timestamp, datetime):
        return float("inf")
    return max(timestamp.replace(fold=0).timestamp(), timestamp.replace(fold=1).timestamp())


def _region_garbage(storage: Storage, region_id: str, merged: int) -> list[_Removed]:
    """What of region ``region_id`` no reader or writer reads again, its merged generation being ``merged``."""
    manifest = latest_region_manifest(storage, region_id)
    why = contradiction(manifest, merged) if manifest is not None else None
    if why is not None:  # what memwal verify reports: nothing is removed by what cannot be trusted
        msg = f"{storage.uri}: region {region_id}: {why}: nothing of it is removed (memwal verify)"
        raise MemWalCorruptionError(msg)
    out = []
    for name, is_dir in storage.list_dir(f"_mem_wal/{region_id}"):
        found = _GENERATION_DIR.fullmatch(name)
        if is_dir and found and int(found.group(1)) <= merged:
            out.append(_Removed(region_id, "generation", int(found.group(1)), f"_mem_wal/{region_id}/{name}"))
    if manifest is None:
        return out
    names = storage.list_dir(f"_mem_wal/{region_id}/wal")
    positions = [None if d or not n.endswith(".arrow") else parse_bitrev64_name(n) for n, d in names]
    # The newest entry stays: pylance's writer puts its fence entry after the last WAL file
    # it finds, and in an empty WAL at position 1, before the replay position, where readers
    # never see the new writer epoch it claims.
    newest = max((p for p in positions if p is not None), default=None)
    for position in positions:
        if position is None or position > manifest.replay_after_wal_position or position == newest:
            continue
        entry = read_wal_entry(storage, region_id, position)
        if isinstance(entry, WalEntry) and entry.generation <= merged:  # a damaged entry stays (verify names it)
            out.append(_Removed(region_id, "wal", entry.generation, wal_entry_path(region_id, position)))
    return sorted(out, key=lambda r: (r.kind, r.generation, r.path))
