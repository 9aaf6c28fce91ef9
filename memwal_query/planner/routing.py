"""Which region each lookup key routes to, by the region specs, and which regions hold rows
their spec values exclude.

A region is pruned on the promise that it holds only rows of its spec value; pylance's
``mem_wal_writer(shard_id)`` lets a writer put any row in any region, so the promise is
checked: every unmerged row of a region whose values are known is evaluated once (a flushed
generation once per process, kept in the table's cache; MemTable rows per snapshot), and a
region holding a row its values exclude is read by every query (:class:`RegionValues`
``outside``), with a warning naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import MemWalError
from memwal_query.format.decode import RegionSpec
from memwal_query.format.wal import TOMBSTONE
from memwal_query.planner.pruning import RegionValues
from memwal_query.regionspec.spec import evaluate_spec
from memwal_query.snapshot.cache import SnapshotCache
from memwal_query.snapshot.generations import generation_keys, generation_read_error
from memwal_query.snapshot.kept_ranks import held
from memwal_query.snapshot.model import GenerationSource, RegionSnapshot, Snapshot

__all__ = ["route_keys", "checked_values"]

log = logging.getLogger("memwal_query")


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
        if rv is None or rv.outside or spec is None:
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
        mask = _inside(spec, rv, ev)
        out[r.region_id] = keys.filter(pa.array(mask)) if not mask.all() else keys
    return out


def _inside(spec: RegionSpec, rv: RegionValues, evaluated: pa.Table) -> np.ndarray:
    """Which evaluated rows have the region's value in every field it knows."""
    mask = np.ones(evaluated.num_rows, dtype=bool)
    for f in spec.fields:
        if f.field_id in rv.values and f.field_id in evaluated.column_names:
            mask &= _equals(evaluated.column(f.field_id), rv.values[f.field_id])
    return mask


def checked_values(
    snap: Snapshot, values: Mapping[str, RegionValues | None], names: Mapping[int, str], cache: SnapshotCache
) -> dict[str, RegionValues | None]:
    """``values`` with :attr:`RegionValues.outside` counted over each region's unmerged rows."""
    out = dict(values)
    for r in snap.regions:
        rv = values.get(r.region_id)
        spec = snap.index.spec(r.manifest.spec_id) if r.manifest is not None else None
        if rv is None or spec is None:
            continue
        sources = [names.get(int(i), "") for f in spec.fields for i in f.source_ids]
        if not all(sources):  # a column the spec reads was dropped: no query can name it
            continue
        n = _outside_ranked(r, spec, rv, names, sources, snap, cache)
        if n is None:
            n = sum(_outside_generation(g, spec, rv, names, sources, snap.primary_key, cache) for g in r.generations)
        if r.memtable is not None and r.memtable.table.num_rows:
            n += _outside(spec, rv, r.memtable.table, names, sources, snap.primary_key)
        if n:
            out[r.region_id] = dataclasses.replace(rv, outside=n)
            with cache.lock:
                warn = r.region_id not in cache.misrouted_regions
                cache.misrouted_regions.add(r.region_id)
            if warn:
                vals = ", ".join(f"{k}={v!r}" for k, v in rv.values.items())
                log.warning(
                    "%s: region %s holds %d unmerged row(s) outside its spec values %s (not written by the "
                    "spec's routing): it is read by every query, never pruned",
                    snap.uri,
                    r.region_id,
                    n,
                    vals,
                )
    return out


def _outside_ranked(
    r: RegionSnapshot,
    spec: RegionSpec,
    rv: RegionValues,
    names: Mapping[int, str],
    sources: Sequence[str],
    snap: Snapshot,
    cache: SnapshotCache,
) -> int | None:
    """0 when no key of the region's generations is outside its values, told by their ranking
    (held when its generations' keys were not read: every row's key is there once); None when
    that cannot tell (no ranking held, a spec reading other columns, a key outside: the rows
    are counted per generation)."""
    pk = snap.primary_key
    if not r.generations or not all(c in pk for c in sources):
        return None
    ranks = held(cache, r.region_id, r.generations)
    if ranks is None:
        return None
    keys = pa.table({pk[0]: pa.array(ranks.keys, type=snap.schema.field(pk[0]).type)})
    return 0 if _outside(spec, rv, keys, names, sources, pk) == 0 else None


def _outside_generation(
    g: GenerationSource,
    spec: RegionSpec,
    rv: RegionValues,
    names: Mapping[int, str],
    sources: Sequence[str],
    pk: Sequence[str],
    cache: SnapshotCache,
) -> int:
    """Rows of a flushed generation its region's values exclude (evaluated once per generation)."""
    memo = (g.uri, spec.spec_id, repr((sorted(rv.values.items()), sources)))  # a renamed source: checked again
    with cache.lock:
        hit = cache.routing_checks.get(memo)
    if hit is not None:
        return hit
    try:
        if all(c in pk for c in sources):
            rows = generation_keys(g.dataset, pk, cache, g.uri)
        else:
            have = set(g.dataset.schema.names)
            rows = g.dataset.to_table(columns=[c for c in dict.fromkeys([*pk, *sources, TOMBSTONE]) if c in have])
    except (OSError, ValueError, RuntimeError) as err:  # its keys let go by a newer snapshot, its files since removed
        raise generation_read_error(g, err) from err
    n = _outside(spec, rv, rows, names, sources, pk)
    with cache.lock:
        cache.routing_checks[memo] = n
    return n


def _outside(
    spec: RegionSpec,
    rv: RegionValues,
    rows: pa.Table,
    names: Mapping[int, str],
    sources: Sequence[str],
    pk: Sequence[str],
) -> int:
    """Rows whose spec values differ from the region's (a spec that cannot be evaluated: all).

    A delete carries only its key: over a spec reading other columns its row says nothing.
    """
    if not all(c in pk for c in sources) and TOMBSTONE in rows.column_names:
        rows = rows.filter(pc.invert(pc.fill_null(rows.column(TOMBSTONE), False)))
    try:
        ev = evaluate_spec(spec, rows, names)
    except MemWalError:
        return int(rows.num_rows)
    return int(rows.num_rows - np.count_nonzero(_inside(spec, rv, ev)))


def _equals(col: pa.ChunkedArray, v: object) -> np.ndarray:
    """Which values of ``col`` equal ``v`` (``None``: which are null); a null equals no value."""
    if v is None:
        return np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_integer(col.type) and not col.null_count:
        return np.asarray(np.asarray(col.to_numpy()) == v, dtype=bool)
    eq = pc.fill_null(pc.equal(col, pa.scalar(v, col.type)), False)
    return np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)
