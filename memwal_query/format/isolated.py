"""Read a small Lance file whose bytes may be hostile, in a helper process.

Lance aborts the whole process on some damaged files instead of raising: a panic on one of
its threads, or a failed allocation of a size read from the file (hypothesis found both in
inline region snapshots: a NUL in a field name, an unknown logical type, offsets past the
end, a 34 GB buffer length). Bytes that only a damaged or hostile table could hold are
therefore read by one helper Python process, started on first use and kept for later reads;
if Lance kills it, that read is a :class:`ValueError` and the next read starts a new helper.
Only inline region snapshots take this path (a few hundred bytes, and pylance 14.0.2 does not
write them); it costs one interpreter start (~0.5 s) per process that meets one.

Example:
    >>> import pyarrow as pa, tempfile, os
    >>> from lance.file import LanceFileWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "f.lance")
    >>> with LanceFileWriter(path, pa.schema([("a", pa.int32())])) as w:
    ...     w.write_batch(pa.table({"a": pa.array([1, 2], pa.int32())}))
    >>> read_isolated(open(path, "rb").read(), max_rows=10).column("a").to_pylist()
    [1, 2]
"""

from __future__ import annotations

import atexit
import os
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow as pa

__all__ = ["read_isolated", "TIMEOUT_S"]

#: Seconds one read may take before the helper is stopped and the read is an error.
TIMEOUT_S = 60.0

_HELPER = r"""
import struct, sys
import pyarrow as pa
from lance.file import LanceFileReader
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = inp.read(16)
    if len(head) < 16:
        break
    size, limit = struct.unpack("<QQ", head)
    path = inp.read(size).decode()
    try:
        reader = LanceFileReader(path)
        rows = reader.num_rows()
        if not 0 <= rows <= limit:
            raise ValueError(f"claims {rows} rows, more than {limit}")
        table = reader.read_all().to_table()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        status, body = 0, sink.getvalue().to_pybytes()
    except BaseException as err:  # Lance's panics are BaseExceptions
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        status, body = 1, f"{type(err).__name__}: {err}".encode()
    out.write(struct.pack("<BQ", status, len(body)) + body)
    out.flush()
"""

_lock = threading.Lock()
_proc: list[subprocess.Popen[bytes]] = []


def _helper() -> subprocess.Popen[bytes]:
    if _proc and _proc[0].poll() is None:
        return _proc[0]
    _proc[:] = [
        subprocess.Popen(
            [sys.executable, "-c", _HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    ]
    return _proc[0]


def _stop() -> None:
    if _proc:
        proc = _proc.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


atexit.register(_stop)


def _read_exactly(proc: subprocess.Popen[bytes], n: int, deadline: float) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def read_isolated(data: bytes, *, max_rows: int) -> pa.Table:
    """The table in Lance file bytes ``data``, read by the helper process.

    Raises:
        ValueError: Lance cannot read it, it holds more than ``max_rows`` rows, or reading it
            killed the helper or took over :data:`TIMEOUT_S` seconds.
    """
    fd, path = tempfile.mkstemp(suffix=".lance", prefix="memwal-isolated-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        name = path.encode()
        with _lock:
            proc = _helper()
            assert proc.stdin is not None
            try:
                proc.stdin.write(struct.pack("<QQ", len(name), max_rows) + name)
                proc.stdin.flush()
                deadline = time.monotonic() + TIMEOUT_S
                status, size = struct.unpack("<BQ", _read_exactly(proc, 9, deadline))
                body = _read_exactly(proc, size, deadline)
            except (BrokenPipeError, EOFError, TimeoutError) as err:
                _stop()
                what = "took too long" if isinstance(err, TimeoutError) else "made Lance abort the reading process"
                raise ValueError(f"reading it {what}") from err
    finally:
        os.unlink(path)
    if status:
        raise ValueError(body.decode(errors="replace"))
    return pa.ipc.open_stream(body).read_all()
