from __future__ import annotations

import datetime as dt
import decimal
import random
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lance.mem_wal import evaluate_sharding_spec

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.decode import RegionSpec, ShardingFieldSpec
from memwal_query.regionspec import transforms as tf
from memwal_query.regionspec.spec import (
    decode_field_value,
    encode_field_value,
    evaluate_spec,
    lance_field_ids,
    parse_result_type,
    region_groups,
    region_runs,
)

N = 10_000
INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
TS_TYPES = [pa.timestamp(u) for u in ("s", "ms", "us", "ns")] + [
    pa.timestamp("us", "UTC"),
    pa.timestamp("ns", "America/New_York"),
]
NAN_BITS_64 = [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF, 0x7FF4000000000000]
NAN_BITS_32 = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FA00000]
CHARS = "aZ09 éß日本語😀\u0301\x00\x7f"


def _mask(rng: np.random.Generator) -> np.ndarray:
    m = rng.random(N) < 0.1
    m[:50] = False  # keep the hand-picked extremes valid
    return m


def _ints(t: pa.DataType, rng: np.random.Generator) -> pa.Array:
    info = np.iinfo(t.to_pandas_dtype())
    v = rng.integers(info.min, info.max, size=N, dtype=t.to_pandas_dtype(), endpoint=True)
    extremes = [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
    if info.min < 0:
        extremes += [-1, -2]
    v[: len(extremes)] = extremes
    return pa.array(v, type=t, mask=_mask(rng))


def _floats(dtype: type[np.floating], rng: np.random.Generator) -> pa.Array:
    finfo = np.finfo(dtype)
    v = (rng.standard_normal(N) * 10.0 ** rng.integers(-30, 30, N)).astype(dtype)
    v[rng.random(N) < 0.05] = 0.0
    v[rng.random(N) < 0.05] = -0.0
    uint = np.uint64 if dtype == np.float64 else np.uint32
    nans = np.array(NAN_BITS_64 if dtype == np.float64 else NAN_BITS_32, dtype=uint).view(dtype)
    specials = np.concatenate(
        [[0.0, -0.0, np.inf, -np.inf, finfo.max, finfo.min, finfo.tiny, finfo.smallest_subnormal]]
    )
    specials = np.concatenate([specials.astype(dtype), nans])
    v[: len(specials)] = specials
    v[rng.random(N) < 0.02] = nans[rng.integers(0, len(nans))]
    return pa.array(v, mask=_mask(rng))


def _strings(rng: random.Random, mask: np.ndarray) -> list[str | None]:
    out: list[str | None] = ["".join(rng.choice(CHARS) for _ in range(n)) for n in range(21)]
    out += ["".join(rng.choice(CHARS) for _ in range(rng.randint(0, 20))) for _ in range(N - 21)]
    return [None if m else s for s, m in zip(out, mask, strict=True)]


def _oracle_table() -> pa.Table:
    rng = np.random.default_rng(42)
    cols: dict[str, pa.Array] = {}
    for t in INT_TYPES:
        cols[str(t)] = _ints(t, rng)
    cols["bool"] = pa.array(rng.random(N) < 0.5, mask=_mask(rng))
    cols["float32"] = _floats(np.float32, rng)
    cols["float64"] = _floats(np.float64, rng)
    cols["date32"] = _ints(pa.int32(), rng).cast(pa.date32())
    cols["time32s"] = pa.array(rng.integers(0, 86_400, N, dtype=np.int32), mask=_mask(rng)).cast(pa.time32("s"))
    cols["time32ms"] = pa.array(rng.integers(0, 86_400_000, N, dtype=np.int32), mask=_mask(rng)).cast(pa.time32("ms"))
    cols["time64us"] = pa.array(rng.integers(0, 86_400 * 10**6, N), mask=_mask(rng)).cast(pa.time64("us"))
    cols["time64ns"] = pa.array(rng.integers(0, 86_400 * 10**9, N), mask=_mask(rng)).cast(pa.time64("ns"))
    for t in TS_TYPES:
        cols[str(t)] = _ints(pa.int64(), rng).cast(t)
    strs = _strings(random.Random(7), _mask(rng))
    cols["string"] = pa.array(strs, pa.string())
    cols["large_string"] = pa.array(strs, pa.large_string())
    return pa.table(cols)


@pytest.fixture(scope="module")
def oracle_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Table, Any]:
    table = _oracle_table()
    ds = lance.write_dataset(table, str(tmp_path_factory.mktemp("oracle") / "t"))
    return table, ds


def _field(fid: str, sid: int, transform: str, params: dict[str, str]) -> dict[str, Any]:
    return {
        "field_id": fid,
        "source_ids": [sid],
        "transform": transform,
        "expression": None,
        "result_type": "int32",
        "parameters": params,
    }


def _spec(fields: list[dict[str, Any]]) -> RegionSpec:
    return RegionSpec(
        1,
        tuple(
            ShardingFieldSpec(f["field_id"], tuple(f["source_ids"]), f["transform"], None, "int32", f["parameters"])
            for f in fields
        ),
    )


@pytest.mark.parametrize("num_buckets", [16, 1000, 2**31 - 1])
def test_bucket_matches_oracle_on_every_accepted_type(oracle_data: tuple[pa.Table, Any], num_buckets: int) -> None:
    table, ds = oracle_data
    ids = {name: fid for fid, name in lance_field_ids(ds).items()}
    fields = [_field(n, ids[n], "bucket", {"num_buckets": str(num_buckets)}) for n in table.column_names]
    want = evaluate_sharding_spec(
        table.combine_chunks().to_batches()[0], {"spec_id": 1, "fields": fields}, ds.lance_schema
    )
    got = evaluate_spec(_spec(fields), table, lance_field_ids(ds))
    for name in table.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
        assert got.column(name).null_count == 0


def test_identity_and_unsharded_match_oracle(oracle_data: tuple[pa.Table, Any]) -> None:
    table, ds = oracle_data
    names = ["int8", "uint64", "bool", "float64", "string", "timestamp[us, tz=UTC]"]
    ids = {name: fid for fid, name in lance_field_ids(ds).items()}
    fields = [_field(n, ids[n], "identity", {}) for n in names] + [_field("u", 0, "unsharded", {})]
    want = evaluate_sharding_spec(table.to_batches()[0], {"spec_id": 1, "fields": fields}, ds.lance_schema)
    got = evaluate_spec(_spec(fields), table, lance_field_ids(ds))
    assert got.schema.field("u").type == want.schema.field("u").type == pa.int32()
    for name in [*names, "u"]:
        a, b = got.column(name).combine_chunks(), want.column(name)
        if a.type == pa.float64():  # NaN != NaN: compare bit patterns
            a, b = a.view(pa.uint64()), b.view(pa.uint64())
        assert a.equals(b), name


def test_multi_source_bucket_uses_first_source_like_oracle(tmp_path: Any) -> None:
    table = pa.table({"a": pa.array([1, 1, 5, None]), "b": pa.array([3, 4, 3, 9])})
    ds = lance.write_dataset(table, str(tmp_path / "t"))
    field = {**_field("b", 0, "bucket", {"num_buckets": "1000"}), "source_ids": [0, 1]}
    want = evaluate_sharding_spec(table.to_batches()[0], {"spec_id": 1, "fields": [field]}, ds.lance_schema)
    spec = RegionSpec(1, (ShardingFieldSpec("b", (0, 1), "bucket", None, "int32", {"num_buckets": "1000"}),))
    assert evaluate_spec(spec, table, lance_field_ids(ds)).column("b").to_pylist() == want.column("b").to_pylist()


@pytest.mark.parametrize(
    "array",
    [
        pa.array(np.array([1.5], np.float16)),
        pa.array([dt.date(2020, 1, 1)], pa.date64()),
        pa.array([b"a"], pa.binary()),
        pa.array([b"a"], pa.large_binary()),
        pa.array([b"abcd"], pa.binary(4)),
        pa.array([decimal.Decimal("1.5")], pa.decimal128(10, 2)),
        pa.array([1], pa.duration("s")),
        pa.array(["a"], pa.string_view()),
        pa.array(["a"]).dictionary_encode(),
    ],
    ids=lambda a: str(a.type),
)
def test_types_the_oracle_refuses_are_refused(array: pa.Array, tmp_path: Any) -> None:
    table = pa.table({"c": array})
    ds = lance.write_dataset(table, str(tmp_path / "t"))
    field = _field("bucket", 0, "bucket", {"num_buckets": "4"})
    with pytest.raises(ValueError, match="Unsupported bucket sharding column type"):
        evaluate_sharding_spec(table.to_batches()[0], {"spec_id": 1, "fields": [field]}, ds.lance_schema)
    with pytest.raises(InvalidArgumentError, match="region spec 1: region spec field 'bucket': cannot bucket"):
        evaluate_spec(_spec([field]), table, {0: "c"})


def test_spec_vectors_and_canonical_nan() -> None:
    # Test vectors from the MemWAL spec, appendix "Bucket Hashing" (num_buckets = 8).
    assert tf.bucket(pa.array([1, 2, None, 3], pa.int32()), 8).to_pylist() == [2, 7, 0, 1]
    assert tf.bucket(pa.array(["a", "b", None]), 8).to_pylist() == [1, 5, 0]
    assert tf.bucket(pa.array([True]), 8).to_pylist() == [2]
    assert tf.bucket(pa.array([1.25], pa.float32()), 8).to_pylist() == [0]
    assert tf.bucket(pa.array([1.25]), 8).to_pylist() == [0]
    nans = np.array(NAN_BITS_64, np.uint64).view(np.float64)
    assert len(set(tf.hash_values(pa.array(nans)).tolist())) == 1
    assert tf.hash_values(pa.array([0.0, -0.0])).tolist()[0] == tf.hash_values(pa.array([-0.0])).tolist()[0]


@pytest.mark.parametrize(
    ("params", "message"),
    [({}, "missing parameter 'num_buckets'"), ({"num_buckets": "0"}, "positive"), ({"num_buckets": "x"}, "invalid")],
)
def test_bad_bucket_parameters(params: dict[str, str], message: str) -> None:
    spec = RegionSpec(3, (ShardingFieldSpec("bk", (0,), "bucket", None, "int32", params),))
    with pytest.raises(InvalidArgumentError, match=f"region spec 3: region spec field 'bk'.*{message}"):
        evaluate_spec(spec, pa.table({"a": [1]}), {0: "a"})


def test_missing_source_reads_as_null_and_unknown_transform_fails() -> None:
    spec = RegionSpec(
        1,
        (
            ShardingFieldSpec("b", (9,), "bucket", None, "int32", {"num_buckets": "4"}),
            ShardingFieldSpec("i", (9,), "identity", None, "utf8"),
        ),
    )
    got = evaluate_spec(spec, pa.table({"a": [1, 2]}), {0: "a", 9: "gone"})
    assert got.to_pylist() == [{"b": 0, "i": None}] * 2
    assert got.schema.field("i").type == pa.string()
    bad = RegionSpec(1, (ShardingFieldSpec("z", (0,), "zorder", None, "int32"),))
    with pytest.raises(InvalidArgumentError, match="'z' has unsupported transform 'zorder'"):
        evaluate_spec(bad, pa.table({"a": [1]}), {0: "a"})


# ---- multi_bucket -------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=40), st.integers(1, 1000))
def test_multi_bucket_one_column_is_bucket_and_nulls_are_ignored(values: list[int | None], n: int) -> None:
    a = pa.array(values, pa.int64())
    assert tf.multi_bucket([a], n).equals(tf.bucket(a, n))
    assert tf.multi_bucket([a, pa.nulls(len(values), pa.string())], n).equals(tf.bucket(a, n))
    s = pa.array([None if v is None else str(v) for v in values])
    ab = tf.multi_bucket([a, s], n).to_pylist()
    for i, v in enumerate(values):
        if v is not None:  # chained: hash(str, seed=hash(int))
            h = int(tf.hash_values(s.slice(i, 1), tf.hash_values(a.slice(i, 1)))[0])
            assert ab[i] == (h & 0x7FFFFFFF) % n


# ---- truncate -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**62), 2**62)), max_size=40), st.integers(1, 10**6))
def test_truncate_int64_floor(values: list[int | None], width: int) -> None:
    got = tf.truncate(pa.array(values, pa.int64()), width).to_pylist()
    assert got == [None if v is None else v - (v % width) for v in values]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-128, 127)), max_size=40), st.integers(1, 100))
def test_truncate_int8(values: list[int | None], width: int) -> None:
    want = [None if v is None else v - (v % width) for v in values]
    arr = pa.array(values, pa.int8())
    if any(w is not None and w < -128 for w in want):
        with pytest.raises(InvalidArgumentError, match="overflows int8"):
            tf.truncate(arr, width)
    else:
        assert tf.truncate(arr, width).to_pylist() == want
        assert tf.truncate(arr, width).type == pa.int8()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=15)), max_size=30), st.integers(1, 20))
def test_truncate_strings_by_code_point(values: list[str | None], width: int) -> None:
    for t in (pa.string(), pa.large_string()):
        got = tf.truncate(pa.array(values, t), width)
        assert got.type == t
        assert got.to_pylist() == [None if v is None else v[:width] for v in values]


def test_truncate_unsigned_decimal_binary_and_errors() -> None:
    assert tf.truncate(pa.array([2**64 - 1, 5, None], pa.uint64()), 10).to_pylist() == [2**64 - 6, 0, None]
    d = pa.array([decimal.Decimal("10.65"), decimal.Decimal("-10.65"), None], pa.decimal128(6, 2))
    assert tf.truncate(d, 50).to_pylist() == [decimal.Decimal("10.50"), decimal.Decimal("-11.00"), None]
    assert tf.truncate(d.slice(1), 50).to_pylist() == [decimal.Decimal("-11.00"), None]
    assert tf.truncate(pa.array([b"abcdef"]), 2).to_pylist() == [b"ab"]
    with pytest.raises(InvalidArgumentError, match="cannot truncate values of type double"):
        tf.truncate(pa.array([1.5]), 2)
    with pytest.raises(InvalidArgumentError, match="width must be positive"):
        tf.truncate(pa.array([1]), 0)
    with pytest.raises(InvalidArgumentError, match="overflows int64"):
        tf.truncate(pa.array([-(2**63)]), 3)


# ---- year / month / day / hour -----------------------------------------------------------

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
datetimes = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31))


def _ref(d: dt.datetime) -> tuple[int, int, int, int]:
    d = d.replace(tzinfo=dt.timezone.utc)
    seconds = (d - EPOCH) // dt.timedelta(seconds=1)
    return (d.year - 1970, (d.year - 1970) * 12 + d.month - 1, seconds // 86400, seconds // 3600)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), datetimes), max_size=30), st.sampled_from(["s", "ms", "us"]))
def test_temporal_transforms_on_timestamps(values: list[dt.datetime | None], unit: str) -> None:
    values = [None if v is None else v.replace(microsecond=0 if unit == "s" else v.microsecond) for v in values]
    refs = [None if v is None else _ref(v) for v in values]
    for tz in (None, "UTC", "Asia/Kolkata"):
        arr = pa.array(values, pa.timestamp(unit)).cast(pa.timestamp(unit, tz))  # tz-aware: same instant
        for i, fn in enumerate((tf.year, tf.month, tf.day, tf.hour)):
            assert fn(arr).to_pylist() == [None if r is None else r[i] for r in refs], (fn, tz)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.dates()), max_size=30))
def test_temporal_transforms_on_dates(values: list[dt.date | None]) -> None:
    refs = [None if v is None else _ref(dt.datetime(v.year, v.month, v.day)) for v in values]
    for t in (pa.date32(), pa.date64()):
        arr = pa.array(values, t)
        for i, fn in enumerate((tf.year, tf.month, tf.day)):
            assert fn(arr).to_pylist() == [None if r is None else r[i] for r in refs]
    with pytest.raises(InvalidArgumentError, match="hour needs a timestamp"):
        tf.hour(pa.array(values, pa.date32()))


def test_temporal_ns_extremes_and_errors() -> None:
    arr = pa.array([-(2**63), 2**63 - 1], pa.timestamp("ns"))
    assert tf.year(arr).to_pylist() == [1677 - 1970, 2262 - 1970]
    with pytest.raises(InvalidArgumentError, match="does not fit int32"):
        tf.hour(pa.array([2**62], pa.timestamp("s")))
    with pytest.raises(InvalidArgumentError, match="needs a date or timestamp"):
        tf.day(pa.array([1]))


# ---- custom expressions -------------------------------------------------------------------


def test_expression_fields() -> None:
    spec = RegionSpec(
        5,
        (
            ShardingFieldSpec("e", (0, 1), None, "col0 * 10 + length(col1)", "int32"),
            ShardingFieldSpec("c", (), None, "42", "Int64"),
            ShardingFieldSpec("m", (7,), None, "coalesce(col0, 'none')", "utf8"),
        ),
    )
    table = pa.table({"a": pa.array(np.arange(100_000)), "s": pa.array(["xy"] * 100_000)})
    got = evaluate_spec(spec, table, {0: "a", 1: "s"})
    assert got.schema.types == [pa.int32(), pa.int64(), pa.string()]
    assert got.column("e").to_pylist() == [i * 10 + 2 for i in range(100_000)]
    assert got.column("c").to_pylist()[:2] == [42, 42]
    assert got.column("m").to_pylist()[:1] == ["none"]
    bad = RegionSpec(5, (ShardingFieldSpec("x", (0,), None, "col0 +* 1", "int32"),))
    with pytest.raises(InvalidArgumentError, match="region spec 5: region spec field 'x': cannot evaluate"):
        evaluate_spec(bad, table, {0: "a"})


# ---- grouping and field value encoding ----------------------------------------------------


def test_region_groups() -> None:
    values = pa.table({"b": pa.array([1, 0, 1, None, 0], pa.int32()), "s": ["x", "y", "x", None, "z"]})
    got = {k: v.to_pylist() for k, v in region_groups(values).items()}
    assert got == {(1, "x"): [0, 2], (0, "y"): [1], (None, None): [3], (0, "z"): [4]}
    assert list(got) == [(1, "x"), (0, "y"), (None, None), (0, "z")]
    assert region_groups(pa.table({"b": pa.array([], pa.int32())})) == {}


@pytest.mark.parametrize("seed", range(5))
def test_region_runs_equal_region_groups(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 500
    b = rng.integers(0, 4, n)
    s = rng.choice(["x", "y", "z"], n)
    values = pa.table(
        {
            "b": pa.array(b, pa.int32(), mask=rng.random(n) < 0.1),
            "s": pa.array(s.tolist(), mask=rng.random(n) < 0.1),
        }
    )
    order, runs = region_runs(values)
    assert order is not None
    ordered = values.take(order)
    got = {key: order.to_numpy()[start:stop].tolist() for key, start, stop in runs}
    want = {k: v.to_pylist() for k, v in region_groups(values).items()}
    assert got == want  # same regions, rows of each in their original order
    assert len(runs) == len(want)  # one run per region
    for key, start, stop in runs:
        assert {tuple(r.values()) for r in ordered.slice(start, stop - start).to_pylist()} == {key}


def test_region_runs_rows_in_order_are_not_reordered() -> None:
    values = pa.table({"b": pa.array([0, 0, 1, 1, 1, None], pa.int32())})
    order, runs = region_runs(values)
    assert order is None
    assert runs == [((0,), 0, 2), ((1,), 2, 5), ((None,), 5, 6)]
    assert region_runs(pa.table({"b": pa.array([], pa.int32())})) == (None, [])
    assert region_runs(pa.table({"b": pa.array([7], pa.int32())})) == (None, [((7,), 0, 1)])


@pytest.mark.parametrize(
    ("value", "typ", "raw"),
    [
        (3, pa.int32(), b"\x03\x00\x00\x00"),
        (-2, pa.int64(), b"\xfe" + b"\xff" * 7),
        (2**64 - 1, pa.uint64(), b"\xff" * 8),
        (True, pa.bool_(), b"\x01"),
        (1.5, pa.float64(), np.float64(1.5).tobytes()),
        ("日本", pa.string(), "日本".encode()),
        ("", pa.large_string(), b""),
        (b"\x00\x01", pa.binary(), b"\x00\x01"),
        (dt.date(1970, 1, 2), pa.date32(), b"\x01\x00\x00\x00"),
        (decimal.Decimal("1.05"), pa.decimal128(5, 2), (105).to_bytes(16, "little")),
    ],
)
def test_field_value_encoding(value: Any, typ: pa.DataType, raw: bytes) -> None:
    assert encode_field_value(value, typ) == raw
    assert decode_field_value(raw, typ) == value


def test_field_value_encoding_errors_and_type_names() -> None:
    with pytest.raises(InvalidArgumentError, match="NULL"):
        encode_field_value(None, pa.int32())
    with pytest.raises(InvalidArgumentError, match="does not decode"):
        decode_field_value(b"\x00", pa.int32())
    assert parse_result_type("LargeUtf8") == pa.large_string()
    assert parse_result_type("Boolean") == pa.bool_()
    assert parse_result_type("nonsense") is None


def test_chunked_and_sliced_input_matches_whole(oracle_data: tuple[pa.Table, Any]) -> None:
    table, ds = oracle_data
    ids = lance_field_ids(ds)
    fields = [_field(n, fid, "bucket", {"num_buckets": "97"}) for fid, n in ids.items()]
    whole = evaluate_spec(_spec(fields), table, ids)
    parts = pa.Table.from_batches(table.to_batches(max_chunksize=333))
    assert evaluate_spec(_spec(fields), parts, ids).equals(whole)
    assert evaluate_spec(_spec(fields), table.slice(123, 456).to_batches()[0], ids).equals(whole.slice(123, 456))
