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

import enum
import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import pyarrow as pa

from memwal_query.errors import MALFORMED, MemWalCorruptionError, one_line
from memwal_query.format.decode import MAX_VERSION, MAX_WAL_POSITION, bitrev64_name, parse_bitrev64_name
from memwal_query.format.paths import check_unlinked
from memwal_query.format.storage import Storage

__all__ = [
    "GEN_COLUMN",
    "LEVEL_COLUMN",
    "SEQ_COLUMN",
    "WalEntry",
    "WalTail",
    "GenerationWal",
    "wal_entry_path",
    "decode_wal_entry",
    "read_wal_entry",
    "replay_wal_tail",
    "scan_generations",
]

log = logging.getLogger("memwal_query")

TOMBSTONE = "_tombstone"
#: Columns memwal appends to MemTable rows and to the merge's key tables: the generation a
#: row belongs to and its order within it. Named apart from what a table's own columns are
#: likely called (``open_table`` refuses a table with a column of these names).
GEN_COLUMN = "_memwal_gen"
SEQ_COLUMN = "_memwal_seq"
#: The merge's key-table column of a row's level: its index among the region's generations
#: (-1: the MemTable).
LEVEL_COLUMN = "_memwal_level"


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
    #: A position missing while a later one exists, where the replay stopped: entries a
    #: collector removed after a newer manifest covered them (read the region again with it),
    #: else a damaged WAL (:func:`gap_error`)
    gap_position: int | None = None

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
    """Read one entry: the entry, ``None`` if absent, or the error naming the file if damaged.

    Raises:
        MemWalCorruptionError: The file lies under a symlink (local disk).
    """
    rel = wal_entry_path(region_id, position)
    check_unlinked(storage, region_id, rel, "WAL entry")
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


class _Missing(enum.Enum):
    GAP = "a missing WAL position followed by an existing one"


def _end_or_gap(storage: Storage, region_id: str, pos: int) -> WalEntry | Exception | _Missing | None:
    """After position ``pos`` was found missing: None at the WAL's end; the entry at ``pos``
    (or its decoding error) when it was written meanwhile (one writer writes positions in
    order); else, when a later position exists, :attr:`_Missing.GAP`."""
    if read_wal_entry(storage, region_id, pos + 1) is None:
        return None
    again = read_wal_entry(storage, region_id, pos)
    return again if again is not None else _Missing.GAP


def gap_error(storage: Storage, region_id: str, pos: int) -> MemWalCorruptionError:
    """The error of a gap at ``pos`` that a newer region manifest does not explain: replaying
    up to it would leave out the entries after it without a word."""
    path = storage.child_uri(wal_entry_path(region_id, pos))
    msg = (
        f"region {region_id}: WAL entry {path} (position {pos}) is missing, but position {pos + 1} after it "
        "exists: the WAL tail has a gap (its later entries would be left out); consistency='eventual' reads "
        "the flushed generations only"
    )
    return MemWalCorruptionError(msg)


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
        MemWalCorruptionError: A damaged entry is followed by a valid one. A missing one
            followed by any ends the replay at :attr:`WalTail.gap_position`.
    """
    entries: list[WalEntry] = []
    skipped: list[int] = []
    torn: int | None = None
    gap: int | None = None
    fenced: list[int] = []
    max_epoch = 0
    pos = replay_after + 1
    reused: int | None = None  # the last position read from ``cache``
    while pos <= MAX_WAL_POSITION:
        cached = cache.get((region_id, pos)) if cache is not None else None
        reused = pos if cached is not None else reused
        result: WalEntry | None | Exception = cached if cached is not None else read_wal_entry(storage, region_id, pos)
        if result is None:
            found = _end_or_gap(storage, region_id, pos)
            if found is _Missing.GAP:
                gap = pos
            if found is None or found is _Missing.GAP:
                break
            result = found
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
    if _forgot_gone(storage, region_id, reused, cache):
        return replay_wal_tail(storage, region_id, replay_after, current_generation, cache)
    return WalTail(tuple(entries), replay_after + 1, pos - 1, tuple(skipped), torn, tuple(fenced), gap)


def _forgot_gone(
    storage: Storage, region_id: str, reused: int | None, cache: MutableMapping[tuple[str, int], WalEntry] | None
) -> bool:
    """Whether the last entry a replay took from ``cache`` (at ``reused``) is gone from
    storage (the table restored from an older copy): the region's cached entries are then
    forgotten, to be read again."""
    if cache is None or reused is None or storage.exists(wal_entry_path(region_id, reused)):
        return False
    for key in [k for k in list(cache) if k[0] == region_id]:
        cache.pop(key, None)
    return True


@dataclass(frozen=True)
class GenerationWal:
    """What a region's WAL still holds of one flushed generation (:func:`scan_generations`).

    Attributes:
        generation: The flushed generation.
        entries: Its WAL entries, oldest first (fence entries and entries of fenced
            writers excluded).
        expected_rows: Rows the flushed generation holds, tombstones and rows superseded
            inside it included (the region manifest's ``physical_rows``): a generation
            holds exactly the rows of its WAL entries.
        damaged_positions: Undecodable WAL entries met while scanning (their generation
            is unknown).
    """

    generation: int
    entries: tuple[WalEntry, ...]
    expected_rows: int
    damaged_positions: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        """Rows in :attr:`entries`."""
        return sum(e.num_rows for e in self.entries)

    @property
    def complete(self) -> bool:
        """Whether the entries hold every row of the generation (it can be rebuilt from them)."""
        return self.rows == self.expected_rows and (self.expected_rows > 0 or not self.entries)

    @property
    def positions(self) -> tuple[int, int] | None:
        """First and last WAL position of :attr:`entries` (None when there is none)."""
        return (self.entries[0].position, self.entries[-1].position) if self.entries else None

    def describe(self) -> str:
        """One clause: which WAL positions hold the generation, or what is missing.

        Example:
            >>> GenerationWal(3, (), 40).describe()
            'the WAL holds 0 of its 40 rows (no entry of generation 3 left)'
        """
        span = self.positions
        where = f"positions {span[0]}..{span[1]}" if span else f"no entry of generation {self.generation} left"
        if self.complete:
            return f"WAL {where} hold all its {self.expected_rows} rows"
        damaged = f"; damaged WAL positions {list(self.damaged_positions)}" if self.damaged_positions else ""
        if self.expected_rows == 0:
            return (
                f"the region manifest records no row count for it, so the WAL's {self.rows} rows ({where}) "
                f"cannot be checked{damaged}"
            )
        return f"the WAL holds {self.rows} of its {self.expected_rows} rows ({where}{damaged})"


def _listed_positions(storage: Storage, region_id: str) -> list[int]:
    names = storage.list_dir(f"_mem_wal/{region_id}/wal")
    found = (parse_bitrev64_name(n) for n, is_dir in names if not is_dir and n.endswith(".arrow"))
    return sorted(p for p in found if p is not None)


def scan_generations(
    storage: Storage,
    region_id: str,
    expected_rows: Mapping[int, int],
    cache: MutableMapping[tuple[str, int], WalEntry] | None = None,
) -> dict[int, GenerationWal]:
    """Find the WAL entries of some flushed generations of a region.

    Every WAL entry records the generation of the MemTable it was written to, and the
    spec keeps entries until their generation is merged, so a flushed generation whose
    directory is lost can be rebuilt from them. One listing of the WAL folder, then the
    entries are read oldest first (``cache`` reuses decoded ones) up to the first entry
    of a generation newer than every generation asked for. Fence entries and entries of
    fenced writers (as in :func:`replay_wal_tail`) are left out.

    Args:
        storage: The table's storage.
        region_id: Region UUID string.
        expected_rows: Generation -> rows the flushed generation holds (the region
            manifest's ``physical_rows``).
        cache: Decoded entries by ``(region, position)``.

    Returns:
        One :class:`GenerationWal` per generation asked for.
    """
    wanted = set(expected_rows)
    found: dict[int, list[WalEntry]] = {g: [] for g in wanted}
    damaged: list[int] = []
    max_epoch = 0
    for pos in _listed_positions(storage, region_id) if wanted else []:
        cached = cache.get((region_id, pos)) if cache is not None else None
        entry = cached if cached is not None else read_wal_entry(storage, region_id, pos)
        if entry is None:
            continue  # removed since the listing
        if isinstance(entry, Exception):
            damaged.append(pos)
            continue
        if cache is not None:
            cache[(region_id, pos)] = entry
        fenced = entry.writer_epoch < max_epoch and not entry.fence
        max_epoch = max(max_epoch, entry.writer_epoch)
        if entry.fence or fenced:
            continue
        if entry.generation > max(wanted):
            break  # a valid writer's generations never go back
        if entry.generation in wanted:
            found[entry.generation].append(entry)
    return {g: GenerationWal(g, tuple(found[g]), expected_rows[g], tuple(damaged)) for g in sorted(wanted)}
