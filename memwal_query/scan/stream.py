"""A one-shot pass over the merged table, batch by batch, at Lance's own pace.

The base fragments a pass reads are scanned by *one* Lance scanner (as
``lance.dataset(uri).to_batches()`` does: Lance reads ahead across fragments, no
pipeline drains between them); each base batch is masked by key against the newer
levels (:class:`~memwal_query.merge.NewerKeys`: a base row is live exactly when its key
has no newer version), so the pass needs neither the base mask nor a row address.
Generations and MemTables follow, each through its own fragment (drop lists as Lance
block lists). Nothing is kept: no column cache entry, no whole fragment in memory; the
first batch arrives as soon as Lance decodes it.

Example:
    >>> import pyarrow as pa
    >>> from memwal_query.merge import NewerKeys
    >>> shadowed(pa.record_batch({"id": [1, 2, 3, 9]}), NewerKeys({"r": pa.table({"id": [2, 9]})}, ["id"])).tolist()
    [False, True, False, True]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import MemWalError, says_missing
from memwal_query.format.lance_open import base_read_error
from memwal_query.merge import NewerKeys
from memwal_query.planner.lance_filter import for_lance
from memwal_query.scan.dataset import MergedDataset
from memwal_query.scan.fragment import SCAN_BATCH_ROWS, SourceFragment, batch_rows
from memwal_query.scan.lance_fragment import LanceFragment

__all__ = ["stream_batches", "shadowed"]

_LANCE_ERRORS = (ValueError, OSError, RuntimeError, pa.ArrowException)


def shadowed(batch: pa.RecordBatch, newer: NewerKeys) -> np.ndarray | None:
    """Rows of a base batch whose key has a newer version (``None``: none)."""
    hit = newer.contains(pa.table({k: batch.column(k) for k in newer.pk}))
    return hit if hit.any() else None


def stream_batches(
    dataset: MergedDataset, columns: Sequence[str] | None, filter: pc.Expression | None
) -> Iterator[pa.RecordBatch]:
    """The merged rows (``columns``, ``filter``; regions pruned) as a stream of batches.

    Args:
        dataset: The merged dataset (normally ``view.dataset(cache=False)``: a one-shot
            pass does not fill the column cache).
        columns: Columns to return (``None``: all).
        filter: A pyarrow filter, pushed into every source (and pruning regions).

    Raises:
        InvalidArgumentError: Unknown columns.
        MemWalError: A file of the snapshot was garbage-collected meanwhile.
    """
    out = dataset.projected(columns)
    cols = list(out.names)
    frags = dataset.source_fragments(filter)
    base = [f for f in frags if isinstance(f, LanceFragment) and f.region is None and f.gen == 0]
    rest = [f for f in frags if not any(f is b for b in base)]
    if base and not dataset.with_hidden:
        yield from _base_pass(dataset, base, cols, filter, out)
    else:
        rest = frags
    yield from _fragments(rest, cols, filter, out)


def _fragments(
    frags: list[SourceFragment], cols: list[str], filt: pc.Expression | None, out: pa.Schema
) -> Iterator[pa.RecordBatch]:
    for f in frags:
        yield from f.scanner(columns=cols, filter=filt, batch_size=SCAN_BATCH_ROWS).to_batches()


def _base_pass(
    dataset: MergedDataset, base: list[LanceFragment], cols: list[str], filt: pc.Expression | None, out: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Every base fragment of ``base`` through one Lance scanner, masked by key."""
    newer = dataset.merge.newer
    pk = newer.pk if len(newer) else []
    read = cols + [k for k in pk if k not in cols]
    if not read:  # count(*)-like: a column to count rows with
        read = list(dataset.data_schema.names[:1])
    ds = base[0].dataset
    try:  # Lance converts an expression filter when the scanner is made: it may refuse it there
        scanner = ds.scanner(
            fragments=[f.fragment for f in base],
            columns=read,
            filter=for_lance(filt, ds.schema),
            batch_size=batch_rows([f.fragment for f in base]),
        )
        it = scanner.to_batches()
        first = next(it, None)
    except _LANCE_ERRORS as err:
        if says_missing(err) or filt is None:
            raise _unreadable(dataset, base, err) from err
        yield from _fragments(list(base), cols, filt, out)  # Lance rejected the filter: per fragment
        return
    if first is None:
        return
    try:
        for b in _chain(first, it):
            if pk:
                hit = shadowed(b, newer)
                if hit is not None:
                    b = b.filter(pa.array(~hit))
            if not b.num_rows:
                continue
            if not cols:
                yield pa.record_batch({"_": pa.nulls(b.num_rows)}).select([])
            else:
                yield pa.RecordBatch.from_arrays([_cast(b.column(c), out.field(c).type) for c in cols], schema=out)
    except GeneratorExit:  # closed unfinished, maybe at exit when module globals are gone
        raise
    except _LANCE_ERRORS as err:
        raise _unreadable(dataset, base, err) from err


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def _cast(a: pa.Array, t: pa.DataType) -> pa.Array:
    return a if a.type == t else a.cast(t)


def _unreadable(dataset: MergedDataset, base: list[LanceFragment], err: BaseException) -> MemWalError:
    """The error for a failed read of the base fragments ``base`` (one scanner: which one failed
    is known only when there is one)."""
    if len(base) == 1:
        return base_read_error(
            dataset.snapshot.base, f"base fragment {base[0].fragment.fragment_id}", err, base[0].fragment
        )
    return base_read_error(dataset.snapshot.base, f"one of {len(base)} base fragments", err)
