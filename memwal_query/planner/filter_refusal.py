"""Filters refused, by pyarrow or by Lance, as the user who wrote the filter reads it.

:func:`check_filter` refuses a filter that is neither SQL text nor a pyarrow expression;
:func:`blamed_on_filter` turns a search or scan that failed on a pyarrow expression that
does not bind to the table's columns (a column the table lacks, no kernel for its types)
into one error naming the filter: Lance reports it from whichever source it searched
first, with its own column list (vector columns renamed to a placeholder).

Lance parses a filter by wrapping it in ``SELECT 1 FROM t WHERE ...`` and resolves it
against the dataset's schema, its internal columns included, so its refusals quote SQL
the user never wrote ("Error parsing statement: SELECT 1 FROM t WHERE amount > (sql parser
error: ...)"), list ``_rowid``, ``_rowaddr`` and the like among the valid fields, and repeat
"Invalid user input". :func:`refusal` keeps the reason and the user's own columns, and
says how to write a date or timestamp literal, or a NaN or infinity, which Lance does not
take as a string.

Example:
    >>> refusal("Invalid user input: Error parsing statement: SELECT 1 FROM t WHERE a > "
    ...         "(sql parser error: Expected: an expression, found: EOF)")
    'Expected: an expression, found: EOF'
    >>> refusal("Invalid user input: Schema error: No field named b. Valid fields are a, _rowid, _distance.")
    'No field named b. Valid fields are a.'
    >>> text = 'Received literal Utf8("May") and could not convert to literal of type ' + "'Date32'"
    >>> refusal("Invalid user input: " + text)[len(text) :]
    " (write DATE '2024-01-31')"
    >>> nan = text.replace("May", "NaN").replace("Date32", "Float64")
    >>> refusal("Invalid user input: " + nan)[len(nan) :]
    " (write CAST('NaN' AS DOUBLE))"
    >>> refusal("Not found: t/data/x.lance") is None
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from memwal_query.errors import InvalidArgumentError
from memwal_query.format.row_address import LANCE_ROW_COLUMNS

__all__ = ["blamed_on_filter", "check_filter", "check_search_filter", "refusal"]

_NO_FIELD = re.compile(r"No match for FieldRef\.Name\((?P<name>[^)]*)\) in ")
_INPUT = "Invalid user input: "
_PARSE = re.compile(r"Error parsing statement: SELECT 1 FROM t WHERE .*\(sql parser error: (?P<why>.*)\)\s*$", re.S)
_RESOLVE = re.compile(r"Error resolving filter expression .*?: (?=Received literal|Schema error|\w+ error)", re.S)
_VALID = re.compile(r"Valid fields are (?P<names>.*?)\.(?:\s|$)", re.S)
_TEMPORAL = re.compile(
    r"Received literal Utf8\(\"(?P<v>[^\"]*)\"\) and could not convert to literal of type '(?P<t>\w+)"
)
_INTERNAL = LANCE_ROW_COLUMNS | {"_distance", "_score", "_tombstone"}
_DATE = re.compile(r"\d{4}-\d\d-\d\d")
_NON_FINITE = {"nan", "inf", "infinity"}
_LITERALS = {"Timestamp": "TIMESTAMP", "Date32": "DATE", "Date64": "DATE", "Time64": "TIME", "Time32": "TIME"}


def refusal(text: str) -> str | None:
    """The reason Lance gave for refusing a filter (``text``: its one-line message), or
    None when ``text`` is not a refused filter."""
    if not text.startswith(_INPUT):
        return None
    why = text.replace(_INPUT, "")
    if m := _PARSE.search(why):
        return m.group("why")
    why = _RESOLVE.sub("", why).replace("Schema error: ", "")
    if m := _VALID.search(why):
        names = [n for n in m.group("names").split(", ") if n not in _INTERNAL]
        why = why[: m.start("names")] + ", ".join(names) + why[m.end("names") :]
    if (m := _TEMPORAL.search(why)) and m.group("t") in _LITERALS:
        value = m.group("v") if _DATE.match(m.group("v")) else "2024-01-31"
        why += f" (write {_LITERALS[m.group('t')]} '{value}')"
    elif m and m.group("t").startswith("Float") and m.group("v").strip("+-").lower() in _NON_FINITE:
        why += f" (write CAST('{m.group('v')}' AS DOUBLE))"
    return why


def check_filter(filt: object, uri: str, schema: pa.Schema | None = None) -> None:
    """Refuse a filter that is neither None, SQL text nor a pyarrow expression, and with
    ``schema``, an expression that does not bind to it (see :func:`blamed_on_filter`)."""
    if filt is not None and not isinstance(filt, (str, pc.Expression)):
        msg = f"filter must be a SQL string or a pyarrow expression, got {type(filt).__name__} ({uri})"
        raise InvalidArgumentError(msg)
    if schema is not None and isinstance(filt, pc.Expression):
        _bind(filt, schema, f"invalid filter {filt} for {uri}")


def check_search_filter(filt: object, uri: str, schema: pa.Schema, kind: str) -> None:
    """:func:`check_filter` for a search's filter, which each source's Lance search applies as
    given: also refuse a SQL filter naming one of Lance's row columns (``_rowid`` ...), which
    every source has of its own and the merged table has not (``kind``: e.g. ``"vector search "``).

    Example:
        >>> check_search_filter("_rowid = 0", "t", pa.schema([("id", pa.int64())]), "")
        Traceback (most recent call last):
        ...
        memwal_query.errors.InvalidArgumentError: invalid filter '_rowid = 0' for t: no column '_rowid' (columns: id)
    """
    check_filter(filt, uri)
    if isinstance(filt, str):
        for m in _ROW_COLUMN.finditer(_QUOTED.sub(_bare_name, filt)):
            if m.group("name").lower() not in schema.names:
                why = f"no column {m.group('name')!r} (columns: {', '.join(schema.names)})"
                raise InvalidArgumentError(f"invalid {kind}filter {filt!r} for {uri}: {why}")
        for m in _QUOTED.finditer(filt):
            name = m.group(0)[1:-1].replace('""', '"') if m.group(0).startswith('"') else None
            if name in schema.names:  # SQL's quoted name is a string to Lance: silently no row
                why = f'Lance reads "{name}" as a string, not the column: write {name} or `{name}`'
                raise InvalidArgumentError(f"invalid {kind}filter {filt!r} for {uri}: {why}")


@contextmanager
def blamed_on_filter(filt: object, schema: pa.Schema, uri: str, kind: str = "") -> Iterator[None]:
    """Where the work inside fails and ``filt`` is a pyarrow expression that does not bind to
    ``schema`` (a column the table lacks, no kernel for its types), raise that instead: an
    :class:`InvalidArgumentError` naming the filter, the table and the column or types at
    fault. Checked only on failure: binding costs ~0.1 ms a call.

    Args:
        filt: The user's filter (None, SQL text or a pyarrow expression).
        schema: The merged table's columns.
        uri: The table, named in errors.
        kind: What the filter is for, e.g. ``"vector search "``.

    Example:
        >>> schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
        >>> with blamed_on_filter(pc.field("nope") == 1, schema, "t"):
        ...     raise OSError("No match for FieldRef.Name(nope) in id: int64, _rowid: uint64, ...")
        Traceback (most recent call last):
        ...
        memwal_query.errors.InvalidArgumentError: invalid filter (nope == 1) for t: no column 'nope' (columns: id, s)
    """
    try:
        yield
    except Exception as err:
        if isinstance(filt, pc.Expression):
            what = f"invalid {kind}filter {filt} for {uri}"
            _bind(filt, schema, what)
            found = (_NO_SUBSTRAIT.search(" ".join(str(e).split())) for e in (err, err.__cause__) if e is not None)
            if m := next((f for f in found if f), None):  # valid, but Lance's searches cannot take it
                msg = (
                    f"{what}: Lance's searches take an expression filter through Substrait, which cannot "
                    f"carry this one ({m.group(0).strip()}): write it as SQL text"
                )
                raise InvalidArgumentError(msg) from err
        raise


#: Lance's row columns, which its SQL filters take in every dataset: each source of a merged
#: table numbers its rows on its own (``_rowid = 0`` matched the first row of every source).
_ROW_COLUMN = re.compile(rf"(?<![\w$.])(?P<name>{'|'.join(sorted(LANCE_ROW_COLUMNS))})(?![\w$])", re.I)
#: What names no column: strings (Lance reads "..." as one too), comments; and quoted names.
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/|`(?P<name>[^`]*)`", re.S)


def _bare_name(m: re.Match[str]) -> str:
    """A quoted name as the bare word it names, anything else that names no column as a space."""
    name = m.group("name")
    return f" {name} " if name is not None and name.lower() in LANCE_ROW_COLUMNS else " "


#: What Lance says of an expression its Substrait conversion cannot carry (a cast, a function).
_NO_SUBSTRAIT = re.compile(r"Substrait is only capable of representing[^.:]*|No conversion function exists[^.:]*")


def _bind(filt: pc.Expression, schema: pa.Schema, what: str) -> None:
    # float16 columns as float32: pyarrow compares no float16 (a scan filters them by Lance)
    bound = pa.schema([f.with_type(pa.float32()) if pa.types.is_float16(f.type) else f for f in schema])
    try:
        pds.dataset(bound.empty_table()).scanner(filter=filt, columns=[])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        text = str(err)
        if m := _NO_FIELD.search(text):
            why = f"no column {m.group('name')!r} (columns: {', '.join(schema.names)})"
        else:
            why = " ".join(text.split())
        raise InvalidArgumentError(f"{what}: {why}") from err
