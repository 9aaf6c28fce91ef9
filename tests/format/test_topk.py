"""The k smallest by a sampled bound equal numpy's full sort, whatever the values."""

from __future__ import annotations

import numpy as np
import pytest

from memwal_query.format.topk import smallest


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 320, 641, 5_000, 28_257])
@pytest.mark.parametrize("k", [1, 10, 100])
def test_smallest_are_the_k_smallest(n: int, k: int) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    for values in (
        rng.random(n).astype(np.float32),
        np.sort(rng.random(n)),  # ascending: the strided sample holds the smallest
        np.sort(rng.random(n))[::-1].copy(),  # descending: it holds the largest
        rng.integers(0, 3, n).astype(np.float32),  # ties everywhere
    ):
        got = smallest(values, k)
        assert got.size == min(k, n)
        assert len(set(got.tolist())) == got.size  # distinct positions
        assert np.sort(values[got]).tolist() == np.sort(values)[: min(k, n)].tolist()


def test_infinities_and_nan_sort_as_numpy_does() -> None:
    rng = np.random.default_rng(3)
    values = rng.random(10_000).astype(np.float32)
    values[rng.choice(10_000, 9_000, replace=False)] = np.inf  # unusable rows
    values[rng.choice(10_000, 500, replace=False)] = np.nan
    for k in (1, 10, 600):
        got = smallest(values, k)
        ref = np.argpartition(values, k - 1)[:k]
        assert np.sort(values[got]).tolist() == pytest.approx(np.sort(values[ref]).tolist(), nan_ok=True)
    nan_sample = np.full(5_000, np.nan)
    nan_sample[7] = 1.0
    assert smallest(nan_sample, 2).size == 2
    assert 7 in smallest(nan_sample, 2).tolist()


def test_no_positions_for_k_zero() -> None:
    assert smallest(np.arange(100.0), 0).size == 0
