"""Small helpers for the text memwal prints (explanations, the CLI, notebooks).

Example:
    >>> counted(1, "fragment"), counted(3, "fragment"), counted(1, "entry", "entries"), counted(2000, "row")
    ('1 fragment', '3 fragments', '1 entry', '2,000 rows')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["counted", "skipped_runs"]


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` with its noun in the right number, thousands separated."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def skipped_runs(skipped: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Skipped generations (``{"generation", "reason"}``, by generation) as (``"generation
    g"`` or ``"generations a-b"``, reason), runs of consecutive ones with one reason joined: a
    region manifest lists every generation ever flushed, and each merged one was a line.

    Example:
        >>> rows = [{"generation": g, "reason": "merged"} for g in (1, 2, 3)] + [{"generation": 5, "reason": "lost"}]
        >>> skipped_runs(rows)
        [('generations 1-3', 'merged'), ('generation 5', 'lost')]
    """
    runs: list[list[Any]] = []  # [first, last, reason]
    for s in skipped:
        g, why = s["generation"], s["reason"]
        if runs and runs[-1][2] == why and runs[-1][1] + 1 == g:
            runs[-1][1] = g
        else:
            runs.append([g, g, why])
    return [(f"generation {a}" if a == b else f"generations {a}-{b}", why) for a, b, why in runs]
