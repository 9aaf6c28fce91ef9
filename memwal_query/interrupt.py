"""Ctrl-C ends a running query at its scans' next batch, in a script, the CLI or a notebook.

While DataFusion runs a query, the thread that asked for it waits in native code, and
DataFusion looks for a signal only when its runtime's timer fires, which busy workers drive
between polls: a join feeding an aggregate let a Ctrl-C wait a minute or more, and in a
notebook the interrupted query ran on in the background, holding up the next cell.

:func:`interruptibly` runs the query on a worker thread while the main thread waits in
Python, where a Ctrl-C is a ``KeyboardInterrupt`` at once. It then stops the query's scans
(:class:`~memwal_query.scan_gate.Interrupts`): each fails at its next batch
(:func:`~memwal_query.scan_gate.guarded`), DataFusion ends the query there, and the caller
gets the ``KeyboardInterrupt`` once the query has ended: within a second for a scan or an
aggregate; a join that multiplies rows first uses up the input batch it holds (a second
Ctrl-C returns at once, leaving the query to end by itself; a query run meanwhile is not
stopped). Queries other threads started while it ran end too. Off the main thread, or when
Ctrl-C does not raise ``KeyboardInterrupt`` (a handler of the program's own), the query runs
where it is asked, as before.

Example:
    >>> interruptibly(lambda: 6 * 7)
    42
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import TypeVar

from memwal_query.scan_gate import INTERRUPTS

__all__ = ["interruptibly"]

T = TypeVar("T")


def interruptibly(run: Callable[[], T], *, wait: bool = True) -> T:
    """``run()``, on a worker thread when called on the main thread, so that a Ctrl-C ends it.

    Args:
        run: The query.
        wait: On Ctrl-C, wait for the query to end (``False``: a process about to exit).

    Raises:
        KeyboardInterrupt: Ctrl-C while it ran (after it ended, or at a second Ctrl-C).
        BaseException: What ``run()`` raised.
    """
    if threading.current_thread() is not threading.main_thread():
        return run()
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return run()
    era = INTERRUPTS.begin()  # the scans this query starts
    query = _Query(run)
    # not a daemon: the interpreter waits for an interrupted query to end before it exits
    # (a thread still in DataFusion when the interpreter finalizes aborts the process)
    threading.Thread(target=query.work, name="memwal-query").start()
    try:
        while not query.done.wait(0.5):
            pass
    except KeyboardInterrupt:
        INTERRUPTS.stop(era)
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: back at once
            if wait:
                query.done.wait()
        raise
    if query.error is not None:
        raise query.error
    return query.out  # type: ignore[return-value]


class _Query:
    """One query run on a worker thread: its result or its error, once done."""

    def __init__(self, run: Callable[[], object]) -> None:
        self.run = run
        self.done = threading.Event()
        self.out: object = None
        self.error: BaseException | None = None

    def work(self) -> None:
        try:
            self.out = self.run()
        except BaseException as err:  # handed to the caller
            self.error = err
        finally:
            self.done.set()
