"""Posting lists decoded from pylance's INVERTED indexes, against the rows' own tokens.

The oracle for the decoder is the analyzer run over each row's text (the tokens Lance
indexed): every row must sit in exactly the posting lists of its distinct tokens. The
non-live statistics counted from posting lists must equal those counted from the rows'
text, and a search must score the same whichever route counted them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from test_fts import QUERIES, WORDS, assert_same, build, oracle, oracle_search

import memwal_query as mq
from memwal_query.fts import corpus as corpus_mod
from memwal_query.fts import index_files, nonlive
from memwal_query.fts.analyzer import Analyzer
from memwal_query.fts.index_files import read_index_files
from memwal_query.fts.posting_codec import UnsupportedPostings
from memwal_query.vector_background import wait_warm


def _texts(n: int) -> list[str | None]:
    """Tokens in exactly 1, 127, 128, 129, 256 and 300 rows (block edges), one in every
    97th row (wide deltas), a frequent one (many full blocks), and Zipf noise."""
    rng = np.random.default_rng(3)
    out: list[str | None] = []
    for i in range(n):
        words = [f"noise{int(z)}" for z in rng.zipf(1.3, size=int(rng.integers(0, 6))) if z < 5000]
        edges = (("one", 1), ("edge", 127), ("block", 128), ("extra", 129), ("two", 256))
        words += [w for w, rows in edges if i < rows]
        words += ["three"] * (i < 300) + ["sparse"] * (i % 97 == 0) + ["often"] * (i % 3 != 1)
        out.append(" ".join(words) if words or i % 2 else None)
    return out


@pytest.mark.parametrize("fragment_rows", [1_000_000, 700])  # one fragment; row ids past 2^32
def test_each_row_is_in_the_posting_lists_of_its_tokens(tmp_path: Path, fragment_rows: int) -> None:
    texts = _texts(3000)
    ds = lance.write_dataset(
        pa.table({"id": np.arange(3000), "text": texts}), str(tmp_path / "t"), max_rows_per_file=fragment_rows
    )
    ds.create_scalar_index("text", "INVERTED")
    ds = lance.dataset(ds.uri)
    desc = next(d for d in ds.describe_indices() if d.name == "text_idx")
    files = read_index_files(f"{ds.uri}/_indices/{desc.segments[0].uuid}")
    assert files.postings_decodable
    analyzer = Analyzer.from_params(desc.details)
    rows = ds.to_table(columns=["text"], with_row_address=True)
    want: dict[int, set[str]] = {
        int(a): set(analyzer.tokens(t))
        for a, t in zip(rows.column("_rowaddr").to_pylist(), rows.column("text").to_pylist(), strict=True)
    }
    got: dict[int, set[str]] = {a: set() for a in want}
    vocabulary = set().union(*want.values())
    assert {"one", "edg", "block", "extra", "two", "three", "spars", "often"} <= vocabulary  # stemmed
    for token in vocabulary:
        ids = files.partitions[0].posting_rowids(token)
        assert ids.size == files.doc_freq(token)
        for a in ids.tolist():
            got[a].add(token)
    assert got == want
    assert files.partitions[0].posting_rowids("not-a-token").size == 0
    picked = np.array(sorted(want)[::7], dtype=np.uint64)
    assert files.doc_freq_among("three", picked) == sum(1 for a in picked.tolist() if "three" in want[a])
    # every posting at once (full blocks and tails), as in-memory postings: what tokenizing gives
    from memwal_query.fts.postings import Postings

    addrs = np.sort(rows.column("_rowaddr").to_numpy().astype(np.uint64))
    tokenized = Postings.build(
        addrs,
        analyzer.tokenize_flat(
            [
                texts[i]
                for i in (addrs & 0xFFFFFFFF).astype(np.int64)
                + (addrs >> np.uint64(32)).astype(np.int64) * fragment_rows
            ]
        ),
    )
    indexed = Postings.from_index(addrs, files)
    assert np.array_equal(indexed.lengths, tokenized.lengths)
    for token in vocabulary:
        (ir, i_f), (tr, tf) = indexed.term(token), tokenized.term(token)
        assert np.array_equal(ir, tr) and np.array_equal(i_f, tf), token


def _vocabulary(t: Any) -> set[str]:
    """Every token the test tables' texts can hold (they are drawn from ``WORDS``)."""
    desc = corpus_mod.inverted_index(lance.dataset(t.uri), "text")
    analyzer = Analyzer.from_params(desc.details)
    return {tok for w in WORDS for tok in analyzer.tokens(w)} | {"zzz-absent"}


def test_nonlive_doc_freq_from_postings_equals_from_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = build(str(tmp_path / "t"))
    monkeypatch.setattr(nonlive.NonLiveFreq, "count_later", lambda self: None)  # keep each route
    by_postings = corpus_mod.corpus_of(mq.open_table(t.uri).view, "text").indexed
    monkeypatch.setattr(index_files, "layout_supported", lambda meta: False)
    index_files._cache.clear()
    by_text = corpus_mod.corpus_of(mq.open_table(t.uri).view, "text").indexed
    assert [s.name for s in by_postings] == [s.name for s in by_text] and by_postings
    assert all(s.files[0].postings_decodable for s in by_postings)
    assert not any(s.files[0].postings_decodable for s in by_text)
    nonzero = 0
    for a, b in zip(by_postings, by_text, strict=True):
        for token in sorted(_vocabulary(t)):
            assert a.nonlive.get(token) == b.nonlive.get(token), (a.name, token)
            nonzero += a.nonlive.get(token) > 0
    assert nonzero > 10  # the table has non-live indexed rows holding many tokens


def test_search_scores_the_same_when_postings_do_not_decode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = build(str(tmp_path / "t"))
    want = oracle(t, str(tmp_path / "oracle"))
    calls = []

    def broken(*args: object) -> np.ndarray:
        calls.append(args)
        raise UnsupportedPostings("damaged")

    monkeypatch.setattr(index_files, "decode_doc_ids", broken)
    index_files._cache.clear()
    table = mq.open_table(t.uri)
    for query in QUERIES:
        assert_same(table.search_text("text", query, k=10, columns=["id"]), oracle_search(want, query, 10), 10)
    assert len(calls) == 1  # the first failure switches the source to counting from text
    assert corpus_mod.corpus_of(table.view, "text").indexed[0].nonlive.from_text


def test_later_searches_look_nonlive_counts_up_once_the_rows_are_tokenized(tmp_path: Path) -> None:
    t = build(str(tmp_path / "t"))
    want = oracle(t, str(tmp_path / "oracle"))
    table = mq.open_table(t.uri)
    assert_same(table.search_text("text", QUERIES[0], k=10, columns=["id"]), oracle_search(want, QUERIES[0], 10), 10)
    src = corpus_mod.corpus_of(table.view, "text").indexed[0]
    wait_warm()
    assert src.nonlive.from_text  # the rows are tokenized: every token is a lookup now
    for query in QUERIES:
        assert_same(table.search_text("text", query, k=10, columns=["id"]), oracle_search(want, query, 10), 10)


EXIT_SCRIPT = """
import atexit, sys, time
import memwal_query as mq
from memwal_query.fts import nonlive
nonlive._CHUNK = 1
done = []
add = nonlive.TokenCounts._add
def slow_add(self, analyzer, addrs, texts):
    time.sleep(0.02)
    add(self, analyzer, addrs, texts)
    done.append(len(addrs))
nonlive.TokenCounts._add = slow_add
mq.open_table(sys.argv[1]).search_text("text", "apple", k=3)
atexit.register(lambda: print(sum(done), flush=True))  # atexit runs once threads are joined
"""


def test_an_exiting_process_does_not_wait_for_the_background_tokenizing(tmp_path: Path) -> None:
    t = build(str(tmp_path / "t"), keep_open=False)
    rows = corpus_mod.corpus_of(mq.open_table(t.uri).view, "text").indexed[0].nonlive.rows
    assert rows > 100
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, t.uri], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-800:]
    assert int(proc.stdout.split()[-1]) < rows  # stopped between chunks, not all of them tokenized


def test_an_index_in_format_1_is_counted_from_text(tmp_path: Path) -> None:
    """pylance still writes format 1 on request: its postings are not decoded here, the
    non-live rows are tokenized instead, and the answers are the same."""
    t = build(str(tmp_path / "t"), params={"format_version": 1})
    want = oracle(t, str(tmp_path / "oracle"))
    table = mq.open_table(t.uri)
    for query in QUERIES:
        assert_same(table.search_text("text", query, k=10, columns=["id"]), oracle_search(want, query, 10), 10)
    base = corpus_mod.corpus_of(table.view, "text").indexed[0]
    assert not base.files[0].postings_decodable and base.nonlive.rows and base.nonlive.from_text


@pytest.mark.parametrize("variant", ["segmented", "format 3"])
def test_segmented_and_format_3_indexes_score_as_one_index(tmp_path: Path, variant: str) -> None:
    """A base index built in segments (one per two fragments: each its own posting lists and
    document ids) or written in format 3 (not decoded here: counted from text) scores like
    one index over the live rows."""
    segmented = variant == "segmented"
    t = build(str(tmp_path / "t"), segmented=segmented, params=None if segmented else {"format_version": 3})
    want = oracle(t, str(tmp_path / "oracle"))
    table = mq.open_table(t.uri)
    for query in QUERIES:
        for k in (1, 10, 50):
            assert_same(table.search_text("text", query, k=k, columns=["id"]), oracle_search(want, query, k), k)
    base = corpus_mod.corpus_of(table.view, "text").indexed[0]
    decodable = [f.postings_decodable for f in base.files]
    assert decodable == ([True] * 3 if segmented else [False]), decodable


def test_generation_postings_from_its_index_equal_its_tokenized_rows(tmp_path: Path) -> None:
    """A small generation's in-memory postings, read from its own INVERTED index, hold what
    tokenizing its rows gives: every token's rows and frequencies, every row's length."""
    from memwal_query.fts.postings import Postings

    t = build(str(tmp_path / "t"))
    snap = mq.open_table(t.uri).view.snapshot
    desc = corpus_mod.inverted_index(snap.base, "text")
    analyzer = Analyzer.from_params(desc.details)
    vocabulary = sorted(_vocabulary(t))
    checked = 0
    for g in (g for r in snap.regions for g in r.generations):
        gdesc = corpus_mod.inverted_index(g.dataset, "text")
        rows = g.dataset.to_table(columns=["text"], with_row_address=True).sort_by("_rowaddr")
        addrs = rows.column("_rowaddr").to_numpy().astype(np.uint64)
        want = Postings.build(addrs, analyzer.tokenize_flat(rows.column("text").to_pylist()))
        files = read_index_files(f"{g.dataset.uri}/_indices/{gdesc.segments[0].uuid}")
        got = Postings.from_index(addrs, files)
        assert np.array_equal(got.lengths, want.lengths) and np.array_equal(got.rowaddrs, want.rowaddrs)
        for token in vocabulary:
            (gr, gf), (wr, wf) = got.term(token), want.term(token)
            assert np.array_equal(gr, wr) and np.array_equal(gf, wf), (g.uri, token)
        checked += 1
    assert checked >= 4
