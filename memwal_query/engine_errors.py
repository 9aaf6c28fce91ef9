"""Our errors back out of DataFusion, as they were raised.

DataFusion calls into this package (SQL table functions while it plans, fragment
scans while it executes) and turns an exception raised there into its own
``Exception`` whose text is ``Execution error: PyErr { type: ..., value: ...,
traceback: Some("Traceback ...") }``: a thousand characters in which our one-line
message is buried. Every :class:`MemWalError` raised inside such a callback passes
through :func:`raised_in_engine`, which keeps it (the few most recent, per process);
where a query comes back to us (``Table.sql``, the CLI), :func:`engine_error`
finds the error DataFusion is reporting and hands back the original exception.

Example:
    >>> from memwal_query.errors import InvalidArgumentError
    >>> err = raised_in_engine(InvalidArgumentError("unknown column 'v' in t"))
    >>> wrapped = Exception(f"Execution error: PyErr {{ value: {err!r}, traceback: None }}")
    >>> engine_error(wrapped) is err
    True
    >>> str(engine_error(Exception("SQL error: ParserError(...)")))
    'query failed: SQL error: ParserError(...)'
    >>> str(engine_error(Exception("Optimizer rule 'r' failed\\ncaused by\\nCannot cast A to B")))
    "query failed: Optimizer rule 'r' failed (caused by: Cannot cast A to B)"
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Iterator
from typing import TypeVar

from memwal_query.errors import MemWalError

__all__ = ["engine_error", "raised_error", "raised_in_engine", "recorded"]

T = TypeVar("T")

_KEPT = 32
_recent: deque[MemWalError] = deque(maxlen=_KEPT)
_lock = threading.Lock()
# DataFusion's rendering of a Python exception: keep only its value.
_PYERR = re.compile(r"PyErr \{ type: <class '[^']*'>, value: (?P<value>.*?), traceback: ", re.S)
# datafusion-python 55 turns a pushed-down filter into a pyarrow expression; a predicate
# its simplifier folded partly to a constant (``a < 0 AND (a = 0 AND a = 1)``) becomes a
# pyarrow scalar combined with an expression, which pyarrow refuses. A plain
# ``pyarrow.dataset`` fails the same way: say so instead of showing pyarrow's TypeError.
_CONSTANT_FILTER = re.compile(
    r"for [&|]: '?pyarrow\.lib\.BooleanScalar'? and|Cannot convert pyarrow\.lib\.BooleanScalar"
)
_CONSTANT_HINT = (
    "query failed: DataFusion simplified part of the WHERE clause to a constant it cannot pass to"
    " a table scan (a datafusion-python limitation, not the table's); drop the contradictory or"
    " always-true part of the predicate"
)

# DataFusion's report of a KeyboardInterrupt (a signal checked while it waits, or raised in
# one of our callbacks).
_INTERRUPT = re.compile(r"External error: KeyboardInterrupt\b|<class 'KeyboardInterrupt'>")

# A filter comparing a float16 column with an integer literal reaches the scan as a float16
# comparison (``f < 0``: DataFusion casts the literal), which pyarrow has no kernel for.
_FLOAT16_FILTER = re.compile(r"has no kernel matching input types \([^)]*halffloat")
_FLOAT16_HINT = (
    " (pyarrow cannot compare float16 values in a pushed filter: compare a float16 column with a"
    " float literal, e.g. f < 0.0, or CAST it AS FLOAT)"
)


def raised_in_engine(err: MemWalError) -> MemWalError:
    """Keep ``err``, raised inside a DataFusion callback, so :func:`engine_error` finds it.

    Args:
        err: The error about to be raised.

    Returns:
        ``err`` itself (``raise raised_in_engine(err)``).
    """
    with _lock:
        _recent.append(err)
    return err


def recorded(items: Iterator[T]) -> Iterator[T]:
    """``items``; a :class:`MemWalError` they raise is kept for :func:`engine_error`.

    pyarrow's refusal of a float16 comparison (a pushed filter) becomes a MemWalError
    saying how to write the filter instead.
    """
    try:
        yield from items
    except GeneratorExit:  # closed unfinished (a LIMIT), maybe at exit when module globals are gone
        raise
    except MemWalError as err:
        raised_in_engine(err)
        raise
    except NotImplementedError as err:  # pyarrow.ArrowNotImplementedError
        if not _FLOAT16_FILTER.search(str(err)):
            raise
        raise raised_in_engine(MemWalError(f"cannot apply a pushed filter: {err}{_FLOAT16_HINT}")) from err


def raised_error(exc: BaseException) -> MemWalError | None:
    """The :class:`MemWalError` raised inside DataFusion that ``exc`` reports, or None."""
    text = str(exc)
    with _lock:
        for err in reversed(_recent):
            msg = str(err)
            if msg and (msg in text or repr(msg)[1:-1] in text):
                _recent.remove(err)
                return err
    return None


def engine_error(exc: BaseException) -> MemWalError:
    """The :class:`MemWalError` behind a DataFusion exception, or a one-line one from its text.

    Args:
        exc: What DataFusion raised.

    Returns:
        The original error when one of ours raised inside DataFusion is what ``exc``
        reports; otherwise a :class:`MemWalError` ``query failed: ...`` with the
        first line of DataFusion's message (a Python exception's value only) and, when
        DataFusion says what caused it, the last cause.

    Raises:
        KeyboardInterrupt: ``exc`` reports one (Ctrl-C while the query ran).
    """
    text = str(exc)
    if _INTERRUPT.search(text):  # Ctrl-C while DataFusion waited or called us: not a failure
        raise KeyboardInterrupt from exc
    ours = raised_error(exc)
    if ours is not None:
        return ours
    if _CONSTANT_FILTER.search(text):
        return MemWalError(_CONSTANT_HINT)
    m = _PYERR.search(text)
    if m is not None:
        text = text[: m.start()] + m.group("value")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    if "caused by" in lines[1:]:  # "Optimizer rule ... failed", "type_coercion" say nothing alone
        at = len(lines) - lines[::-1].index("caused by")
        cause = " ".join(lines[at:])
        if cause and cause not in first:
            first += f" (caused by: {cause})"
    if _FLOAT16_FILTER.search(first):
        first += _FLOAT16_HINT
    return MemWalError(f"query failed: {first}")
