"""Small helpers for the text memwal prints (explanations, the CLI, notebooks).

Example:
    >>> counted(1, "fragment"), counted(3, "fragment"), counted(1, "entry", "entries"), counted(2000, "row")
    ('1 fragment', '3 fragments', '1 entry', '2,000 rows')
"""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` with its noun in the right number, thousands separated."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
