"""Tokens of the rows an INVERTED index holds, learnt once and kept across snapshots.

A text search re-scores the rows Lance's index search returns (their tokens) and subtracts
from the index's statistics the rows it holds that are no longer live (their token counts).
Both are learnt from the rows' texts, read by row address from the data files the index was
built over, and kept under a key naming the index (``IndexedSource.rows_key``: its segments'
ids), whose rows at an address never change.

Example:
    >>> import numpy as np
    >>> from memwal_query.fts.analyzer import Analyzer
    >>> an = Analyzer.from_params({"base_tokenizer": "simple"})
    >>> docs = tokenized(("idx#1", "text", an), np.array([7], np.uint64), lambda a: ["hello world"])
    >>> docs[0].tokens
    ('hello', 'world')
    >>> tokenized(("idx#1", "text", an), np.array([7], np.uint64), lambda a: 1 / 0)[0].tokens  # kept: not read again
    ('hello', 'world')
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lance
import numpy as np
from lance.file import LanceFileReader

from memwal_query.format.sets import unique
from memwal_query.fts.analyzer import Analyzer, Doc
from memwal_query.fts.nonlive import TokenCounts
from memwal_query.regionspec.spec import lance_field_ids

__all__ = ["indexed_fragments", "read_texts", "token_counts", "tokenized"]

_MEMO_MAX_DOCS = 2_000_000


class _Memo:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.docs: OrderedDict[tuple[str, str, Analyzer], dict[int, Doc]] = OrderedDict()
        self.count = 0

    def tokenized(
        self, key: tuple[str, str, Analyzer], addrs: np.ndarray, read: Callable[[np.ndarray], Sequence[str | None]]
    ) -> list[Doc]:
        with self.lock:
            known = self.docs.setdefault(key, {})
            self.docs.move_to_end(key)
            missing = np.array([a for a in addrs.tolist() if a not in known], dtype=np.uint64)
        if missing.size:
            fresh = dict(zip(missing.tolist(), key[2].tokenize_all(read(missing)), strict=True))
            with self.lock:
                known.update(fresh)
                self.count += len(fresh)
                while self.count > _MEMO_MAX_DOCS and len(self.docs) > 1:
                    _, gone = self.docs.popitem(last=False)
                    self.count -= len(gone)
        return [known[a] for a in addrs.tolist()]


_memo = _Memo()
_counts: OrderedDict[tuple[str, str, Analyzer], TokenCounts] = OrderedDict()
_COUNTS_ENTRIES = 16  # indexes whose non-live rows' token counts are kept


def token_counts(key: tuple[str, str, Analyzer]) -> TokenCounts:
    """The token counts of non-live rows seen so far of one index (``IndexedSource.rows_key``)."""
    with _memo.lock:
        got = _counts.get(key)
        if got is None:
            got = _counts[key] = TokenCounts()
            while len(_counts) > _COUNTS_ENTRIES:
                _counts.popitem(last=False)
        _counts.move_to_end(key)
        return got


def read_texts(
    ds: lance.LanceDataset, column: str, addrs: np.ndarray, fragments: Mapping[int, Any], options: Mapping[str, str]
) -> list[str | None]:
    """Text of rows by address from the data files of ``fragments`` (metadata by id, as the
    index saw them: :func:`indexed_fragments`): deleted rows too (they are still there).
    Rows found nowhere read as None."""
    fid = next(i for i, n in lance_field_ids(ds).items() if n == column)
    out: dict[int, str | None] = {}
    frag_of = (addrs >> np.uint64(32)).astype(np.int64)
    for frag_id in unique(frag_of).tolist():
        meta = fragments.get(frag_id)
        rows = addrs[frag_of == frag_id]
        files = [f for f in meta.files if fid in f.fields] if meta is not None else []
        if not files:
            continue  # the fragment is gone (all its rows deleted): not readable here
        reader = LanceFileReader(
            f"{ds.uri}/data/{files[0].path}", storage_options=dict(options) or None, columns=[column]
        )
        offsets = (rows & np.uint64(0xFFFFFFFF)).astype(np.int64)
        texts = reader.take_rows(offsets.tolist()).to_table().column(0).to_pylist()
        out.update(zip(rows.tolist(), texts, strict=True))
    return [out.get(a) for a in addrs.tolist()]


def indexed_fragments(ds: lance.LanceDataset, versions: Sequence[int], options: Mapping[str, str]) -> dict[int, Any]:
    """The metadata of every fragment as an index built at ``versions`` saw it (by id): from
    the oldest of those versions listing it, else from ``ds``. A fragment's data files can
    change after the index was built (a column rewritten in place: Lance then takes it out
    of the index's coverage, while the index still holds its old rows' tokens), and one
    whose rows were all deleted leaves the manifest."""
    out: dict[int, Any] = {}
    for version in sorted(set(versions)):
        try:
            at = (
                ds
                if version == ds.version
                else lance.dataset(ds.uri, version=version, storage_options=dict(options) or None)
            )
        except (OSError, ValueError, RuntimeError):
            continue  # cleaned up: its fragments read as they are now (or not at all)
        for f in at.get_fragments():
            out.setdefault(f.fragment_id, f.metadata)
    for f in ds.get_fragments():
        out.setdefault(f.fragment_id, f.metadata)
    return out


def tokenized(
    key: tuple[str, str, Analyzer], addrs: np.ndarray, read: Callable[[np.ndarray], Sequence[str | None]]
) -> list[Doc]:
    """The rows at ``addrs`` of the index ``key`` names (``(rows_key, column, analyzer)``)
    tokenized; ``read`` gives the texts of rows not seen before."""
    return _memo.tokenized(key, addrs, read)
