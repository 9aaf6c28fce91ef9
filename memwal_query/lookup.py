"""Point lookups by primary key across LSM levels, newest source first.

For each key: the region it routes to (region pruning), then that region's
MemTable, then its unmerged generations newest first (each skipped when its bloom
filter rules the key out), and finally the base table (one filtered scan for all
keys still unresolved; Lance uses a scalar index on the key when there is one).
The first version found decides: a live row is returned, a tombstone hides the
key. Nothing here needs the snapshot's merge (the base mask), so a lookup on a
freshly opened table is cheap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError, MemWalCorruptionError
from memwal_query.format.bloom import BloomFilter, key_hash, read_bloom_filter
from memwal_query.format.wal import TOMBSTONE
from memwal_query.merge import first_of_group
from memwal_query.planner.routing import route_keys
from memwal_query.snapshot.model import GenerationSource, RegionSnapshot
from memwal_query.view.table_view import TableView

__all__ = ["LookupStats", "LookupResult", "normalize_keys", "lookup"]

log = logging.getLogger("memwal_query")


@dataclass
class LookupStats:
    """What a lookup touched."""

    keys: int = 0
    regions_searched: int = 0
    regions_pruned: int = 0
    memtable_hits: int = 0
    generations_scanned: int = 0
    generations_skipped_by_bloom: int = 0
    generation_hits: int = 0
    base_keys: int = 0
    base_hits: int = 0
    deleted: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _key_array(values: list[Any], typ: pa.DataType) -> pa.Array:
    """``values`` as an array of ``typ``; a value that would change (1.5 as an integer) raises.

    ``pa.array(values, type)`` truncates floats into integer types silently: a lookup of
    1.5 would return key 1.
    """
    arr = pa.array(values, typ)
    floats = [v for v in values if isinstance(v, float | np.floating)]
    if floats and not pa.types.is_floating(typ):
        pa.array(floats).cast(typ)  # safe cast: ArrowInvalid on truncation
    return arr


def normalize_keys(keys: Any, schema: pa.Schema, pk: Sequence[str]) -> pa.Table:
    """Keys as a table of the primary-key columns, cast to their types, deduplicated.

    Accepts a scalar or list (single-column keys), a pyarrow Array / ChunkedArray,
    a StructArray or pyarrow Table / dict of columns (composite keys).

    Raises:
        InvalidArgumentError: Wrong columns, or values that do not fit the key type.
    """
    types = {k: schema.field(k).type for k in pk}
    if isinstance(keys, pa.Table):
        table = keys
    elif isinstance(keys, dict):
        table = pa.table(keys)
    elif isinstance(keys, pa.StructArray):
        table = pa.Table.from_struct_array(keys)
    elif isinstance(keys, (pa.Array, pa.ChunkedArray)):
        if len(pk) != 1:
            msg = f"the key has columns {list(pk)}: pass a struct array, table or dict of columns"
            raise InvalidArgumentError(msg)
        table = pa.table({pk[0]: keys})
    else:
        if len(pk) != 1:
            msg = f"the key has columns {list(pk)}: pass a struct array, table or dict of columns"
            raise InvalidArgumentError(msg)
        values = list(keys) if isinstance(keys, (list, tuple, set, np.ndarray)) else [keys]
        try:
            table = pa.table({pk[0]: _key_array(values, types[pk[0]])})
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as err:
            msg = f"lookup keys {values[:5]!r} do not fit the key column {pk[0]!r} of type {types[pk[0]]}: {err}"
            raise InvalidArgumentError(msg) from err
    missing = [k for k in pk if k not in table.column_names]
    if missing:
        msg = f"lookup keys lack key column(s) {missing} (key: {list(pk)})"
        raise InvalidArgumentError(msg)
    cols = {}
    for k in pk:
        col = table.column(k)
        if col.type != types[k]:
            try:
                col = col.cast(types[k])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                msg = f"lookup key column {k!r} of type {col.type} cannot be compared with {types[k]}: {err}"
                raise InvalidArgumentError(msg) from err
        cols[k] = col
    out = pa.table(cols)
    if out.num_rows > 1:
        out = out.group_by(list(pk), use_threads=False).aggregate([])
        out = out.select(list(pk))
    return out


def _key_filter(keys: pa.Table, pk: Sequence[str]) -> pc.Expression:
    # Exact for one column; a superset (each column IN its values) for composite
    # keys, refined by a semi-join afterwards.
    expr: pc.Expression | None = None
    for k in pk:
        e = pc.field(k).isin(pc.unique(keys.column(k)))
        expr = e if expr is None else expr & e
    assert expr is not None
    return expr


def _semi(rows: pa.Table, keys: pa.Table, pk: Sequence[str]) -> pa.Table:
    if len(pk) == 1 or rows.num_rows == 0:
        return rows
    return rows.join(keys, keys=list(pk), join_type="left semi")


def _anti(keys: pa.Table, found: pa.Table, pk: Sequence[str]) -> pa.Table:
    if found.num_rows == 0 or keys.num_rows == 0:
        return keys
    if len(pk) == 1:
        hit = pc.is_in(keys.column(pk[0]), value_set=found.column(pk[0]).combine_chunks())
        return keys.filter(pc.invert(hit))
    return keys.join(found.select(list(pk)), keys=list(pk), join_type="left anti")


def _newest(rows: pa.Table, pk: Sequence[str], order: Sequence[str]) -> pa.Table:
    if rows.num_rows <= 1:
        return rows
    idx = pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in pk] + [(o, "descending") for o in order])
    s = rows.take(idx)
    return s.filter(pa.array(first_of_group([s.column(k) for k in pk])))


def _split_found(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    tomb = pc.fill_null(rows.column(TOMBSTONE), False)
    return rows.filter(pc.invert(tomb)), rows.filter(tomb)


class LookupResult(NamedTuple):
    """A lookup's rows and what it touched."""

    rows: pa.Table
    stats: LookupStats


def _bloom(gen: GenerationSource, view: TableView) -> BloomFilter | None:
    if gen.rebuilt_from_wal:
        return None  # rebuilt from the WAL: no bloom filter
    storage = view.storage
    rel = gen.uri[len(storage.uri) + 1 :] + "/bloom_filter.bin"
    cache = view.cache.blooms
    if gen.uri in cache:
        hit = cache[gen.uri]
        return hit if isinstance(hit, BloomFilter) else None
    try:
        bloom = read_bloom_filter(storage, rel)
    except MemWalCorruptionError as err:
        log.warning("%s; the generation is scanned instead", err)
        bloom = None
    cache[gen.uri] = bloom
    return bloom


class _Search:
    """One lookup in progress: the keys still unresolved, the rows found, the counts."""

    def __init__(self, view: TableView, want: pa.Table, read_cols: list[str], out_cols: list[str]) -> None:
        self.view = view
        self.pk = list(view.snapshot.primary_key)
        self.read_cols = read_cols
        self.out_cols = out_cols
        self.remaining = want
        self.parts: list[pa.Table] = []
        self.stats = LookupStats(keys=want.num_rows)
        self.type_names = [str(view.snapshot.schema.field(k).type) for k in self.pk]
        self.key_hashes: dict[tuple[Any, ...], int] = {}

    def found(self, rows: pa.Table, keys: pa.Table) -> pa.Table:
        """Record the newest version per key of ``rows``; the keys of ``keys`` still unresolved."""
        live, dead = _split_found(rows)
        self.stats.deleted += dead.num_rows
        self.parts.append(live.select(self.out_cols))
        return _anti(keys, rows, self.pk)

    def memtable(self, region: RegionSnapshot, rkeys: pa.Table) -> pa.Table:
        mem = region.memtable
        if mem is None or not mem.table.num_rows:
            return rkeys
        pk = self.pk
        m = _semi(mem.table.filter(_key_filter(rkeys, pk)), rkeys, pk)
        if not m.num_rows:
            return rkeys
        m = _newest(m, pk, ["_gen", "_seq"])
        self.stats.memtable_hits += m.num_rows
        return self.found(m, rkeys)

    def candidates(self, gen: GenerationSource, rkeys: pa.Table) -> pa.Table | None:
        """The keys the generation's bloom filter may hold (``None``: none of them)."""
        bloom = _bloom(gen, self.view)
        if bloom is None:
            return rkeys
        hashes = []
        for tup in zip(*[rkeys.column(k).to_pylist() for k in self.pk], strict=True):
            h = self.key_hashes.get(tup)
            if h is None:
                h = self.key_hashes[tup] = key_hash(tup, self.type_names)
            hashes.append(h)
        maybe = bloom.might_contain_hashes(hashes)
        if not maybe.any():
            self.stats.generations_skipped_by_bloom += 1
            return None
        return rkeys.filter(pa.array(maybe))

    def generation(self, gen: GenerationSource, rkeys: pa.Table) -> pa.Table:
        candidates = self.candidates(gen, rkeys)
        if candidates is None:
            return rkeys
        self.stats.generations_scanned += 1
        rows = gen.dataset.to_table(
            columns=list(dict.fromkeys(self.read_cols + [TOMBSTONE])),
            filter=_key_filter(candidates, self.pk),
            with_row_address=True,
        )
        rows = _semi(rows, candidates, self.pk)
        if rows.num_rows == 0:
            return rkeys
        rows = _newest(rows, self.pk, ["_rowaddr"])
        self.stats.generation_hits += rows.num_rows
        return self.found(rows, rkeys)

    def region(self, region: RegionSnapshot, rkeys: pa.Table) -> None:
        """Resolve ``rkeys`` in the region's MemTable, then its generations newest first."""
        pk = self.pk
        if len(pk) > 1:
            rkeys = _semi(rkeys, self.remaining, pk)
        else:
            rkeys = rkeys.filter(pc.is_in(rkeys.column(pk[0]), value_set=self.remaining.column(pk[0]).combine_chunks()))
        if rkeys.num_rows == 0:
            return
        self.stats.regions_searched += 1
        left = self.memtable(region, rkeys)
        for gen in sorted(region.generations, key=lambda g: g.generation, reverse=True):
            if left.num_rows == 0:
                break
            left = self.generation(gen, left)
        resolved = _anti(rkeys, left, pk) if left.num_rows else rkeys
        self.remaining = _anti(self.remaining, resolved, pk)

    def base(self) -> None:
        """The keys no newer level holds: one filtered scan of the base."""
        if not self.remaining.num_rows:
            return
        self.stats.base_keys = self.remaining.num_rows
        rows = self.view.snapshot.base.to_table(columns=self.read_cols, filter=_key_filter(self.remaining, self.pk))
        rows = _semi(rows, self.remaining, self.pk)
        self.stats.base_hits = rows.num_rows
        self.parts.append(rows.select(self.out_cols))


def lookup(view: TableView, keys: Any, columns: Sequence[str] | None = None) -> LookupResult:
    """Newest live row per key (absent when deleted or never written). See module docs."""
    t0 = time.perf_counter()
    snap = view.snapshot
    pk = list(snap.primary_key)
    schema = snap.schema
    out_cols = list(columns) if columns is not None else list(schema.names)
    unknown = [c for c in out_cols if c not in schema.names]
    if unknown:
        msg = f"unknown column(s) {unknown} in {snap.uri}"
        raise InvalidArgumentError(msg)
    want = normalize_keys(keys, schema, pk)
    search = _Search(view, want, list(dict.fromkeys(pk + out_cols)), out_cols)
    routed = route_keys(snap, view.region_values(), view.field_names(), want)  # None: every region
    for region in snap.regions:
        rkeys = routed.get(region.region_id) if routed is not None else search.remaining
        if rkeys is None or rkeys.num_rows == 0:
            search.stats.regions_pruned += 1
            continue
        search.region(region, rkeys)
    search.base()
    out_schema = pa.schema([schema.field(c) for c in out_cols])
    parts = search.parts
    result = pa.concat_tables([p.cast(out_schema) for p in parts]) if parts else out_schema.empty_table()
    search.stats.seconds = time.perf_counter() - t0
    return LookupResult(result, search.stats)
