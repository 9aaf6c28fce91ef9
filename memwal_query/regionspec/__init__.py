"""Region (sharding) spec evaluation, shared by the reader and the writer.

- :mod:`~memwal_query.regionspec.murmur3`: vectorised murmur3_x86_32.
- :mod:`~memwal_query.regionspec.transforms`: one whole-array function per transform.
- :mod:`~memwal_query.regionspec.spec`: a whole spec over a table; grouping;
  region manifest field value encoding.

Example:
    >>> import pyarrow as pa
    >>> from memwal_query.regionspec import transforms
    >>> transforms.bucket(pa.array(["a"]), 8).to_pylist()
    [1]
"""

from __future__ import annotations

from memwal_query.regionspec.spec import (
    decode_field_value,
    encode_field_value,
    evaluate_field,
    evaluate_spec,
    lance_field_ids,
    parse_result_type,
    region_groups,
    region_runs,
)

__all__ = [
    "evaluate_spec",
    "evaluate_field",
    "parse_result_type",
    "region_groups",
    "region_runs",
    "encode_field_value",
    "decode_field_value",
    "lance_field_ids",
]
