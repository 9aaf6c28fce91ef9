"""The one exception hierarchy of memwal.

Every error a user can see derives from :class:`MemWalError` and names the table,
region or file involved, so a message read in a log says where to look.

Example:
    >>> from memwal_query.errors import MemWalError, TableNotFoundError
    >>> issubclass(TableNotFoundError, MemWalError)
    True
"""

from __future__ import annotations

import numbers
import struct
from typing import Final

from google.protobuf.message import DecodeError

__all__ = [
    "positive_k",
    "positive_int",
    "MALFORMED",
    "one_line",
    "is_panic",
    "says_missing",
    "MemWalError",
    "TableNotFoundError",
    "NotAMemWalTableError",
    "NoPrimaryKeyError",
    "ManifestError",
    "MemWalCorruptionError",
    "GenerationLostError",
    "ChangesUnavailableError",
    "UnsupportedVersionError",
    "SchemaChangedError",
    "InvalidArgumentError",
    "QueryInterruptedError",
    "StorageError",
]


class MemWalError(Exception):
    """Base class of every error raised by memwal.

    A message is one line: a cause quoted into it (a DataFusion or Lance error that
    spans lines) has its line breaks folded into spaces, so a log keeps it whole.

    Example:
        >>> str(MemWalError("cannot plan 'x = 1': Schema error\\nValid fields are t.id"))
        "cannot plan 'x = 1': Schema error Valid fields are t.id"
    """

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and ("\n" in args[0] or "\r" in args[0]):
            args = (" ".join(args[0].split()),)
        super().__init__(*args)


class TableNotFoundError(MemWalError):
    """No Lance table exists at the given URI."""


class NotAMemWalTableError(MemWalError):
    """The Lance table exists but has no MemWAL index (``initialize_mem_wal`` never ran)."""


class NoPrimaryKeyError(MemWalError):
    """The table schema declares no primary key, so rows cannot be merged by key."""


class ManifestError(MemWalError):
    """A manifest (Lance manifest or region manifest) cannot be read or decoded."""


class MemWalCorruptionError(MemWalError):
    """Stored MemWAL data is damaged in a way that cannot be read past safely."""


class GenerationLostError(MemWalCorruptionError):
    """A flushed generation that is not merged yet cannot be read and its rows cannot be served.

    Its directory is missing, unreadable or partly deleted, the base table does not hold
    its rows (the region's merged generation is below it), and either the region's WAL
    does not hold every entry needed to rebuild it or ``on_missing_generation="error"``
    forbade the rebuild.
    """


class ChangesUnavailableError(MemWalError):
    """The changes since a change token cannot be computed: the history they need is gone.

    A generation merged since the token was garbage-collected and so was a WAL entry
    written since the token, so nothing says which keys were written. Read the whole
    table instead, and take tokens more often than history is removed.
    """


class UnsupportedVersionError(MemWalError):
    """An installed dependency has a version this code cannot work with."""


class SchemaChangedError(MemWalError):
    """The table's columns changed since a Spark query fixed its schema (a DataFrame
    loaded, a stream started): a column renamed, dropped or of another type, also inside a
    struct or a list. Load the DataFrame again, or restart the stream, to read the table's
    columns as they are now."""


class QueryInterruptedError(MemWalError):
    """A query ended because Ctrl-C interrupted one: its own, or one the main thread ran when
    it started (the scans started meanwhile end too, see :mod:`memwal_query.interrupt`)."""


class InvalidArgumentError(MemWalError, ValueError):
    """A caller passed an argument that cannot be used (bad region id, option, column)."""


class StorageError(MemWalError, OSError):
    """The storage layer failed (bad storage options, unreachable object store)."""


MALFORMED: Final[tuple[type[BaseException], ...]] = (
    ValueError,  # also UnicodeDecodeError, json errors, pyarrow.ArrowInvalid
    TypeError,
    KeyError,
    IndexError,
    OverflowError,
    RecursionError,
    MemoryError,  # also pyarrow.ArrowMemoryError: a length field asking for too much
    NotImplementedError,  # pyarrow.ArrowNotImplementedError: an unknown type or codec
    OSError,  # pyarrow.ArrowIOError: a stream shorter than its framing says
    struct.error,
    DecodeError,
)
"""What a decoder of on-storage bytes may raise on malformed input.

Callers catch these around a decoder and raise a :class:`MemWalError` subclass
naming the file (see :func:`one_line`); nothing else is caught, so bugs stay loud.
"""

_MAX_DETAIL: Final = 300


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (whitespace collapsed, cut at 300 characters).

    Example:
        >>> one_line(ValueError("bad\\n  thing"))
        'bad thing'
    """
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= _MAX_DETAIL else text[:_MAX_DETAIL] + "…"


def says_missing(err: BaseException) -> bool:
    """Whether a storage error says a file is not there (pyarrow's and Lance's wordings).

    Example:
        >>> says_missing(OSError("Not found: t/_versions/1.manifest")), says_missing(OSError("timed out"))
        (True, False)
    """
    text = str(err).lower()
    return "not found" in text or "no such file" in text


def is_panic(err: BaseException) -> bool:
    """Whether ``err`` is a Rust panic surfaced by pyo3 (``pyo3_runtime.PanicException``).

    pyo3 derives it from :class:`BaseException`, so ``except Exception`` misses it;
    a decoder handing untrusted bytes to a Rust library (Lance) checks for it.
    """
    return type(err).__name__ == "PanicException"


def positive_k(k: object) -> int:
    """``k`` (how many results a search returns) as an int: a positive integer, numpy's too.

    Raises:
        InvalidArgumentError: ``k`` is not a positive integer (a bool is not one).

    Example:
        >>> positive_k(3)
        3
    """
    return positive_int(k, "k")


def positive_int(value: object, what: str, *, optional: bool = False) -> int:
    """``value`` as an int: a positive integer, numpy's too (``optional``: None passes as 0).

    Raises:
        InvalidArgumentError: ``value`` is not a positive integer (a bool is not one),
            naming ``what``.

    Example:
        >>> positive_int(None, "max_rows_per_put for t", optional=True)
        0
    """
    if optional and value is None:
        return 0
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or int(value) <= 0:
        msg = f"{what} must be a positive integer{' or None' if optional else ''}, got {value!r}"
        raise InvalidArgumentError(msg)
    return int(value)
