"""A table's own columns named like the ones memwal adds (``_gen``, ``_seq``, ``_region``,
``_lvl``) read as any other column at every level; the debugging columns and the searches'
``_distance`` / ``_score`` refuse a clash in one line. Checked against the dict model."""

from __future__ import annotations

from pathlib import Path

import datafusion
import pyarrow as pa
import pytest

import memwal_query as mq

from lsm_model import PK, ModelTable


def _table(tmp_path: Path, name: str) -> ModelTable:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field(name, pa.float64())])
    rows = [{"id": i, name: float(i * 10 + 1)} for i in range(6)]
    t = ModelTable(str(tmp_path / "t"), schema, pa.Table.from_pylist(rows[:3], schema=schema), bucket=("id", 2))
    t.put([{"id": 2, name: 20.5}, {"id": 3, name: 33.0}])
    t.delete([(0,)])
    t.flush()
    t.put([{"id": 4, name: 40.0}, {"id": 5, name: 50.0}])  # in the WAL tail
    return t


@pytest.mark.parametrize("name", ["_gen", "_seq", "_region", "_lvl"])
def test_a_column_named_like_ours_reads_as_written(tmp_path: Path, name: str) -> None:
    t = _table(tmp_path, name)
    table = mq.open_table(t.uri)
    want = sorted((r["id"], r[name]) for r in t.model.values())
    assert len(want) == 5

    def pairs(got: pa.Table) -> list[tuple[int, float]]:
        return sorted(zip(got.column("id").to_pylist(), got.column(name).to_pylist(), strict=True))

    assert pairs(table.to_arrow()) == want
    assert pairs(table.sql(f'SELECT id, "{name}" FROM t').to_arrow_table()) == want
    assert pairs(table.to_reader(columns=["id", name]).read_all()) == want
    assert pairs(table.lookup([1, 2, 4])) == [p for p in want if p[0] in (1, 2, 4)]
    assert pairs(table.sql(f'SELECT id, "{name}" FROM t WHERE "{name}" > 30').to_arrow_table()) == [
        p for p in want if p[1] > 30
    ]
    eventual = mq.open_table(t.uri, consistency="eventual")  # the WAL tail left out
    assert pairs(eventual.to_arrow()) == [p for p in want if p[0] < 4]


@pytest.mark.parametrize("name", ["_gen", "_region"])
def test_debugging_columns_refuse_a_clash(tmp_path: Path, name: str) -> None:
    table = mq.open_table(_table(tmp_path, name).uri)
    with pytest.raises(mq.InvalidArgumentError, match=f"its own column\\(s\\) \\['{name}'\\].*hidden_columns=True"):
        table.register(datafusion.SessionContext(), "t", hidden_columns=True)


def test_a_column_named_like_our_internal_ones_is_refused(tmp_path: Path) -> None:
    t = _table(tmp_path, "_memwal_seq")
    with pytest.raises(mq.MemWalError, match=f"table {t.uri} has column\\(s\\) \\['_memwal_seq'\\]") as err:
        mq.open_table(t.uri)
    assert "\n" not in str(err.value)


def test_searches_refuse_a_column_named_like_their_score(tmp_path: Path) -> None:
    """Lance refuses to search a table with a ``_distance`` column ("Duplicate column name"),
    and ``_score`` is the column a text search adds: one line naming the table."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("_distance", pa.float64()),
            pa.field("_score", pa.float64()),
            pa.field("text", pa.string()),
            pa.field("xy", pa.list_(pa.float32(), 2)),
        ]
    )
    rows = [{"id": i, "_distance": 1.0, "_score": 2.0, "text": "a b", "xy": [float(i), 0.0]} for i in range(4)]
    t = ModelTable(str(tmp_path / "t"), schema, pa.Table.from_pylist(rows, schema=schema), unsharded=True)
    table = mq.open_table(t.uri)
    with pytest.raises(mq.InvalidArgumentError, match=f"^{t.uri} has its own column '_distance'"):
        table.nearest("xy", [0.0, 0.0], k=2)
    with pytest.raises(mq.InvalidArgumentError, match=f"^{t.uri} has its own column '_score'"):
        table.search_text("text", "a", k=2)


@pytest.mark.parametrize("key", [True, False])
def test_a_column_lance_cannot_read_is_refused_in_one_line(tmp_path: Path, key: bool) -> None:
    """Lance cannot read a column whose name holds a backtick (pylance's own read fails): open
    said each flushed generation was lost, with a repair hint, then failed with Lance's text."""
    ticked = "k`ey"
    pk = ticked if key else "id"
    schema = pa.schema(
        [pa.field(pk, pa.string(), nullable=False, metadata=PK), pa.field("v" if key else ticked, pa.int64())]
    )
    names = schema.names
    t = ModelTable(
        str(tmp_path / "t"), schema, pa.Table.from_pylist([{names[0]: "a", names[1]: 1}], schema=schema), unsharded=True
    )
    t.put([{names[0]: "b", names[1]: 2}])
    t.flush()
    with pytest.raises(mq.MemWalError, match="has column\\(s\\) \\['k`ey'\\] whose name holds a backtick") as err:
        mq.open_table(t.uri)
    assert "\n" not in str(err.value) and t.uri in str(err.value)


def test_a_column_named_like_the_writers_delete_flag_is_refused(tmp_path: Path) -> None:
    """pylance's writer takes a ``_tombstone`` column and writes its delete flags into it."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("_tombstone", pa.bool_())])
    t = ModelTable(
        str(tmp_path / "t"),
        schema,
        pa.Table.from_pylist([{"id": 1, "_tombstone": True}], schema=schema),
        unsharded=True,
    )
    with pytest.raises(mq.MemWalError, match="has a column '_tombstone', the column pylance's MemWAL writer adds"):
        mq.open_table(t.uri)
