"""Change tokens: a storable string that says which state of a table a snapshot showed.

A token records what identifies a snapshot's rows, region by region, so that
:func:`memwal_query.changes.changes` can later find what was written after it without
the old snapshot: the base version, and per region the region manifest version and
writer epoch, the merged generation, the highest generation flushed or merged, and
the last WAL position the snapshot covered (the WAL tail read by a strong snapshot, or
the position the flushed generations cover for an eventual one). Every write after
the token is in a WAL entry after that position, and it ends up in a generation above
that highest generation or in the WAL tail of a newer snapshot: those are what a
change feed reads.

The token also carries a fingerprint of the table's primary key (names and types), and
the id of the MemWAL index entry of the base version it was taken at (Lance gives every
rewrite of the index a new random id): a token is refused by a table with another key,
and by a table whose base version of that number holds another index (the check needs
that version's manifest), or whose region lists another directory for the generation the
token names (directory names start with random digits; region ids follow the region spec,
so two tables sharded alike share them). After ``cleanup_old_versions`` removed the
version, a token of a region that had flushed no generation is checked by its key only.

Format: ``mwc1.`` followed by URL-safe base64 (no padding) of zlib-compressed compact
JSON. Nothing in it is secret; it names region ids and version numbers.

Example:
    >>> token = ChangeToken("a" * 16, "", 3, "strong", (RegionMark("r1", 2, 1, 0, 1, 7),))
    >>> text = token.encode()
    >>> text.startswith("mwc1.") and ChangeToken.decode(text) == token
    True
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from memwal_query.errors import MALFORMED, InvalidArgumentError, one_line
from memwal_query.format.decode import decode_index_entries
from memwal_query.format.names import lance_manifest_file_name
from memwal_query.format.storage import Storage
from memwal_query.snapshot.model import RegionSnapshot, Snapshot

__all__ = [
    "RegionMark",
    "ChangeToken",
    "token_of",
    "stored_token",
    "generation_path",
    "in_process_regions",
    "fingerprint",
    "index_anchor",
    "storage_of",
    "MEMWAL_INDEX",
]

PREFIX = "mwc1."
#: The Lance index entry holding the MemWAL index.
MEMWAL_INDEX = "__lance_mem_wal"
#: Longest token text accepted (a table with thousands of regions stays far below).
MAX_TOKEN_CHARS = 4 << 20
_MAX_JSON_BYTES = 64 << 20
_BAD_TOKEN: tuple[type[BaseException], ...] = (*MALFORMED, zlib.error)


@dataclass(frozen=True)
class RegionMark:
    """What one region held when the token was taken.

    Attributes:
        region_id: The region UUID string.
        manifest_version: Its region manifest version (0: no manifest yet).
        writer_epoch: The writer epoch of that manifest.
        merged_generation: Generations up to this one were in the base.
        flushed_through: The highest generation flushed or merged: newer writes land in
            higher generations.
        wal_position: The last WAL position whose rows the snapshot showed.
        generation_path: The directory of generation ``flushed_through`` ("" when none):
            its name starts with 8 random hex digits, so it tells this table from another
            whose regions have the same ids (a region id is derived from the region spec).
    """

    region_id: str
    manifest_version: int
    writer_epoch: int
    merged_generation: int
    flushed_through: int
    wal_position: int
    generation_path: str = ""


@dataclass(frozen=True)
class ChangeToken:
    """A decoded change token (see the module docs).

    Attributes:
        fingerprint: Hash of the primary key's column names and types.
        anchor: Id of the MemWAL index entry of ``base_version`` ("" when unknown).
        base_version: The base table version.
        consistency: ``"strong"`` or ``"eventual"``.
        regions: One mark per region, sorted by region id.
    """

    fingerprint: str
    anchor: str
    base_version: int
    consistency: str
    regions: tuple[RegionMark, ...]

    def region(self, region_id: str) -> RegionMark | None:
        """The mark of ``region_id``; None when the region did not exist yet."""
        return next((r for r in self.regions if r.region_id == region_id), None)

    def encode(self) -> str:
        """The token as a string that can be stored (``mwc1.`` + base64)."""
        body = {
            "f": self.fingerprint,
            "a": self.anchor,
            "b": self.base_version,
            "c": self.consistency,
            "r": [
                [r.region_id, r.manifest_version, r.writer_epoch, r.merged_generation]
                + [r.flushed_through, r.wal_position, r.generation_path]
                for r in self.regions
            ],
        }
        raw = zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 9)
        return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, text: object) -> ChangeToken:
        """Parse a token made by :meth:`encode`.

        Raises:
            InvalidArgumentError: ``text`` is not a change token (one line saying why).
        """
        if not isinstance(text, str):
            msg = f"a change token must be a string, got {type(text).__name__}"
            raise InvalidArgumentError(msg)
        shown = text if len(text) <= 40 else text[:37] + "..."
        if not text.startswith(PREFIX) or len(text) > MAX_TOKEN_CHARS:
            msg = f"{shown!r} is not a memwal change token (those start with {PREFIX!r}: see Table.change_token)"
            raise InvalidArgumentError(msg)
        try:
            body = text[len(PREFIX) :]
            data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            inflater = zlib.decompressobj()
            raw = inflater.decompress(data, _MAX_JSON_BYTES)
            if inflater.unconsumed_tail:
                raise ValueError("too large")
            return _from_json(json.loads(raw))
        except _BAD_TOKEN as err:
            msg = f"{shown!r} is not a valid memwal change token: {one_line(err)}"
            raise InvalidArgumentError(msg) from err


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise ValueError(f"expected a version number, got {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _from_json(body: Any) -> ChangeToken:
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    consistency = _str(body["c"])
    if consistency not in ("strong", "eventual"):
        raise ValueError(f"unknown consistency {consistency!r}")
    regions = []
    for item in body["r"]:
        if not isinstance(item, list) or len(item) not in (6, 7):  # 6: tokens taken before the path was recorded
            raise ValueError(f"bad region entry {item!r}")
        version, epoch, merged, flushed, position = (_int(v) for v in item[1:6])
        path = _str(item[6]) if len(item) == 7 else ""
        regions.append(RegionMark(_str(item[0]), version, epoch, merged, flushed, position, path))
    return ChangeToken(_str(body["f"]), _str(body["a"]), _int(body["b"]), consistency, tuple(regions))


def fingerprint(schema: pa.Schema, primary_key: tuple[str, ...]) -> str:
    """A short hash of the primary key's column names and types (other columns may be added later).

    Example:
        >>> s = pa.schema([("id", pa.int64()), ("v", pa.string())])
        >>> fingerprint(s, ("id",)) == fingerprint(s.append(pa.field("w", pa.int8())), ("id",))
        True
        >>> fingerprint(s, ("id",)) == fingerprint(s, ("v",))
        False
    """
    text = json.dumps([[k, str(schema.field(k).type)] for k in primary_key])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def storage_of(snapshot: Snapshot) -> Storage:
    """A :class:`Storage` at the snapshot's table, with the options its base was opened with."""
    options: Mapping[str, str] | None = snapshot.base.initial_storage_options
    return Storage.open(snapshot.uri, options)


def index_anchor(storage: Storage, version: int) -> str | None:
    """The id of the MemWAL index entry in base version ``version``; None when it cannot be read.

    The version's manifest may have been cleaned up (``cleanup_old_versions``); the
    check it serves is then skipped.
    """
    data = storage.read_bytes(f"_versions/{lance_manifest_file_name(version)}")
    if data is None:
        return None
    try:
        entries = decode_index_entries(data)
    except MALFORMED:
        return None
    return next((e.uuid for e in entries if e.name == MEMWAL_INDEX), "")


def _wal_position(region: RegionSnapshot) -> int:
    m = region.manifest
    if m is None:
        return 0
    if region.wal_tail is not None:  # strong: every entry read (torn ones excluded)
        return max(region.wal_tail.last_position, m.replay_after_wal_position)
    return m.replay_after_wal_position


def region_mark(region: RegionSnapshot) -> RegionMark:
    """The mark of one region of a snapshot.

    A generation the snapshot left out (``on_missing_generation="skip"``) was not shown:
    the mark stops below the first such one, so a change feed reads it and what follows.
    """
    m = region.manifest
    flushed = max((g.generation for g in m.flushed_generations), default=0) if m is not None else 0
    through = max(flushed, region.merged_generation)
    left_out = [s.generation for s in region.skipped if s.missing]
    if left_out:
        through = min(through, min(left_out) - 1)
    return RegionMark(
        region.region_id,
        m.version if m is not None else 0,
        m.writer_epoch if m is not None else 0,
        region.merged_generation,
        through,
        _wal_position(region),
        generation_path(region, through),
    )


def generation_path(region: RegionSnapshot, generation: int) -> str:
    """The directory of a flushed generation the region manifest lists ("" when it lists none)."""
    m = region.manifest
    listed = m.flushed_generations if m is not None else ()
    return next((g.path for g in listed if g.generation == generation), "")


def in_process_regions(snapshot: Snapshot) -> list[str]:
    """Regions whose MemTable holds rows handed in with ``open_table(live=...)``."""
    return [r.region_id for r in snapshot.regions if r.memtable is not None and r.memtable.live]


def token_of(snapshot: Snapshot, storage: Storage | None = None) -> ChangeToken:
    """The change token of a snapshot (one storage read: the base manifest's index id)."""
    storage = storage or storage_of(snapshot)
    return ChangeToken(
        fingerprint(snapshot.schema, snapshot.primary_key),
        index_anchor(storage, snapshot.base_version) or "",
        snapshot.base_version,
        snapshot.consistency,
        tuple(region_mark(r) for r in sorted(snapshot.regions, key=lambda r: r.region_id)),
    )


def stored_token(snapshot: Snapshot, storage: Storage | None = None) -> str:
    """The token text of a snapshot, refused when it holds in-process rows (``live=``).

    Those rows are in no WAL entry: a token cannot say what they were, so a change feed from
    it could not take them back (pass the :class:`~memwal_query.Table` itself instead).

    Raises:
        InvalidArgumentError: The snapshot holds rows handed in with ``live=``.
    """
    regions = in_process_regions(snapshot)
    if regions:
        msg = (
            f"{snapshot.uri}: region {regions[0]} holds rows handed in with live= that are in no WAL entry: "
            "a change token cannot say what they were; pass this Table to changes() instead, or take "
            "the token of a snapshot opened without live="
        )
        raise InvalidArgumentError(msg)
    return token_of(snapshot, storage).encode()
