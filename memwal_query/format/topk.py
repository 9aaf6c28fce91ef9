"""Positions of the k smallest values of a large array, faster than ``np.argpartition``.

numpy 2.4's ``argpartition`` costs ~0.3 ms on 28k float32 distances (a vector search's
probed pool rows), a fifth of that search. :func:`smallest` bounds the k-th smallest
value by the k-th smallest of a strided sample (the sample's k smallest are values of
the array, so at least k values lie at or under it, and so do the array's k smallest),
keeps the values under that bound (~k * 30 of them) and partitions those only: the
same answer in ~20 us.

Example:
    >>> import numpy as np
    >>> sorted(smallest(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), 2).tolist())
    [1, 3]
"""

from __future__ import annotations

import numpy as np

__all__ = ["smallest"]

#: Sampled values per wanted one: the bound keeps about this many values per k.
_OVERSAMPLE = 32


def smallest(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` smallest of ``values`` (any order; NaN sorts last, as in numpy).

    Args:
        values: A 1-d array.
        k: How many (all positions when ``values`` has at most ``k``).

    Returns:
        ``min(k, values.size)`` positions.
    """
    n = values.size
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    if n <= k:
        return np.arange(n)
    step = n // (k * _OVERSAMPLE)
    if step >= 2:
        bound = np.partition(values[::step], k - 1)[k - 1]
        if not np.isnan(bound):
            under = np.flatnonzero(values <= bound)  # at least k: the sample's k smallest
            return under[np.argpartition(values[under], k - 1)[:k]]
    return np.argpartition(values, k - 1)[:k]
