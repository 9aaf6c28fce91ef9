"""A process forked from one that used memwal: its DataFusion queries refused with an error
naming the fix (they would hang), memwal's thread pools made again.

DataFusion runs a query's partitions on a pool of worker threads, started by the first query
of the process; ``fork()`` copies only the thread that calls it. In a child forked after a
query ran, the next query that hands work to the pool waits for threads that do not exist,
forever (datafusion 55: a 100k-row ``sum`` in the child never returned). On Linux that child
is what ``multiprocessing`` makes by default before Python 3.14 (``Pool``, ``Process``,
``ProcessPoolExecutor``). Every place memwal runs DataFusion calls :func:`check_engine`
first: the first call records the process, a call in a process forked from it raises.
Lance's reads (lookups, vector and text search, ``count_rows``) do not go through
DataFusion's pool and are not refused, but pylance is not fork-safe either (it warns at
every fork; ``lance.dataset()`` in such a child crashed now and then): workers should be
started with ``spawn`` or ``forkserver``.

memwal's own thread pools (searches beside each other, reads in the background) are
:class:`ThreadPool` objects: a child gets pools of its own (one made before the fork has no
threads there, and a search handed to it waited forever).

Example:
    >>> check_engine("t")  # in the process that runs the queries: nothing to say
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memwal_query.errors import MemWalError

__all__ = ["ThreadPool", "check_engine"]

#: The process that ran memwal's first DataFusion query (None: none has run yet).
_engine_pid: int | None = None


def check_engine(what: str) -> None:
    """Note that DataFusion runs a query in this process, or raise when this process was
    forked from one that ran queries (the query would never return).

    Args:
        what: What the query is about (a table's URI), for the error.

    Raises:
        MemWalError: This process is a fork of one whose DataFusion had run queries.
    """
    global _engine_pid  # noqa: PLW0603 - one value per process, set once
    pid = os.getpid()
    if _engine_pid is None:
        _engine_pid = pid
    elif _engine_pid != pid:
        msg = (
            f"cannot query {what} with DataFusion in process {pid}: it was forked from process {_engine_pid} "
            "after that one ran DataFusion queries, whose worker threads a fork does not copy (the query "
            'would wait forever); start workers with multiprocessing.get_context("spawn") (or "forkserver") '
            "and open the table there by its URI"
        )
        raise MemWalError(msg)


class ThreadPool:
    """A ``ThreadPoolExecutor`` made on first use, again in a forked child.

    Example:
        >>> pool = ThreadPool(2, "doc")
        >>> pool.get().submit(sum, [1, 2]).result()
        3
    """

    def __init__(self, workers: int, prefix: str, *, after_fork: list[Any] | None = None) -> None:
        """``after_fork``: a list this pool empties in a forked child (futures of the parent's
        pool: they never finish there)."""
        self.workers = workers
        self._prefix = prefix
        self._after_fork = after_fork
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> ThreadPoolExecutor:
        """This process's executor."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self._prefix)
            return self._pool

    def _forget(self) -> None:
        self._lock = threading.Lock()  # a thread of the parent may have held it at the fork
        self._pool = None
        if self._after_fork is not None:
            self._after_fork.clear()
