from __future__ import annotations

import random

import mmh3
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal_query.regionspec.murmur3 import (
    hash_binary_array,
    hash_int32_words,
    hash_int64_words,
    hash_offsets_bytes,
)

M = 0xFFFFFFFF


def spark_hash_bytes(data: bytes, seed: int = 0) -> int:
    """Pure-Python reference of Spark's hashUnsafeBytes (one round per tail byte)."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & M

    def mix_k1(k: int) -> int:
        return (rotl((k * 0xCC9E2D51) & M, 15) * 0x1B873593) & M

    def mix_h1(h: int, k: int) -> int:
        return (rotl(h ^ k, 13) * 5 + 0xE6546B64) & M

    h = seed & M
    nblocks = len(data) // 4
    for i in range(nblocks):
        h = mix_h1(h, mix_k1(int.from_bytes(data[4 * i : 4 * i + 4], "little")))
    for b in data[4 * nblocks :]:
        h = mix_h1(h, mix_k1((b - 256 if b > 127 else b) & M))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def test_reference_matches_mmh3_on_whole_blocks() -> None:
    rng = random.Random(1)
    for n in range(0, 41, 4):
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert spark_hash_bytes(data, 7) == mmh3.hash(data, 7)


def test_reference_differs_from_mmh3_on_tails() -> None:
    # The tail rule is what makes this Spark's hash, not standard murmur3.
    assert spark_hash_bytes(b"\xff") != mmh3.hash(b"\xff")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=50), st.integers(-(2**31), 2**31 - 1))
def test_int32_words_match_mmh3(values: list[int], seed: int) -> None:
    got = hash_int32_words(np.array(values, dtype=np.uint32), seed)
    assert got.tolist() == [mmh3.hash(v.to_bytes(4, "little"), seed & M) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=50), st.integers(0, 2**32 - 1))
def test_int64_words_match_mmh3(values: list[int], seed: int) -> None:
    got = hash_int64_words(np.array(values, dtype=np.uint64), seed)
    assert got.tolist() == [mmh3.hash(v.to_bytes(8, "little"), seed) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=30), st.integers(0, 2**32 - 1))
def test_bytes_match_reference_and_mmh3(values: list[bytes], seed: int) -> None:
    got = hash_binary_array(pa.array(values, pa.binary()), seed).tolist()
    assert got == [spark_hash_bytes(v, seed) for v in values]
    assert [g for g, v in zip(got, values, strict=True) if len(v) % 4 == 0] == [
        mmh3.hash(v, seed) for v in values if len(v) % 4 == 0
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=30), st.integers(0, 5))
def test_strings_sliced_large_and_per_row_seeds(values: list[str | None], cut: int) -> None:
    seeds = np.arange(len(values), dtype=np.int32) * 977 - 5
    for typ in (pa.string(), pa.large_string()):
        arr = pa.array(values, typ).slice(min(cut, len(values)))
        s = seeds[min(cut, len(values)) :]
        got = hash_binary_array(arr, s).tolist()
        want = [spark_hash_bytes((v or "").encode(), int(x)) for v, x in zip(arr.to_pylist(), s, strict=True)]
        assert [g for g, v in zip(got, arr.to_pylist(), strict=True) if v is not None] == [
            w for w, v in zip(want, arr.to_pylist(), strict=True) if v is not None
        ]


def test_offsets_all_lengths_and_empty() -> None:
    values = [bytes(range(200, 200 + n)) for n in range(0, 30)] + [b""]
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])])
    data = np.frombuffer(b"".join(values), dtype=np.uint8)
    assert hash_offsets_bytes(offsets, data).tolist() == [spark_hash_bytes(v) for v in values]
    assert hash_offsets_bytes(np.array([0]), np.zeros(0, np.uint8)).tolist() == []
    assert hash_binary_array(pa.array([], pa.string())).tolist() == []
    assert hash_binary_array(pa.array(["", ""])).tolist() == [mmh3.hash(b"")] * 2
