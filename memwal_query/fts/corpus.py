"""The live corpus of a snapshot: per-source BM25 statistics over live rows only.

One INVERTED index built over exactly the live rows would count ``N``, total tokens
and ``df`` over those rows. The snapshot's rows sit in several sources, and each index
also holds rows that are not live any more. So, per source:

* **indexed** (the base index, each flushed generation's own index): the index files'
  totals (:mod:`memwal_query.fts.index_files`) minus its *non-live documents*: indexed
  rows that are deleted (a merge replaced them; a newer version inside the generation)
  or dropped by the snapshot's merge (a newer level holds their key). Their count and
  lengths come from the index's docs file; a query token's document frequency among them
  from its posting list, until the rows, read back from the data files (deleted rows
  included), are tokenized with the index's analyzer on the background thread
  (:class:`~memwal_query.fts.nonlive.NonLiveFreq`); that cost grows with the rows that
  left the index, not with the table.
* **flat** (MemTable rows, base fragments the index does not cover yet, a dataset with
  stable row ids (its index's row ids are not row addresses), a generation
  without an index): every live row tokenized.

The corpus is built once per snapshot and column (kept while the snapshot's
``MergeState`` lives); tokenized rows are memoized per dataset and row address
across snapshots (a row address never changes its text).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError, MemWalCorruptionError, MemWalError
from memwal_query.format.index_restriction import IndexedOnly
from memwal_query.format.lance_open import base_read_error, vanished_error
from memwal_query.format.row_address import take_rows
from memwal_query.format.sets import unique
from memwal_query.fts.analyzer import Analyzer, Doc
from memwal_query.fts.bm25 import CorpusStats
from memwal_query.fts.index_files import InvertedIndexFiles, index_params, read_index_files
from memwal_query.fts.nonlive import NonLiveCounts, NonLiveFreq
from memwal_query.fts.pool import PostingsPool
from memwal_query.fts.posting_codec import UnsupportedPostings
from memwal_query.fts.postings import Postings
from memwal_query.fts.row_tokens import indexed_fragments, read_texts, token_counts, tokenized
from memwal_query.view.table_view import TableView

__all__ = [
    "IndexedSource",
    "FlatSource",
    "Corpus",
    "corpus_of",
    "fragments_of",
    "kept_columns",
    "index_analyzer",
    "inverted_index",
    "tokenize_rows",
]

log = logging.getLogger(__name__)

_INVERTED = "InvertedIndexDetails"
#: Generations with at most this many rows are scored from in-memory postings (tokenized
#: once per generation); larger ones are searched through their own index.
POSTINGS_MAX_ROWS = 50_000


@dataclass(frozen=True)
class IndexedSource:
    """A dataset searched through its own INVERTED index, with its live statistics."""

    name: str
    region_id: str | None
    dataset: lance.LanceDataset = field(repr=False)
    files: tuple[InvertedIndexFiles, ...] = field(repr=False)
    drop: np.ndarray = field(repr=False)  # row addresses that are not live (sorted)
    # the fragments Lance's search is restricted to (the base's indexed ones), or None: all
    indexed_only: IndexedOnly | None
    #: names the rows the index holds (its segments' ids): what is learnt of a row at an address
    #: (its tokens) is kept under it, across snapshots; another table at the same path differs
    rows_key: str
    num_docs: int
    total_tokens: int
    nonlive: NonLiveFreq = field(repr=False)

    @property
    def unreadable_rows(self) -> int:
        """Non-live rows whose text could not be read when counted from text (statistics approximate)."""
        return self.nonlive.unreadable_rows

    def doc_freq(self, token: str) -> int:
        """Live documents of this source holding ``token``."""
        return sum(f.doc_freq(token) for f in self.files) - self.nonlive.get(token)

    def index_stats(self, tokens: Sequence[str]) -> CorpusStats:
        """The statistics Lance itself scores this source with (every indexed row)."""
        n = sum(f.num_docs for f in self.files)
        total = sum(f.total_tokens for f in self.files)
        return CorpusStats(n, total, {t: sum(f.doc_freq(t) for f in self.files) for t in set(tokens)})


@dataclass(frozen=True)
class FlatSource:
    """Rows scored from in-memory postings (:mod:`memwal_query.fts.postings`), no Lance search."""

    name: str
    region_id: str | None
    dataset: lance.LanceDataset = field(repr=False)
    fragments: tuple[int, ...] | None  # the fragments of ``dataset`` it holds (None: all)
    postings: Postings = field(repr=False)
    live: np.ndarray = field(repr=False)  # which rows of the postings are live
    rows: pa.Table = field(repr=False)  # :func:`kept_columns`, aligned with the postings' rows
    num_docs: int
    total_tokens: int

    def doc_freq(self, token: str) -> int:
        """Live documents of this source holding ``token``."""
        return self.postings.doc_freq(token, self.live)


@dataclass(frozen=True)
class Corpus:
    """Every source of one text column of a snapshot."""

    column: str
    analyzer: Analyzer
    index_name: str
    indexed: tuple[IndexedSource, ...]
    flat: tuple[FlatSource, ...]
    pool: PostingsPool = field(repr=False)  # the flat sources' postings end to end

    @classmethod
    def of(
        cls,
        column: str,
        analyzer: Analyzer,
        index_name: str,
        indexed: Sequence[IndexedSource],
        flat: Sequence[FlatSource],
    ) -> Corpus:
        """The corpus of these sources (pools the flat ones)."""
        pool = PostingsPool.of([f.postings for f in flat], [f.live for f in flat])
        return cls(column, analyzer, index_name, tuple(indexed), tuple(flat), pool)

    def stats(self, tokens: Sequence[str]) -> CorpusStats:
        """``N``, total tokens and ``df`` of ``tokens`` over the snapshot's live rows."""
        sources: list[IndexedSource | FlatSource] = [*self.indexed, *self.flat]
        return CorpusStats(
            num_docs=sum(s.num_docs for s in sources),
            total_tokens=sum(s.total_tokens for s in sources),
            doc_freq={t: sum(s.doc_freq(t) for s in self.indexed) + self.pool.doc_freq(t) for t in set(tokens)},
        )


def kept_columns(schema: pa.Schema, text_column: str) -> list[str]:
    """The columns of in-memory text-search rows kept for output: all but wide ones
    (vectors, binary, nested lists; read by row address when asked for), the text always."""
    t = pa.types
    wide = (t.is_fixed_size_list, t.is_list, t.is_large_list, t.is_binary, t.is_large_binary)
    keep = [f.name for f in schema if not any(w(f.type) for w in wide)]
    return keep if text_column in keep else [*keep, text_column]


def fragments_of(ds: lance.LanceDataset, ids: Sequence[int] | None) -> list[lance.LanceFragment] | None:
    """The fragments ``ids`` of ``ds`` (None: all of them)."""
    if ids is None:
        return None
    return [f for f in (ds.get_fragment(i) for i in ids) if f is not None]


def _live_addrs(ds: lance.LanceDataset, fragments: Sequence[int] | None) -> np.ndarray:
    t = ds.scanner(columns=[], with_row_address=True, fragments=fragments_of(ds, fragments)).to_table()
    return np.sort(t.column("_rowaddr").to_numpy().astype(np.uint64))


def _null_texts(ds: lance.LanceDataset, column: str) -> np.ndarray:
    """The row addresses of ``ds``'s rows whose ``column`` is NULL."""
    t = ds.scanner(columns=[column], with_row_address=True).to_table()
    nulls = t.filter(pc.is_null(t.column(column))).column("_rowaddr")
    return np.asarray(nulls.to_numpy(), dtype=np.uint64)


def inverted_index(ds: lance.LanceDataset, column: str) -> Any | None:
    """The INVERTED index description of ``column`` in ``ds`` (None: there is none, or the
    index list cannot be read)."""
    try:
        return _inverted(ds.describe_indices(), column)
    except (OSError, ValueError, RuntimeError):
        return None


def _inverted(described: list[Any], column: str) -> Any | None:
    found = [d for d in described if d.type_url.endswith(_INVERTED) and list(d.field_names) == [column]]
    return found[0] if found else None


def _indexed_source(
    name: str,
    region_id: str | None,
    ds: lance.LanceDataset,
    desc: Any,
    ctx: _Build,
    drop: np.ndarray | None,
    *,
    restrict: Callable[[Collection[int]], IndexedOnly] | None,
) -> IndexedSource:
    try:
        files = tuple(read_index_files(f"{ds.uri}/_indices/{s.uuid}", ctx.options) for s in desc.segments)
    except MemWalCorruptionError as err:  # compacted and cleaned up since the snapshot opened?
        gone = vanished_error(ds, f"the INVERTED index of {name}", err.__cause__ or err)
        if gone is None:
            raise
        raise gone from err
    covered = sorted(
        {int(f) for s in desc.segments for f in s.fragment_ids} & {f.fragment_id for f in ds.get_fragments()}
    )
    drop = np.empty(0, np.uint64) if drop is None else unique(np.asarray(drop, dtype=np.uint64))
    if restrict is None and ctx.analyzer.empty_is_token:  # a generation's index holds NULL texts as ''
        drop = unique(np.concatenate([drop, _null_texts(ds, ctx.column)]))
    live = _live_addrs(ds, covered if restrict is not None else None)
    kept = np.setdiff1d(live, drop, assume_unique=True)
    rowids = unique(np.concatenate([f.rowids for f in files])) if files else np.empty(0, np.uint64)
    nonlive = np.setdiff1d(rowids, kept, assume_unique=True)
    versions = [int(s.dataset_version_at_last_update) for s in desc.segments]
    lengths = sum((f.doc_lengths(nonlive) for f in files), np.zeros(nonlive.size, np.int64))
    # an index's segments hold the rows of the fragments it was built over, which never change:
    # its ids name them (a table written again at the same path has other rows at the same addresses)
    rows_key = f"{ds.uri}#{','.join(sorted(str(s.uuid) for s in desc.segments))}"
    counts = token_counts((rows_key, ctx.column, ctx.analyzer))

    def count_all(stop: Callable[[], bool] | None) -> NonLiveCounts | None:
        fragments = indexed_fragments(ds, versions, ctx.options)
        return counts.of(ctx.analyzer, nonlive, lambda a: read_texts(ds, ctx.column, a, fragments, ctx.options), stop)

    return IndexedSource(
        name=name,
        region_id=region_id,
        dataset=ds,
        files=files,
        drop=drop,
        indexed_only=restrict(covered) if restrict is not None else None,
        rows_key=rows_key,
        num_docs=sum(f.num_docs for f in files) - int(nonlive.size),
        total_tokens=sum(f.total_tokens for f in files) - int(lengths.sum()),
        nonlive=NonLiveFreq(files, nonlive, lengths, count_all),
    )


_postings: OrderedDict[tuple[str, str, Analyzer], tuple[Postings, pa.Table]] = OrderedDict()
_POSTINGS_ENTRIES = 256
_postings_lock = threading.Lock()


def _flat_source(
    name: str,
    region_id: str | None,
    ds: lance.LanceDataset,
    fragments: Sequence[int] | None,
    ctx: _Build,
    drop: np.ndarray | None,
    cache_key: str | None,
    index: Any | None = None,
) -> FlatSource:
    """A source scored from postings; ``cache_key`` names rows that never change (kept across
    snapshots). ``index``: the dataset's own INVERTED index (with the corpus's analyzer), whose
    posting lists are read instead of tokenizing the rows where they decode here."""
    key = None if cache_key is None else (cache_key, ctx.column, ctx.analyzer)
    with _postings_lock:
        hit = _postings.get(key) if key is not None else None
    if hit is None:
        frags = fragments_of(ds, fragments)
        rows = ds.scanner(
            columns=kept_columns(ds.schema, ctx.column), with_row_address=True, fragments=frags
        ).to_table()
        rows = rows.take(pc.sort_indices(rows.column("_rowaddr")))
        addrs = rows.column("_rowaddr").to_numpy().astype(np.uint64)
        text = rows.column(ctx.column)
        # a generation's index holds NULL texts as '' (raw tokenizer): tokenized here instead
        nulls_as_empty = ctx.analyzer.empty_is_token and text.null_count > 0
        postings = None if nulls_as_empty else _indexed_postings(ds, index, addrs, ctx)
        if postings is None:
            postings = Postings.build(addrs, ctx.analyzer.tokenize_flat(text.to_pylist()))
        rows = rows.drop_columns(["_rowaddr"])
        live = np.ones(len(postings), dtype=bool)
        if key is not None:
            with _postings_lock:
                _postings[key] = (postings, rows)
                while len(_postings) > _POSTINGS_ENTRIES:
                    _postings.popitem(last=False)
    else:
        postings, rows = hit
        live = postings.mask_of(_live_addrs(ds, fragments))  # rows deleted since are not live
    if drop is not None and drop.size:
        live &= ~postings.mask_of(drop)
    return FlatSource(
        name=name,
        region_id=region_id,
        dataset=ds,
        fragments=None if fragments is None else tuple(fragments),
        postings=postings,
        live=live,
        rows=rows,
        num_docs=postings.num_docs(live),
        total_tokens=postings.total_tokens(live),
    )


def _indexed_postings(ds: lance.LanceDataset, index: Any | None, addrs: np.ndarray, ctx: _Build) -> Postings | None:
    """The postings of ``ds``'s rows ``addrs`` from its own index (one segment covering every
    fragment, no positions, postings decoded here), or None."""
    if index is None or ctx.analyzer.with_position or len(index.segments) != 1:
        return None
    seg = index.segments[0]
    if {int(f) for f in seg.fragment_ids} != {f.fragment_id for f in ds.get_fragments()}:
        return None
    try:
        return Postings.from_index(addrs, read_index_files(f"{ds.uri}/_indices/{seg.uuid}", ctx.options))
    except (UnsupportedPostings, MemWalCorruptionError) as err:
        log.debug("%s: postings tokenized (the index's do not decode here: %s)", ds.uri, err)
        return None


@dataclass(frozen=True)
class _Build:
    column: str
    analyzer: Analyzer
    options: Mapping[str, str]


def _fragment_key(ds: lance.LanceDataset, frag: lance.LanceFragment, layout: str) -> str:
    """What makes a fragment's rows: its id and data files (deletions only hide rows), and the
    columns' names and field ids (``layout``: a dropped column's name taken by a new one, two
    names swapped, change the rows read from the same files)."""
    return f"{ds.uri}#{frag.fragment_id}:" + ",".join(f.path for f in frag.metadata.files) + f"@{layout}"


def _layout(ds: lance.LanceDataset) -> str:
    """A digest of ``ds``'s Lance schema (names, field ids, types)."""
    return hashlib.blake2b(str(ds.lance_schema).encode(), digest_size=16).hexdigest()


def index_analyzer(ds: lance.LanceDataset, desc: Any, options: Mapping[str, str], what: str = "the index") -> Analyzer:
    """The analyzer an INVERTED index was built with: its own ``metadata.lance`` parameters over
    ``describe_indices()``'s, which leave ``custom_stop_words`` out (the default stop words then
    dropped tokens the index holds)."""
    params = dict(desc.details)
    if desc.segments:
        uri = f"{ds.uri}/_indices/{desc.segments[0].uuid}"
        try:
            stored = index_params(uri, options)
        except MemWalCorruptionError as err:  # compacted and cleaned up since the snapshot opened?
            gone = vanished_error(ds, f"the INVERTED index {desc.name}", err.__cause__ or err)
            if gone is None:
                raise
            raise gone from err
        params.update({k: v for k, v in stored.items() if v is not None})
    return Analyzer.from_params(params, what)


def _same_analyzer(ds: lance.LanceDataset, desc: Any, ctx: _Build) -> bool:
    """Whether generation ``ds``'s own index (``desc``) tokenizes as the corpus does (an index
    whose parameters cannot be read is not used: its rows are tokenized instead)."""
    try:
        return index_analyzer(ds, desc, ctx.options) == ctx.analyzer
    except MemWalError:
        return False


def _build(view: TableView, column: str) -> Corpus:
    snap, merge = view.snapshot, view.merge
    try:  # not "no index" when the list cannot be read (the table was deleted, say)
        desc = _inverted(snap.base.describe_indices(), column)
    except (OSError, ValueError, RuntimeError) as err:
        raise base_read_error(snap.base, "the index list", err) from err
    if desc is None:
        msg = (
            f"column {column!r} of {view.uri} has no INVERTED index: create one on the base table "
            f"(create_scalar_index({column!r}, 'INVERTED')) before initialize_mem_wal"
        )
        raise InvalidArgumentError(msg)
    analyzer = index_analyzer(snap.base, desc, view.storage.storage_options, f"index {desc.name} on {column!r}")
    ctx = _Build(column, analyzer, view.storage.storage_options)
    base = snap.base
    # an index names rows by row id; with stable row ids those are not row addresses, which
    # the live statistics are worked out in: such a dataset is scored from its tokenized rows
    indexed: list[IndexedSource] = []
    covered: set[int] = set()
    unindexed = "the base, scored from its rows (stable row ids)"
    if not base.has_stable_row_ids:
        unindexed = "the base's unindexed fragments"
        indexed = [_indexed_source("base", None, base, desc, ctx, merge.base_drop, restrict=view.indexed_only)]
        covered = {int(f) for s in desc.segments for f in s.fragment_ids}
    layout = _layout(base)
    flat = [
        _flat_source(
            unindexed,
            None,
            base,
            [f.fragment_id],
            ctx,
            merge.base_drop,
            _fragment_key(base, f, layout),
        )
        for f in base.get_fragments()
        if f.fragment_id not in covered
    ]
    for region in snap.regions:
        rid = region.region_id
        for g in region.generations:
            what = f"{rid} generation {g.generation}"
            by_index = not g.rebuilt_from_wal and not g.dataset.has_stable_row_ids
            gdesc = inverted_index(g.dataset, column) if by_index else None
            drop = merge.generation_drop.get(g.uri)
            big = g.num_rows > POSTINGS_MAX_ROWS
            own = gdesc if gdesc is not None and _same_analyzer(g.dataset, gdesc, ctx) else None
            if big and own is not None:
                indexed.append(_indexed_source(what, rid, g.dataset, own, ctx, drop, restrict=None))
            else:
                key = None if g.rebuilt_from_wal else g.uri
                flat.append(_flat_source(what, rid, g.dataset, None, ctx, drop, key, own))
        mem = merge.memtables.get(rid)
        if mem is not None and mem.num_rows:
            ds = view.memtable_dataset(rid, mem)
            flat.append(_flat_source(f"{rid} memtable", rid, ds, None, ctx, None, None))
    return Corpus.of(column, ctx.analyzer, str(desc.name), indexed, flat)


_corpora: dict[tuple[int, str], Corpus] = {}
_corpora_lock = threading.Lock()


def corpus_of(view: TableView, column: str) -> Corpus:
    """The corpus of ``column`` in ``table``'s snapshot (built once per snapshot).

    Raises:
        InvalidArgumentError: ``column`` has no INVERTED index on the base table.
        MemWalError: A source cannot be read.
    """
    merge = view.merge
    key = (id(merge), column)
    with _corpora_lock:
        hit = _corpora.get(key)
    if hit is not None:
        return hit
    try:
        corpus = _build(view, column)
    except MemWalError:
        raise
    except (OSError, ValueError, RuntimeError) as err:
        msg = f"cannot read the full-text sources of {view.uri}: {err}"
        raise MemWalError(msg) from err
    with _corpora_lock:
        if key not in _corpora:
            _corpora[key] = corpus
            weakref.finalize(merge, _forget, key)
    for src in corpus.indexed:  # later queries look their non-live statistics up
        src.nonlive.count_later()
    return corpus


def _forget(key: tuple[int, str]) -> None:
    with _corpora_lock:
        _corpora.pop(key, None)


def tokenize_rows(src: IndexedSource, corpus: Corpus, addrs: np.ndarray) -> list[Doc]:
    """The rows at ``addrs`` of ``src``'s index tokenized (memoized under ``src.rows_key``;
    only rows not seen before are read)."""
    column, ds = corpus.column, src.dataset
    return tokenized(
        (src.rows_key, column, corpus.analyzer), addrs, lambda a: take_rows(ds, a, [column]).column(0).to_pylist()
    )
