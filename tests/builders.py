"""Builders of pylance-written test tables shared by several test modules."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lsm_model import PK, ModelTable


def events_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("cat", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("qty", pa.int32()),
        ]
    )


def rows(ids: Any, tag: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    cats = ["a", "b", "c", "d"]
    return [
        {
            "id": int(i),
            "cat": cats[int(rng.integers(0, 4))],
            "amount": float(tag * 1000 + int(i) % 97),
            "qty": int(rng.integers(0, 50)),
        }
        for i in ids
    ]


def build_events(path: str, *, seed: int = 0, keep_open: bool = True) -> ModelTable:
    """4 bucket regions; several generations; deletes; re-inserts; duplicates in
    one batch; one merged generation per region; an open writer (WAL tail)."""
    rng = np.random.default_rng(seed)
    schema = events_schema()
    base = pa.Table.from_pylist(rows(range(2000), 0, rng), schema=schema)
    t = ModelTable(path, schema, base, bucket=("id", 4), max_memtable_rows=150)
    # round 1: updates + new keys, then flush
    t.put(rows(rng.choice(2600, 400, replace=False), 1, rng))
    t.delete([(int(k),) for k in rng.choice(2000, 40, replace=False)])
    t.flush()
    # merge generation 1 of every region
    for r in t.regions():
        gens = t.flushed(r)
        if gens:
            t.merge(r, gens[0][0])
    # round 2: duplicates inside one batch (last wins), deletes then re-inserts
    dup = rows([7, 7, 7, 11, 11], 2, rng)
    t.put(dup)
    t.delete([(5,), (6,), (2100,)])
    t.put(rows([5, 2100], 3, rng))
    t.put(rows(rng.choice(2600, 300, replace=False), 4, rng))
    t.flush()
    # round 3: left open -> WAL tail (live MemTable of another writer)
    t.put(rows(rng.choice(2600, 60, replace=False), 5, rng))
    t.delete([(int(k),) for k in rng.choice(2600, 10, replace=False)])
    if not keep_open:
        t.flush()
    return t


def plain_live_rows(uri: str) -> pa.Table:
    """The live rows of a MemWAL table whose writers are all closed, computed with plain
    Lance reads (nothing from ``memwal_query``): the base, then every flushed generation
    directory found on storage, oldest first, row by row (a later row wins, a tombstone
    deletes). A merged generation replays what the base already holds, so merge progress
    is not needed. Rows still in a WAL tail are not seen.
    """
    base = lance.dataset(uri).to_table()
    pk = [f.name for f in base.schema if (f.metadata or {}).get(b"lance-schema:unenforced-primary-key")]
    live = {tuple(r[k] for k in pk): r for r in base.to_pylist()}
    gens = sorted((int(d.rsplit("_gen_", 1)[1]), d) for d in glob.glob(f"{uri}/_mem_wal/*/*_gen_*"))
    for _, d in gens:
        for r in lance.dataset(d).to_table().to_pylist():
            key = tuple(r[k] for k in pk)
            if r.pop("_tombstone"):
                live.pop(key, None)
            else:
                live[key] = r
    return pa.Table.from_pylist(list(live.values()), schema=base.schema)


_COUNT_CHILD = """
import json, sys
import memwal_query as mq
t = mq.open_table(sys.argv[1])
n = t.sql("SELECT count(*) AS n FROM t " + sys.argv[2]).to_arrow_table().column("n")[0].as_py()
mask = t.merge_state.base_mask
drops = mask.all().tolist()  # every fragment decided (a scan of small ones checks keys as it reads)
print(json.dumps({"n": n, "sources": dict(mask.status().key_sources), "mask": drops}))
"""


def counted_in_a_new_process(uri: str, cache_dir: str, where: str = "") -> dict[str, Any]:
    """``count(*)`` of table ``uri`` in a new process with ``MEMWAL_CACHE_DIR=cache_dir`` (``where``:
    a filter, so that the count scans), then its base mask decided whole: ``{"n", "sources"
    (where each fragment's drop list came from), "mask"}``."""
    env = {**os.environ, "MEMWAL_CACHE_DIR": cache_dir, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-c", _COUNT_CHILD, uri, where]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def refuses_every_cut_and_flip(data: bytes, decode: Callable[[bytes], object], bit: int = 0x10) -> None:
    """Assert that a kept file's bytes ``data`` decode to nothing (``decode`` gives None) cut short
    anywhere or with any one byte changed (by ``bit``)."""
    for cut in range(len(data)):
        assert decode(data[:cut]) is None, cut
    for at in range(len(data)):
        flipped = bytearray(data)
        flipped[at] ^= bit
        assert decode(bytes(flipped)) is None, at
