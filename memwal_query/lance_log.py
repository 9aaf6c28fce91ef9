"""Silence the one known-spurious pylance log line, and nothing else.

pylance 14 logs ``Index __lance_mem_wal has no fields`` at ERROR level whenever it
opens the MemWAL index (every merge, every writer): harmless, but it is the first
thing a new user sees. pylance's Rust logger reads ``LANCE_LOG`` once, when ``lance``
is imported, as ``env_logger`` directives with an optional ``/regex`` that a message
must match to be printed. Where the user has not set ``LANCE_LOG``, importing
:mod:`memwal_query` (before it imports ``lance``) sets it to pylance's default level
(``error``) with a regex that matches every message except that exact one: real
errors still print; a user's own ``LANCE_LOG`` is never touched; when ``lance`` was
imported first, nothing changes.

The level comes first as a bare entry and the regex rides on a ``lance=error``
entry: pylance's Python side takes the first entry without ``=`` as a Python logging
level (``LANCE_LOG=off`` or ``error/...`` there makes ``import lance`` fail).

Example:
    >>> import re
    >>> pattern = re.compile(everything_but(NOISE))
    >>> bool(pattern.search(NOISE)), bool(pattern.search(NOISE + "!")), bool(pattern.search("Index x"))
    (False, True, True)
"""

from __future__ import annotations

import os

__all__ = ["NOISE", "everything_but", "quiet_known_noise"]

#: The spurious message (pylance 14.0.2, target ``lance::index``).
NOISE = "Index __lance_mem_wal has no fields"


def _lit(c: str) -> str:
    return "\\" + c if c in "\\.+*?()|[]{}^$#&-~" else c


def everything_but(message: str) -> str:
    """A regex (Rust ``regex`` and Python ``re`` alike) matching every text except ``message``.

    Built without look-ahead (Rust's ``regex`` has none): at each position the text
    ends early, differs, or goes on; past the end, any further character differs.
    """
    out = "[\\s\\S]"
    for c in reversed(message):
        out = f"(?:$|[^{_lit(c)}]|{_lit(c)}{out})"
    return "^" + out


def quiet_known_noise() -> None:
    """Set ``LANCE_LOG`` to hide :data:`NOISE` only, unless the user has set it."""
    os.environ.setdefault("LANCE_LOG", f"error,lance=error/{everything_but(NOISE)}")
