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

from memwal_query.errors import MALFORMED, MemWalCorruptionError, one_line
from memwal_query.format.decode import MAX_VERSION, MAX_WAL_POSITION, bitrev64_name
from memwal_query.format.storage import Storage

__all__ = ["WalEntry", "WalTail", "wal_entry_path", "decode_wal_entry", "read_wal_entry", "replay_wal_tail"]

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


def _meta_int(meta: dict[str, str], key: str, high: int) -> int:
    text = meta.get(key, "0")
    if len(text) > 20 or not text.isascii() or not text.isdigit() or int(text) > high:
        msg = f"schema metadata {key}={text[:40]!r} is not an integer in 0..{high}"
        raise ValueError(msg)
    return int(text)


def decode_wal_entry(data: bytes, position: int) -> WalEntry:
    """Decode one WAL entry (an Arrow IPC stream file).

    The table is fully validated (offsets, UTF-8), so damaged bytes fail here and
    not later inside a compute kernel.

    Args:
        data: The whole file.
        position: Its WAL position (from the file name).

    Returns:
        The decoded entry.

    Raises:
        ValueError: Not a valid Arrow IPC stream, or bad ``generation`` /
            ``writer_epoch`` / ``fence_sentinel`` schema metadata.
        pyarrow.ArrowException: Arrow rejected the stream in another way.
    """
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    table = reader.read_all()
    table.validate(full=True)
    meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    fence = meta.get("fence_sentinel", "").lower() == "true"
    generation = _meta_int(meta, "generation", MAX_VERSION)
    epoch = _meta_int(meta, "writer_epoch", (1 << 64) - 1)
    return WalEntry(position, generation, epoch, fence, table)


def read_wal_entry(storage: Storage, region_id: str, position: int) -> WalEntry | None | MemWalCorruptionError:
    """Read one entry: the entry, ``None`` if absent, or the error naming the file if damaged."""
    rel = wal_entry_path(region_id, position)
    data = storage.read_bytes(rel)
    if data is None:
        return None
    try:
        return decode_wal_entry(data, position)
    except (*MALFORMED, pa.ArrowException) as err:
        msg = f"region {region_id}: WAL entry {storage.child_uri(rel)} does not decode: {one_line(err)}"
        error = MemWalCorruptionError(msg)
        error.__cause__ = err
        return error


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
    while pos <= MAX_WAL_POSITION:
        cached = cache.get((region_id, pos)) if cache is not None else None
        result: WalEntry | None | Exception = cached if cached is not None else read_wal_entry(storage, region_id, pos)
        if result is None:
            break
        if isinstance(result, Exception):
            following = read_wal_entry(storage, region_id, pos + 1)
            path = storage.child_uri(wal_entry_path(region_id, pos))
            if isinstance(following, WalEntry):
                msg = f"{result} (position {pos}), but position {pos + 1} after it is valid"
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
