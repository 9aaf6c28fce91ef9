"""DataFusion sources: the merged table as one ``pyarrow.dataset.Dataset``.

DataFusion's Python bindings accept a ``pyarrow.dataset.Dataset`` subclass and
duck-type it: ``schema``, ``scanner(columns=, filter=).projected_schema`` and
``get_fragments(filter)`` (one partition per fragment), then per fragment
``scanner(schema, columns=, filter=, batch_size=).to_batches()``. Filters arrive as
``pyarrow.compute.Expression`` and are *Exact*: every fragment applies them.

The merged table is the union of:

* the masked base: each base Lance fragment minus the row addresses whose key has
  a newer version (``MergeState.base_drop``);
* each unmerged flushed generation minus its superseded and tombstone rows;
* each region's surviving MemTable rows (in memory).

Because the masks depend only on keys, every filter is pushed into every source.
``count(*)`` (``columns=[]`` and no filter) is answered from fragment metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from lance.dataset import serialize_row_addrs

from memwal_query.catchup import CatchupPlan
from memwal_query.engine_errors import recorded
from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.merge import MergeState
from memwal_query.planner.plan import Plan
from memwal_query.scan_gate import guarded
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.model import GenerationSource, Snapshot

__all__ = ["HIDDEN_COLUMNS", "MergedDataset", "ScanContext", "hidden_fields"]

log = logging.getLogger("memwal_query")

HIDDEN_COLUMNS = ("_gen", "_rowaddr", "_region")
SCAN_BATCH_ROWS = 65536
#: Decoded columns kept per table lineage (:class:`SnapshotCache`): fragments are
#: immutable, so a column of a fragment is decoded from Lance once and later scans of
#: any snapshot of the lineage filter it in memory. Beyond the budget, scans read Lance.
RESIDENT_MAX_BYTES = 512 << 20
_COUNT_CHUNK = 1 << 20


def hidden_fields() -> list[pa.Field]:
    """The optional debugging columns: generation (0 = base), row address, region."""
    return [
        pa.field("_gen", pa.int64(), nullable=False),
        pa.field("_rowaddr", pa.uint64(), nullable=False),
        pa.field("_region", pa.string(), nullable=True),
    ]


def _drop_mask(rowaddr: pa.Array | pa.ChunkedArray, drop: np.ndarray) -> pa.Array:
    """``True`` for rows whose address is *not* in the sorted ``drop`` array."""
    ra = np.asarray(rowaddr.to_numpy() if isinstance(rowaddr, pa.Array) else rowaddr.to_numpy(), dtype=np.uint64)
    if ra.size and bool(np.all(ra[1:] >= ra[:-1])):
        # Scans return a fragment's rows in address order: look up only the drops
        # inside this batch's address range (few), not every row (many).
        d = drop[np.searchsorted(drop, ra[0]) : np.searchsorted(drop, ra[-1], "right")]
        keep = np.ones(ra.size, dtype=bool)
        if d.size:
            pos = np.searchsorted(ra, d)
            ok = pos < ra.size
            pos, d = pos[ok], d[ok]
            keep[pos[ra[pos] == d]] = False
        return pa.array(keep)
    idx = np.searchsorted(drop, ra)
    idx[idx == drop.size] = 0
    return pa.array(drop[idx] != ra)


def fragment_cache_key(source_uri: str, frag: lance.fragment.LanceFragment) -> tuple[object, ...]:
    """What identifies a Lance fragment's rows: its dataset, id, data files and deletion file."""
    meta = frag.metadata
    d = meta.deletion_file
    deletion = None if d is None else (d.read_version, d.id, d.num_deleted_rows)
    return (source_uri, int(frag.fragment_id), tuple(f.path for f in frag.data_files()), deletion)


def _scan_columns(cols: list[str], filt: object, names: Sequence[str]) -> list[str]:
    """``cols`` plus the columns of ``names`` the filter may refer to (by name in its text:
    more is harmless), the columns a cached scan needs."""
    if filt is None:
        return cols
    text = str(filt)
    return [*cols, *[n for n in names if n in text and n not in cols]]


def _as_expression(filt: object) -> pc.Expression:
    """A pushed filter as an Expression (DataFusion may hand a simplified constant scalar)."""
    return filt if isinstance(filt, pc.Expression) else pc.scalar(filt)


def _in_fragment(drop: np.ndarray, frag: lance.fragment.LanceFragment) -> np.ndarray:
    """The part of a sorted row-address list that falls in ``frag`` (addresses are fragment id << 32 | offset)."""
    lo = np.searchsorted(drop, np.uint64(frag.fragment_id << 32))
    hi = np.searchsorted(drop, np.uint64((frag.fragment_id + 1) << 32))
    return drop[lo:hi]


def _one_chunk(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """``col`` as one contiguous chunk when it fits one Arrow array.

    Lance decodes ~8k-row chunks; kept columns are filtered by every later query, and
    each output chunk is one Python round trip into DataFusion: one chunk per fragment
    makes a filtered scan of a cached fragment one kernel call and a few batches.
    """
    if col.num_chunks <= 1:
        return col
    try:
        return pa.chunked_array([col.combine_chunks()], col.type)
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # e.g. > 2 GiB of string data
        return col


def _is_gone(err: BaseException) -> bool:
    text = str(err).lower()
    return "not found" in text or "no such file" in text


def _mentions_hidden(expr: pc.Expression | None) -> bool:
    if expr is None:
        return False
    text = str(expr)
    return any(h in text for h in HIDDEN_COLUMNS)


@dataclass
class _Scan:
    """What DataFusion gets back from ``scanner()``: a schema and a batch iterator."""

    projected_schema: pa.Schema
    _batches: Iterator[pa.RecordBatch] | None = None

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        # DataFusion pulls these on its own threads: guarded, so none is left running
        # Python when the interpreter exits (see scan_gate); our errors are recorded
        # so they come back out of DataFusion as raised (see engine_errors).
        return guarded(recorded(self._batches)) if self._batches is not None else iter(())

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.to_batches()), schema=self.projected_schema)


def _zero_column_batches(n: int) -> Iterator[pa.RecordBatch]:
    while n > 0:
        k = min(n, _COUNT_CHUNK)
        yield pa.record_batch({"_": pa.nulls(k)}).select([])
        n -= k


@dataclass(frozen=True)
class ScanContext:
    """What a fragment needs from its table: picklable, so fragments can be shipped.

    A pickled fragment carries this context, its Lance dataset (pylance pickles a
    dataset with its manifest, so unpickling reads nothing) and its drop list: a
    Spark task can scan it without opening the table or recomputing the merge.
    """

    uri: str
    data_schema: pa.Schema
    schema: pa.Schema
    with_hidden: bool

    def projected(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of a projection; raises on unknown columns."""
        if columns is None:
            return self.schema
        missing = [c for c in columns if c not in self.schema.names]
        if missing:
            msg = f"unknown column(s) {missing} in {self.uri}"
            raise InvalidArgumentError(msg)
        return pa.schema([self.schema.field(c) for c in columns])


class _Fragment:
    """One partition of the merged table (picklable: see :class:`ScanContext`)."""

    kind = "fragment"
    region: str | None = None

    def __init__(self, owner: ScanContext) -> None:
        self._owner = owner

    def scanner(
        self,
        schema: pa.Schema | None = None,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **_: object,
    ) -> _Scan:
        """Scan this fragment: DataFusion's per-partition call.

        ``columns=[]`` without a filter is a ``count(*)``: answered from metadata.
        """
        out = self._out_schema(columns)
        cols = list(out.names)
        if not cols and filter is None:
            return _Scan(out, _zero_column_batches(self.live_rows()))
        return _Scan(out, self._batches(cols, filter, out, batch_size))

    def live_rows(self) -> int:
        """Rows this fragment contributes to the merged table."""
        raise NotImplementedError

    def rows_hint(self) -> int:
        """Rows before masking (cheap; used to pack small sources together)."""
        return self.live_rows()

    def _batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def _out_schema(self, columns: Sequence[str] | None) -> pa.Schema:
        return self._owner.projected(columns)

    def _finish(
        self,
        batch: pa.RecordBatch,
        columns: list[str],
        gen: int,
        region: str | None,
        post_filter: pc.Expression | None,
        out: pa.Schema,
    ) -> pa.RecordBatch | None:
        n = batch.num_rows
        cols = {name: batch.column(name) for name in batch.schema.names}
        if self._owner.with_hidden:
            cols.setdefault("_gen", pa.array(np.full(n, gen, dtype=np.int64)))
            cols.setdefault("_region", pa.array([region] * n, pa.string()) if region else pa.nulls(n, pa.string()))
        if post_filter is not None:
            full = pa.RecordBatch.from_pydict(cols)
            full = pa.Table.from_batches([full]).filter(post_filter).combine_chunks()
            if full.num_rows == 0:
                return None
            batch = full.to_batches()[0]
            n = batch.num_rows
            cols = {name: batch.column(name) for name in batch.schema.names}
        if n == 0:
            return None
        if not columns:
            return pa.record_batch({"_": pa.nulls(n)}).select([])
        arrays = [cols[c] if c in cols else pa.nulls(n, out.field(c).type) for c in columns]
        arrays = [
            a.cast(out.field(c).type) if a.type != out.field(c).type else a
            for a, c in zip(arrays, columns, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=out)


class _LanceFragment(_Fragment):
    """A Lance fragment (base or flushed generation) minus a sorted drop list."""

    def __init__(
        self,
        owner: ScanContext,
        dataset: lance.LanceDataset,
        fragment: lance.fragment.LanceFragment,
        drop: np.ndarray,
        gen: int,
        region: str | None,
        label: str,
    ) -> None:
        super().__init__(owner)
        self.dataset = dataset
        self.fragment = fragment
        self.drop = drop
        self._blocklist: bytes | None = None
        self._rows: int | None = None
        self.gen = gen
        self.region = region
        self.label = label
        self.resident: SnapshotCache | None = None  # where decoded columns are kept
        self.source_uri = str(dataset.uri)  # the snapshot's name for the dataset (cache key)
        self._key: tuple[object, ...] | None = None
        self._keep: pa.Array | None = None  # this snapshot's drop list as a mask over cached rows
        self._surviving: dict[str, pa.ChunkedArray] = {}  # cached columns with the mask applied

    def __repr__(self) -> str:
        return f"<memwal fragment {self.label} dropped={self.drop.size}>"

    def __getstate__(self) -> dict[str, object]:
        # shipped fragments (Spark tasks) carry no process-local cache
        return {**self.__dict__, "resident": None, "_keep": None, "_surviving": {}}

    def _resident(self, names: list[str]) -> pa.Table | None:
        """Rows of columns ``names`` (and ``_rowaddr``), decoded once per table lineage.

        Fragments never change (a new deletion file makes a new cache key), so their
        columns are kept in the table's :class:`SnapshotCache` (shared with refreshed
        snapshots, bounded by ``RESIDENT_MAX_BYTES``); :meth:`survivors` applies the
        snapshot's drop list. A query then filters memory instead of decoding Lance pages.
        """
        cache = self.resident
        if cache is None:
            return None
        if self._key is None:
            self._key = fragment_cache_key(self.source_uri, self.fragment)
        key = self._key
        with cache.lock:
            if key in cache.over_budget:
                return None
            entry = dict(cache.fragment_columns.get(key, {}))
        missing = [c for c in names if c not in entry]
        if missing or "_rowaddr" not in entry:
            try:
                t = self.fragment.to_table(columns=missing, with_row_address=True)
            except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
                if _is_gone(err):
                    raise self._gone(err) from err
                raise
            known = entry.get("_rowaddr")
            if known is not None and not known.equals(t.column("_rowaddr")):
                return None  # not the rows cached for this key: read Lance (never seen)
            add = {c: _one_chunk(t.column(c)) for c in [*missing, "_rowaddr"] if c not in entry}
            size = sum(a.nbytes for a in add.values())
            entry.update(add)
            with cache.lock:
                if cache.resident_bytes + size > RESIDENT_MAX_BYTES:
                    cache.over_budget.add(key)  # this scan uses what it decoded; later ones read Lance
                else:
                    stored = cache.fragment_columns.setdefault(key, {})
                    cache.resident_bytes += sum(a.nbytes for c, a in add.items() if c not in stored)
                    for c, a in add.items():
                        stored.setdefault(c, a)
        return pa.table({**{c: entry[c] for c in names}, "_rowaddr": entry["_rowaddr"]})

    def _keep_mask(self, rows: pa.Table) -> pa.Array | None:
        """The drop list as a mask over cached rows (computed once per snapshot); None: keep all."""
        if not self.drop.size:
            return None
        if self._keep is None:
            self._keep = _drop_mask(rows.column("_rowaddr"), self.drop)
        return self._keep

    def survivors(self, names: list[str]) -> pa.Table | None:
        """Cached rows of ``names`` (and ``_rowaddr``) that survive the merge (None when not cached).

        The drop list is applied once per snapshot and column (a column copy lives as long
        as this snapshot's dataset): a later query filters only its own predicate, as over
        the raw base.
        """
        rows = self._resident(names)
        if rows is None:
            return None
        keep = self._keep_mask(rows)
        if keep is None:
            return rows
        out = {}
        for c in rows.column_names:
            col = self._surviving.get(c)
            if col is None:
                col = self._surviving[c] = pc.filter(rows.column(c), keep)
            out[c] = col
        return pa.table(out)

    def _resident_batches(
        self, rows: pa.Table, cols: list[str], filt: pc.Expression | None, out: pa.Schema, size: int
    ) -> Iterator[pa.RecordBatch] | None:
        if filt is not None:
            try:
                rows = rows.filter(_as_expression(filt))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
                return None  # let Lance evaluate it
        return (
            res
            for b in rows.to_batches(max_chunksize=size)
            if (res := self._finish(b, cols, self.gen, self.region, None, out)) is not None
        )

    def live_rows(self) -> int:
        return int(self.fragment.count_rows()) - int(self.drop.size)

    def _gone(self, err: BaseException) -> MemWalError:
        where = f"generation {self.gen} of region {self.region}" if self.gen else "base fragment"
        msg = (
            f"{where} ({self.label}) of {self._owner.uri} is no longer readable: it was merged and "
            f"garbage-collected after this snapshot was opened; refresh() the table and retry ({err})"
        )
        return MemWalError(msg)

    def _guard(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            if _is_gone(err):
                raise self._gone(err) from err
            raise

    def rows_hint(self) -> int:
        if self._rows is None:
            self._rows = int(self.fragment.count_rows())
        return self._rows

    def _batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        owner = self._owner
        post = None
        lance_filter = filt
        read = [c for c in cols if c not in HIDDEN_COLUMNS]
        if owner.with_hidden and _mentions_hidden(filt):
            post, lance_filter = filt, None
            read = list(owner.data_schema.names)
        need_addr = self.drop.size > 0 or "_rowaddr" in cols or post is not None
        size = max(batch_size or 0, SCAN_BATCH_ROWS)
        if post is None:
            rows = self.survivors(_scan_columns(read, filt, owner.data_schema.names))
            if rows is not None:
                resident = self._resident_batches(rows, cols, lance_filter, out, size)
                if resident is not None:
                    yield from resident
                    return
        if self.drop.size and filt is None and not owner.with_hidden:
            # Unfiltered scan: let Lance skip the dropped rows while decoding
            # (measured faster than masking whole batches afterwards).
            if self._blocklist is None:
                self._blocklist = serialize_row_addrs(self.drop.tolist())
            scanner = self.dataset.scanner(
                fragments=[self.fragment], columns=read, row_addr_blocklist=self._blocklist, batch_size=size
            )
            for b in self._guard(scanner.to_batches()):
                res = self._finish(b, cols, self.gen, self.region, None, out)
                if res is not None:
                    yield res
            return

        def scan(f: pc.Expression | None, columns: list[str]) -> Iterator[pa.RecordBatch]:
            return self.fragment.scanner(
                columns=columns, filter=f, with_row_address=need_addr, batch_size=size
            ).to_batches()

        try:
            it = scan(lance_filter, read)
            first = next(it, None)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            if _is_gone(err):
                raise self._gone(err) from err
            if lance_filter is None:
                raise
            log.debug("Lance rejected filter %s (%s); filtering in memory", lance_filter, err)
            post, read = lance_filter, list(owner.data_schema.names)
            it = scan(None, read)
            first = next(it, None)
        if first is None:
            return
        for b in self._guard(_chain_first(first, it)):
            if self.drop.size:
                b = b.filter(_drop_mask(b.column("_rowaddr"), self.drop))
            res = self._finish(b, cols, self.gen, self.region, post, out)
            if res is not None:
                yield res


def _chain_first(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def _rebuilt_rows(g: GenerationSource, drop: np.ndarray) -> pa.Table:
    """The surviving rows of a generation rebuilt from the WAL, laid out as MemTable rows.

    They live in memory anyway, and a shipped fragment (Spark tasks) carries them along
    (the in-process Lance dataset they were put in is not readable elsewhere).
    """
    t = g.dataset.to_table(with_row_address=True)
    if drop.size:
        t = t.filter(_drop_mask(t.column("_rowaddr"), drop))
    seq = t.column("_rowaddr")
    t = t.drop_columns(["_rowaddr"])
    t = t.append_column("_gen", pa.array(np.full(t.num_rows, g.generation, dtype=np.int64)))
    return t.append_column("_seq", seq)


class _MemoryFragment(_Fragment):
    """A region's surviving MemTable rows."""

    def __init__(self, owner: ScanContext, table: pa.Table, region: str) -> None:
        super().__init__(owner)
        self.table = table
        self.region = region

    def __repr__(self) -> str:
        return f"<memwal memtable region={self.region} rows={self.table.num_rows}>"

    def live_rows(self) -> int:
        return int(self.table.num_rows)

    def _batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        t = self.table
        data = {name: t.column(name) for name in self._owner.data_schema.names}
        n = t.num_rows
        if self._owner.with_hidden:
            data["_gen"] = t.column("_gen")
            data["_rowaddr"] = t.column("_seq")
            data["_region"] = pa.chunked_array([pa.array([self.region] * n, pa.string())])
        full = pa.table(data)
        if filt is not None:
            full = full.filter(filt)
        sel = full.select(cols) if cols else full.select([])
        for b in sel.to_batches(max_chunksize=batch_size or SCAN_BATCH_ROWS):
            yield pa.RecordBatch.from_arrays(b.columns, schema=out) if cols else b


class _GroupFragment(_Fragment):
    """Several small sources (generations, MemTables) scanned as one partition.

    Each partition costs DataFusion a Python round trip; dozens of small
    generations would cost more in partitions than in rows.
    """

    def __init__(self, owner: ScanContext, parts: list[_Fragment], memo: dict[object, pa.Table] | None = None) -> None:
        super().__init__(owner)
        self.parts = parts
        self._memo = memo

    def __repr__(self) -> str:
        return f"<memwal group of {len(self.parts)} small sources>"

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_memo": None}

    def live_rows(self) -> int:
        return sum(p.live_rows() for p in self.parts)

    def _combined(self, names: list[str]) -> pa.Table | None:
        """Surviving rows of every part (columns ``names``) as one table, built once per
        snapshot from cached columns: one filter per query instead of one per source."""
        if self._memo is None or self._owner.with_hidden or not names:
            return None  # (no columns: a zero-column table would lose its row count)
        key = (tuple(id(p) for p in self.parts), tuple(names))
        got = self._memo.get(key)
        if got is not None:
            return got
        target = pa.schema([self._owner.data_schema.field(n) for n in names])
        tables = []
        for p in self.parts:
            if isinstance(p, _MemoryFragment):
                t: pa.Table | None = p.table.select(names)
            elif isinstance(p, _LanceFragment):
                t = p.survivors(names)
                t = None if t is None else t.select(names)
            else:
                t = None
            if t is None:
                return None
            try:
                tables.append(t.cast(target))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return None
        combined = pa.concat_tables(tables) if tables else target.empty_table()
        combined = pa.table({c: _one_chunk(combined.column(c)) for c in combined.column_names})
        if len(self._memo) >= 64:  # distinct pruning patterns: keep the memo small
            self._memo.clear()
        self._memo[key] = combined
        return combined

    def _batches(
        self, cols: list[str], filt: pc.Expression | None, out: pa.Schema, batch_size: int | None
    ) -> Iterator[pa.RecordBatch]:
        rows = self._combined(_scan_columns(cols, filt, self._owner.data_schema.names))
        if rows is not None and filt is not None:
            try:
                rows = rows.filter(_as_expression(filt))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
                rows = None  # let each source evaluate it
        if rows is not None:
            for b in rows.to_batches(max_chunksize=max(batch_size or 0, SCAN_BATCH_ROWS)):
                res = self._finish(b, cols, 0, None, None, out)
                if res is not None:
                    yield res
            return
        for p in self.parts:
            yield from p._batches(cols, filt, out, batch_size)


SMALL_SOURCE_ROWS = 200_000
GROUP_ROWS = 1_000_000


def _pack_small(frags: list[_Fragment], memo: dict[object, pa.Table] | None = None) -> list[_Fragment]:
    """Base fragments stay one partition each; small sources share partitions."""
    out: list[_Fragment] = []
    group: list[_Fragment] = []
    rows = 0
    for f in frags:
        n = f.rows_hint()
        if f.region is None or n > SMALL_SOURCE_ROWS:
            out.append(f)
            continue
        if group and rows + n > GROUP_ROWS:
            out.append(group[0] if len(group) == 1 else _GroupFragment(group[0]._owner, group, memo))
            group, rows = [], 0
        group.append(f)
        rows += n
    if group:
        out.append(group[0] if len(group) == 1 else _GroupFragment(group[0]._owner, group, memo))
    return out


class MergedDataset(pds.Dataset):  # type: ignore[misc]
    """The merged (deduplicated) table of one snapshot, as DataFusion reads it.

    Register it with ``ctx.register_dataset(name, dataset)``; normally through
    :meth:`memwal_query.Table.register`.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        merge: MergeState,
        *,
        with_hidden: bool = False,
        region_filter: Callable[[pc.Expression], Plan] | None = None,
        catchup: Callable[[pc.Expression], CatchupPlan | None] | None = None,
        resident: SnapshotCache | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.merge = merge
        self.with_hidden = with_hidden
        self._region_filter = region_filter
        self._catchup = catchup
        self._resident = resident
        self._catchup_frags: dict[str, list[_Fragment]] = {}
        self._group_memo: dict[object, pa.Table] = {}  # combined small sources (see _GroupFragment)
        self.last_plan: Plan | None = None
        self.last_catchup: CatchupPlan | None = None
        self.data_schema = snapshot.schema
        fields = list(snapshot.schema)
        if with_hidden:
            fields += hidden_fields()
        self._schema = pa.schema(fields, metadata=snapshot.schema.metadata)
        self.context = ScanContext(snapshot.uri, snapshot.schema, self._schema, with_hidden)
        self._fragments: list[_Fragment] = self._build_fragments()

    @property
    def schema(self) -> pa.Schema:
        """The merged table's schema (hidden columns included when requested)."""
        return self._schema

    def projected(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of a projection; raises on unknown columns."""
        return self.context.projected(columns)

    def _build_fragments(self) -> list[_Fragment]:
        frags: list[_Fragment] = []
        drop = self.merge.base_drop
        base = self.snapshot.base
        for f in base.get_fragments():
            frag = _LanceFragment(self.context, base, f, _in_fragment(drop, f), 0, None, f"base/{f.fragment_id}")
            frag.resident, frag.source_uri = self._resident, self.snapshot.uri
            frags.append(frag)
        for region in self.snapshot.regions:
            for g in region.generations:
                gdrop = self.merge.generation_drop.get(g.uri, np.empty(0, dtype=np.uint64))
                if g.rebuilt_from_wal:
                    frags.append(_MemoryFragment(self.context, _rebuilt_rows(g, gdrop), region.region_id))
                else:
                    frags += self._generation_fragments(g, gdrop, "gen", self._resident)
            mem = self.merge.memtables.get(region.region_id)
            if mem is not None and mem.num_rows:
                frags.append(_MemoryFragment(self.context, mem, region.region_id))
        return frags

    def get_fragments(self, filter: pc.Expression | None = None) -> list[_Fragment]:
        """One fragment per partition; the filter is applied inside each scan.

        With a filter, regions that cannot hold a matching row (region pruning,
        :mod:`memwal_query.planner.pruning`) contribute no fragment; the decision is
        kept in :attr:`last_plan`.
        """
        frags = _pack_small(self.source_fragments(filter), self._group_memo if self._resident is not None else None)
        # DataFusion needs at least one partition (an empty table, or every source pruned).
        return frags or [_MemoryFragment(self.context, self._empty_rows(), "")]

    def _empty_rows(self) -> pa.Table:
        extra = {"_gen": pa.int64(), "_seq": pa.uint64()}
        return pa.schema(list(self.data_schema) + [pa.field(k, t) for k, t in extra.items()]).empty_table()

    def source_fragments(self, filter: pc.Expression | None = None) -> list[_Fragment]:
        """Every source fragment the filter may need, one per Lance fragment / MemTable.

        Each has ``.region`` (``None`` for the base) and ``.label``; ``get_fragments``
        packs the small ones into shared partitions. Region pruning applies.
        """
        frags = self._fragments
        pruned: set[str] = set()
        if filter is not None and self._region_filter is not None:
            plan = self._region_filter(filter)
            self.last_plan = plan
            if plan.pruned_regions:
                pruned = set(plan.pruned_regions)
                frags = [f for f in frags if f.region is None or f.region not in pruned]
        self.last_catchup = None
        if filter is not None and self._catchup is not None:
            catchup = self._catchup(filter)
            if catchup is not None:
                # Index catch-up: base fragments the filter's index does not cover yet are
                # served by the catch-up generations (and their own indexes) instead.
                self.last_catchup = catchup
                uncovered = set(catchup.uncovered_fragments)
                frags = [
                    f
                    for f in frags
                    if not (isinstance(f, _LanceFragment) and f.gen == 0 and f.fragment.fragment_id in uncovered)
                ]
                frags += [f for f in self._catchup_fragments(catchup) if f.region not in pruned]
        return list(frags)

    def _catchup_fragments(self, plan: CatchupPlan) -> list[_Fragment]:
        got = self._catchup_frags.get(plan.index.name)
        if got is None:
            # not kept decoded: scanned through Lance so that their own indexes serve the filter
            got = [
                f for src in plan.sources for f in self._generation_fragments(src.generation, src.drop, "catch-up gen")
            ]
            self._catchup_frags[plan.index.name] = got
        return got

    def _generation_fragments(
        self, g: GenerationSource, drop: np.ndarray, kind: str, resident: SnapshotCache | None = None
    ) -> list[_LanceFragment]:
        """One fragment per Lance fragment of generation ``g``, each with its part of ``drop``."""
        out = []
        for f in g.dataset.get_fragments():
            label = f"{g.region_id}/{kind}{g.generation}/{f.fragment_id}"
            frag = _LanceFragment(self.context, g.dataset, f, _in_fragment(drop, f), g.generation, g.region_id, label)
            frag.resident, frag.source_uri = resident, g.uri
            out.append(frag)
        return out

    def scanner(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None, **_: object) -> _Scan:
        """A scan of the whole merged table (used by DataFusion for the schema)."""
        out = self.projected(columns)
        frags = self._fragments

        def batches() -> Iterator[pa.RecordBatch]:
            for fr in frags:
                yield from fr.scanner(columns=columns, filter=filter).to_batches()

        return _Scan(out, batches())

    def to_table(
        self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None, **_: object
    ) -> pa.Table:
        """Materialise the merged table (optionally projected and filtered)."""
        scan = self.scanner(columns=columns, filter=filter)
        return pa.Table.from_batches(list(scan.to_batches()), schema=scan.projected_schema)

    def count_rows(self, filter: pc.Expression | None = None, **_: object) -> int:
        """Rows of the merged table (metadata only when there is no filter)."""
        return sum(b.num_rows for b in self.scanner(columns=[], filter=filter).to_batches())
