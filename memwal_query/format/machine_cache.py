"""Files this machine keeps about a local table's files that never change, so that a new
process need not read them again.

A Lance data file is written once: what was derived from it stays true while its path,
size and modification time are the same. Each kind of kept file (``key-runs``: see
:mod:`memwal_query.key_runs`) lives in its own folder of the cache directory: ``MEMWAL_CACHE_DIR``,
else ``$XDG_CACHE_HOME/memwal`` (an absolute one), else ``~/.cache/memwal``; ``off`` (or
``""``, ``0``, ``none``, ``false``), or no home directory, keeps nothing. A kept file is named
by a digest of what it was derived from; it is written whole or not at all (a ``.part`` file
renamed), readable by this user only, and read only when it is a regular file of at most the
size its reader allows. A reader checks its own checksum and contents: a kept file is a hint,
never trusted. A background trim, once per process and folder, removes the oldest files
beyond :data:`MAX_FILES` or :data:`MAX_BYTES`. What a query found missing and does not need
itself is derived and kept off its path (:func:`later`: a thread, :data:`LATER_SECONDS` later,
or at the process's exit; :func:`settle` runs it now).

Example:
    >>> import os, tempfile
    >>> from unittest import mock
    >>> name = digest("a data file's path, size and time", "field 3")
    >>> with mock.patch.dict(os.environ, {"MEMWAL_CACHE_DIR": tempfile.mkdtemp()}):
    ...     kept = keep("example", name, b"derived bytes")
    ...     print(kept, read_kept("example", name, 100), read_kept("example", name, 5))
    True b'derived bytes' None
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "LATER_SECONDS",
    "MAX_BYTES",
    "MAX_FILES",
    "cache_dir",
    "digest",
    "file_identity",
    "file_stamp",
    "fragment_stamp",
    "keep",
    "later",
    "read_kept",
    "settle",
    "trim",
]

log = logging.getLogger(__name__)

MAX_FILES = 20_000
"""Files of one kind kept at most; beyond it (or :data:`MAX_BYTES`), the oldest are removed down to half."""
MAX_BYTES = 256 << 20
"""Bytes of files of one kind kept at most."""
_OFF = ("", "off", "none", "0", "false")


def cache_dir(kind: str) -> Path | None:
    """The folder of kept files of ``kind`` (``MEMWAL_CACHE_DIR``, else the user's cache
    directory); None when keeping is off or there is nowhere to keep them."""
    env = os.environ.get("MEMWAL_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env) / kind
    xdg, home = os.environ.get("XDG_CACHE_HOME", ""), os.path.expanduser("~")
    if os.path.isabs(xdg):  # a relative one is ignored, as the XDG specification says
        return Path(xdg) / "memwal" / kind
    return Path(home) / ".cache" / "memwal" / kind if os.path.isabs(home) else None  # no home: nowhere


def file_stamp(path: str) -> str | None:
    """A local file never rewritten, as ``path`` names it: the path, its size and modification
    time; None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{path}\0{st.st_size}\0{st.st_mtime_ns}"


def fragment_stamp(folder: str, meta: Any) -> str | None:
    """What a Lance fragment's rows are made of (``meta``: its metadata; ``folder``: its
    dataset's local directory): its id and rows, each data file's :func:`file_stamp` and
    columns, its deletion file's; None when a file lives in another base or cannot be stat'ed."""
    parts = [f"{meta.id}\0{meta.physical_rows}"]
    for f in meta.files:
        where = os.path.join(folder, "data", f.path) if getattr(f, "base_id", None) is None else None
        stamp = file_stamp(os.path.normpath(where)) if where is not None else None
        if stamp is None:
            return None
        parts.append(f"{stamp}\0{list(f.fields)}\0{list(f.column_indices)}")
    d = meta.deletion_file
    if d is not None:
        where = os.path.join(folder, d.path(meta.id)) if getattr(d, "base_id", None) is None else None
        stamp = file_stamp(os.path.normpath(where)) if where is not None else None
        if stamp is None:
            return None
        parts.append(f"{stamp}\0{d.file_type}\0{d.num_deleted_rows}")
    return "\0".join(parts)


def file_identity(path: str) -> str | None:
    """What identifies the contents of a local file that is never rewritten: :func:`file_stamp`
    of its real path."""
    return file_stamp(os.path.realpath(path))


def digest(*parts: str) -> bytes:
    """The 32-byte name of what ``parts`` describe."""
    return hashlib.blake2b("\0\0".join(parts).encode(), digest_size=32).digest()


def _kept_path(where: Path, name: bytes) -> Path:
    hexed = name.hex()
    return where / hexed[:2] / hexed


def read_kept(kind: str, name: bytes, limit: int) -> bytes | None:
    """The bytes kept of ``kind`` under ``name`` (:func:`digest`) when they are a regular file of
    at most ``limit`` bytes; None otherwise (nothing kept, keeping off, a pipe or device a read
    would wait on or never finish, a file too large to be one)."""
    where = cache_dir(kind)
    if where is None:
        return None
    try:
        fd = os.open(_kept_path(where, name), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def keep(kind: str, name: bytes, data: bytes) -> bool:
    """Keep ``data`` of ``kind`` under ``name`` (written whole or not at all; a cache directory
    that cannot be written keeps nothing). Returns whether it was kept."""
    where = cache_dir(kind)
    if where is None:
        return False
    target = _kept_path(where, name)
    part = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        _private_folder(target.parent)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # derived from the user's data
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(part, target)
    except OSError as err:
        log.debug("%s not kept in %s: %s", kind, where, err)
        with contextlib.suppress(OSError):
            part.unlink(missing_ok=True)
        return False
    _trim_once(where)
    return True


_made: set[Path] = set()


def _private_folder(folder: Path) -> None:
    """Create ``folder`` and the cache folders above it that are missing, readable by this user
    only (the walk up once per process and folder; one probe after that: removed meanwhile, made again)."""
    if folder in _made and folder.is_dir():
        return
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)
    _made.add(folder)


_trimmed: set[Path] = set()
_trim_lock = threading.Lock()


def _trim_once(where: Path) -> None:
    """Once per process and folder, in the background: :func:`trim` it."""
    with _trim_lock:
        if where in _trimmed:
            return
        _trimmed.add(where)
    threading.Thread(target=trim, args=(where,), name="memwal-cache-trim", daemon=True).start()


def trim(where: Path) -> None:
    """Remove the oldest files in folder ``where`` beyond :data:`MAX_FILES` or :data:`MAX_BYTES`,
    down to half of both (leftover ``.part`` files too): what a process does once per folder,
    in the background, when it first keeps a file there."""
    try:
        files = []
        for p in where.glob("*/*"):
            with contextlib.suppress(FileNotFoundError):  # renamed or removed by another process
                st = p.stat()
                files.append((st.st_mtime_ns, st.st_size, p))
        total = sum(f[1] for f in files)
        if len(files) <= MAX_FILES and total <= MAX_BYTES:
            return
        files.sort()  # oldest first
        left = len(files)
        for _, size, p in files:
            if left <= MAX_FILES // 2 and total <= MAX_BYTES // 2:
                break
            p.unlink(missing_ok=True)
            left, total = left - 1, total - size
    except OSError as err:  # another process trimming, a directory gone: the next process tries again
        log.debug("kept files in %s not trimmed: %s", where, err)


LATER_SECONDS = 0.5
"""How long :func:`later` work waits before it runs: past the query that made what it keeps (run
at once, ranking and keeping a region's generations took a core and the interpreter's lock from
the open's threads: a first open 36 -> 47 ms)."""


class _Later:
    """One piece of :func:`later` work: run once, by its thread after :data:`LATER_SECONDS` or
    by :func:`settle` (it holds no reference to its thread: no cycle; what it was given is let
    go once it ran)."""

    def __init__(self, work: Callable[..., object], args: tuple[object, ...]) -> None:
        self.work: Callable[..., object] | None = work
        self.args = args
        self.pid = os.getpid()  # a forked child does not run its parent's work (Lance is not fork-safe)
        self.cancelled = threading.Event()
        self._lock = threading.Lock()

    def wait_then_run(self) -> None:
        """The thread's body: the work, :data:`LATER_SECONDS` from now unless :func:`settle` took it."""
        if not self.cancelled.wait(LATER_SECONDS):
            self.run()

    def run(self) -> None:
        with self._lock:
            work, args = self.work, self.args
            self.work, self.args = None, ()
        if work is None:
            return
        try:
            work(*args)
        except Exception as err:  # noqa: BLE001 - a hint not kept: nothing is lost
            log.debug("not kept: %s", err)


_pending: list[tuple[_Later, threading.Thread]] = []
_pending_lock = threading.Lock()


def later(work: Callable[..., object], *args: object) -> None:
    """Run ``work(*args)`` :data:`LATER_SECONDS` from now on a thread of its own: deriving and
    keeping a file the query that found it missing does not need (a region's generations'
    ranking, a base's whole mask); :func:`settle` runs it at once, as the process does at exit.
    A failure is logged (debug) and dropped: a later process derives it again."""
    job = _Later(work, args)
    thread = threading.Thread(target=job.wait_then_run, name="memwal-keep", daemon=True)
    with _pending_lock:
        _pending[:] = [p for p in _pending if p[1].is_alive()]
        _pending.append((job, thread))
    thread.start()


def settle(timeout: float | None = None) -> None:
    """Run the :func:`later` work still waiting, here and now, and wait for what runs (each
    ``timeout`` seconds at most)."""
    with _pending_lock:
        jobs = [(job, thread) for job, thread in _pending if job.pid == os.getpid()]
    for job, thread in jobs:
        job.cancelled.set()
        job.run()  # returns at once when its thread runs it: then joined
        thread.join(timeout)


atexit.register(settle, 5.0)  # what a short process (a CLI call) found missing is kept for the next
