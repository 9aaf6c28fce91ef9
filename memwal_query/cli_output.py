"""What ``memwal sql`` writes: a text table, CSV, JSON or an Arrow IPC stream.

Text formats have no type for some Arrow values: CSV writes nested values as JSON text and
binary as base64; JSON writes binary as base64 and NaN and the infinities as the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (``null`` is SQL's NULL); dates after year 9999
come out as Arrow writes them; durations as ISO 8601 text (``PT0.000000001S``) and times of
day in nanoseconds as text (``23:59:59.999999999``), exactly, in every format. JSON needs
distinct column names. The Arrow stream keeps every value exactly. Rows stream
batch by batch; an error raised while the query runs comes out as memwal's.

Example:
    >>> import io, pyarrow as pa
    >>> out, batch = io.StringIO(), pa.record_batch({"f": [float("nan"), None]})
    >>> write_json(pa.RecordBatchReader.from_batches(batch.schema, [batch]), out)
    >>> out.getvalue()
    '[\\n{"f": "NaN"},\\n{"f": null}\\n]\\n'
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["write_arrow", "write_csv", "write_json", "write_pretty"]


def _batches(reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    from memwal_query.engine_errors import engine_error
    from memwal_query.errors import MemWalError

    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except MemWalError:
            raise
        except Exception as err:  # an execution error surfaces while streaming
            raise engine_error(err) from err
        yield batch


def write_pretty(reader: pa.RecordBatchReader, out: IO[str], max_rows: int) -> None:
    import pyarrow as pa

    from memwal_query.display import format_text_table
    from memwal_query.terminal_text import shown

    taken: list[pa.RecordBatch] = []
    n = 0
    more = False
    for batch in _batches(reader):
        if n + batch.num_rows > max_rows:
            taken.append(batch.slice(0, max_rows - n))
            more = True
            break
        taken.append(batch)
        n += batch.num_rows
    table = pa.Table.from_batches(taken, schema=reader.schema)
    if table.column_names == ["plan_type", "plan"]:  # EXPLAIN: each plan whole, one line per node
        for kind, plan in zip(*table.to_pydict().values(), strict=True):
            lines = str(plan).split("\n")  # each escaped as a table's cell is (a literal may hold \x1b)
            out.write(f"{shown(str(kind))}:\n" + "".join(shown(line, backslash=False) + "\n" for line in lines) + "\n")
        return
    footer = f"more rows not shown (--max-rows {max_rows}; --format csv|json|arrow writes all)" if more else None
    out.write(format_text_table(table, footer=footer) + "\n")


def write_csv(reader: pa.RecordBatchReader, sink: IO[bytes]) -> None:
    """CSV; nested values (structs, lists, maps) as JSON text and binary values as base64,
    which CSV has no type for."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from memwal_query.display import json_value, python_values
    from memwal_query.exact_text import needs_text

    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary, pa.types.is_binary_view)
    values = [f.type.value_type if pa.types.is_dictionary(f.type) else f.type for f in reader.schema]
    as_text = [pa.types.is_nested(t) or any(b(t) for b in binary) or needs_text(t) for t in values]
    schema = pa.schema([f.with_type(pa.string()) if t else f for f, t in zip(reader.schema, as_text, strict=True)])

    def text(col: pa.Array, name: str) -> pa.Array:
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        nested = pa.types.is_nested(col.type)
        values = python_values(col, name)
        texts = [None if v is None else _json_text(v, json_value) if nested else json_value(v) for v in values]
        return pa.array(texts, pa.string())

    with pacsv.CSVWriter(sink, schema) as w:
        for batch in _batches(reader):
            if any(as_text):
                cols = [
                    text(c, f.name) if t else c for c, f, t in zip(batch.columns, reader.schema, as_text, strict=True)
                ]
                batch = pa.RecordBatch.from_arrays(cols, schema=schema)
            try:
                w.write_batch(batch)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                from memwal_query.errors import InvalidArgumentError

                msg = f"the rows cannot be written as CSV: {err} (--format arrow keeps every value)"
                raise InvalidArgumentError(msg) from err


def _json_safe(value: Any) -> Any:
    """``value`` with NaN and the infinities as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` at any depth: JSON has no such numbers (and ``null`` is SQL's NULL)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _json_text(value: Any, default: Any) -> str:
    return json.dumps(_json_safe(value), default=default, ensure_ascii=False, allow_nan=False)


def write_json(reader: pa.RecordBatchReader, out: IO[str]) -> None:
    from memwal_query.display import json_value, python_values

    names = reader.schema.names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # a JSON object holds each name once: a row would lose a column
        from memwal_query.errors import InvalidArgumentError

        msg = f"column name(s) {twice} repeat: JSON objects need distinct names (give them aliases: AS ...)"
        raise InvalidArgumentError(msg)
    out.write("[")
    first = True
    for batch in _batches(reader):
        columns = [python_values(c, n) for c, n in zip(batch.columns, names, strict=True)]
        rows = (
            (dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True))
            if names
            else ({} for _ in range(batch.num_rows))
        )
        for row in rows:
            out.write(("\n" if first else ",\n") + _json_text(row, json_value))
            first = False
    out.write("\n]\n" if not first else "]\n")


def write_arrow(reader: pa.RecordBatchReader, sink: IO[bytes]) -> None:
    import pyarrow as pa

    with pa.ipc.new_stream(sink, reader.schema) as w:
        for batch in _batches(reader):
            w.write_batch(batch)
