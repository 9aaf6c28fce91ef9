"""Silence the known-spurious pylance log lines, and nothing else.

pylance 14 logs ``Index __lance_mem_wal has no fields`` at ERROR level whenever it
opens the MemWAL index (every merge, every writer): harmless, but it is the first
thing a new user sees. When a region writer is fenced (another writer claimed its
region), pylance also logs ``Task 'memtable_flusher' error handling message: Writer
fenced ...`` once per region at ERROR level, then raises the same failure from the
writer's ``close()``, where memwal reports it (or, in a Spark sink, writes the batch
again): one line per region and retry, for a failure already handled.

pylance's Rust logger reads ``LANCE_LOG`` once, when ``lance`` is imported, as
``env_logger`` directives with an optional ``/regex`` that a message must match to be
printed. Where the user has not set ``LANCE_LOG``, importing :mod:`memwal_query`
(before it imports ``lance``) sets it to pylance's default level (``error``) with a
regex that matches every message except those: real errors still print; a user's own
``LANCE_LOG`` is never touched; when ``lance`` was imported first, nothing changes.

The level comes first as a bare entry and the regex rides on a ``lance=error``
entry: pylance's Python side takes the first entry without ``=`` as a Python logging
level (``LANCE_LOG=off`` or ``error/...`` there makes ``import lance`` fail).

Example:
    >>> import re
    >>> pattern = re.compile(everything_but(NOISE, prefixes=["Task 'x'"]))
    >>> [bool(pattern.search(m)) for m in (NOISE, NOISE + "!", "Index x", "Task 'x' failed", "Task 'y'")]
    [False, True, True, False, True]
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["FENCED", "NOISE", "everything_but", "quiet_known_noise"]

#: The spurious message (pylance 14.0.2, target ``lance::index``).
NOISE = "Index __lance_mem_wal has no fields"

#: How the messages of a fenced writer's flusher start (pylance 14.0.2, target
#: ``lance::dataset::mem_wal::write``); its ``close()`` raises the same failure.
FENCED = "Task 'memtable_flusher' error handling message: Writer fenced"


def _lit(c: str) -> str:
    return "\\" + c if c in "\\.+*?()|[]{}^$#&-~" else c


class _Node:
    __slots__ = ("children", "exact", "prefix")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.exact = False  # a message ends here
        self.prefix = False  # every text from here on is hidden

    def pattern(self) -> str:
        """What a text may go on with from this node and still be printed."""
        kids = self.children
        alts = [] if self.exact else ["$"]
        alts.append(f"[^{''.join(_lit(c) for c in kids)}]" if kids else "[\\s\\S]")
        alts += [_lit(c) + n.pattern() for c, n in kids.items() if not n.prefix]
        return "(?:" + "|".join(alts) + ")"


def everything_but(*messages: str, prefixes: Iterable[str] = ()) -> str:
    """A regex (Rust ``regex`` and Python ``re`` alike) matching every text except ``messages``
    and the texts starting with one of ``prefixes``.

    Built without look-ahead (Rust's ``regex`` has none), walking a trie of the hidden texts:
    at each position the text ends early, differs from every hidden text, or goes on along
    one of them; past the end of a message, any further character differs.
    """
    root = _Node()
    for text, is_prefix in [(m, False) for m in messages] + [(p, True) for p in prefixes]:
        if not text:
            raise ValueError("everything_but: an empty message or prefix would hide everything")
        node = root
        for c in text:
            node = node.children.setdefault(c, _Node())
        node.exact |= not is_prefix
        node.prefix |= is_prefix
    return "^" + root.pattern()


def quiet_known_noise() -> None:
    """Set ``LANCE_LOG`` to hide :data:`NOISE` and :data:`FENCED` lines only, unless the user has set it."""
    os.environ.setdefault("LANCE_LOG", f"error,lance=error/{everything_but(NOISE, prefixes=[FENCED])}")
