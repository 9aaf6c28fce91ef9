"""Reads a vector search starts for later searches, on one background thread (a
full-text search's tokenizing of non-live rows runs there too:
:class:`memwal_query.fts.nonlive.NonLiveFreq`).

After a search, what later searches use (the pooled small generations laid out by
partition, the held large generations' rows, the lagging base's mask) is read on a
single background thread: a first search does not wait for it, and until it is read
those sources are searched through Lance (the same rows and distances).

An exiting interpreter must not wait for queued reads: :data:`EXITING` is set by a hook
registered with ``threading._register_atexit``, which runs before executors are joined
(no public hook runs that early: ``atexit``'s run after the join). A queued read then
does not start, and a running one stops between batches (its ``stop`` callable).
``MEMWAL_KNN_BACKGROUND=0`` runs every such read on the calling thread instead.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future

from memwal_query.forked import ThreadPool

__all__ = ["EXITING", "enabled", "later", "wait_warm"]

_PENDING: list[Future[None]] = []  # background reads not waited for yet (see wait_warm)
_WARMER = ThreadPool(1, "memwal-knn-warm", after_fork=_PENDING)
#: Set when the interpreter starts exiting (a running read stops, queued ones are skipped).
EXITING = threading.Event()
_PENDING_LOCK = threading.Lock()
# threading runs these hooks in reverse order: after this one, concurrent.futures' join
_at_exit = getattr(threading, "_register_atexit", None)
if _at_exit is not None:
    _at_exit(EXITING.set)


def enabled() -> bool:
    """Whether reads for later searches run in the background (``MEMWAL_KNN_BACKGROUND``, default on)."""
    return os.environ.get("MEMWAL_KNN_BACKGROUND", "").strip().lower() not in ("0", "false", "off", "no")


def later(job: Callable[[], object]) -> None:
    """Run ``job`` on the background thread (on the calling thread when :func:`enabled` is false)."""
    if not enabled():
        job()  # asked not to use a background thread: the search that starts it waits
        return
    with _PENDING_LOCK:
        _PENDING[:] = [f for f in _PENDING if not f.done() or f.exception() is not None]
        _PENDING.append(_WARMER.get().submit(_unless_exiting, job))


def _unless_exiting(job: Callable[[], object]) -> None:
    """Run a background read unless the interpreter is exiting: exit waits for the read
    running, not for the ones queued."""
    if not EXITING.is_set():
        job()


def wait_warm() -> None:
    """Wait until what searches so far started reading in the background is read (tests, benchmarks).

    Raises:
        Exception: The first error of a background read (they are otherwise silent: the
            searches keep reading Lance).
    """
    with _PENDING_LOCK:
        pending, _PENDING[:] = list(_PENDING), []
    for f in pending:
        f.result()
