"""Generation keys kept on this machine (``memwal_query.snapshot.kept_keys``): a new process
ranks a flushed generation's keys from the file an earlier one kept, and gets what Lance's
read of them returns.

Tables are written by pylance's MemWAL writer; kept keys are compared with Lance's read of
the same generation and every count with the dict model (``lsm_model.ModelTable``); kept
files damaged in every way, and generations changed since, are read through Lance again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import memwal_query as mq
from memwal_query.format import machine_cache
from memwal_query.format.wal import TOMBSTONE
from memwal_query.snapshot import kept_keys
from memwal_query.snapshot.model import GenerationSource

from builders import build_events
from lsm_model import PK, ModelTable

REPO = Path(__file__).resolve().parents[1]


def _generations(uri: str) -> list[GenerationSource]:
    return [g for r in mq.open_table(uri).view.snapshot.regions for g in r.generations]


def _composite(path: str) -> ModelTable:
    """Keys of an integer and a string column; two generations per region, a WAL tail."""
    schema = pa.schema(
        [
            pa.field("a", pa.int32(), nullable=False, metadata=PK),
            pa.field("b", pa.string(), nullable=False, metadata=PK),
            pa.field("v", pa.float64()),
        ]
    )
    rng = np.random.default_rng(3)
    base = pa.table({"a": np.arange(300, dtype=np.int32), "b": [f"k{i % 7}" for i in range(300)], "v": rng.random(300)})
    t = ModelTable(path, schema, base, bucket=("a", 2), max_memtable_rows=60)
    for round_ in range(2):
        t.put([{"a": int(a), "b": f"k{a % 7}", "v": float(round_)} for a in rng.choice(400, 90, replace=False)])
        t.delete([(int(a), f"k{a % 7}") for a in rng.choice(300, 10, replace=False)])
        t.flush()
    t.put([{"a": 5, "b": "k5", "v": 9.0}])
    return t


@pytest.mark.parametrize("build", [build_events, _composite])
def test_kept_keys_are_what_lance_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build: object) -> None:
    """After one open, every unmerged generation's keys are kept, equal to Lance's read of
    them (key columns, tombstones, row addresses); a second open ranks them from the files
    and answers as the model does."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    t = build(str(tmp_path / "t"))  # type: ignore[operator]
    gens = _generations(t.uri)
    assert gens
    for g in gens:
        columns = [*t.pk, TOMBSTONE]
        want = g.dataset.to_table(columns=columns, with_row_address=True)
        got = kept_keys.load(g.dataset, columns)
        assert got is not None and got.equals(want), g.uri
    kept = list((tmp_path / "cache" / kept_keys.KIND).glob("*/*"))
    assert len(kept) == len(gens) and {p.stat().st_mode & 0o777 for p in kept} == {0o600}
    again = mq.open_table(t.uri)
    assert again.count_rows() == len(t.model)
    assert sorted(again.sql("SELECT * FROM t").to_arrow_table().to_pylist(), key=str) == sorted(
        t.model.values(), key=str
    )


_CHILD = """
import json, sys
import lance
reads = []
plain = lance.LanceDataset.to_table
def counted(self, *args, **kwargs):
    if "_tombstone" in (kwargs.get("columns") or []):
        reads.append(self.uri)
    return plain(self, *args, **kwargs)
lance.LanceDataset.to_table = counted
import memwal_query as mq
t = mq.open_table(sys.argv[1])
n = t.sql("SELECT count(*) AS n FROM t").to_arrow_table().column("n")[0].as_py()
print(json.dumps({"n": n, "reads": len(reads)}))
"""


def _fresh_process(uri: str, cache_dir: str) -> dict[str, int]:
    env = {**os.environ, "MEMWAL_CACHE_DIR": cache_dir, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _CHILD, uri], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_new_process_reads_no_generation_keys_kept_before(tmp_path: Path) -> None:
    """The first process reads each unmerged generation's keys through Lance; the next reads
    none, with the model's count; after a flush, only the new generations' are read."""
    t = build_events(str(tmp_path / "t"))
    cache_dir = str(tmp_path / "cache")
    unmerged = len(_generations(t.uri))
    first = _fresh_process(t.uri, cache_dir)
    assert first == {"n": len(t.model), "reads": unmerged}
    assert _fresh_process(t.uri, cache_dir) == {"n": len(t.model), "reads": 0}
    t.flush()  # the open writers' rows: a new generation in each region they wrote to
    flushed = len(_generations(t.uri)) - unmerged
    assert flushed > 0
    assert _fresh_process(t.uri, cache_dir) == {"n": len(t.model), "reads": flushed}
    assert _fresh_process(t.uri, "off") == {"n": len(t.model), "reads": unmerged + flushed}


def _damages(data: bytes, name: bytes, columns: pa.Table) -> dict[str, bytes]:
    """Ways a kept file can be wrong: cut short, a flipped bit, another generation's name, and
    whole files (a good CRC-32) of the wrong columns or rows."""

    def whole(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        body = b"MWGKEYS1" + name + sink.getvalue().to_pybytes()
        return body + zlib.crc32(body).to_bytes(4, "little")

    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    retyped = columns.set_column(0, columns.field(0).name, columns.column(0).cast(pa.float64()))
    return {
        "cut short": data[: len(data) - 9],
        "a flipped bit": bytes(flipped),
        "another name": data[:8] + bytes(32) + data[40:],
        "a row fewer": whole(columns.slice(1)),
        "a key of another type": whole(retyped),
        "no row address": whole(columns.drop_columns(["_rowaddr"])),
        "empty": b"",
    }


def test_damaged_kept_files_are_read_through_lance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept file that is not whole, not for this generation, or not its columns and rows is
    ignored: the keys are Lance's, and the answers the model's."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    t = build_events(str(tmp_path / "t"))
    g = _generations(t.uri)[0]
    columns = [*t.pk, TOMBSTONE]
    want = g.dataset.to_table(columns=columns, with_row_address=True)
    shutil.rmtree(tmp_path / "cache" / kept_keys.KIND)
    assert kept_keys.load(g.dataset, columns) is None and kept_keys.keep(g.dataset, columns, want)
    (path,) = (tmp_path / "cache" / kept_keys.KIND).glob("*/*")
    good = path.read_bytes()
    assert kept_keys.load(g.dataset, columns) is not None
    for what, data in _damages(good, bytes.fromhex(path.name), want).items():
        path.write_bytes(data)
        assert kept_keys.load(g.dataset, columns) is None, what
        fresh = mq.open_table(t.uri)
        assert fresh.count_rows() == len(t.model), what
    path.write_bytes(good)
    assert kept_keys.load(g.dataset, columns) is not None  # the good file again


def test_a_generation_changed_since_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data file whose modification time or size changed is not the one the keys were kept
    for: nothing kept is found for it (its keys are read through Lance)."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", str(tmp_path / "cache"))
    t = build_events(str(tmp_path / "t"))
    g = _generations(t.uri)[0]
    columns = [*t.pk, TOMBSTONE]
    assert kept_keys.load(g.dataset, columns) is not None
    (frag,) = g.dataset.get_fragments()
    data_file = Path(g.dataset.uri) / "data" / frag.metadata.files[0].path
    st = data_file.stat()
    os.utime(data_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert kept_keys.load(g.dataset, columns) is None
    os.utime(data_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert kept_keys.load(g.dataset, columns) is not None


def test_nothing_is_kept_when_keeping_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``MEMWAL_CACHE_DIR=off``: no file is written, and the answers are the model's."""
    monkeypatch.setenv("MEMWAL_CACHE_DIR", "off")
    t = build_events(str(tmp_path / "t"))
    assert mq.open_table(t.uri).count_rows() == len(t.model)
    assert machine_cache.cache_dir(kept_keys.KIND) is None
    assert not list(tmp_path.rglob(kept_keys.KIND))
