"""Values crossing a boundary keep what they mean: instants written into columns without a
time zone (in structs and lists too), text that is not UTF-8, and times handed to Spark,
which holds microseconds."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.errors import InvalidArgumentError, MemWalError
from memwal_query.spark_types import spark_batch, spark_schema
from memwal_write import write_arrow

from lsm_model import PK

NAIVE = pa.timestamp("us")


def _table(tmp_path: Path, *fields: pa.Field) -> str:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), *fields])
    uri = str(tmp_path / "t")
    lance.write_dataset(schema.empty_table(), uri).initialize_mem_wal(bucket_column="id", num_buckets=2)
    return uri


def test_nested_instants_keep_their_local_time(tmp_path: Path) -> None:
    """A zoned timestamp into a column without a zone is stored as its wall-clock time where it
    was taken; in a struct, a list or a map it was stored as its UTC time."""
    uri = _table(
        tmp_path,
        pa.field("s", pa.struct([("at", NAIVE), ("n", pa.int32())])),
        pa.field("l", pa.list_(NAIVE)),
        pa.field("m", pa.map_(pa.string(), NAIVE)),
    )
    zone = pa.timestamp("us", "America/Los_Angeles")
    utc = dt.datetime(2024, 3, 10, 9, 30, tzinfo=dt.timezone.utc)  # 01:30 in Los Angeles
    rows = pa.table(
        {
            "id": [1, 2],
            "s": pa.array([{"at": utc, "n": 1}, None], pa.struct([("at", zone), ("n", pa.int32())])),
            "l": pa.array([[utc, None], None], pa.list_(zone)),
            "m": pa.array([[("k", utc)], []], pa.map_(pa.string(), zone)),
        }
    )
    write_arrow(uri, rows.slice(0))
    got = mq.open_table(uri).to_arrow().sort_by("id").to_pylist()
    local = dt.datetime(2024, 3, 10, 1, 30)
    assert got == [
        {"id": 1, "s": {"at": local, "n": 1}, "l": [local, None], "m": [("k", local)]},
        {"id": 2, "s": None, "l": None, "m": []},
    ]


def test_text_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    """Spark's ``CAST(X'FF61' AS STRING)`` reaches the writer as a string array holding the
    bytes as they are: written, every read of its region failed. Refused, naming the column."""
    uri = _table(tmp_path, pa.field("s", pa.string()), pa.field("l", pa.list_(pa.string())))
    write_arrow(uri, pa.table({"id": [1], "s": ["ok"], "l": [["ok"]]}))
    data = b"\xffa"
    bad = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(b"\0\0\0\0\2\0\0\0"), pa.py_buffer(data)])
    nested = pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), bad)
    encoded = pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), bad)
    for rows in (
        pa.table({"id": [2], "s": bad, "l": [["x"]]}),
        pa.table({"id": [3], "s": ["x"], "l": nested}),
        pa.table({"id": [4], "s": encoded, "l": [["x"]]}),
    ):
        with pytest.raises(MemWalError, match=r"column '[sl]' holds text that is not valid UTF-8"):
            write_arrow(uri, rows)
    assert mq.open_table(uri).to_arrow().column("id").to_pylist() == [1]  # nothing written, still readable


def test_times_handed_to_spark_drop_nanoseconds_towards_the_past() -> None:
    """Before 1970, a cast rounded nanoseconds towards zero, i.e. towards 1970: -500 ns became
    1970-01-01 and a date changed; in a struct the cast failed (a traceback in Spark)."""
    ns = pa.timestamp("ns")
    batch = pa.record_batch(
        {
            "t": pa.array([-500, -1000, -1001, 1500, None], ns),
            "d": pa.array([-1001, 999, None, 0, -1], pa.duration("ns")),
            "s": pa.array([{"t": -1}, None, {"t": 3}, {"t": None}, {"t": -86_400_000_000_001}], pa.struct([("t", ns)])),
            "d64": pa.array([-1, 0, -86_400_000, None, 86_400_000], pa.date64()),
        }
    )
    got = spark_batch(batch, spark_schema(batch.schema))
    assert got.column("t").cast(pa.int64()).to_pylist() == [-1, -1, -2, 1, None]
    assert got.column("d").cast(pa.int64()).to_pylist() == [-2, 0, None, 0, -1]
    assert [None if r is None else r["t"] for r in got.column("s").to_pylist()] == [
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
        None,
        dt.datetime(1970, 1, 1),
        None,
        dt.datetime(1969, 12, 30, 23, 59, 59, 999999),
    ]
    assert got.column("d64").to_pylist() == [
        dt.date(1969, 12, 31),
        dt.date(1970, 1, 1),
        dt.date(1969, 12, 31),
        None,
        dt.date(1970, 1, 2),
    ]


def test_a_time_out_of_sparks_range_is_refused() -> None:
    """A timestamp[s] of 2**62 seconds came to Spark as 1970-01-01 (an unchecked cast)."""
    for t in (pa.timestamp("s"), pa.timestamp("ms", "UTC")):
        batch = pa.record_batch({"at": pa.array([0, 2**62], t)})
        with pytest.raises(InvalidArgumentError, match="column 'at'.*out of bounds"):
            spark_batch(batch, spark_schema(batch.schema))


def test_a_change_column_says_upsert_or_delete_in_any_case(tmp_path: Path) -> None:
    """A ``_change`` column (the change feed's shape, written by the Spark sink) deletes the
    rows saying ``delete``: ``DELETE`` was taken for an upsert of a row of NULLs. Any case is
    read; NULL upserts; another value is refused before anything is written."""
    from memwal_write.spark_sink import SinkOptions, apply_rows

    uri = _table(tmp_path, pa.field("v", pa.int64()))
    opts = SinkOptions.from_options({"path": uri})
    start = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "v": pa.array([10, 20, 30, 40], pa.int64())})
    apply_rows(start, opts)
    change = pa.array(["DELETE", "Upsert", None, "delete"])
    rows = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "v": pa.array([None, 21, 31, None], pa.int64())})
    apply_rows(rows.append_column("_change", change), opts)
    assert mq.open_table(uri).to_arrow().sort_by("id").to_pylist() == [{"id": 2, "v": 21}, {"id": 3, "v": 31}]
    odd = rows.append_column("_change", pa.array(["upsert", "remove", "insert", None]))
    with pytest.raises(InvalidArgumentError, match=r"_change must be 'upsert' or 'delete', got \['insert', 'remove'\]"):
        apply_rows(odd, opts)
    assert mq.open_table(uri).count_rows() == 2
