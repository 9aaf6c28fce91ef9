"""Full-text search across LSM levels, against one INVERTED index over the live rows.

The oracle is a plain Lance table holding the dict model's live rows with the same
INVERTED index; merged search must return the same top-k with scores within 1%.
"""

from __future__ import annotations

import glob
import shutil
import sys
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lance.file import LanceFileReader
from lance.query import MatchQuery, PhraseQuery

import memwal_query as mq
from memwal_query.errors import InvalidArgumentError
from memwal_query.fts.analyzer import Analyzer
from memwal_query.fts.fst import FstMap

from lsm_model import PK, ModelTable

WORDS = (
    "apple banana cherry date elder fig grape honey ice jam kiwi lemon mango nut olive pear "
    "quince rasp straw tomato the and of running runs RUN Café café naïve über O'Brien e-mail "
    "x1y2 3.14 東京 données Straße jumping jumped résumé"
).split()


def texts(n: int, rng: np.random.Generator) -> list[str | None]:
    p = 1.0 / np.arange(1, len(WORDS) + 1) ** 1.1
    p /= p.sum()
    out: list[str | None] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.02:
            out.append(None)
        elif r < 0.03:
            out.append("the and of")  # stop words only: no document
        else:
            words = rng.choice(WORDS, size=int(rng.integers(1, 14)), p=p)
            sep = rng.choice([" ", ", ", "! ", " - "], size=len(words))
            out.append("".join(f"{w}{s}" for w, s in zip(words, sep, strict=True)).strip())
    return out


def schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("text", pa.string()),
        ]
    )


def rows(ids: Any, rng: np.random.Generator) -> list[dict[str, Any]]:
    ids = [int(i) for i in ids]
    return [
        {"id": i, "cat": ["a", "b", "c"][int(rng.integers(0, 3))], "text": t}
        for i, t in zip(ids, texts(len(ids), rng), strict=True)
    ]


def build(
    path: str,
    *,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    keep_open: bool = True,
    stable_row_ids: bool = False,
    segmented: bool = False,
) -> ModelTable:
    """4 bucket regions; text-changing updates, deletes, re-inserts, a merged generation
    (deleted base rows in the base index, unindexed base fragments), a WAL tail.

    ``stable_row_ids``: the base keeps stable row ids and is compacted before it is
    indexed, so its row ids are not its row addresses. ``segmented``: the base index is
    built one segment per two fragments (Lance's distributed build)."""
    rng = np.random.default_rng(seed)
    base = pa.Table.from_pylist(rows(range(1500), rng), schema=schema())

    def prepare(ds: lance.LanceDataset) -> None:
        if stable_row_ids:
            ds.optimize.compact_files(target_rows_per_fragment=1_000_000)
            ds = lance.dataset(path)
        if segmented:
            frags = [f.fragment_id for f in ds.get_fragments()]
            parts = [frags[i : i + 2] for i in range(0, len(frags), 2)]
            segments = [
                ds.create_index_uncommitted("text", "INVERTED", fragment_ids=p, **(params or {})) for p in parts
            ]
            ds.commit_existing_index_segments("text_idx", "text", segments)
            return
        ds.create_scalar_index("text", "INVERTED", **(params or {}))

    t = ModelTable(
        path,
        schema(),
        base,
        bucket=("id", 4),
        max_memtable_rows=120,
        prepare=prepare,
        write_params={"enable_stable_row_ids": stable_row_ids, "max_rows_per_file": 300}
        if stable_row_ids or segmented
        else None,
    )
    t.put(rows(rng.choice(1900, 300, replace=False), rng))
    t.delete([(int(k),) for k in rng.choice(1500, 40, replace=False)])
    t.flush()
    for r in t.regions()[:2]:
        gens = t.flushed(r)
        if gens:
            t.merge(r, gens[0][0])
    t.put(rows([7, 7, 11], rng))  # duplicates in one batch: the last wins
    t.delete([(5,), (6,), (1950,)])
    t.put(rows([5, 1950], rng))  # re-inserts
    t.put(rows(rng.choice(1900, 250, replace=False), rng))
    t.flush()
    t.put(rows(rng.choice(2000, 80, replace=False), rng))  # left open: the WAL tail
    t.delete([(int(k),) for k in rng.choice(2000, 10, replace=False)])
    if not keep_open:
        t.flush()
    return t


def indexed_table(path: str, base: pa.Table, params: dict[str, Any]) -> ModelTable:
    """A table of ``base`` rows with an INVERTED index on ``text`` (``params``), 2 bucket regions."""
    return ModelTable(
        path, schema(), base, bucket=("id", 2), prepare=lambda ds: ds.create_scalar_index("text", "INVERTED", **params)
    )


def oracle(t: ModelTable, path: str, params: dict[str, Any] | None = None) -> lance.LanceDataset:
    ds = lance.write_dataset(t.expected(), path)
    ds.create_scalar_index("text", "INVERTED", **(params or {}))
    return lance.dataset(path)


def oracle_search(
    ds: lance.LanceDataset, query: str, k: int, filt: str | None = None, phrase: bool = False
) -> pa.Table:
    q = PhraseQuery(query, "text") if phrase else MatchQuery(query, "text")
    kwargs: dict[str, Any] = {"columns": ["id", "_score"], "full_text_query": q, "limit": k}
    if filt:
        kwargs.update(filter=filt, prefilter=True)
    return ds.scanner(**kwargs).to_table()


def assert_same(got: pa.Table, want: pa.Table, k: int) -> None:
    """Same top-k (ties at the cut may swap) and scores within 1%."""
    gs, ws = got.column("_score").to_pylist(), want.column("_score").to_pylist()
    assert len(gs) == len(ws), (got, want)
    np.testing.assert_allclose(gs, ws, rtol=0.01)
    cut = ws[-1] if len(ws) == k else -1.0
    sure = lambda t: {i for i, s in zip(t["id"].to_pylist(), t["_score"].to_pylist(), strict=True) if s > cut * 1.01}  # noqa: E731
    assert sure(got) == sure(want)
    assert set(got["id"].to_pylist()) <= set(want["id"].to_pylist()) | {
        i for i, s in zip(got["id"].to_pylist(), gs, strict=True) if abs(s - cut) <= 0.01 * cut
    }


QUERIES = ["apple", "apple banana", "running jumped", "cafe über", "apple apple kiwi", "東京 données", "O'Brien e-mail"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelTable, lance.LanceDataset]:
    root = tmp_path_factory.mktemp("fts")
    t = build(str(root / "t"))
    return t, oracle(t, str(root / "oracle"))


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("k", [1, 10, 50])
def test_merged_search_equals_one_index_over_live_rows(tables: Any, query: str, k: int) -> None:
    t, ds = tables
    table = mq.open_table(t.uri)
    got = table.search_text("text", query, k=k, columns=["id", "text"])
    assert got.column_names == ["id", "text", "_score"]
    assert_same(got, oracle_search(ds, query, k), k)
    live = {r["id"]: r["text"] for r in t.expected().to_pylist()}
    assert all(live[i] == tx for i, tx in zip(got["id"].to_pylist(), got["text"].to_pylist(), strict=True))


def test_stable_row_ids_that_are_not_row_addresses(tmp_path: Path) -> None:
    t = build(str(tmp_path / "t"), stable_row_ids=True)
    ds = lance.dataset(t.uri)
    both = ds.scanner(columns=[], with_row_id=True, with_row_address=True).to_table()
    assert ds.has_stable_row_ids and both["_rowid"] != both["_rowaddr"]
    want = oracle(t, str(tmp_path / "oracle"))
    live = {r["id"]: r["text"] for r in t.expected().to_pylist()}
    table = mq.open_table(t.uri)
    for query, filt in zip(QUERIES, [None, "cat = 'a'"] * len(QUERIES), strict=False):
        got = table.search_text("text", query, k=10, columns=["id", "text"], filter=filt)
        assert_same(got, oracle_search(want, query, 10, filt), 10)
        assert all(live[i] == tx for i, tx in zip(got["id"].to_pylist(), got["text"].to_pylist(), strict=True))


@pytest.mark.parametrize("filt", ["cat = 'a'", "id < 300", "id IN (5, 7, 11, 1950)", "cat = 'b' AND id > 1000"])
def test_filter_applies_to_live_values(tables: Any, filt: str) -> None:
    t, ds = tables
    table = mq.open_table(t.uri)
    for query in ["apple banana", "cherry"]:
        assert_same(table.search_text("text", query, k=20, filter=filt), oracle_search(ds, query, 20, filt), 20)


def test_filter_prunes_regions(tables: Any) -> None:
    t, _ = tables
    from memwal_query.fts.search import search_text

    table = mq.open_table(t.uri)
    _, stats = search_text(table.view, "text", "apple", k=5, filter="id = 7")
    assert len(stats.pruned_regions) == 3
    assert not any(r in s for s in stats.sources for r in stats.pruned_regions)


def test_eventual_snapshot_and_naive_union_differs(tables: Any, tmp_path: Path) -> None:
    t, _ = tables
    table = mq.open_table(t.uri, consistency="eventual")
    live = table.to_arrow()
    ds = lance.write_dataset(live, str(tmp_path / "o"))
    ds.create_scalar_index("text", "INVERTED")
    for q in QUERIES[:3]:
        assert_same(table.search_text("text", q, k=10), oracle_search(ds, q, 10), 10)


@pytest.mark.parametrize("query", QUERIES)
def test_threshold_rounds_find_the_same_top_k(tables: Any, query: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source searched top-m first (no source small enough to take whole)."""
    import memwal_query.fts.search as search

    monkeypatch.setattr(search, "_SMALL_SOURCE", 0)
    t, ds = tables
    table = mq.open_table(t.uri)
    for k in (1, 3, 25):
        got, stats = search.search_text(table.view, "text", query, k=k)
        assert not stats.exhaustive
        assert_same(got, oracle_search(ds, query, k), k)


PARAMS = [
    {},
    {"stem": False, "remove_stop_words": False, "lower_case": False, "ascii_folding": False},
    {"base_tokenizer": "whitespace", "max_token_length": 6},
    {"base_tokenizer": "ngram", "min_ngram_length": 2, "max_ngram_length": 3},
    {"with_position": True, "language": "French"},
    # Lance's custom list replaces the default one ("and", "of" are indexed); describe_indices()
    # gives it as None: memwal read the default list, and scores were wrong
    {"remove_stop_words": True, "custom_stop_words": ["apple", "the"]},
]


@pytest.mark.parametrize("params", PARAMS, ids=[",".join(p) or "default" for p in PARAMS])
def test_analyzer_and_index_files_match_lance(tmp_path: Path, params: dict[str, Any]) -> None:
    """Token counts per row and df per token, read from the index files, equal our own tokenization."""
    from memwal_query.fts.corpus import index_analyzer, inverted_index
    from memwal_query.fts.index_files import read_index_files

    rng = np.random.default_rng(3)
    extra = ["".join(chr(int(c)) for c in rng.integers(0x41, 0x24F, 5)) for _ in range(300)]  # wide first bytes
    docs = texts(600, rng) + [" ".join(rng.choice(extra, 6)) for _ in range(200)]
    ds = lance.write_dataset(pa.table({"text": docs}), str(tmp_path / "d"))
    ds.create_scalar_index("text", "INVERTED", **params)
    ds = lance.dataset(str(tmp_path / "d"))
    desc = inverted_index(ds, "text")
    analyzer = index_analyzer(ds, desc, {})
    assert analyzer.with_position == bool(params.get("with_position"))
    files = read_index_files(f"{ds.uri}/_indices/{desc.segments[0].uuid}")
    mine = analyzer.tokenize_all(docs)
    lengths = np.array([len(d) for d in mine])
    assert files.rowids.tolist() == np.flatnonzero(lengths).tolist()  # rows without tokens are no documents
    assert files.num_tokens.tolist() == lengths[lengths > 0].tolist()
    assert files.total_tokens == lengths.sum()
    df: dict[str, int] = {}
    for d in mine:
        for tok in set(d.tokens):
            df[tok] = df.get(tok, 0) + 1
    assert {t: files.doc_freq(t) for t in df} == df
    assert files.doc_freq("zzz-not-a-token") == 0


def test_fst_of_a_large_unicode_vocabulary(tmp_path: Path) -> None:
    """Nodes with more than 32 transitions (an index table), multi-byte keys, long shared prefixes."""
    rng = np.random.default_rng(5)
    alphabet = [chr(c) for c in range(0x61, 0x7B)] + [chr(c) for c in range(0xE0, 0x17F)] + list("東京日本語")
    vocab = sorted({"".join(rng.choice(alphabet, int(rng.integers(1, 9)))) for _ in range(4000)})
    vocab += [f"prefix{'x' * i}" for i in range(30)]
    params = {"stem": False, "remove_stop_words": False, "ascii_folding": False, "max_token_length": None}
    ds = lance.write_dataset(pa.table({"text": vocab}), str(tmp_path / "v"))
    ds.create_scalar_index("text", "INVERTED", **params)
    (path,) = glob.glob(f"{tmp_path}/v/_indices/*/part_0_tokens.lance")
    fst = FstMap(LanceFileReader(path).read_all().to_table().column("_token_fst_bytes")[0].as_py())
    analyzer = Analyzer.from_params(params)
    tokens = sorted({t for v in vocab for t in analyzer.tokens(v)})
    ids = [fst.get(t) for t in tokens]
    assert sorted(i for i in ids if i is not None) == list(range(len(tokens))) and fst.len == len(tokens)
    assert fst.get("prefixxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx") is None and fst.get("") is None


@pytest.mark.parametrize("params", PARAMS[1:], ids=[",".join(p) for p in PARAMS[1:]])
def test_merged_search_with_other_index_parameters(tmp_path: Path, params: dict[str, Any]) -> None:
    t = build(str(tmp_path / "t"), seed=4, params=params)
    ds = oracle(t, str(tmp_path / "o"), params)
    table = mq.open_table(t.uri)
    for q in ["Apple banana", "café über", "runn jump", "O'Brien", "and of grape"]:
        assert_same(table.search_text("text", q, k=15), oracle_search(ds, q, 15), 15)


def test_phrase_queries_where_the_index_has_positions(tmp_path: Path) -> None:
    params = {"with_position": True}
    t = build(str(tmp_path / "t"), seed=6, params=params)
    ds = oracle(t, str(tmp_path / "o"), params)
    table = mq.open_table(t.uri)
    for q in ["apple banana", "banana apple", "the apple", "cherry, date", "apple apple"]:
        got = table.search_text("text", q, k=20, phrase=True)
        assert_same(got, oracle_search(ds, q, 20, phrase=True), 20)
        assert got.num_rows > 0
    filtered = table.search_text("text", "apple banana", k=20, phrase=True, filter="cat = 'a'")
    assert_same(filtered, oracle_search(ds, "apple banana", 20, "cat = 'a'", phrase=True), 20)


def test_phrase_queries_on_an_ngram_index_answer_as_lance_does(tmp_path: Path) -> None:
    """Lance's n-gram tokens all sit at position 0: its phrase query passes any document
    holding one of them (a plain query). MemTable rows were checked as real phrases."""
    params = {"base_tokenizer": "ngram", "min_ngram_length": 2, "max_ngram_length": 3, "with_position": True}
    t = build(str(tmp_path / "t"), seed=8, params=params)
    ds = oracle(t, str(tmp_path / "o"), params)
    table = mq.open_table(t.uri)
    for q in ["apple", "banan", "kiwi pear"]:
        got = table.search_text("text", q, k=40, phrase=True)
        assert_same(got, oracle_search(ds, q, 40, phrase=True), 40)


def test_phrase_queries_with_tokens_sharing_a_position(tmp_path: Path) -> None:
    """The ``code`` analyzer with ``preserve_original`` gives ``foo_bar`` and its parts
    ``foo`` / ``bar`` the positions 0, 0, 1: Lance takes a phrase's tokens at one position as
    alternatives. MemTable and generation rows needed all of them: ``"foo_bar baz"`` missed
    ``x foo bar baz``."""
    params = {
        "base_tokenizer": "code",
        "split_identifiers": True,
        "preserve_original": True,
        "with_position": True,
    }
    words = ["foo", "bar", "baz", "fooBar", "foo_bar", "barBaz", "x", "fooBar_baz"]
    rng = np.random.default_rng(2)
    texts_ = [" ".join(rng.choice(words, int(rng.integers(1, 5)))) for _ in range(300)]
    base = pa.Table.from_pylist([{"id": i, "cat": "a", "text": texts_[i]} for i in range(100)], schema=schema())
    t = indexed_table(str(tmp_path / "t"), base, params)
    t.put([{"id": i, "cat": "b", "text": texts_[i]} for i in range(100, 200)])
    t.flush()  # a generation
    t.put([{"id": i, "cat": "b", "text": texts_[i]} for i in range(200, 300)])  # the WAL tail
    ds = oracle(t, str(tmp_path / "o"), params)
    table = mq.open_table(t.uri)
    for q in ["foo_bar baz", "fooBar", "foo_bar", "foo bar", "x fooBar_baz", "barBaz foo"]:
        want = oracle_search(ds, q, 300, phrase=True)
        assert want.num_rows, q
        assert_same(table.search_text("text", q, k=300, phrase=True), want, 300)
    t.flush()


def test_clear_errors(tables: Any, tmp_path: Path) -> None:
    t, _ = tables
    table = mq.open_table(t.uri)
    with pytest.raises(InvalidArgumentError, match=r"column 'cat' of .* has no INVERTED index") as err:
        table.search_text("cat", "a")
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match=r"phrase queries need positions: index text_idx on 'text'"):
        table.search_text("text", "apple banana", phrase=True)
    with pytest.raises(InvalidArgumentError, match="not a string column"):
        table.search_text("id", "1")
    with pytest.raises(InvalidArgumentError, match="k must be a positive integer"):
        table.search_text("text", "apple", k=0)
    with pytest.raises(InvalidArgumentError, match="unknown column"):
        table.search_text("text", "apple", columns=["nope"])
    with pytest.raises(InvalidArgumentError, match="no_col") as err:
        table.search_text("text", "apple", filter="no_col = 1")
    assert f"invalid text search filter 'no_col = 1' for {t.uri} (in " in str(err.value)
    assert str(err.value).endswith(": No field named no_col. Valid fields are id, cat, text.")
    with pytest.raises(InvalidArgumentError) as err:
        table.search_text("text", "apple", filter=pc.field("cat") == 1)
    assert str(err.value).startswith(f"invalid text search filter (cat == 1) for {t.uri}: Function 'equal' has no")
    assert "\n" not in str(err.value)
    empty = table.search_text("text", "the and of", columns=["id"])  # stop words only: nothing to match
    assert empty.num_rows == 0 and empty.column_names == ["id", "_score"]


def test_refresh_sees_new_writes_and_merges(tmp_path: Path) -> None:
    t = build(str(tmp_path / "t"), seed=8, keep_open=False)
    table = mq.open_table(t.uri)
    table.search_text("text", "apple")
    rng = np.random.default_rng(9)
    t.put(rows(rng.choice(2000, 200, replace=False), rng))
    t.flush()
    for r in t.regions()[2:]:  # build() merged generation 1 of the first two regions
        gens = t.flushed(r)
        if gens:
            t.merge(r, gens[0][0])
    t.delete([(int(k),) for k in rng.choice(2000, 30, replace=False)])
    ds = oracle(t, str(tmp_path / "o"))
    fresh = table.refresh()
    for q in QUERIES[:4]:
        assert_same(fresh.search_text("text", q, k=10), oracle_search(ds, q, 10), 10)


@pytest.mark.parametrize("small_source", [0, 4096])
def test_generations_through_their_own_indexes(tables: Any, monkeypatch: pytest.MonkeyPatch, small_source: int) -> None:
    """Generations above the postings threshold are searched through their own index files."""
    import memwal_query.fts.corpus as corpus
    import memwal_query.fts.search as search

    monkeypatch.setattr(corpus, "POSTINGS_MAX_ROWS", 0)
    monkeypatch.setattr(search, "_SMALL_SOURCE", small_source)
    t, ds = tables
    table = mq.open_table(t.uri)
    built = corpus.corpus_of(table.view, "text")
    assert len(built.indexed) > 1 and all(s.unreadable_rows == 0 for s in built.indexed)
    assert any(sum(f.num_docs for f in s.files) > s.num_docs for s in built.indexed[1:])  # non-live rows removed
    for q in QUERIES:
        for k in (1, 10):
            assert_same(table.search_text("text", q, k=k), oracle_search(ds, q, k), k)
    for filt in ("cat = 'a'", "id < 300"):
        assert_same(
            table.search_text("text", "apple banana", k=20, filter=filt),
            oracle_search(ds, "apple banana", 20, filt),
            20,
        )


@pytest.mark.parametrize("params", PARAMS, ids=[",".join(p) or "default" for p in PARAMS])
def test_many_texts_per_lance_call_tokenize_like_one_at_a_time(params: dict[str, Any]) -> None:
    """Batched tokenization (texts joined by a separator word) equals Lance on each text alone:
    tokens and positions, texts holding the separator word, empty, NULL and stop-word-only texts."""
    from memwal_query.fts import analyzer as az

    rng = np.random.default_rng(11)
    words = ["The", "a", "Cats", "running", "dogs", "and", "über", "naïve", "C++", "foo_bar", "x" * 45, ",", "!"]
    docs: list[str | None] = [" ".join(rng.choice(words, int(rng.integers(0, 25)))) for _ in range(1500)]
    docs[3::97] = [None] * len(docs[3::97])
    docs[5::89] = ["the and a"] * len(docs[5::89])
    docs[700] = f"cats {az._SEPARATOR} dogs"  # falls back for its batch only
    a = Analyzer.from_params({**params, "with_position": True})
    one = [a.tokenize(d) for d in docs]
    assert a.tokenize_all(docs) == one
    tokens = a.tokenize_flat(docs)
    assert [tokens.doc(i) for i in range(len(docs))] == one
    assert sum(len(d) for d in one) == len(tokens.words) > 0


def test_wide_columns_are_read_by_address_not_kept(tmp_path: Path) -> None:
    """In-memory sources keep their narrow columns only (a vector column is not held for
    every row); asked for, a vector comes from its source by row address and equals the model."""
    from memwal_query.fts.corpus import corpus_of

    vec_schema = schema().append(pa.field("vec", pa.list_(pa.float32(), 4)))
    rng = np.random.default_rng(21)

    def with_vectors(ids: Any) -> list[dict[str, Any]]:
        return [{**r, "vec": [float(r["id"]), 1.0, 2.0, float(len(r["text"] or ""))]} for r in rows(ids, rng)]

    base = pa.Table.from_pylist(with_vectors(range(400)), schema=vec_schema)
    t = ModelTable(
        str(tmp_path / "v"),
        vec_schema,
        base,
        bucket=("id", 2),
        max_memtable_rows=100,
        prepare=lambda ds: ds.create_scalar_index("text", "INVERTED"),
    )
    newer = with_vectors(rng.choice(500, 120, replace=False))
    t.put(newer)
    t.flush()
    tail = with_vectors(rng.choice(500, 40, replace=False))
    t.put(tail)  # WAL tail
    newer_ids = {r["id"] for r in newer + tail}
    table = mq.open_table(t.uri)
    flat = corpus_of(table.view, "text").flat
    assert flat and all("vec" not in f.rows.column_names and "text" in f.rows.column_names for f in flat)
    seen_flat = 0
    for word in WORDS[:6]:
        got = table.search_text("text", word, k=20, columns=["id", "vec", "text"])
        narrow = table.search_text("text", word, k=20, columns=["id", "text"])  # from the kept rows
        assert got.select(["id", "text", "_score"]).equals(narrow.select(["id", "text", "_score"]))
        for r in got.to_pylist():
            want = t.model[(r["id"],)]
            assert r["vec"] == pytest.approx(want["vec"]) and r["text"] == want["text"]
        seen_flat += sum(1 for r in got.to_pylist() if r["id"] in newer_ids)
    assert seen_flat  # rows of the in-memory sources were among the answers


@pytest.mark.parametrize("n", [50, 5_000])  # short posting lists summed densely, then sparsely
def test_bm25_sums_every_query_token_whatever_the_posting_lengths(n: int) -> None:
    from memwal_query.fts.bm25 import CorpusStats
    from memwal_query.fts.postings import bm25_from

    rng = np.random.default_rng(n)
    lists = {t: np.unique(rng.integers(0, n, 40)) for t in "abc"}
    weights = {t: (idx, rng.random(idx.size) + 0.1) for t, idx in lists.items()}
    stats = CorpusStats(n, 10 * n, {"a": 3, "b": 7, "c": 1})
    mask = rng.random(n) < 0.7
    for query in (["a"], ["a", "b"], ["b", "c", "b"], ["a", "zzz"], ["zzz"]):
        want: dict[int, float] = {}
        for t in query:
            idx, w = weights.get(t, (np.empty(0, np.int64), np.empty(0)))
            for r, x in zip(idx.tolist(), w.tolist(), strict=True):
                if mask[r]:
                    want[r] = want.get(r, 0.0) + stats.idf(t) * x
        rows, scores = bm25_from(n, lambda t: weights.get(t, (np.empty(0, np.int64), np.empty(0))), query, stats, mask)
        got = dict(zip(rows.tolist(), scores.tolist(), strict=True))
        assert got.keys() == want.keys(), query
        assert all(abs(got[r] - want[r]) < 1e-9 for r in want), query


def test_a_search_of_a_snapshot_whose_generations_were_collected(tmp_path: Path) -> None:
    """A snapshot searched (hybrid: the rows it holds have the key and vector only), then every
    generation merged and garbage-collected: a text search read the winners' other columns from
    a collected generation and raised Lance's bare OSError ("Not found: .../data/...lance"); it
    says to refresh, as scans do."""
    from memwal_write import collect_garbage, merge_generations, write_arrow

    rng = np.random.default_rng(3)
    dim = 8
    fields = [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("vec", pa.list_(pa.float32(), dim))]
    vschema = pa.schema([*fields, pa.field("text", pa.string())])

    def vrows(ids: Any) -> pa.Table:
        ids = np.asarray(ids, dtype=np.int64)
        vecs = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(len(ids) * dim, dtype=np.float32)), dim)
        words = [" ".join(rng.choice(WORDS[:12], int(rng.integers(2, 8)))) for _ in ids]
        return pa.table({"id": ids, "vec": vecs, "text": words}, schema=vschema)

    uri = str(tmp_path / "t")
    lance.write_dataset(vrows(range(2000)), uri, enable_stable_row_ids=True, max_rows_per_file=1000)
    lance.dataset(uri).create_index("vec", "IVF_FLAT", num_partitions=4)
    lance.dataset(uri).create_scalar_index("text", "INVERTED")
    lance.dataset(uri).initialize_mem_wal(bucket_column="id", num_buckets=4, max_memtable_rows=300)
    write_arrow(uri, vrows(range(1500, 2600)))
    old = mq.open_table(uri)
    q = rng.standard_normal(dim).astype(np.float32)
    old.search_hybrid("vec", q, "text", "apple", k=10, nprobes=4)
    merge_generations(uri)
    collect_garbage(uri, older_than=0)
    with pytest.raises(mq.MemWalError, match=r"refresh\(\) the table and retry") as err:
        old.search_text("text", "kiwi", k=10)
    assert "\n" not in str(err.value)
    assert old.refresh().search_text("text", "kiwi", k=10).num_rows == 10


def test_a_table_written_again_at_the_same_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens learnt of the base's rows were kept by path and row address: a table deleted and
    written again at the same path (a notebook re-running its set-up) was scored with the old
    rows' tokens (17 of 122 scores wrong in a helper's reproduction). The second table has the
    same shape and the same number of tokens per row (each word replaced by another), which
    also defeats the length check of the non-live rows' counts."""
    path = str(tmp_path / "t")
    build(path, seed=3, keep_open=False)
    old = mq.open_table(path)
    for q in QUERIES[:4]:
        old.search_text("text", q, k=10)
    mq.vector.wait_warm()  # the non-live rows tokenized in the background
    shutil.rmtree(path)
    fruit = WORDS[:20]  # no stop words: a row keeps its token count
    monkeypatch.setattr(sys.modules[__name__], "WORDS", fruit[1:] + fruit[:1] + WORDS[20:])
    second = build(path, seed=3, keep_open=False)
    ds = oracle(second, str(tmp_path / "o"))
    for table in (mq.open_table(path), old.refresh()):
        for q in QUERIES[:4]:
            assert_same(table.search_text("text", q, k=50), oracle_search(ds, q, 50), 50)


def test_base_text_rewritten_in_place(tmp_path: Path) -> None:
    """A column rewritten in place (``merge_insert(...).write_mode("rewrite_columns")`` on the
    base) takes the fragment out of the index's coverage while the index still holds the old
    rows' tokens: those non-live rows' counts were read from the new text (same token counts:
    each word swapped for another), and scores were wrong in a cold process too."""
    fruit = WORDS[:20]
    swap = dict(zip(fruit, fruit[1:] + fruit[:1], strict=True))
    rng = np.random.default_rng(5)
    n = 1200
    text = [" ".join(rng.choice(fruit[:12], int(rng.integers(2, 8)))) for _ in range(n)]
    path = str(tmp_path / "t")
    base = pa.table({"id": list(range(n)), "cat": ["a"] * n, "text": text}, schema=schema())
    ds = lance.write_dataset(base, path, max_rows_per_file=400)
    ds.create_scalar_index("text", "INVERTED")
    lance.dataset(path).initialize_mem_wal(unsharded=True)
    table = mq.open_table(path)
    table.search_text("text", "apple", k=10)
    mq.vector.wait_warm()
    ids = list(range(0, 400, 2))  # half of the first fragment
    for i in ids:
        text[i] = " ".join(swap[w] for w in text[i].split())
    patch = pa.table({"id": pa.array(ids, pa.int64()), "text": [text[i] for i in ids]})
    lance.dataset(path).merge_insert("id").when_matched_update_all().write_mode("rewrite_columns").execute(patch)
    live = pa.table({"id": list(range(n)), "cat": ["a"] * n, "text": text}, schema=schema())
    want = lance.write_dataset(live, str(tmp_path / "o"))
    want.create_scalar_index("text", "INVERTED")
    want = lance.dataset(str(tmp_path / "o"))
    for fresh in (table.refresh(), mq.open_table(path)):
        mq.vector.wait_warm()
        for q in ["apple", "banana", "apple kiwi", "cherry date"]:
            assert_same(fresh.search_text("text", q, k=10), oracle_search(want, q, 10), 10)


def test_an_empty_text_is_a_token_of_the_raw_tokenizer(tmp_path: Path) -> None:
    """Lance's ``raw`` tokenizer makes ``''`` one token: the query ``''`` finds the rows whose
    text is empty. memwal gave an empty text (row or query) no token: nothing was found."""
    params = {"base_tokenizer": "raw"}
    base = pa.Table.from_pylist(
        [{"id": i, "cat": "a", "text": ["", "red", None, "red blue"][i % 4]} for i in range(40)], schema=schema()
    )
    t = indexed_table(str(tmp_path / "t"), base, params)
    t.put([{"id": i, "cat": "b", "text": ["", "red"][i % 2]} for i in range(30, 50)])  # the WAL tail
    ds = oracle(t, str(tmp_path / "o"), params)
    table = mq.open_table(t.uri)
    for q in ["", "red", "red blue"]:
        want = oracle_search(ds, q, 100)
        assert want.num_rows, q
        assert_same(table.search_text("text", q, k=100), want, 100)
    t.flush()


@pytest.mark.parametrize("served", ["postings", "index"])
def test_null_texts_of_a_raw_tokenized_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: str) -> None:
    """The index pylance builds when it flushes a generation holds a NULL text as the token
    ``''`` of the ``raw`` tokenizer (a base index and a plain Lance index leave NULLs out): the
    query ``''`` also found the NULL rows, and every score counted them as documents.
    ``served``: the generation's postings read into memory, or searched through its own index."""
    import memwal_query.fts.corpus as corpus

    if served == "index":
        monkeypatch.setattr(corpus, "POSTINGS_MAX_ROWS", 10)
    params = {"base_tokenizer": "raw"}
    base = pa.Table.from_pylist(
        [{"id": i, "cat": "a", "text": ["", "red", None, "blue"][i % 4]} for i in range(40)], schema=schema()
    )
    t = indexed_table(str(tmp_path / "t"), base, params)
    t.put([{"id": i, "cat": "b", "text": ["", "red", None, None, "blue"][i % 5]} for i in range(20, 90)])
    t.delete([(21,), (22,), (23,)])  # a NULL row's key deleted inside the generation
    t.flush()
    t.put([{"id": i, "cat": "c", "text": "red"} for i in range(60, 64)])  # NULL rows replaced (the WAL tail)
    ds = oracle(t, str(tmp_path / "o"), params)
    for table in (mq.open_table(t.uri), mq.open_table(t.uri).refresh()):
        for q in ["", "red", "blue"]:
            want = oracle_search(ds, q, 100)
            assert want.num_rows, q
            assert_same(table.search_text("text", q, k=100), want, 100)
        mq.vector.wait_warm()
        assert_same(table.search_text("text", "", k=100), oracle_search(ds, "", 100), 100)
    t.flush()


def test_tied_scores_come_back_alike_from_one_search_to_the_next(tmp_path: Path) -> None:
    """Lance's search of an index of several segments (``optimize_indices`` after a merge)
    returns rows of equal score in another order each time: the same call on one snapshot
    ordered its ties (and picked those at the k-th score) differently from one run to the
    next, and the hybrid search's ranks followed. Ties are ordered by source, then address."""
    rng = np.random.default_rng(1)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("text", pa.string())])
    words = ["apple", "banana", "kiwi", "pear", "fig"]

    def rows(ids: Any) -> list[dict[str, Any]]:
        return [{"id": int(i), "text": " ".join(rng.choice(words, int(rng.integers(1, 4))))} for i in ids]

    base = pa.Table.from_pylist(rows(range(1000)), schema=schema)
    prepare = lambda ds: ds.create_scalar_index("text", "INVERTED")  # noqa: E731
    t = ModelTable(str(tmp_path / "t"), schema, base, bucket=("id", 2), max_memtable_rows=150, prepare=prepare)
    t.put(rows(rng.choice(1200, 300, replace=False)))
    t.delete([(int(k),) for k in rng.choice(1000, 40, replace=False)])
    t.flush()
    region = t.regions()[0]
    t.merge(region, t.flushed(region)[0][0])
    lance.dataset(t.uri).optimize.optimize_indices()  # a second segment of the base index
    t.put(rows(rng.choice(1200, 100, replace=False)))
    t.flush()
    table = mq.open_table(t.uri)
    for query in ("apple", "apple kiwi"):
        runs = [table.search_text("text", query, k=50, columns=["id"]).to_pylist() for _ in range(10)]
        assert all(run == runs[0] for run in runs), query
        scores = [r["_score"] for r in runs[0]]
        assert len(set(scores)) < len(scores)  # ties, in the same order each time


@pytest.mark.parametrize("change", ["dropped and added again", "names swapped"])
def test_rows_searched_flat_follow_the_columns_after_a_schema_change(tmp_path: Path, change: str) -> None:
    """The rows of base fragments searched without the index are kept for later searches by
    their data files: after ``drop_columns`` + ``add_columns`` of the same name, or two names
    swapped, ``search_text`` still showed the old values under the names (to_arrow and Lance
    did not)."""
    schema = pa.schema(
        [pa.field("id", pa.int64(), False, metadata=PK), pa.field("b", pa.string()), pa.field("c", pa.string()),
         pa.field("txt", pa.string())]
    )  # fmt: skip
    uri = str(tmp_path / "t")
    ds = lance.write_dataset(pa.table({"id": [1], "b": ["b1"], "c": ["c1"], "txt": ["plum"]}, schema), uri)
    ds.create_scalar_index("txt", "INVERTED")
    later = pa.table({"id": [5], "b": ["b5"], "c": ["c5"], "txt": ["plum"]}, schema)
    lance.write_dataset(later, uri, mode="append")  # outside the index: searched flat
    lance.dataset(uri).initialize_mem_wal(unsharded=True)
    first = mq.open_table(uri)
    first.search_text("txt", "plum", k=10)  # keeps the flat fragment's rows
    if change == "names swapped":
        for old, new in (("b", "tmp"), ("c", "b"), ("tmp", "c")):
            lance.dataset(uri).alter_columns({"path": old, "name": new})
    else:
        lance.dataset(uri).drop_columns(["b"])
        lance.dataset(uri).add_columns(pa.field("b", pa.string()))
    want = sorted(lance.dataset(uri).to_table().to_pylist(), key=lambda r: r["id"])
    for table in (mq.open_table(uri), first.refresh()):
        found = table.search_text("txt", "plum", k=10).drop_columns(["_score"]).to_pylist()
        assert sorted(found, key=lambda r: r["id"]) == want
