"""What an INVERTED index holds, read from its files: documents, lengths, document frequencies.

A Lance INVERTED index directory (``_indices/{uuid}/``) has one ``metadata.lance``
(schema metadata: ``partitions``, ``params``) and, per partition ``p``,
``part_p_docs.lance`` (``_rowid``, ``_num_tokens``; schema metadata ``total_tokens``),
``part_p_tokens.lance`` (the token dictionary: an FST token -> token id, or in the
legacy layout a ``_token`` column) and ``part_p_invert.lance`` (one row per token
id; ``_length`` is the token's document count). Lance scores a query with the sums
over partitions: ``N`` = documents, ``avgdl`` = total tokens / ``N``, ``df`` = posting
lengths, counting every document the index holds, deleted rows included (measured:
deletes and prefilters leave scores unchanged). Documents with no token at all
(NULL, empty, only stop words) are not in the index.

Reading these files gives exact per-source statistics without decoding posting
lists; :mod:`memwal_query.fts.corpus` then removes the rows that are not live.
Index directories never change, so each is read once per process (bounded cache).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from lance.file import LanceFileReader

from memwal_query.errors import MemWalCorruptionError
from memwal_query.format.lance_open import lance_message
from memwal_query.format.sets import member
from memwal_query.fts.fst import FstMap
from memwal_query.fts.posting_codec import UnsupportedPostings, decode_all, decode_doc_ids, layout_supported

__all__ = ["InvertedIndexFiles", "index_params", "read_index_files"]

_CACHE_ENTRIES = 64
_DF_ENTRIES = 100_000  # tokens whose doc_freq an index keeps
_cache: OrderedDict[str, InvertedIndexFiles] = OrderedDict()
_params: OrderedDict[str, dict[str, object]] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class _Partition:
    tokens: FstMap | dict[str, int]
    lengths: np.ndarray = field(repr=False)
    doc_rowids: np.ndarray = field(repr=False)  # the docs file's row ids, in its order
    invert: str = ""  # its ``invert.lance`` when its posting lists decode here (else "")
    options: Mapping[str, str] | None = field(default=None, repr=False)

    def doc_freq(self, token: str) -> int:
        tid = self.tokens.get(token)
        if tid is None or tid >= self.lengths.size:
            return 0
        return int(self.lengths[tid])

    def posting_rowids(self, token: str) -> np.ndarray:
        """Row ids of the documents holding ``token``, decoded from its posting list.

        Raises:
            UnsupportedPostings: The postings are in a layout not decoded here, or do not add up.
        """
        if not self.invert:
            raise UnsupportedPostings("this partition's posting layout is not decoded here")
        tid = self.tokens.get(token)
        if tid is None or tid >= self.lengths.size or not self.lengths[tid]:
            return np.empty(0, np.uint64)
        # a reader per read (~0.3 ms; each token's count is memoized): no open Lance file is
        # kept in this process-wide cache until the interpreter exits
        opts = dict(self.options) if self.options else None
        try:
            reader = LanceFileReader(self.invert, storage_options=opts, columns=["_posting"])
            col = reader.take_rows([int(tid)]).to_table().column(0)
        except (OSError, ValueError, RuntimeError, pa.ArrowException) as err:
            raise UnsupportedPostings(f"cannot read the postings of token id {tid} in {self.invert}: {err}") from err
        lists = col.combine_chunks()
        if len(lists) != 1 or lists.null_count:
            raise UnsupportedPostings(f"no posting list for token id {tid} in {self.invert}")
        blocks = lists.values[lists.offsets[0].as_py() : lists.offsets[1].as_py()]
        ids = decode_doc_ids(blocks, int(self.lengths[tid]), self.doc_rowids.size)
        return np.asarray(self.doc_rowids[ids], dtype=np.uint64)


@dataclass(frozen=True)
class InvertedIndexFiles:
    """The statistics of one INVERTED index directory (all partitions)."""

    uri: str
    params: dict[str, object]
    partitions: tuple[_Partition, ...] = field(repr=False)
    rowids: np.ndarray = field(repr=False)  # sorted, unique
    num_tokens: np.ndarray = field(repr=False)  # aligned with rowids
    total_tokens: int
    _df: dict[str, int] = field(default_factory=dict, repr=False, compare=False)  # doc_freq, memoized

    @property
    def num_docs(self) -> int:
        """Documents the index holds (deleted rows included)."""
        return int(self.rowids.size)

    def doc_freq(self, token: str) -> int:
        """Documents of the index holding ``token`` (its posting lengths summed; remembered)."""
        hit = self._df.get(token)
        if hit is None:
            hit = self._df[token] = sum(p.doc_freq(token) for p in self.partitions)
            if len(self._df) > _DF_ENTRIES:
                self._df.clear()
        return hit

    @property
    def postings_decodable(self) -> bool:
        """Whether every partition's posting lists are in the layout :mod:`~memwal_query.fts.posting_codec` decodes."""
        return all(p.invert for p in self.partitions)

    def doc_freq_among(self, token: str, rowids: np.ndarray) -> int:
        """Documents holding ``token`` among sorted, distinct ``rowids``, from the posting lists.

        Raises:
            UnsupportedPostings: See :meth:`_Partition.posting_rowids`.
        """
        return sum(int(member(p.posting_rowids(token), rowids).sum()) for p in self.partitions)

    def all_postings(self) -> tuple[FstMap | dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
        """Every posting of a one-partition index: (token -> token id, then token id, row id and
        frequency per posting, sorted by token id).

        Raises:
            UnsupportedPostings: More than one partition, or postings not decoded here.
        """
        if len(self.partitions) != 1 or not self.partitions[0].invert:
            raise UnsupportedPostings(f"{self.uri}: not one partition in the layout decoded here")
        p = self.partitions[0]
        try:
            lists, _ = _read(p.invert, p.options, ["_posting"])
        except (OSError, ValueError, RuntimeError, pa.ArrowException) as err:
            raise UnsupportedPostings(f"cannot read the postings in {p.invert}: {err}") from err
        tok, doc, freq = decode_all(lists.column(0).combine_chunks(), p.lengths, p.doc_rowids.size)
        return p.tokens, tok, p.doc_rowids[doc], freq

    def doc_lengths(self, rowids: np.ndarray) -> np.ndarray:
        """Token counts of ``rowids`` (0 for a row the index does not hold)."""
        pos = np.searchsorted(self.rowids, rowids)
        pos = np.minimum(pos, max(self.rowids.size - 1, 0))
        hit = self.rowids[pos] == rowids if self.rowids.size else np.zeros(rowids.size, dtype=bool)
        return np.where(hit, self.num_tokens[pos] if self.rowids.size else 0, 0).astype(np.int64)


def _read(
    path: str, options: Mapping[str, str] | None, columns: list[str] | None = None
) -> tuple[pa.Table, dict[str, str]]:
    reader = LanceFileReader(path, storage_options=dict(options or {}) or None, columns=columns)
    table = reader.read_all(batch_size=1 << 16).to_table()
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    return table, meta


def _partition(uri: str, prefix: str, options: Mapping[str, str] | None) -> tuple[_Partition, pa.Table, int]:
    tokens, _ = _read(f"{uri}/{prefix}tokens.lance", options)
    if "_token_fst_bytes" in tokens.column_names:
        dictionary: FstMap | dict[str, int] = FstMap(tokens.column("_token_fst_bytes")[0].as_py())
    elif "_token" in tokens.column_names:
        dictionary = dict(zip(tokens.column("_token").to_pylist(), tokens.column("_token_id").to_pylist(), strict=True))
    else:
        msg = f"{uri}: token dictionary {prefix}tokens.lance has neither an FST nor a _token column"
        raise MemWalCorruptionError(msg)
    inv, inv_meta = _read(f"{uri}/{prefix}invert.lance", options, ["_length"])
    docs, meta = _read(f"{uri}/{prefix}docs.lance", options)
    total = int(meta.get("total_tokens", 0)) or int(docs.column("_num_tokens").to_numpy().sum())
    lengths = inv.column("_length").to_numpy().astype(np.int64)
    rowids = docs.column("_rowid").to_numpy().astype(np.uint64)
    invert = f"{uri}/{prefix}invert.lance" if layout_supported(inv_meta) else ""
    return _Partition(dictionary, lengths, rowids, invert, dict(options or {}) or None), docs, total


def index_params(uri: str, storage_options: Mapping[str, str] | None = None) -> dict[str, object]:
    """The parameters the INVERTED index in directory ``uri`` was built with, from its
    ``metadata.lance`` (read once): ``describe_indices()`` gives ``custom_stop_words`` as None.

    Raises:
        MemWalCorruptionError: The file cannot be read.
    """
    with _lock:
        files = _cache.get(uri)
        hit = files.params if files is not None else _params.get(uri)
    if hit is not None:
        return dict(hit)
    try:
        _, meta = _read(f"{uri}/metadata.lance", storage_options)
        params = dict(json.loads(meta.get("params", "{}")))
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        msg = f"cannot read the inverted index at {uri}: {lance_message(err)}"
        raise MemWalCorruptionError(msg) from err
    with _lock:
        _params[uri] = params
        while len(_params) > _CACHE_ENTRIES * 4:
            _params.popitem(last=False)
    return dict(params)


def read_index_files(uri: str, storage_options: Mapping[str, str] | None = None) -> InvertedIndexFiles:
    """The statistics of the INVERTED index in directory ``uri`` (read once, then cached).

    Raises:
        MemWalCorruptionError: The files are not an INVERTED index Lance wrote.
    """
    with _lock:
        hit = _cache.get(uri)
        if hit is not None:
            _cache.move_to_end(uri)
            return hit
    try:
        _, meta = _read(f"{uri}/metadata.lance", storage_options)
        params = json.loads(meta.get("params", "{}"))
        parts = json.loads(meta["partitions"]) if "partitions" in meta else None
        prefixes = [f"part_{p}_" for p in parts] if parts is not None else [""]
        read = [_partition(uri, p, storage_options) for p in prefixes]
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        msg = f"cannot read the inverted index at {uri}: {lance_message(err)}"
        raise MemWalCorruptionError(msg) from err
    docs = pa.concat_tables([d for _, d, _ in read]) if read else None
    if docs is not None and docs.num_rows:
        rowids = docs.column("_rowid").to_numpy().astype(np.uint64)
        ntok = docs.column("_num_tokens").to_numpy().astype(np.int64)
        order = np.argsort(rowids, kind="stable")
        rowids, ntok = rowids[order], ntok[order]
    else:
        rowids, ntok = np.empty(0, np.uint64), np.empty(0, np.int64)
    files = InvertedIndexFiles(
        uri=uri,
        params=dict(params),
        partitions=tuple(p for p, _, _ in read),
        rowids=rowids,
        num_tokens=ntok,
        total_tokens=sum(t for _, _, t in read),
    )
    with _lock:
        _cache[uri] = files
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    return files
