"""WAL tail replay: the rows of a region's live MemTable(s) that no flushed
generation covers yet.

Rule (FORMAT.md, reproduces the writer's own recovery): read positions
``replay_after + 1, + 2, ...`` while the entry exists; skip fence entries (0 rows,
``fence_sentinel=true``); skip entries whose ``generation`` is below the region
manifest's ``current_generation`` (``replay_after`` can lag behind a flush).

Fencing (the spec's Appendix 1): a writer claiming a region bumps the epoch and
writes a fence entry; an entry of a *lower* epoch than one already seen in the log
was written by a fenced (zombie) writer after it lost the region: it is skipped,
with a warning, and never wins over the new writer's rows.

A torn *last* entry (undecodable, nothing after it) was never acknowledged to the
writer: it is treated as not committed, with a warning. An undecodable entry that
is followed by a valid one is corruption and raises :class:`MemWalCorruptionError`.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass

import pyarrow as pa

from memwal_query.errors import MemWalCorruptionError
from memwal_query.format.decode import bitrev64_name
from memwal_query.format.storage import Storage

__all__ = ["WalEntry", "WalTail", "wal_entry_path", "read_wal_entry", "replay_wal_tail"]

log = logging.getLogger("memwal_query")

TOMBSTONE = "_tombstone"


@dataclass(frozen=True)
class WalEntry:
    """One decoded WAL entry (an Arrow IPC stream file)."""

    position: int
    generation: int
    writer_epoch: int
    fence: bool
    table: pa.Table

    @property
    def num_rows(self) -> int:
        """Rows in the entry (0 for a fence entry)."""
        return int(self.table.num_rows)


@dataclass(frozen=True)
class WalTail:
    """The replayed tail of one region's WAL."""

    entries: tuple[WalEntry, ...]
    first_position: int
    last_position: int
    skipped_positions: tuple[int, ...]
    torn_position: int | None
    fenced_positions: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        """Rows in the replayed entries."""
        return sum(e.num_rows for e in self.entries)


def wal_entry_path(region_id: str, position: int) -> str:
    """Path of a WAL entry relative to the table root."""
    return f"_mem_wal/{region_id}/wal/{bitrev64_name(position)}.arrow"


def _decode_entry(data: bytes, position: int) -> WalEntry:
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    table = reader.read_all()
    meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    fence = meta.get("fence_sentinel", "").lower() == "true"
    generation = int(meta.get("generation", "0"))
    epoch = int(meta.get("writer_epoch", "0"))
    return WalEntry(position, generation, epoch, fence, table)


def read_wal_entry(storage: Storage, region_id: str, position: int) -> WalEntry | None | Exception:
    """Read one entry: the entry, ``None`` if absent, or the decode error if damaged."""
    data = storage.read_bytes(wal_entry_path(region_id, position))
    if data is None:
        return None
    try:
        return _decode_entry(data, position)
    except (pa.ArrowInvalid, pa.ArrowException, ValueError, OSError) as err:
        return err


def replay_wal_tail(
    storage: Storage,
    region_id: str,
    replay_after: int,
    current_generation: int,
    cache: MutableMapping[tuple[str, int], WalEntry] | None = None,
) -> WalTail:
    """Replay a region's WAL tail.

    Args:
        storage: The table's storage.
        region_id: Region UUID string.
        replay_after: Last WAL position covered by a flushed generation.
        current_generation: The region manifest's active generation.
        cache: Decoded entries by ``(region, position)``, reused across refreshes
            (entries are immutable once written).

    Returns:
        The entries to replay, oldest first.

    Raises:
        MemWalCorruptionError: A damaged entry is followed by a valid one.
    """
    entries: list[WalEntry] = []
    skipped: list[int] = []
    torn: int | None = None
    fenced: list[int] = []
    max_epoch = 0
    pos = replay_after + 1
    while True:
        cached = cache.get((region_id, pos)) if cache is not None else None
        result: WalEntry | None | Exception = cached if cached is not None else read_wal_entry(storage, region_id, pos)
        if result is None:
            break
        if isinstance(result, Exception):
            following = read_wal_entry(storage, region_id, pos + 1)
            path = storage.child_uri(wal_entry_path(region_id, pos))
            if isinstance(following, WalEntry):
                msg = (
                    f"region {region_id}: WAL entry at position {pos} ({path}) is damaged "
                    f"but position {pos + 1} is valid: {result}"
                )
                raise MemWalCorruptionError(msg) from result
            log.warning(
                "region %s: last WAL entry at position %d (%s) is torn; treated as not committed: %s",
                region_id,
                pos,
                path,
                result,
            )
            torn = pos
            break
        if cache is not None:
            cache[(region_id, pos)] = result
        if result.writer_epoch < max_epoch and not result.fence:
            log.warning(
                "region %s: WAL entry at position %d has writer epoch %d after epoch %d was claimed: "
                "written by a fenced writer, ignored",
                region_id,
                pos,
                result.writer_epoch,
                max_epoch,
            )
            fenced.append(pos)
        elif result.fence or result.generation < current_generation:
            skipped.append(pos)
        else:
            entries.append(result)
        max_epoch = max(max_epoch, result.writer_epoch)
        pos += 1
    return WalTail(tuple(entries), replay_after + 1, pos - 1, tuple(skipped), torn, tuple(fenced))
