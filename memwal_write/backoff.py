"""How long a writer waits before trying again after losing a race to another writer.

Example:
    >>> 0.5 <= backoff(0, first=1.0, cap=8.0) <= 1.5, backoff(10, first=1.0, cap=8.0) <= 12.0
    (True, True)
"""

from __future__ import annotations

import random

__all__ = ["backoff"]


def backoff(attempt: int, *, first: float, cap: float) -> float:
    """Seconds to wait before attempt ``attempt + 1``: ``first`` doubled per attempt, at most
    ``cap``, jittered by a random factor in [0.5, 1.5] (so racing writers draw apart)."""
    return float(min(cap, first * 2.0**attempt)) * random.uniform(0.5, 1.5)
