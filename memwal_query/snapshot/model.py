"""The snapshot model: one base table version and every region's sources, frozen.

Values only (no I/O): :mod:`memwal_query.snapshot.load` builds them from storage; the
merge (:mod:`memwal_query.merge`), the planner and the access paths read them.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import lance
import pyarrow as pa

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.inline_snapshots import InlineRegion
from memwal_query.format.model import MemWalIndex, RegionManifest
from memwal_query.format.wal import WalTail

__all__ = [
    "Consistency",
    "MissingGenerationPolicy",
    "MISSING_GENERATION_POLICIES",
    "LiveMemTable",
    "GenerationSource",
    "SkippedGeneration",
    "MemTableSource",
    "IN_PROCESS",
    "RegionSnapshot",
    "Snapshot",
    "check_missing_generation_policy",
    "check_version",
    "primary_key_of",
]

Consistency = Literal["strong", "eventual"]

#: What opening does with a flushed generation that is not merged but cannot be read
#: (see :func:`memwal_query.open_table`).
MissingGenerationPolicy = Literal["recover", "error", "skip"]

MISSING_GENERATION_POLICIES: tuple[str, ...] = ("recover", "error", "skip")

PK_META = b"lance-schema:unenforced-primary-key"

PK_POS_META = b"lance-schema:unenforced-primary-key:position"


@runtime_checkable
class LiveMemTable(Protocol):
    """An in-process MemTable handed to :func:`memwal_query.open_table`.


    A writer in the same process exposes what it has buffered but not yet made
    durable, so it reads its own writes. Rows rank above every stored level of the
    region with a lower or equal generation; later rows win over earlier ones.
    ``_tombstone`` (bool) marks deletes; a missing column means no deletes.


    Example:
        >>> import pyarrow as pa
        >>> class Buffered:
        ...     region_id = "00000000-0000-0000-0000-000000000001"
        ...     generation = 1
        ...     def to_batches(self):
        ...         return [pa.record_batch({"id": [1]})]
        >>> isinstance(Buffered(), LiveMemTable)
        True
    """

    @property
    def region_id(self) -> str: ...

    @property
    def generation(self) -> int: ...

    def to_batches(self) -> Iterable[pa.RecordBatch]: ...


@dataclass(frozen=True)
class GenerationSource:
    """A flushed generation that is not merged into the base yet."""

    region_id: str
    generation: int
    uri: str
    dataset: lance.LanceDataset = field(repr=False, compare=False)
    num_rows: int
    #: Where the generation's directory was, when it is lost and ``dataset`` holds its rows
    #: rebuilt from the region's WAL (:mod:`memwal_query.recovery`); empty otherwise.
    lost_uri: str = ""
    #: First and last WAL position the rebuilt rows come from.
    wal_positions: tuple[int, int] | None = None
    #: The generation's directory when it was written before the base's columns changed and
    #: ``dataset`` holds its rows with the current columns (:mod:`memwal_query.snapshot.evolution`).
    conformed_from: str = ""

    @property
    def rebuilt_from_wal(self) -> bool:
        """True when the rows come from the WAL because the directory is lost."""
        return bool(self.lost_uri)


@dataclass(frozen=True)
class SkippedGeneration:
    """A generation listed by the region manifest that the snapshot does not read."""

    region_id: str
    generation: int
    reason: str
    #: The generation's directory (empty for merged generations, which are not opened).
    uri: str = ""
    #: Not merged, yet unreadable: unless a retry or the WAL restores them, its rows are
    #: missing from the snapshot (:mod:`memwal_query.recovery`).
    missing: bool = False


#: How :attr:`MemTableSource.origin` names rows handed in with ``open_table(live=...)``.
IN_PROCESS = "in-process"


@dataclass(frozen=True)
class MemTableSource:
    """Rows of live MemTables: the replayed WAL tail and/or in-process batches.


    ``table`` has the base columns plus ``_tombstone``, ``_gen`` (int64) and
    ``_seq`` (uint64, larger = newer inside a generation).
    """

    region_id: str
    table: pa.Table = field(repr=False, compare=False)
    origin: str
    wal_positions: tuple[int, int] | None
    generations: tuple[int, ...]

    @property
    def live(self) -> bool:
        """True when some rows were handed in with ``open_table(live=...)`` (in no WAL entry)."""
        return IN_PROCESS in self.origin


@dataclass(frozen=True)
class RegionSnapshot:
    """One region as the snapshot sees it."""

    region_id: str
    manifest: RegionManifest | None
    merged_generation: int
    generations: tuple[GenerationSource, ...]
    skipped: tuple[SkippedGeneration, ...]
    memtable: MemTableSource | None
    wal_tail: WalTail | None = field(repr=False, compare=False, default=None)
    #: The name its generations' ranking is kept on this machine under, when it can be
    #: (``memwal_query.snapshot.kept_ranks``; typed loosely: the model imports no kept file).
    ranks_name: object = field(repr=False, compare=False, default=None)

    @property
    def spec_id(self) -> int:
        """The region spec id (0 = manual region)."""
        return self.manifest.spec_id if self.manifest is not None else 0


@dataclass(frozen=True)
class Snapshot:
    """A frozen view of a MemWAL table: base version + per-region sources."""

    uri: str
    base_version: int
    base: lance.LanceDataset = field(repr=False, compare=False)
    schema: pa.Schema = field(repr=False, compare=False)
    primary_key: tuple[str, ...]
    index: MemWalIndex = field(repr=False, compare=False)
    regions: tuple[RegionSnapshot, ...]
    consistency: Consistency
    consistency_source: str
    inline_regions: tuple[InlineRegion, ...] = ()
    #: True when every region was read as of one instant (strong reads: a pass after
    #: reading found no region's WAL grown and no new region); False for eventual reads
    #: and for strong reads of a table whose writers kept every pass from settling.
    consistent_cut: bool = False
    #: How unmerged generations that cannot be read were handled (``open_table``).
    on_missing_generation: MissingGenerationPolicy = "recover"
    #: Which Lance field each column path of the base is (a digest): a column dropped and
    #: added again, or renamed, keeps its data files but not its field id.
    fields_tag: str = ""

    @property
    def columns_mark(self) -> bytes:
        """A digest of the base's columns: their Arrow schema and which Lance field each is (a
        column dropped and added again has the same schema, not the same field: what rows
        conformed to the old one held is not the new one's)."""
        schema = self.schema.serialize().to_pybytes()
        return hashlib.sha1(self.fields_tag.encode() + schema, usedforsecurity=False).digest()

    @property
    def cache_source(self) -> str:
        """The base's name in the cache of decoded columns (columns are cached by name)."""
        return f"{self.uri}#fields={self.fields_tag}" if self.fields_tag else self.uri


def primary_key_of(schema: pa.Schema) -> tuple[str, ...]:
    """Primary key columns declared by Lance field metadata, in key order."""
    found: list[tuple[int, int, str]] = []
    for i, f in enumerate(schema):
        meta = f.metadata or {}
        if meta.get(PK_META, b"").lower() == b"true":
            pos = int(meta.get(PK_POS_META, str(i).encode()))
            found.append((pos, i, f.name))
    return tuple(name for _, _, name in sorted(found))


def check_missing_generation_policy(value: object) -> None:
    """Raise :class:`InvalidArgumentError` unless ``value`` is a :data:`MissingGenerationPolicy`."""
    if value not in MISSING_GENERATION_POLICIES:
        msg = f"on_missing_generation must be 'recover', 'error' or 'skip', got {value!r}"
        raise InvalidArgumentError(msg)


def check_version(uri: str, value: object) -> int | None:
    """``value`` as a base version number (None: the latest); :class:`InvalidArgumentError` otherwise.

    Example:
        >>> check_version("t", 3), check_version("t", None)
        (3, None)
        >>> check_version("t", "3")
        Traceback (most recent call last):
        ...
        memwal_query.errors.InvalidArgumentError: t: version must be a base version number (an int >= 1), got '3'
    """
    if value is None:
        return None
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # ints and numpy ints, not floats or strings
    except TypeError:
        number = 0
    if isinstance(value, bool) or number < 1:
        msg = f"{uri}: version must be a base version number (an int >= 1), got {value!r}"
        raise InvalidArgumentError(msg)
    return number
