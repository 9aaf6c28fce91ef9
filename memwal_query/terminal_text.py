"""Text of a table's values and names as a terminal shows it: the characters that act on a
terminal escaped, widths counted in terminal columns.

A value or a column name may hold anything: a line break or an escape sequence would forge
rows or take over the terminal (``\\x1b[2J`` clears it), an 8-bit control (``\\x9b``, the
one-byte CSI) or a line separator (``\\u2028``) act on some terminals, and a direction
override (``\\u202e``) shows ``gnp.exe`` as ``exe.png``. :func:`shown` writes control
characters, line and paragraph separators, the bidirectional controls and unpaired
surrogates as escapes, and the backslash doubled, so the text shown tells them apart; the
characters text is written with stay as they are (joiners in emoji and in Persian, a
no-break space, a soft hyphen). :func:`width` counts East Asian wide characters as two
columns and combining marks and format characters as none, so columns line up.

Example:
    >>> shown("a\\nb"), shown("\\u202egnp.exe"), shown("C:\\\\x"), shown("日本"), shown("10\\xa0000")
    ('a\\\\nb', '\\\\u202egnp.exe', 'C:\\\\\\\\x', '日本', '10\\xa0000')
    >>> width("日本"), width("e\\u0301"), pad("日本", 6) + "|"
    (4, 1, '日本  |')
"""

from __future__ import annotations

import unicodedata

__all__ = ["clip", "pad", "shown", "width"]

_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(text: str, *, backslash: bool = True) -> str:
    """``text`` with the characters that act on a terminal escaped (``\\x1b``, ``\\u202e``,
    ``\\n``) and, with ``backslash``, the backslash doubled."""
    if text.isprintable() and (not backslash or "\\" not in text):
        return text
    if not backslash and not any(_acts(c) for c in text):
        return text
    return "".join(_char(c, backslash) for c in text)


#: Bidirectional controls: they reorder what follows them on the line.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _acts(c: str) -> bool:
    """Whether ``c`` acts on a terminal (or cannot be written): shown escaped."""
    if c.isprintable() or c == " ":
        return False
    return c in _BIDI or unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs")


def _char(c: str, backslash: bool) -> str:
    if c == "\\":
        return "\\\\" if backslash else c
    if c in _NAMED:
        return _NAMED[c]
    if not _acts(c):
        return c
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def width(text: str) -> int:
    """Terminal columns of ``text`` (printable: see :func:`shown`)."""
    if text.isascii():
        return len(text)
    return sum(_columns(c) for c in text)


def _columns(c: str) -> int:
    if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` columns, ending in ``…`` when cut."""
    if width(text) <= limit:
        return text
    out: list[str] = []
    used = 0
    for c in text:
        cols = _columns(c)
        if used + cols > limit - 1:
            break
        out.append(c)
        used += cols
    return "".join(out) + "…"


def pad(text: str, columns: int, *, right: bool = False) -> str:
    """``text`` padded with spaces to ``columns`` terminal columns (on the left with ``right``)."""
    fill = " " * max(0, columns - width(text))
    return fill + text if right else text + fill
