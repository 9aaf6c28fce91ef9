"""The columns a pushed filter reads, from the predicate IR (one decode per filter).

DataFusion hands every fragment the same ``pyarrow.compute.Expression``; it is decoded
into the predicate IR (:mod:`memwal_query.planner.arrow_expr`) once and remembered by
its text. A filter the IR cannot read entirely (:class:`~memwal_query.planner.predicates.Unknown`)
may read any column: the answer is then "all columns".

Example:
    >>> import pyarrow.compute as pc
    >>> sorted(filter_columns((pc.field("a") > 1) & (pc.field("b") == "x"), ("a", "b", "c")))
    ['a', 'b']
    >>> scan_columns(["c"], pc.field("a") > 1, ("a", "b", "c"))
    ['c', 'a']
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError
from memwal_query.planner.arrow_expr import expression_key, from_arrow_expression
from memwal_query.planner.predicates import Predicate, needed_columns

__all__ = ["applying", "decoded", "expression_filter", "filter_columns", "scan_columns", "mentions_any"]


def expression_filter(filt: object) -> object:
    """``filt`` when it is a filter a dataset takes: a pyarrow expression, None, or the
    boolean scalar DataFusion pushes for a WHERE clause it folded to a constant.

    Raises:
        InvalidArgumentError: Anything else (SQL text read as a constant: every row returned).
    """
    if filt is None or isinstance(filt, (pc.Expression, pa.BooleanScalar, bool)):
        return filt
    msg = (
        f"Table.dataset() filters are pyarrow.compute expressions, not {type(filt).__name__} ({filt!r:.80}): "
        "for SQL text use Table.to_reader(filter=...) or Table.sql"
    )
    raise InvalidArgumentError(msg)


_MEMO_SIZE = 256
_memo: dict[tuple[bytes, tuple[str, ...]], Predicate] = {}
_lock = threading.Lock()


def decoded(filt: pc.Expression, names: Sequence[str]) -> Predicate:
    """``filt`` as the predicate IR over columns ``names`` (decoded once per filter)."""
    key = (expression_key(filt), tuple(names))
    with _lock:
        got = _memo.get(key)
    if got is None:
        got = from_arrow_expression(filt, key[1])
        with _lock:
            if len(_memo) >= _MEMO_SIZE:
                _memo.clear()
            _memo[key] = got
    return got


def filter_columns(filt: object, names: Sequence[str]) -> frozenset[str] | None:
    """The columns of ``names`` that ``filt`` reads; ``None`` when the IR cannot tell (any)."""
    if filt is None or not isinstance(filt, pc.Expression):
        return frozenset()  # no filter, or a constant DataFusion simplified it to
    return needed_columns(decoded(filt, names))


def scan_columns(cols: list[str], filt: object, names: Sequence[str]) -> list[str]:
    """``cols`` plus the columns of ``names`` the filter reads (all of them when unknown)."""
    if filt is None:
        return cols
    used = filter_columns(filt, names)
    extra = names if used is None else [n for n in names if n in used]
    return [*cols, *[n for n in extra if n not in cols]]


def mentions_any(filt: object, names: Sequence[str], these: Sequence[str]) -> bool:
    """Whether ``filt`` (over ``names``) may read one of ``these`` (yes when unknown)."""
    if filt is None:
        return False
    used = filter_columns(filt, names)
    return used is None or any(c in used for c in these)


def applying(batches: Iterator[pa.RecordBatch], filt: pc.Expression, uri: str) -> Iterator[pa.RecordBatch]:
    """``batches`` filtered by ``filt``; pyarrow refusing to evaluate it (a literal out of the
    column's range, no kernel for its types) is an :class:`InvalidArgumentError` naming the filter."""
    try:
        yield from batches
    except GeneratorExit:  # closed unfinished, maybe at exit when ``pa`` is gone
        raise
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        msg = f"filter {filt} cannot be applied to {uri}: {' '.join(str(err).split())}"
        raise InvalidArgumentError(msg) from err
