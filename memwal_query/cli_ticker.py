"""A query's elapsed time on a terminal while ``memwal sql`` waits for its first rows.

Drawn on stderr, only when stderr is a terminal, from one second on, and wiped when the
first batch arrives (or the query ends), so it never mixes with the rows written.

Example:
    >>> import io, pyarrow as pa
    >>> batch = pa.record_batch({"n": [1]})
    >>> reader = ticking(pa.RecordBatchReader.from_batches(batch.schema, [batch]), Ticker(io.StringIO()))
    >>> reader.read_all().num_rows
    1
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Protocol

import pyarrow as pa

__all__ = ["Ticker", "stop_all", "ticking", "track", "untrack"]


class _Line(Protocol):
    def stop(self) -> None: ...


_started: set[_Line] = set()  # lines drawn on the terminal, or about to be: wiped by stop_all()
_started_lock = threading.Lock()


def track(line: _Line) -> None:
    """Have :func:`stop_all` stop ``line`` (a ticker, a progress bar) until :func:`untrack`."""
    with _started_lock:
        _started.add(line)


def untrack(line: _Line) -> None:
    """``line`` was stopped: :func:`stop_all` leaves it."""
    with _started_lock:
        _started.discard(line)


class Ticker:
    """``running the query ... 3 s (Ctrl-C stops it)`` on a terminal, redrawn twice a second."""

    def __init__(self, stream: IO[str] | None = None, after: float = 1.0) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._after = after
        self._on = bool(getattr(self._stream, "isatty", lambda: False)())
        self._done = threading.Event()
        self._drawn = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start drawing (after ``after`` seconds); nothing happens off a terminal."""
        if self._on and self._thread is None:
            track(self)
            self._thread = threading.Thread(target=self._run, name="memwal-ticker", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        if self._done.wait(self._after):
            return
        while True:
            with self._lock:
                if self._done.is_set():
                    return
                self._stream.write(f"\rrunning the query ... {time.monotonic() - t0:.0f} s (Ctrl-C stops it)")
                self._stream.flush()
                self._drawn = True
            if self._done.wait(0.5):
                return

    def stop(self) -> None:
        """Stop and wipe the line (idempotent)."""
        with self._lock:
            self._done.set()
            if self._drawn:
                self._stream.write("\r\x1b[K")
                self._stream.flush()
                self._drawn = False
        untrack(self)


def stop_all() -> None:
    """Stop and wipe every line started and not stopped (a command interrupted while it runs
    on another thread: its line is wiped before ``memwal: interrupted`` is written)."""
    with _started_lock:
        lines = list(_started)
    for line in lines:
        line.stop()


def ticking(reader: pa.RecordBatchReader, ticker: Ticker) -> pa.RecordBatchReader:
    """``reader``, with ``ticker`` drawn until its first batch (or its end, or an error)."""

    def batches() -> Iterator[pa.RecordBatch]:
        ticker.start()
        try:
            for batch in reader:
                ticker.stop()
                yield batch
        finally:
            ticker.stop()

    return pa.RecordBatchReader.from_batches(reader.schema, batches())
