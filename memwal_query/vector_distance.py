"""Lance's vector distances, computed exactly or fast (from dot products) with an error bound.

Lance's distances: squared l2, ``1 - cosine similarity``, ``1 - dot``. A cosine distance
to or from a zero vector is undefined: Lance leaves such rows out, and so does memwal (a NaN
distance, which every search drops, as it drops rows whose vector holds NaN). An infinite
component gives an infinite distance (``-inf`` for dot: the nearest), which Lance ranks
like any other and so does memwal.

:func:`exact_distances` computes them from the vectors (l2 from the differences), as a
search reports them. :func:`distances_from_dot` computes them from each row's dot product
with the query and its squared norm, which is what makes searching a large in-memory
matrix fast, but in float32 ``|x|² - 2 x·q + |q|²`` cancels where the vectors lie far from
the origin compared with the gaps between them (coordinates in metres, a constant offset
in every dimension): the fast distances may then rank rows wrongly. :func:`dot_slack`
bounds their error, so a search can rescore every row the bound leaves in doubt exactly
(:meth:`memwal_query.vector_pool.VectorPool.candidates`). :func:`vector_matrix` makes the
float32 matrix they take from an Arrow vector column.

Example:
    >>> import numpy as np
    >>> m = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    >>> [round(d, 6) for d in exact_distances(m, np.array([3.0, 0.0], np.float32), "cosine").tolist()]
    [0.4, nan]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["exact_distances", "distances_from_dot", "dot_slack", "vector_matrix"]

_U = 2.0**-24  # float32's unit roundoff


def vector_matrix(col: pa.ChunkedArray | pa.Array, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A vector column as a float32 matrix (null vectors and null elements as zeros) and its validity mask."""
    if isinstance(col, pa.ChunkedArray):  # pyarrow copies even a single chunk it combines
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    n = len(arr)
    values = arr.values
    valid = np.ones(n, dtype=bool)
    if arr.null_count:
        valid = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False))
    if pa.types.is_float32(values.type) and values.buffers()[1] is not None:
        # straight from the data buffer (nulls hold arbitrary values: zeroed below)
        start = values.offset + arr.offset * dim
        data = np.frombuffer(values.buffers()[1], dtype=np.float32, count=n * dim, offset=start * 4)
        mat = data.reshape(n, dim)
        # null elements inside valid vectors (flatten() leaves out the null vectors)
        if values.null_count and (not arr.null_count or arr.flatten().null_count):
            ok = pc.is_valid(values.slice(arr.offset * dim, n * dim)).to_numpy(zero_copy_only=False)
            mat = np.where(np.asarray(ok).reshape(n, dim), mat, np.float32(0))
        elif arr.null_count:
            mat = mat.copy()
        if arr.null_count:
            mat[~valid] = 0
        return np.ascontiguousarray(mat), valid
    sliced = values.slice(arr.offset * dim, n * dim)
    mat = np.asarray(sliced.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(n, dim)
    if sliced.null_count:  # zeros for null elements only: a NaN or infinite value stays what it is
        ok = np.asarray(pc.is_valid(sliced).to_numpy(zero_copy_only=False)).reshape(n, dim)
        mat = np.where(ok, mat, np.float32(0))
    if arr.null_count:
        mat = mat.copy() if not mat.flags.writeable else mat
        mat[~valid] = 0
    return np.ascontiguousarray(mat), valid


def exact_distances(mat: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    """Lance's distance of each row of ``mat`` to ``q``, computed from the vectors (float32).

    Example:
        >>> import numpy as np
        >>> m = np.array([[1.0, 2.0], [0.0, 0.0]], dtype=np.float32)
        >>> exact_distances(m, np.zeros(2, np.float32), "l2").tolist()
        [5.0, 0.0]
    """
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / infinite components: see the module
        if metric == "l2":
            diff = mat - q
            return np.asarray((diff * diff).sum(axis=1), dtype=np.float32)
        dot = mat @ q
        if metric == "cosine":
            n = np.linalg.norm(mat, axis=1) * float(np.linalg.norm(q))
            return _cosine(dot, n)
        return np.asarray(1 - dot, dtype=np.float32)


def distances_from_dot(dot: np.ndarray, norms: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    """Distances from each row's dot product with ``q`` and its squared norm (fast, see :func:`dot_slack`)."""
    with np.errstate(invalid="ignore", over="ignore"):
        if metric == "l2":
            out = np.maximum(norms - 2 * dot + float(q @ q), 0)
        elif metric == "cosine":
            return _cosine(dot, np.sqrt(norms) * float(np.linalg.norm(q)))
        else:
            out = 1 - dot
    return np.asarray(out, dtype=np.float32)


def dot_slack(max_norm: float, q: np.ndarray, metric: str, dim: int) -> float:
    """A bound on the error of :func:`distances_from_dot` for rows of norm at most ``max_norm``.

    Float32 dot products of ``dim`` terms err by at most ``dim`` unit roundoffs times the
    sum of the terms' magnitudes (Cauchy-Schwarz: ``|x| |q|``); the l2 formula adds up
    terms as large as ``(|x| + |q|)²``. The bound is doubled for safety: a wider bound
    only rescores a few more rows.

    Example:
        >>> import numpy as np
        >>> dot_slack(1.0, np.ones(4, np.float32), "cosine", 4) < 1e-5
        True
    """
    c = 2.0 * (dim + 8) * _U
    qn = float(np.linalg.norm(q.astype(np.float64)))
    if metric == "l2":
        return c * (max_norm + qn) ** 2
    if metric == "cosine":
        return c
    return c * (max_norm * qn + 1.0)


def _cosine(dot: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """``1 - dot / norms``; NaN (left out) where a norm product is zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(norms == 0, np.nan, 1 - dot / np.where(norms == 0, 1, norms))
    return np.asarray(out, dtype=np.float32)
