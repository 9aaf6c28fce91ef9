"""Vector search on awkward data: vectors far from the origin, zero vectors under cosine,
queries and arguments that are not what they should be. Every answer is checked against
numpy over the model's live rows, or against Lance's own search of those rows."""

from __future__ import annotations

from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import memwal_query as mq
import memwal_query.vector_pool as vector_pool
from memwal_query.vector import wait_warm

from lsm_model import PK, ModelTable


def _points_table(uri: str, pts: np.ndarray, column_type: pa.DataType | None = None) -> ModelTable:
    """Rows 0..n-1 with vector ``pts[i]``: the first half in the base, a quarter in a flushed
    generation, the rest in the open writer's MemTable (read from its WAL tail)."""
    dim = pts.shape[1]
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("xy", column_type or pa.list_(pa.float32(), dim)),
        ]
    )
    rows = [{"id": i, "xy": p.tolist()} for i, p in enumerate(pts)]
    n = len(rows)
    base = pa.Table.from_pylist(rows[: n // 2], schema=schema)
    t = ModelTable(uri, schema, base, unsharded=True, max_memtable_rows=n)
    t.put(rows[n // 2 : 3 * n // 4])
    t.flush()
    t.put(rows[3 * n // 4 :])
    return t


def _numpy_nearest(t: ModelTable, q: np.ndarray, k: int) -> list[int]:
    ids = np.array([r["id"] for r in t.model.values()])
    vecs = np.array([r["xy"] for r in t.model.values()], dtype=np.float64)
    d = ((vecs - q.astype(np.float64)) ** 2).sum(axis=1)
    return ids[np.argsort(d, kind="stable")[:k]].tolist()


def test_exact_search_of_vectors_far_from_the_origin(tmp_path: Path) -> None:
    """Points in metres (|x|² ~ 1.6e13, gaps of a few metres): scored from dot products in
    float32, |x|² - 2x·q + |q|² lost the nearest rows of the MemTable and the pooled generation."""
    rng = np.random.default_rng(0)
    pts = (np.array([500_000.0, 4_000_000.0]) + rng.uniform(0, 2000, (400, 2))).astype(np.float32)
    t = _points_table(str(tmp_path / "t"), pts)
    table = mq.open_table(t.uri)
    for warm in (False, True):  # the MemTables alone, then the pool with the generation in memory
        if warm:
            wait_warm()
            table = table.refresh()
        for target in (350, 250, 10):  # a MemTable row, a generation row, a base row
            q = pts[target] + np.float32(1.0)
            got = table.nearest("xy", q, k=5)
            assert got.column("id").to_pylist() == _numpy_nearest(t, q, 5), (warm, target)
            assert got.column("id").to_pylist()[0] == target
    wait_warm()


def test_cosine_leaves_out_zero_vectors_at_every_level(tmp_path: Path) -> None:
    """Lance leaves out rows whose cosine distance is undefined (a zero vector); the
    in-memory search of generations and MemTables scored them 1.0 and returned them."""
    pts = np.array([[0, 0], [1, 0], [0, 1], [0, 0], [-1, 0], [0, 0], [1, 1], [0, 0]], dtype=np.float32)
    t = _points_table(str(tmp_path / "t"), pts)  # zero vectors: ids 0, 3 (base), 5 (generation), 7 (MemTable)
    plain = lance.write_dataset(t.expected(), str(tmp_path / "plain"))
    table = mq.open_table(t.uri)
    q = np.array([1.0, 0.2], np.float32)
    want = plain.to_table(nearest={"column": "xy", "q": q, "k": 10, "metric": "cosine"})
    assert sorted(want.column("id").to_pylist()) == [1, 2, 4, 6]  # Lance's own answer: no zero vector
    for filt in (None, "id >= 0"):  # in memory / Lance's flat search of every level
        got = table.nearest("xy", q, k=10, distance="cosine", filter=filt)
        assert got.column("id").to_pylist() == want.column("id").to_pylist(), filt
        assert np.allclose(got.column("_distance").to_numpy(), want.column("_distance").to_numpy(), atol=1e-6)
    with pytest.raises(mq.InvalidArgumentError, match="'xy' is all zeros: its cosine distance"):
        table.nearest("xy", [0.0, 0.0], distance="cosine")
    assert table.nearest("xy", [0.0, 0.0], k=3).num_rows == 3  # l2 to a zero query is defined
    wait_warm()


def test_infinite_components_rank_as_lance_ranks_them_and_nan_rows_are_left_out(tmp_path: Path) -> None:
    """A vector with an infinite component has an infinite distance (``-inf`` under dot: the
    nearest), which Lance ranks like any other; memwal dropped such rows after cutting to k, and
    answered short. Rows with a NaN component have no distance: left out, as Lance leaves them."""
    rng = np.random.default_rng(3)
    pts = rng.standard_normal((40, 2)).astype(np.float32)
    for i in (1, 22, 33):  # base, generation, MemTable
        pts[i] = [np.inf, 1.0]
    for i in (2, 23, 34):
        pts[i] = [np.nan, 1.0]
    t = _points_table(str(tmp_path / "t"), pts)
    plain = lance.write_dataset(t.expected(), str(tmp_path / "plain"))
    table = mq.open_table(t.uri)
    q = np.array([1.0, 0.5], np.float32)
    for warm in (False, True):  # MemTables and Lance searches, then the generation pooled in memory
        if warm:
            wait_warm()
            table = table.refresh()
        for metric, k in (("dot", 5), ("l2", 40), ("cosine", 40)):
            want = plain.to_table(nearest={"column": "xy", "q": q, "k": k, "metric": metric})
            want = want.select(["id", "_distance"])
            for filt in (None, "id >= 0"):
                got = table.nearest("xy", q, k=k, distance=metric, filter=filt, columns=["id"])
                mine, lances = ({i: x for i, x in zip(*r.to_pydict().values(), strict=True)} for r in (got, want))
                assert mine.keys() == lances.keys(), (warm, metric, filt)  # ties (the infinite ones) in any order
                assert np.allclose([mine[i] for i in lances], list(lances.values()), rtol=0, atol=1e-6)
                assert got.column("_distance").to_pylist() == sorted(mine.values())
    assert not {2, 23, 34} & set(table.nearest("xy", q, k=40).column("id").to_pylist())
    wait_warm()


def test_query_and_argument_errors(tmp_path: Path) -> None:
    pts = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = _points_table(str(tmp_path / "t"), pts)
    table = mq.open_table(t.uri)
    for query in (np.ones((1, 4)), np.ones((4, 1)), np.ones(4, np.float16), [1, 1, 1, 1]):
        assert table.nearest("xy", query, k=2).num_rows == 2  # one vector, any layout or number type
    bad = [
        (np.ones((2, 2)), "must be one vector, got an array of shape \\(2, 2\\)"),
        (None, "not a numeric vector"),
        (np.ones(4) * (1 + 1j), "not a numeric vector"),
        (["a", "b", "c", "d"], "not a numeric vector"),
        ([1e300, 0, 0, 0], "beyond float32's range"),
    ]
    for query, message in bad:
        with pytest.raises(mq.InvalidArgumentError, match=message):
            table.nearest("xy", query)
    with pytest.raises(mq.InvalidArgumentError, match="filter must be a SQL string or a pyarrow expression, got int"):
        table.nearest("xy", [1.0] * 4, filter=123)  # type: ignore[arg-type]
    with pytest.raises(mq.InvalidArgumentError, match="asked for more than once"):
        table.nearest("xy", [1.0] * 4, k=2, columns=["id", "id"])  # as every other path refuses it
    # Lance's refusals quoted the SQL it wraps a filter in and listed its internal columns
    for filt, reason in (
        ("id >", "Expected: an expression, found: EOF"),
        ("no = 1", "No field named no. Valid fields are id, xy."),
    ):
        with pytest.raises(mq.InvalidArgumentError) as err:
            table.nearest("xy", [1.0] * 4, filter=filt)
        assert str(err.value) == f"invalid vector search filter {filt!r} for base of {t.uri}: {reason}"
    # the same as a pyarrow expression: refused before any source is searched (Lance's own text
    # named the base, listed a placeholder for the vector column and was no InvalidArgumentError)
    with pytest.raises(mq.InvalidArgumentError) as err:
        table.nearest("xy", [1.0] * 4, filter=pc.field("no") == 1)
    assert str(err.value) == f"invalid vector search filter (no == 1) for {t.uri}: no column 'no' (columns: id, xy)"
    # a valid expression Lance's Substrait conversion cannot carry and memwal cannot write as SQL
    # (a cast) was a MemWalError "vector search in base ... failed"; the search says to write it as SQL
    with pytest.raises(mq.InvalidArgumentError, match="through Substrait, which cannot carry this one .*as SQL"):
        table.nearest("xy", [1.0] * 4, filter=pc.field("id").cast(pa.float64()) > 1.5)
    # Lance reads the first of several statements only: the SQL function (whose filter cannot be
    # planned by DataFusion inside the query) refuses them as the Python call does
    knn = "SELECT id FROM memwal_knn('t', 'xy', [1.0, 1.0, 1.0, 1.0], 2, '{}')"
    with pytest.raises(mq.InvalidArgumentError, match="filter must be one SQL expression"):
        table.sql(knn.format("id > 0; id < 0")).collect()
    assert len(table.sql(knn.format("id > 0 AND id < 99")).to_pydict()["id"]) == 2
    ints = _points_table(str(tmp_path / "i8"), pts.astype(np.int8), pa.list_(pa.int8(), 4))
    with pytest.raises(mq.InvalidArgumentError, match="holds int8 vectors: Lance searches float vectors only"):
        mq.open_table(ints.uri).nearest("xy", [1.0] * 4, filter="id > 0")
    wait_warm()


def test_hybrid_arguments(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("text", pa.string()),
            pa.field("f", pa.list_(pa.float32(), 2)),
        ]
    )
    base = pa.Table.from_pylist([{"id": i, "text": f"apple {i}", "f": [i, 1.0]} for i in range(10)], schema=schema)
    t = ModelTable(
        str(tmp_path / "t"), schema, base, unsharded=True, prepare=lambda ds: ds.create_scalar_index("text", "INVERTED")
    )
    table = mq.open_table(t.uri)
    plain = table.search_hybrid("f", [1, 1], "text", "apple", k=3, depth=50, rrf_k=60)
    numpy_ints = table.search_hybrid("f", [1, 1], "text", "apple", k=3, depth=np.int64(50), rrf_k=np.int64(60))
    assert numpy_ints.equals(plain)
    for bad in (float("nan"), float("inf"), -1):
        with pytest.raises(mq.InvalidArgumentError, match="rrf_k must be a finite non-negative number"):
            table.search_hybrid("f", [1, 1], "text", "apple", k=3, rrf_k=bad)
    wait_warm()


def test_search_filters_read_names_as_lance_does(tmp_path: Path) -> None:
    """A search filter string is Lance SQL: unquoted ``ID`` is column ``ID`` (DataFusion
    lower-cases it to ``id``) and ``"Cat"`` is a string (a name to DataFusion: refused). Regions were
    pruned with DataFusion's reading while Lance filtered rows with its own: ``ID = 5`` pruned
    to the region of ``id = 5`` and found nothing. Checked against Lance's own filter of the
    live rows."""
    n = 240
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("ID", pa.int64()),
            pa.field("Cat", pa.string()),
            pa.field("text", pa.string()),
            pa.field("xy", pa.list_(pa.float32(), 2)),
        ]
    )
    rows = [
        {"id": i, "ID": (i * 7) % 12, "Cat": "ab"[i % 2], "text": f"word w{i % 5}", "xy": [float(i), 0.0]}
        for i in range(n)
    ]
    t = ModelTable(str(tmp_path / "t"), schema, pa.Table.from_pylist(rows[:120], schema=schema), bucket=("id", 4))
    lance.dataset(t.uri).create_scalar_index("text", "INVERTED")
    t.put(rows[120:180])
    t.flush()
    t.put(rows[180:])
    table = mq.open_table(t.uri)
    live = lance.write_dataset(pa.Table.from_pylist(list(t.model.values()), schema=schema), str(tmp_path / "live"))
    q = np.array([100.0, 0.0], np.float32)
    filters = ["ID = 5", "ID = 5 AND id > 3", "`Cat` = 'a'", "Cat = 'b' AND ID < 3", "cat = 'a'"]
    for filt in filters:  # the last: Lance finds ``Cat`` in another case too
        want = sorted(live.to_table(columns=["id"], filter=filt).column("id").to_pylist())
        got = table.nearest("xy", q, k=n, filter=filt)
        assert sorted(got.column("id").to_pylist()) == want, filt
        hits = table.search_text("text", "word", k=n, filter=filt)
        assert sorted(hits.column("id").to_pylist()) == want, filt
    assert table.nearest("xy", q, k=n, filter="ID = 5").num_rows > 0
    # ``"Cat"`` is a string to Lance, so the filter matched no row: refused, saying so
    with pytest.raises(mq.InvalidArgumentError, match='Lance reads "Cat" as a string'):
        table.nearest("xy", q, k=n, filter="\"Cat\" = 'a'")
    wait_warm()


def test_pool_scores_infinite_vectors_exactly() -> None:
    """The pool scores rows from dot products and squared norms; for a vector with an infinite
    component l2's ``|x|² - 2x·q`` is ``inf - inf`` (NaN: "no distance"), which let the row lose
    its place in the k to rows that have no distance at all."""
    vecs = np.array([[0.0, 1.0], [np.nan, 1.0], [np.nan, 2.0], [np.inf, 1.0], [1.0, 1.0]], np.float32)
    norms = (vecs * vecs).sum(axis=1)
    pool = vector_pool.VectorPool((), vecs, norms, np.zeros(5, np.int32), np.arange(5), None, None)
    idx, d = pool.candidates(np.array([1.0, 0.0], np.float32), "l2", None, 3)
    assert sorted(zip(d.tolist(), idx.tolist(), strict=True)) == [(1.0, 4), (2.0, 0), (np.inf, 3)]


def test_a_pyarrow_filter_on_the_vector_column(tmp_path: Path) -> None:
    """Lance leaves vector columns out of the schema it converts pyarrow filters with: such a
    filter failed with Lance's "No match for FieldRef.Name(xy)"; it is handed over as SQL text."""
    pts = np.arange(40, dtype=np.float32).reshape(20, 2)
    t = _points_table(str(tmp_path / "t"), pts)
    table = mq.open_table(t.uri)
    q = [3.0, 3.0]
    want = table.nearest("xy", q, k=5, filter="xy IS NOT NULL AND id > 2")
    got = table.nearest("xy", q, k=5, filter=pc.field("xy").is_valid() & (pc.field("id") > 2))
    assert got.column("id").to_pylist() == want.column("id").to_pylist() == [3, 4, 5, 6, 7]
    assert table.nearest("xy", q, k=5, filter=pc.field("xy").is_null()).num_rows == 0
    wait_warm()


def test_sql_knn_takes_the_distance(tmp_path: Path) -> None:
    """``memwal_knn``'s 7th argument is the distance (NULL ``nprobes``: the default)."""
    rng = np.random.default_rng(5)
    t = _points_table(str(tmp_path / "t"), rng.standard_normal((60, 4)).astype(np.float32))
    table = mq.open_table(t.uri)
    q = [0.5, -1.0, 0.25, 2.0]
    for distance in ("cosine", "dot", "l2"):
        want = table.nearest("xy", q, k=7, distance=distance)
        got = table.sql(f"SELECT id, _distance FROM memwal_knn('t', 'xy', {q}, 7, '', NULL, '{distance}')")
        assert got.to_arrow_table().to_pylist() == want.select(["id", "_distance"]).to_pylist(), distance
    default = table.sql(f"SELECT id, _distance FROM memwal_knn('t', 'xy', {q}, 7, '', NULL, NULL)")
    assert default.to_arrow_table().to_pylist() == want.select(["id", "_distance"]).to_pylist()  # l2, the last
    with pytest.raises(mq.InvalidArgumentError, match="memwal_knn: the distance must be a string, got 2"):
        table.sql(f"SELECT id FROM memwal_knn('t', 'xy', {q}, 7, '', 4, 2)").collect()
    with pytest.raises(mq.InvalidArgumentError, match="'manhattan'"):
        table.sql(f"SELECT id FROM memwal_knn('t', 'xy', {q}, 7, '', 4, 'manhattan')").collect()
    wait_warm()


def test_searches_of_a_snapshot_whose_base_files_were_compacted_away(tmp_path: Path) -> None:
    """The base compacted and its old versions cleaned up after a snapshot opened: scans said so
    ("no longer readable ... refresh() the table"), vector and text searches gave Lance's bare
    "Not found: .../data/...lance"."""
    import datetime

    rng = np.random.default_rng(3)
    n = 600
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), ("v", pa.list_(pa.float32(), 4)), ("s", pa.string())]
    )
    words = np.array(["apple", "pear", "plum", "fig"])
    rows = pa.table(
        {
            "id": np.arange(n),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 4, dtype=np.float32)), 4),
            "s": [" ".join(rng.choice(words, 3)) for _ in range(n)],
        },
        schema=schema,
    )
    uri = str(tmp_path / "t")
    lance.write_dataset(rows, uri, max_rows_per_file=100).initialize_mem_wal(unsharded=True)
    lance.dataset(uri).create_index("v", "IVF_FLAT", num_partitions=2)
    lance.dataset(uri).create_scalar_index("s", "INVERTED")
    old = mq.open_table(uri)
    ds = lance.dataset(uri)
    ds.delete("id % 3 = 0")
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=10_000, materialize_deletions_threshold=0.0)
    lance.dataset(uri).cleanup_old_versions(older_than=datetime.timedelta(0), delete_unverified=True)
    for search in (lambda: old.nearest("v", [0.5] * 4, k=3), lambda: old.search_text("s", "apple", k=3)):
        with pytest.raises(mq.MemWalError, match=r"no longer readable .* refresh\(\) the table and retry") as err:
            search()
        assert "\n" not in str(err.value) and f"{uri} of {uri}" not in str(err.value)
    assert old.refresh().nearest("v", [0.5] * 4, k=3).num_rows == 3


def test_a_search_filter_with_nan_as_text_says_how_to_write_it(tmp_path: Path) -> None:
    """Lance's filters take no 'NaN' or 'Infinity' text for a float column (DataFusion's SQL
    does): the refusal says to write CAST('NaN' AS DOUBLE), which answers as SQL's 'NaN'."""
    from lsm_model import PK, ModelTable

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("d", pa.float64()),
            pa.field("vec", pa.list_(pa.float32(), 2)),
        ]
    )

    def rows(ids: range) -> pa.Table:
        values = [float("nan"), float("inf"), 1.0]
        return pa.Table.from_pylist([{"id": i, "d": values[i % 3], "vec": [float(i), 0.0]} for i in ids], schema=schema)

    t = ModelTable(str(tmp_path / "t"), schema, rows(range(30)), unsharded=True)
    t.put(rows(range(20, 40)))
    table = mq.open_table(t.uri)
    with pytest.raises(mq.InvalidArgumentError, match=r"'Float64' \(write CAST\('NaN' AS DOUBLE\)\)"):
        table.nearest("vec", [0.0, 0.0], k=100, filter="d = 'NaN'")
    got = table.nearest("vec", [0.0, 0.0], k=100, filter="d = CAST('NaN' AS DOUBLE)").column("id").to_pylist()
    assert sorted(got) == table.sql("SELECT id FROM t WHERE d = 'NaN' ORDER BY id").to_pydict()["id"]
    t.flush()


def _typed_table(tmp_path: Path) -> ModelTable:
    """45 rows with an int16, a decimal, a dictionary and an INVERTED-indexed text column: a
    base, a flushed generation and a WAL tail."""
    import decimal

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("xy", pa.list_(pa.float32(), 2)),
            pa.field("n", pa.int16()),
            pa.field("dec", pa.decimal128(10, 2)),
            pa.field("cat", pa.dictionary(pa.int32(), pa.string())),
            pa.field("text", pa.string()),
        ]
    )

    def rows(ids: range) -> pa.Table:
        return pa.table(
            {
                "id": list(ids),
                "xy": [[float(i), 1.0] for i in ids],
                "n": pa.array([None if i % 6 == 0 else i % 5 for i in ids], pa.int16()),
                "dec": pa.array([decimal.Decimal(i) / 4 for i in ids], pa.decimal128(10, 2)),
                "cat": pa.array([f"c{i % 3}" for i in ids]).dictionary_encode().cast(schema.field("cat").type),
                "text": [f"word{i % 4} common" for i in ids],
            },
            schema=schema,
        )

    t = ModelTable(str(tmp_path / "t"), schema, rows(range(30)), unsharded=True, max_memtable_rows=100)
    lance.dataset(t.uri).create_scalar_index("text", "INVERTED")
    t.put(rows(range(25, 40)))
    t.flush()
    t.put(rows(range(35, 45)))  # a WAL tail
    return t


def test_search_filters_substrait_cannot_carry_are_handed_to_lance_as_sql(tmp_path: Path) -> None:
    """pyarrow binds an integer column compared with a float, or a dictionary column compared
    with a string, by a safe cast, which its Substrait cannot represent: ``nearest`` and
    ``search_text`` refused such filters (to_reader, which filters rows itself, answered them).
    They are written as SQL for Lance (as DataFusion compares: ``CAST(n AS DOUBLE) > 2.5``)."""
    t = _typed_table(tmp_path)
    table = mq.open_table(t.uri)
    n, dec, cat = pc.field("n"), pc.field("dec"), pc.field("cat")
    for filt in (n > 2.5, n == 2.0, (cat == "c1") & (n < 3.5), cat.isin(["c0", "c2"])):
        want = sorted(table.to_reader(columns=["id"], filter=filt).read_all()["id"].to_pylist())
        assert want and len(want) < 45, str(filt)
        got = table.nearest("xy", [0.0, 1.0], k=100, filter=filt)["id"].to_pylist()
        assert sorted(got) == want, str(filt)
        found = table.search_text("text", "common", k=100, filter=filt)["id"].to_pylist()
        assert sorted(found) == want, str(filt)
    # a decimal column against a float: DataFusion compares decimals, Lance's SQL takes no float there
    with pytest.raises(mq.InvalidArgumentError, match="could not convert to literal of type 'Decimal128"):
        table.nearest("xy", [0.0, 1.0], k=100, filter=dec >= 3.5)
    wait_warm()
    t.flush()


def test_search_filters_naming_lances_row_columns_are_refused(tmp_path: Path) -> None:
    """Lance's SQL filters take its row columns (``_rowid``, ``_row_created_at_version``, ...) in
    every dataset, each source numbering its own rows: ``nearest(filter="_rowid = 0")`` found
    the first row of the base, of the generation and of the MemTable. The merged table has no
    such column (SQL and ``to_reader`` refuse it); neither do its searches."""
    t = _typed_table(tmp_path)
    table = mq.open_table(t.uri)
    searches = (
        lambda f: table.nearest("xy", [0.0, 1.0], k=10, filter=f),
        lambda f: table.search_text("text", "common", k=10, filter=f),
        lambda f: table.search_hybrid("xy", [0.0, 1.0], "text", "common", k=10, filter=f),
    )
    for filt in ("_rowid = 0", "id = 5 OR _ROW_CREATED_AT_VERSION = 1", "`_row_last_updated_at_version` > 0"):
        for search in searches:
            refused = r"(?i)invalid (vector|text) search filter .* no column '_row"
            with pytest.raises(mq.InvalidArgumentError, match=refused):
                search(filt)
    # a column name in double quotes (SQL's quoted name) is a string to Lance: no row, silently
    for search in searches:
        with pytest.raises(mq.InvalidArgumentError, match='Lance reads "cat" as a string, not the column'):
            search("\"cat\" = 'c1'")
    # strings (Lance reads "..." as one too) and comments name no column
    for filt in ("text = '_rowid = 0'", 'text = "_rowid"', "id = 1 -- _rowid", "id = 1 /* _rowid */"):
        want = 1 if filt.startswith("id") else 0
        assert table.nearest("xy", [0.0, 1.0], k=10, filter=filt).num_rows == want, filt
    with pytest.raises(mq.InvalidArgumentError, match="nprobes must be a positive integer, got True"):
        table.nearest("xy", [0.0, 1.0], nprobes=True)  # type: ignore[arg-type]
    wait_warm()
    t.flush()
