"""A base fragment's drop list decided again from the last one, when the newer keys changed a little.

A refresh after a small write changes the newer levels' keys by a few keys, and a base
fragment whose rows did not change (the same identity: id, data files, deletion file)
shadows the rows it shadowed before, minus those whose key left the newer levels, plus
those whose key joined them. For a key-sorted fragment that is two binary searches per
changed key in the fragment's range instead of one lookup per row (at 20M base rows and
160k newer keys, deciding every fragment again took 55 ms of lookups after a 5-row write).

Example:
    >>> import numpy as np
    >>> added, removed = key_delta(np.array([1, 4, 9]), np.array([1, 5, 9]))
    >>> added.tolist(), removed.tolist()
    ([5], [4])
    >>> keys = np.array([3, 4, 5, 6])  # a sorted fragment; row i has address 100 + i
    >>> redecided(keys, lambda rows: (rows + 100).astype(np.uint64), np.array([101], np.uint64), added, removed)
    array([102], dtype=uint64)
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from memwal_query.snapshot.cache import Decision, SnapshotCache

__all__ = ["PriorDecisions", "absent", "is_sorted", "key_delta", "redecided", "sorted_hits"]

_EMPTY_POSITIONS = np.empty(0, dtype=np.int64)
_EMPTY_ADDRESSES = np.empty(0, dtype=np.uint64)
REDECIDE_MAX_SHARE = 128
"""A fragment is decided again from its last decision when the changed keys in its key range
number at most its rows / this (a binary search costs about what 180 per-row lookups do)."""


def is_sorted(keys: np.ndarray) -> bool:
    """Whether ``keys`` are in ascending order."""
    return bool(np.all(keys[1:] >= keys[:-1]))


def absent(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The values of sorted ``a`` that sorted ``b`` lacks."""
    if not b.size or not a.size:
        return a
    at = np.minimum(np.searchsorted(b, a), b.size - 1)
    return np.asarray(a[b[at] != a])


def key_delta(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The keys ``new`` has and ``old`` lacks, and those ``old`` has and ``new`` lacks (both
    sorted, unique); None when they are not comparable (other key types)."""
    if old.dtype != new.dtype:
        return None
    return absent(new, old), absent(old, new)


def sorted_hits(keys: np.ndarray, newer: np.ndarray) -> np.ndarray:
    """Positions (ascending) of the rows of key-sorted ``keys`` whose key is in sorted ``newer``."""
    if not keys.size or not newer.size:
        return _EMPTY_POSITIONS
    w = newer[np.searchsorted(newer, keys[0]) : np.searchsorted(newer, keys[-1], "right")]
    if w.size == 0:
        return _EMPTY_POSITIONS
    lo = np.searchsorted(keys, w, "left")
    hi = np.searchsorted(keys, w, "right")
    counts = hi - lo
    total = int(counts.sum())
    if not total:
        return _EMPTY_POSITIONS
    if not bool((counts > 1).any()):  # unique base keys: one row per key found
        return np.asarray(lo[counts > 0], dtype=np.int64)
    starts = np.repeat(lo, counts)
    return np.asarray(starts + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts), dtype=np.int64)


def _in_range(keys: np.ndarray, values: np.ndarray) -> int:
    """How many of sorted ``values`` lie within sorted ``keys``' range."""
    if not keys.size or not values.size:
        return 0
    return int(np.searchsorted(values, keys[-1], "right") - np.searchsorted(values, keys[0]))


def redecided(
    keys: np.ndarray,
    addresses: Callable[[np.ndarray], np.ndarray],
    drop: np.ndarray,
    added: np.ndarray,
    removed: np.ndarray,
) -> np.ndarray | None:
    """The drop list of a fragment with key-sorted ``keys`` after the newer keys changed.

    Args:
        keys: The fragment's keys in row order (ascending).
        addresses: Row addresses of positions in ``keys`` (only rows that are live).
        drop: The drop list decided before the change (sorted addresses).
        added: Keys that joined the newer levels (sorted).
        removed: Keys that left them (sorted).

    Returns:
        The new sorted drop list, or None when too many changed keys fall in the fragment's
        range for binary searches to beat deciding it whole.
    """
    if _in_range(keys, added) + _in_range(keys, removed) > max(keys.size // REDECIDE_MAX_SHARE, 16):
        return None
    gone = addresses(sorted_hits(keys, removed)) if removed.size else _EMPTY_ADDRESSES
    joined = addresses(sorted_hits(keys, added)) if added.size else _EMPTY_ADDRESSES
    out = drop
    if gone.size:
        at = np.minimum(np.searchsorted(gone, out), gone.size - 1)
        out = out[gone[at] != out]
    if joined.size:
        out = np.union1d(out, joined).astype(np.uint64, copy=False)
    return out


class PriorDecisions:
    """The drop lists base fragments were given by earlier snapshots (kept in the cache per
    fragment identity) and how a snapshot's integer newer keys ``numeric`` differ from
    theirs: a fragment is decided again from its last list when few keys changed.
    """

    def __init__(self, cache: SnapshotCache, numeric: np.ndarray) -> None:
        self.cache = cache
        self.numeric = numeric
        self._deltas: dict[int, tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]] = {}
        self._lock = threading.Lock()

    def redecide(
        self, ident: tuple[object, ...], keys: pa.ChunkedArray, addresses: Callable[[np.ndarray], np.ndarray]
    ) -> tuple[np.ndarray | None, bool | None]:
        """The drop list of the fragment ``ident`` with key column ``keys`` from its last
        decision (:func:`redecided`), and whether its keys are sorted; (None, ...) when
        there is none to start from or deciding it whole is cheaper."""
        with self.cache.lock:
            prior = self.cache.decisions.get(ident)
        if prior is None:
            return None, None
        if prior.newer is self.numeric:
            return prior.drop, prior.key_sorted
        delta = self._delta(prior.newer)
        if delta is None or prior.key_sorted is False or keys.null_count:
            return None, prior.key_sorted
        k = np.asarray(keys.to_numpy(), dtype=self.numeric.dtype)
        # checked again each time: a run of a fragment's stored rows (deleted ones too) can be
        # out of order where the run of its live rows was not; only "unsorted" carries over
        key_sorted = is_sorted(k)
        if not key_sorted:
            return None, False
        return redecided(k, addresses, prior.drop, *delta), True

    def _delta(self, old: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The keys added and removed since the snapshot whose keys were ``old`` (once per ``old``)."""
        with self._lock:
            got = self._deltas.get(id(old))
        if got is None:
            got = (old, key_delta(old, self.numeric))  # holds ``old``: its id stays its own
            with self._lock:
                got = self._deltas.setdefault(id(old), got)
        return got[1]

    def remember(self, ident: tuple[object, ...], drop: np.ndarray, key_sorted: bool | None) -> None:
        """Keep a fragment's drop list for the next snapshot's :meth:`redecide`."""
        self.cache.remember_decision(ident, Decision(self.numeric, drop, key_sorted))
