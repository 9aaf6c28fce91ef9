"""Scan partitions dealt into one chain per CPU, the largest first, on a pylance-written table."""

from __future__ import annotations

import datafusion
import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
import memwal_query.scan.dataset as scan_dataset
from memwal_query.scan.balance import ChainFragment, balance
from memwal_query.scan.fragment import SourceFragment
from memwal_query.scan.lance_fragment import LanceFragment

from builders import events_schema, rows
from lsm_model import ModelTable, sort_table


def _leaves(frag: object) -> list[object]:
    return [p for part in frag.parts for p in _leaves(part)] if isinstance(frag, ChainFragment) else [frag]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> ModelTable:
    """Base fragments of 3000, 2000, 700 and 300 rows, two regions of generations, a WAL tail."""
    rng = np.random.default_rng(4)
    schema = events_schema()
    uri = str(tmp_path_factory.mktemp("balance") / "t")
    base = pa.Table.from_pylist(rows(range(3000), 0, rng), schema=schema)
    t = ModelTable(uri, schema, base, bucket=("id", 2), max_memtable_rows=200)
    for lo, hi in [(3000, 5000), (5000, 5700), (5700, 6000)]:
        more = pa.Table.from_pylist(rows(range(lo, hi), 0, rng), schema=schema)
        lance.write_dataset(more, uri, mode="append")
        t.model.update({(r["id"],): r for r in more.to_pylist()})
    t.put(rows(rng.choice(6500, 900, replace=False), 1, rng))
    t.delete([(int(k),) for k in rng.choice(6000, 60, replace=False)])
    t.flush()
    t.put(rows(rng.choice(6500, 100, replace=False), 2, rng))  # left open: the WAL tail
    return t


@pytest.mark.parametrize("cpus", [1, 2, 3])
def test_partitions_are_balanced_chains_of_every_source(
    table: ModelTable, cpus: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = mq.open_table(table.uri)
    ds = t.dataset()
    monkeypatch.setattr(scan_dataset, "workers", lambda: 10**6)
    want = ds.get_fragments()  # no chaining: every partition on its own
    assert len(want) > 3 and not any(isinstance(p, ChainFragment) for p in want)
    monkeypatch.setattr(scan_dataset, "workers", lambda: cpus)
    parts = ds.get_fragments()
    assert len(parts) <= cpus
    leaves = [leaf for p in parts for leaf in _leaves(p)]
    assert sorted(map(repr, leaves)) == sorted(map(repr, want))
    # the two largest base fragments never share a partition while another is free
    big = sorted((f for f in leaves if isinstance(f, LanceFragment) and f.region is None), key=lambda f: -f.rows_hint())
    if cpus > 1:
        holder = {id(leaf): i for i, p in enumerate(parts) for leaf in _leaves(p)}
        assert holder[id(big[0])] != holder[id(big[1])]
    ctx = datafusion.SessionContext()
    t.register(ctx, "t")
    got = pa.Table.from_batches(ctx.sql("SELECT * FROM t").collect())
    assert sort_table(got, ["id"]).equals(sort_table(table.expected(), ["id"]))
    n = ctx.sql("SELECT count(*) AS n FROM t").to_pylist()[0]["n"]
    assert n == len(table.model)
    s = ctx.sql("SELECT sum(qty) AS s FROM t WHERE amount < 1050").to_pylist()[0]["s"]
    assert s == sum(r["qty"] for r in table.model.values() if r["amount"] < 1050)


class _Sized(SourceFragment):
    def __init__(self, n: int) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.n = n

    def live_rows(self) -> int:
        return self.n


def test_longest_first_into_the_least_loaded_chain() -> None:
    parts = [_Sized(n) for n in [5, 100, 40, 60, 10, 30]]
    assert balance(parts, 6) == parts and balance([], 2) == []
    # 100 | 60 -> 40 joins 60 (100 each) -> 30 the first of the two -> 10, 5 the other
    loads = sorted([p.n for p in _leaves(c)] for c in balance(parts, 2))  # type: ignore[attr-defined]
    assert loads == [[60, 40, 10, 5], [100, 30]]
    (one,) = balance(parts, 1)
    assert isinstance(one, ChainFragment) and one.live_rows() == 245 and one.rows_hint() == 245
