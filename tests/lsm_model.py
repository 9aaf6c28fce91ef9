"""Write real MemWAL tables with pylance's own writer, keeping a dict model.

The model is the oracle: a plain ``{key: row}`` dict updated by every put and
delete in the order the writer saw them (later rows of one batch win).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable, ShardWriter, evaluate_sharding_spec

from memwal_query.format.storage import Storage
from memwal_query.snapshot import latest_region_manifest

PK = {"lance-schema:unenforced-primary-key": "true"}
NS = uuid.UUID("4c534d57-5249-5445-5f53-484152443031")


class ModelTable:
    """A pylance-written MemWAL table plus the dict model of its rows."""

    def __init__(
        self,
        uri: str,
        schema: pa.Schema,
        base: pa.Table,
        *,
        bucket: tuple[str, int] | None = None,
        unsharded: bool = False,
        max_memtable_rows: int = 100,
        prepare: Callable[[lance.LanceDataset], None] | None = None,
        maintained_indexes: list[str] | None = None,
        write_params: dict[str, Any] | None = None,
    ) -> None:
        self.uri = uri
        self.schema = schema
        self.pk = [f.name for f in schema if (f.metadata or {}).get(b"lance-schema:unenforced-primary-key")]
        self.max_rows = max_memtable_rows
        ds = lance.write_dataset(base.cast(schema), uri, **(write_params or {}))
        if prepare is not None:  # e.g. build indexes before the MemWAL exists
            prepare(ds)
            ds = lance.dataset(uri)
        kwargs: dict[str, Any] = {"max_memtable_rows": max_memtable_rows}
        if maintained_indexes is not None:
            kwargs["maintained_indexes"] = maintained_indexes
        if bucket is not None:
            kwargs.update(bucket_column=bucket[0], num_buckets=bucket[1])
        elif unsharded:
            kwargs["unsharded"] = True
        ds.initialize_mem_wal(**kwargs)
        self.ds = lance.dataset(uri)
        self.bucketed = bucket is not None
        self.model: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in base.to_pylist():
            self.model[self.key(row)] = row
        self.writers: dict[str, ShardWriter] = {}

    @classmethod
    def attach(cls, uri: str, schema: pa.Schema, *, max_memtable_rows: int = 100) -> ModelTable:
        """A model of the MemWAL table at ``uri`` as it is (its base rows; bucket-sharded)."""
        t = cls.__new__(cls)
        t.uri, t.schema, t.max_rows = uri, schema, max_memtable_rows
        t.pk = [f.name for f in schema if (f.metadata or {}).get(b"lance-schema:unenforced-primary-key")]
        t.ds = lance.dataset(uri)
        t.bucketed = True
        t.model = {t.key(row): row for row in t.ds.to_table().to_pylist()}
        t.writers = {}
        return t

    # -- model ----------------------------------------------------------------
    def key(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in self.pk)

    def expected(self) -> pa.Table:
        rows = list(self.model.values())
        return pa.Table.from_pylist(rows, schema=self.schema) if rows else self.schema.empty_table()

    # -- routing ----------------------------------------------------------------
    def region_of_bucket(self, b: int) -> str:
        return str(uuid.uuid5(NS, f"bucket-{b}"))

    def route(self, table: pa.Table, region: str | None = None) -> dict[str, pa.Table]:
        if region is not None:
            return {region: table}
        if not self.bucketed:
            return {str(uuid.uuid5(NS, "unsharded")): table}
        spec = self.ds.mem_wal_index_details()["sharding_specs"][0]
        batch = table.combine_chunks().to_batches()[0] if table.num_rows else None
        if batch is None:
            return {}
        buckets = evaluate_sharding_spec(batch, spec, self.ds.lance_schema).column(0).to_numpy()
        return {self.region_of_bucket(int(b)): table.filter(pa.array(buckets == b)) for b in np.unique(buckets)}

    def writer(self, region: str) -> ShardWriter:
        w = self.writers.get(region)
        if w is None:
            w = lance.dataset(self.uri).mem_wal_writer(region, max_memtable_rows=self.max_rows)
            self.writers[region] = w
        return w

    # -- operations ---------------------------------------------------------------
    def put(self, rows: Sequence[dict[str, Any]] | pa.Table, region: str | None = None) -> None:
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=self.schema)
        table = table.cast(self.schema)
        for r, part in self.route(table, region).items():
            for off in range(0, part.num_rows, self.max_rows):
                self.writer(r).put(part.slice(off, self.max_rows))
            for row in part.to_pylist():
                self.model[self.key(row)] = row

    def delete(self, keys: Iterable[tuple[Any, ...]], region: str | None = None) -> None:
        keys = list(keys)
        cols = {k: [key[i] for key in keys] for i, k in enumerate(self.pk)}
        table = pa.table({k: pa.array(v, self.schema.field(k).type) for k, v in cols.items()})
        for r, part in self.route(table, region).items():
            for off in range(0, part.num_rows, self.max_rows):
                self.writer(r).delete(part.slice(off, self.max_rows))
            for row in part.to_pylist():
                self.model.pop(self.key(row), None)

    def flush(self) -> None:
        """Close every writer: each flushes its MemTable as a generation."""
        for w in self.writers.values():
            w.close()
        self.writers.clear()

    def storage(self) -> Storage:
        return Storage.open(self.uri)

    def regions(self) -> list[str]:
        return sorted(n for n, d in self.storage().list_dir("_mem_wal") if d)

    def flushed(self, region: str) -> list[tuple[int, str]]:
        m = latest_region_manifest(self.storage(), region)
        return sorted((g.generation, g.path) for g in m.flushed_generations) if m else []

    def merge(self, region: str, generation: int) -> None:
        """Merge one flushed generation into the base (deletes first, then upsert + mark)."""
        path = dict(self.flushed(region))[generation]
        data = lance.dataset(f"{self.uri}/_mem_wal/{region}/{path}").to_table()
        tomb = data.column("_tombstone").to_numpy(zero_copy_only=False)
        ups = data.filter(pa.array(~tomb)).drop_columns(["_tombstone"]).cast(self.schema)
        dels = data.filter(pa.array(tomb)).select(self.pk)
        if dels.num_rows:
            ds = lance.dataset(self.uri)
            if len(self.pk) == 1:
                vals = ",".join(_sql_lit(v) for v in dels.column(0).to_pylist())
                ds.delete(f"{self.pk[0]} IN ({vals})")
            else:
                conds = " OR ".join(
                    "(" + " AND ".join(f"{k} = {_sql_lit(v)}" for k, v in r.items()) + ")" for r in dels.to_pylist()
                )
                ds.delete(conds)
        (
            lance.dataset(self.uri)
            .merge_insert(self.pk if len(self.pk) > 1 else self.pk[0])
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .mark_sstables_as_compacted([CompactedSsTable(region, generation)])
            .execute(ups)
        )

    def merge_all(self, merged: dict[str, int]) -> int:
        """memwal_write's merger over every flushed generation of every region; ``merged``
        (region -> highest generation merged) is updated. Returns how many it merged."""
        from memwal_write.merger import merge_generations

        done = [r for r in merge_generations(self.uri).to_pylist() if r["status"] == "merged"]
        for r in done:
            merged[r["region_id"]] = max(merged.get(r["region_id"], 0), r["generation"])
        return len(done)

    def compact_base(self, rows_per_fragment: int) -> None:
        """Compact the base: a Rewrite commit (no row changes), new fragments and row addresses."""
        ds = lance.dataset(self.uri)
        ds.optimize.compact_files(target_rows_per_fragment=rows_per_fragment, materialize_deletions_threshold=0.0)

    def lsm_scanner(self) -> Any:
        """pylance's own LsmScanner over base + every unmerged flushed generation."""
        from lance.mem_wal import LsmScanner

        import memwal_query as mq

        shards = mq.open_table(self.uri, consistency="eventual").pylance_shard_snapshots()
        return LsmScanner.from_snapshots(lance.dataset(self.uri), shards)


def _sql_lit(v: Any) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return str(v)


def sort_table(t: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Rows sorted by ``keys`` (for order-insensitive comparison)."""
    return t.take(pc.sort_indices(t, sort_keys=[(k, "ascending") for k in keys]))
