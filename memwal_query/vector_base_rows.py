"""The base's live rows held in memory for vector search on a lagging merger.

When the newer levels hold at least half as many keys as the base has rows, the base's
search hits are told live by row address (the base mask) and only the live ones are read,
in one Lance take per search (~0.5-1 ms of a ~9 ms search, after the base search itself:
on its critical path). When the memory budget (``MEMWAL_KNN_MEMORY_MB``) has room after the
pooled and held generations, the base's live rows (a minority there) are read once in the
background instead, and a search finds its live hits' vectors and columns in memory, as
for a held large generation. A row live at one snapshot of a base version stays readable
by address at every later one (the newer levels only grow until a merge writes a new base
version), so the rows are kept per base version and column; a search whose hits are not
all held (the cache is from another base version) takes them from Lance as before.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa

from memwal_query import vector_background as background
from memwal_query.errors import MemWalError
from memwal_query.format.lance_open import lance_message
from memwal_query.format.row_address import ADDR, take_rows
from memwal_query.format.sets import difference
from memwal_query.vector_levels import UNPARTITIONED, knn_memory
from memwal_query.vector_pool import PoolPart, claim_key, keep_claimed, part_of
from memwal_query.view.table_view import TableView

__all__ = ["held_base", "hold_base_later", "held_base_text"]

_CHUNK = 65_536  # rows per Lance take (the read stops between takes at interpreter exit)
_OVER_BUDGET = "over budget"  # kept instead of rows: the live rows do not fit


def _key(view: TableView, column: str) -> tuple[str, str, int, str]:
    base = view.snapshot.base
    return ("base-part", base.uri, int(base.version), column)


def held_base(view: TableView, column: str) -> PoolPart | None:
    """The base's live rows for vector search on ``column``, if held in memory (read already)."""
    with view.cache.lock:
        hit = view.cache.vector_parts.get(_key(view, column))
    return hit if isinstance(hit, PoolPart) else None


def held_base_text(view: TableView, column: str) -> str | None:
    """One line for ``explain`` (None: nothing held or decided)."""
    with view.cache.lock:
        hit = view.cache.vector_parts.get(_key(view, column))
    if isinstance(hit, PoolPart):
        mb = hit.nbytes / 2**20
        return f"the base's {hit.table.num_rows:,} live rows held in memory for KNN on {column} (~{mb:,.1f} MB)"
    if hit == _OVER_BUDGET:
        return f"the base's live rows are not held for KNN on {column}: over the memory budget (MEMWAL_KNN_MEMORY_MB)"
    return None


def hold_base_later(view: TableView, column: str, *, wanted: bool) -> None:
    """Forget the live rows kept for other versions of the base, and when ``wanted`` (the base's
    hits are told live by address) read this version's in the background, once.

    Call after the base mask was started being decided (the reading waits for it).
    """
    key = _key(view, column)
    with view.cache.lock:
        parts = view.cache.vector_parts
        for k in [k for k in parts if k[0] == "base-part" and k[1] == key[1] and k[3] == column and k != key]:
            del parts[k]
    if not wanted or view.snapshot.base.has_stable_row_ids or not claim_key(view.cache, key):
        return  # held, being read, or over budget; with stable row ids hits are not found by address
    background.later(partial(_read, view, column, background.EXITING.is_set))


def _read(view: TableView, column: str, stop: Callable[[], bool]) -> None:
    key = _key(view, column)
    value: object | None = None
    try:
        value = _live_rows(view, column, stop)
    except (MemWalError, ValueError, OSError, RuntimeError, pa.ArrowException):
        value = None  # searches keep taking their hits from Lance (which reports any error)
    finally:
        keep_claimed(view.cache, key, value)


def _live_rows(view: TableView, column: str, stop: Callable[[], bool]) -> PoolPart | str | None:
    """The base's live rows (every column) with their row addresses, or over budget, or ``None`` if stopped."""
    base = view.snapshot.base
    dead = view.merge.base_drop  # sorted superseded addresses (decides the base mask if need be)
    try:
        every = base.scanner(columns=[], with_row_address=True).to_table().column(ADDR).to_numpy()
    except (ValueError, OSError, RuntimeError) as err:
        msg = f"cannot read the row addresses of the base of {view.uri}: {lance_message(err)}"
        raise MemWalError(msg) from err
    live = difference(np.asarray(every, dtype=np.uint64), dead)
    plan = knn_memory(view, column)
    dim = view.snapshot.schema.field(column).type.list_size
    if plan.pooled_bytes + plan.held_bytes + live.size * (dim * 4 + 64) > plan.budget:
        return _OVER_BUDGET
    names = list(view.snapshot.schema.names)
    pieces = []
    for lo in range(0, live.size, _CHUNK):
        if stop():
            return None
        pieces.append(take_rows(base, live[lo : lo + _CHUNK], names))
    if not pieces:
        return None
    rows = pa.concat_tables(pieces).append_column(ADDR, pa.array(live, pa.uint64()))
    return part_of(rows, column, view.snapshot, UNPARTITIONED)
