"""Which region each lookup key routes to, by the region specs (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import MemWalError
from memwal_query.planner.pruning import RegionValues
from memwal_query.regionspec.spec import evaluate_spec
from memwal_query.snapshot.model import Snapshot

__all__ = ["route_keys"]


def route_keys(
    snap: Snapshot, values: Mapping[str, RegionValues | None], names: Mapping[int, str], keys: pa.Table
) -> dict[str, pa.Table] | None:
    """Keys per region by the region specs; regions with unknown values get every key.

    ``None`` when routing is impossible (a spec reads a non-key column).
    """
    out: dict[str, pa.Table] = {}
    evaluated: dict[int, pa.Table] = {}
    for r in snap.regions:
        rv = values.get(r.region_id)
        spec = snap.index.spec(r.manifest.spec_id) if r.manifest is not None else None
        if rv is None or spec is None:
            out[r.region_id] = keys
            continue
        if any(names.get(int(i)) not in snap.primary_key for f in spec.fields for i in f.source_ids):
            return None
        if spec.spec_id not in evaluated:
            try:
                evaluated[spec.spec_id] = evaluate_spec(spec, keys, names)
            except MemWalError:
                return None
        ev = evaluated[spec.spec_id]
        mask = np.ones(keys.num_rows, dtype=bool)
        for f in spec.fields:
            if f.field_id not in rv.values or f.field_id not in ev.column_names:
                continue
            mask &= _equals(ev.column(f.field_id), rv.values[f.field_id])
        out[r.region_id] = keys.filter(pa.array(mask)) if not mask.all() else keys
    return out


def _equals(col: pa.ChunkedArray, v: object) -> np.ndarray:
    """Which values of ``col`` equal ``v`` (``None``: which are null); a null equals no value."""
    if v is None:
        return np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_integer(col.type) and not col.null_count:
        return np.asarray(np.asarray(col.to_numpy()) == v, dtype=bool)
    eq = pc.fill_null(pc.equal(col, pa.scalar(v, col.type)), False)
    return np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)
