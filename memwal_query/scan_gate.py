"""Scans handed to DataFusion end before the interpreter does.

DataFusion runs each partition's scan on its own (tokio) threads and calls back into
Python for every batch. A query that stops early (``LIMIT``) returns while such a call
may still be decoding a Lance fragment with the GIL released. If the interpreter then
finalizes, CPython ends that thread when it asks for the GIL back (``pthread_exit``);
the forced unwind meets native frames that cannot unwind and the process aborts
(``FATAL: exception not rethrown``, exit 134) after printing a correct answer.

Every batch iterator DataFusion receives from this package goes through
:func:`guarded`. At interpreter exit (``atexit`` runs before finalization) the gate
closes: a scan asking for its next batch ends at once, and the exit waits for the
calls already in flight to return, handing the GIL to threads queued for it so they
see the gate closed too. Scans abandoned by a finished query therefore never run
Python after finalization has begun.

Example:
    >>> list(guarded(iter([1, 2, 3])))
    [1, 2, 3]
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TypeVar, cast

from memwal_query.engine_errors import raised_in_engine
from memwal_query.errors import QueryInterruptedError

__all__ = ["guarded", "ScanGate", "GATE", "EXIT_WAIT_SECONDS", "INTERRUPTS", "Interrupts"]

T = TypeVar("T")

#: The longest an exiting interpreter waits for scan calls in flight (one fragment
#: decode each); past it, exit goes on.
EXIT_WAIT_SECONDS = 60.0
#: How long the GIL is handed to other threads after the last call in flight returned:
#: threads queued for the GIL in front of a scan call get it and find the gate closed.
_SETTLE_SECONDS = 0.02


class ScanGate:
    """Counts scan calls in flight; closed once, at exit."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._knocks = 0
        self._used = False
        self._closed = False

    def enter(self) -> bool:
        """Start a scan call; ``False`` when the gate is closed (the scan must end)."""
        with self._cond:
            if self._closed:
                self._knocks += 1
                return False
            self._active += 1
            self._used = True
            return True

    def leave(self) -> None:
        """A scan call returned."""
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def close(self, timeout: float = EXIT_WAIT_SECONDS) -> bool:
        """Close the gate and wait until no scan call is in flight or knocking.

        Returns:
            Whether every call in flight returned within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            if not self._used:
                return True  # no scan ever ran: nothing can be in flight
            while True:
                while self._active:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                knocks = self._knocks
                # Waiting releases the GIL: a thread queued for it runs its scan call now.
                self._cond.wait(_SETTLE_SECONDS)
                if not self._active and self._knocks == knocks:
                    return True
                if time.monotonic() >= deadline:
                    return False


#: The process's gate, closed at interpreter exit.
GATE = ScanGate()


def _close_at_exit() -> None:
    """Close :data:`GATE`; a Ctrl-C while it waits (a KeyboardInterrupt printed as a traceback
    in an exit hook) cuts the wait to :data:`_INTERRUPTED_WAIT_SECONDS`, a second one ends it."""
    try:
        GATE.close()
    except KeyboardInterrupt:
        with contextlib.suppress(KeyboardInterrupt):
            GATE.close(_INTERRUPTED_WAIT_SECONDS)


#: How long an exit interrupted by Ctrl-C still waits for scan calls in flight.
_INTERRUPTED_WAIT_SECONDS = 2.0
atexit.register(_close_at_exit)


class Interrupts:
    """Which scans a Ctrl-C ended (:mod:`memwal_query.interrupt`): every query run begins an
    *era*; a scan belongs to the era current when it started. Stopping the era of an
    interrupted query ends the scans of it and of the eras before (queries other threads ran
    then too), never those of a query begun after it (a query run while an abandoned one
    still ends)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._era = 0
        self._stopped = -1  # scans of eras up to this one end at their next batch

    def begin(self) -> int:
        """A query begins: the era of the scans it starts."""
        with self._lock:
            self._era += 1
            return self._era

    @property
    def era(self) -> int:
        """The current era (a scan starting now belongs to it)."""
        return self._era

    def stop(self, era: int) -> None:
        """End the scans of ``era`` and of the eras before it."""
        with self._lock:
            self._stopped = max(self._stopped, era)

    def stopped(self, era: int) -> bool:
        """Whether scans of ``era`` end at their next batch."""
        return era <= self._stopped


#: The process's interrupts.
INTERRUPTS = Interrupts()


def guarded(batches: Iterator[T], gate: ScanGate = GATE) -> Iterator[T]:
    """``batches``, ending at once when the interpreter exits; each step counted in flight.

    Args:
        batches: A scan's batch iterator.
        gate: The gate to pass (the process's, closed at exit).

    Returns:
        The items of ``batches`` until it ends or the interpreter starts exiting; raising
        :class:`QueryInterruptedError` when asked for one after a Ctrl-C ended its era
        (:class:`Interrupts`).
    """
    return _guarded(batches, gate, INTERRUPTS.era)


def _guarded(batches: Iterator[T], gate: ScanGate, era: int) -> Iterator[T]:
    end = object()
    while gate.enter():
        try:
            if INTERRUPTS.stopped(era):
                raise raised_in_engine(QueryInterruptedError("query interrupted (Ctrl-C): its scans ended"))
            item = next(batches, end)
        finally:
            gate.leave()
        if item is end:
            return
        yield cast(T, item)
