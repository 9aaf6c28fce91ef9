"""Point lookups by primary key across LSM levels, resolved in memory, then fetched.

The rows come back in the order of the keys asked for (a key asked twice, once).

For each key: the region it routes to (region pruning), then the snapshot's
in-memory index of the region's newer levels (``merge.NewerKeys``: the newest
version of every key in its unmerged generations and MemTable, built once by the
merge at open). A key found there is decided without I/O: a tombstone hides it, a
MemTable row comes from memory, a generation row is fetched by its row address
(one ``take`` per generation touched, whatever the number of keys). Only the keys
no newer level holds go to the base, in one filtered read that Lance serves from
a scalar index on the key when there is one. The cost therefore follows the keys
asked for, not the number of generations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import MemWalError, says_missing
from memwal_query.format.lance_open import base_read_error, lance_message
from memwal_query.format.nested import as_schema
from memwal_query.format.scratch import scratch
from memwal_query.format.wal import LEVEL_COLUMN, SEQ_COLUMN, TOMBSTONE
from memwal_query.lookup_keys import normalize_keys
from memwal_query.lookup_rows import (
    MATRIX_MIN_GENERATIONS,
    RegionRows,
    generation_failed,
    held_rows,
    region_rows,
    take_held,
)
from memwal_query.planner.key_match import key_filter, lance_key_filter, of_keys
from memwal_query.planner.lance_filter import quote_name
from memwal_query.planner.routing import route_keys
from memwal_query.scan.fragment import check_projection, column_list
from memwal_query.snapshot.model import GenerationSource, RegionSnapshot
from memwal_query.view.table_view import TableView

__all__ = ["LookupStats", "LookupResult", "lookup"]

_READERS = 4  # generation takes and the base read running at once


@dataclass
class LookupStats:
    """What a lookup touched.

    ``memtable_hits`` / ``generation_hits``: keys whose newest version is in a MemTable /
    an unmerged generation (tombstones included; ``deleted`` counts those). Newer levels are
    resolved in memory: ``generations_scanned`` counts the generations read through Lance
    (one ``take`` each), ``generations_from_memory`` those served from their rows held in
    memory (small generations, read whole once: ``LOOKUP_ROWS_BUDGET``), and
    ``generations_skipped_by_bloom`` stays 0 (no bloom filter is consulted).
    ``base_keys``: keys sent to the base in its one read; ``base_hits``: rows it returned.
    ``regions_pruned``: regions given no key, by their spec values or because the in-memory
    key index shows no newer version of any key asked for (then no routing is done).
    """

    keys: int = 0
    regions_searched: int = 0
    regions_pruned: int = 0
    memtable_hits: int = 0
    generations_scanned: int = 0
    generations_skipped_by_bloom: int = 0
    generation_hits: int = 0
    generations_from_memory: int = 0
    base_keys: int = 0
    base_hits: int = 0
    deleted: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


class LookupResult(NamedTuple):
    """A lookup's rows and what it touched."""

    rows: pa.Table
    stats: LookupStats


def _base_filter(keys: pa.Table, pk: Sequence[str], schema: pa.Schema) -> str | pc.Expression | None:
    """The base query's filter: SQL text for one integer key column or one string key (what
    Lance's scalar index planner sees most directly, like a user's ``id = X``), else an expression."""
    col = keys.column(pk[0])
    name = quote_name(pk[0])
    ints = col.to_pylist() if len(pk) == 1 and pa.types.is_integer(col.type) else []
    # -2**63 in SQL is minus 2**63, a float to Lance's parser: such a key goes as an expression
    if ints and name is not None and -(2**63) not in ints:
        values = [str(v) for v in ints if v is not None]
        if len(values) == 1:
            return f"{name} = {values[0]}"
        return f"{name} IN ({', '.join(values)})"
    if len(pk) == 1 and keys.num_rows == 1 and pa.types.is_string(col.type) and name is not None:
        value = col[0].as_py()
        if value is not None and value.isprintable() and "\\" not in value:
            # one string key: ``k = '...'`` plans ~0.3 ms faster than the expression
            quoted = value.replace("'", "''")
            return f"{name} = '{quoted}'"
    return lance_key_filter(keys, pk, schema)


class _Search:
    """One lookup in progress: which keys are still unresolved, the rows found, the counts.

    ``want`` carries a row number (column :attr:`row`); ``remaining[i]``: key ``i`` is unresolved.
    """

    def __init__(self, view: TableView, want: pa.Table, read_cols: list[str], out_cols: list[str]) -> None:
        self.view = view
        self.pk = list(view.snapshot.primary_key)
        self.row = _row_column(self.pk)
        # All columns: no projection (Lance plans a projection at a cost of its own)
        names = view.snapshot.schema.names
        self.read_cols: list[str] | None = None if set(read_cols) >= set(names) else read_cols
        self.out_cols = out_cols
        self.want = want
        self.remaining = np.ones(want.num_rows, dtype=bool)
        self.parts: list[pa.Table] = []
        self.jobs: list[Callable[[], pa.Table]] = []
        self.base_job: int | None = None
        self.stats = LookupStats(keys=want.num_rows)

    def memtable(self, region: RegionSnapshot, keys: pa.Table) -> None:
        """The live MemTable rows of ``keys`` (the merge kept the newest one per key)."""
        rows = self.view.merge.memtables.get(region.region_id)
        if rows is None or keys.num_rows == 0:
            return
        if len(self.pk) == 1:
            m = rows.filter(pc.is_in(rows.column(self.pk[0]), value_set=keys.column(0).combine_chunks()))
        else:
            m = of_keys(rows.filter(key_filter(keys, self.pk)), keys, self.pk)
        self.parts.append(m.select(self.out_cols))

    def generation(self, region: RegionSnapshot, level: int, keys: pa.Table, addrs: np.ndarray) -> None:
        """Queue the read of the rows at ``addrs`` (sorted) of one generation: one ``take``."""
        gen = region.generations[level]
        held = held_rows(self.view, gen)
        if held is not None:
            rows = take_held(held, addrs)
            if rows is not None:
                self.stats.generations_from_memory += 1
                self.parts.append(rows.select(self.out_cols))
                return
        self.stats.generations_scanned += 1
        self.jobs.append(partial(_generation_take, self.view, gen, keys, addrs, self.read_cols, self.pk))

    def region(self, region: RegionSnapshot, rkeys: pa.Table) -> None:
        """Resolve ``rkeys`` against the region's newer levels, in memory (the merge's key index)."""
        pk = self.pk
        rows = np.asarray(rkeys.column(self.row).to_numpy())
        # a key found in an earlier region is in no other, unless regions share keys: then
        # every region's newest version is shown, as scans show them
        open_ = self.remaining[rows] if not self.view.merge.cross_region_keys else np.ones(rows.size, dtype=bool)
        if not open_.any():
            return
        if not open_.all():
            rkeys, rows = rkeys.filter(pa.array(open_)), rows[open_]
        self.stats.regions_searched += 1
        newer = self.view.merge.newer
        key_rows, newest_rows = newer.find(region.region_id, rkeys.select(pk))
        if key_rows.size == 0:
            return
        self.remaining[rows[key_rows]] = False
        hit = newer.newest[region.region_id].take(pa.array(newest_rows))
        tomb = np.asarray(pc.fill_null(hit.column(TOMBSTONE), False).to_numpy(zero_copy_only=False))
        level = np.asarray(hit.column(LEVEL_COLUMN).to_numpy())
        self.stats.deleted += int(tomb.sum())
        in_mem = level == -1
        self.stats.memtable_hits += int(in_mem.sum())
        self.stats.generation_hits += int(level.size - in_mem.sum())
        live = ~tomb
        if (live & in_mem).any():
            self.memtable(region, hit.filter(pa.array(live & in_mem)).select(pk))
        seq = np.asarray(hit.column(SEQ_COLUMN).to_numpy())
        levels = np.unique(level[live & ~in_mem]).tolist()
        matrix = None
        if len(levels) >= MATRIX_MIN_GENERATIONS:  # many generations: one take from the region's rows
            matrix = region_rows(self.view, region, [region.generations[lvl] for lvl in levels])
        picked: list[np.ndarray] = []
        for lvl in levels:
            at = np.flatnonzero(live & (level == lvl))
            at = at[np.argsort(seq[at], kind="stable")]
            pos = None if matrix is None else matrix.positions(region.generations[lvl].uri, seq[at])
            if pos is not None:
                picked.append(pos)
                continue
            self.generation(region, int(lvl), hit.select(pk).take(pa.array(at)), seq[at])
        if picked:
            self._from_matrix(cast(RegionRows, matrix), picked)

    def _from_matrix(self, matrix: RegionRows, picked: list[np.ndarray]) -> None:
        self.stats.generations_from_memory += len(picked)
        self.parts.append(matrix.table.take(pa.array(np.concatenate(picked))).select(self.out_cols))

    def base(self) -> None:
        """Queue the keys no newer level holds: one filtered read of the base (its key index)."""
        if not self.remaining.any():
            return
        keys = self.want.select(self.pk).filter(pa.array(self.remaining))
        self.stats.base_keys = keys.num_rows
        base, cols, pk = self.view.snapshot.base, self.read_cols, self.pk

        def read() -> pa.Table:
            filt = _base_filter(keys, pk, base.schema)  # None: every row (keys Lance cannot filter by)
            return of_keys(base.to_table(columns=cols, filter=filt), keys, pk, exact=filt is not None)

        self.base_job = len(self.jobs)
        self.jobs.append(read)

    def run(self) -> None:
        """Run the queued reads (at the same time when there are several: Lance releases the GIL)."""
        jobs = self.jobs
        if len(jobs) == 1:
            results = [jobs[0]()]
        elif jobs:
            with ThreadPoolExecutor(min(_READERS, len(jobs))) as pool:
                results = list(pool.map(lambda job: job(), jobs))
        else:
            results = []
        if self.base_job is not None:
            self.stats.base_hits = results[self.base_job].num_rows
        self.parts.extend(r.select(self.out_cols) for r in results)


def _generation_take(
    view: TableView, gen: GenerationSource, keys: pa.Table, addrs: np.ndarray, cols: list[str] | None, pk: list[str]
) -> pa.Table:
    """:func:`_take` of generation ``gen``, a failure named after it (:func:`generation_failed`)."""
    try:
        return _take(gen.dataset, keys, addrs, cols, pk)
    except (OSError, ValueError, RuntimeError) as err:
        raise generation_failed(view, gen, err) from err


def _take(ds: Any, keys: pa.Table, addrs: np.ndarray, cols: list[str] | None, pk: list[str]) -> pa.Table:
    """The rows of generation ``ds`` at row addresses ``addrs`` (sorted), which hold ``keys``."""
    rows = ds._take_rows(pa.array(addrs, pa.uint64()), columns=cols)
    if rows.num_rows != keys.num_rows or not all(rows.column(k).equals(keys.column(k)) for k in pk):
        # Row addresses are row ids in a generation (no stable row ids); if a writer
        # ever changes that, read the rows by key and address instead.
        rows = ds.to_table(columns=cols, filter=lance_key_filter(keys, pk, ds.schema), with_row_address=True)
        rows = rows.filter(pc.is_in(rows.column("_rowaddr"), pa.array(addrs, pa.uint64())))
    return cast("pa.Table", rows)


def _row_column(pk: Sequence[str]) -> str:
    """The name of the keys' row number beside the key columns."""
    return scratch("_row", pk)


def _with_newer_version(view: TableView, want: pa.Table) -> pa.Table:
    """The keys some newer level may hold; the others go straight to the base.

    For one integer key column the merge's sorted key array answers without routing
    (one binary search); other keys are all routed (a region's index answers per region).
    """
    pk = view.snapshot.primary_key
    if len(pk) != 1 or not pa.types.is_integer(want.schema.field(pk[0]).type):
        return want
    return want.filter(pa.array(view.merge.newer.contains(want.select(list(pk)))))


def read_failed(view: TableView, err: BaseException, what: str = "lookup") -> MemWalError:
    """The error for a read of ``what`` (a lookup) whose Lance read failed: a file gone since
    the snapshot opened (merged and garbage-collected, compacted and cleaned up), or another failure."""
    uri, text = view.snapshot.uri, lance_message(err)
    if says_missing(err) and view.snapshot.base is not None:
        return base_read_error(view.snapshot.base, f"a file read by {what}", err)
    return MemWalError(f"{what} in {uri} failed: {text}")


def lookup(view: TableView, keys: Any, columns: Sequence[str] | None = None) -> LookupResult:
    """Newest live row per key (absent when deleted or never written). See module docs."""
    t0 = time.perf_counter()
    snap = view.snapshot
    pk = list(snap.primary_key)
    schema = snap.schema
    named = column_list(columns, snap.uri)
    out_cols = named if named is not None else list(schema.names)
    check_projection(out_cols, schema.names, snap.uri)  # as to_arrow / to_reader check it
    want = normalize_keys(keys, schema, pk)
    want = want.append_column(_row_column(pk), pa.array(np.arange(want.num_rows, dtype=np.int64)))
    keep = list(dict.fromkeys(pk + out_cols))  # the keys too: the rows come back in their order
    search = _Search(view, want, keep, keep)
    probe = _with_newer_version(view, want)
    routed = (  # None: every region
        route_keys(snap, view.region_values(), view.field_names(), probe) if probe.num_rows else {}
    )
    try:
        for region in snap.regions:
            rkeys = routed.get(region.region_id) if routed is not None else probe
            if rkeys is None or rkeys.num_rows == 0:
                search.stats.regions_pruned += 1
                continue
            search.region(region, rkeys)
        search.base()
        search.run()
    except MemWalError:  # ours already (an InvalidArgumentError is a ValueError too)
        raise
    except (OSError, ValueError, RuntimeError, pa.ArrowException) as err:
        raise read_failed(view, err) from err
    kept = pa.schema([schema.field(c) for c in keep])
    parts = [as_schema(p, kept) for p in search.parts]
    result = (parts[0] if len(parts) == 1 else pa.concat_tables(parts)) if parts else kept.empty_table()
    result = _in_key_order(result, want, pk).select(out_cols)
    search.stats.seconds = time.perf_counter() - t0
    return LookupResult(result, search.stats)


def _in_key_order(rows: pa.Table, want: pa.Table, pk: list[str]) -> pa.Table:
    """``rows`` in the order of the keys asked for (``want``, deduplicated, numbered)."""
    if rows.num_rows <= 1:
        return rows
    if len(pk) == 1:
        at = pc.index_in(rows.column(pk[0]), value_set=want.column(pk[0]).combine_chunks())
        return rows.take(pa.array(np.argsort(at.to_numpy(zero_copy_only=False), kind="stable")))
    row = _row_column(pk)
    at = scratch("_at", [*pk, row])
    numbered = rows.select(pk).append_column(at, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    pairs = numbered.join(want.select([*pk, row]), keys=pk, join_type="inner", use_threads=False)
    order = pc.take(pairs.column(at), pc.sort_indices(pairs.column(row)))
    return rows.take(order)
