"""Check the on-storage layout of a MemWAL table (``memwal verify``).

What is checked, per table:

* every data file and deletion file of the latest base version exists and is whole (a data
  file as long as the manifest records, ending with its Lance footer; a deletion file decodes
  and deletes the rows the manifest says: :mod:`memwal_query.verify_files`);
* the MemWAL index of the latest base version decodes; every region spec is
  usable (known transform, parameters, result type, source fields in the schema);
* per region: region manifest versions ``1 .. latest`` are all present, decode,
  name their own region and version, and never go back in writer epoch or
  generation; the version hint does not point past the latest version (a warning:
  readers and writers then probe the versions from 1);
* WAL continuity: positions after the latest manifest's ``replay_after`` are
  contiguous and every entry decodes (a damaged *last* entry is a torn write,
  reported as a warning: the writer never acknowledged it);
* every flushed generation's path stays inside its region folder (no ``..``,
  absolute path, URL, percent-encoded escape or symlink out); every one not merged
  yet opens as a Lance dataset with all its data files and its bloom filter (if any)
  decodes; a lost one (missing, unreadable, partly deleted) is a problem that says
  whether the region's WAL still holds every row to rebuild it; its generation is
  below the region's current generation;
* the version hint and the MemWAL index's inline region snapshots decode;
* MemWAL index consistency: a merged generation never exceeds what its region
  has flushed; index catch-up never exceeds the merged generation; the region's
  spec exists and its field values decode;
* with ``check_keys=True`` (``memwal verify --keys``): no primary key is stored on
  more than one live base row (reads every base key; see :mod:`memwal_query.verify_keys`).

Problems name the file involved, one per line; :attr:`VerifyReport.ok` is true
when there is none.

Example:
    >>> import tempfile
    >>> from memwal_query.demo import write_demo_table
    >>> uri = write_demo_table(tempfile.mkdtemp() + "/t", base_rows=300, update_rows=50, memtable_rows=50, seed=4)
    >>> report = verify_table(uri)
    >>> report.ok, report.checked["regions"]
    (True, 4)
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence

import lance
import pyarrow as pa

from memwal_query.errors import (
    MALFORMED,
    MemWalCorruptionError,
    MemWalError,
    NotAMemWalTableError,
    one_line,
)
from memwal_query.format.bloom import read_bloom_filter
from memwal_query.format.decode import (
    MAX_HINT_BYTES,
    FlushedGeneration,
    MemWalIndex,
    RegionManifest,
    RegionSpec,
    bitrev64_name,
    decode_mem_wal_index,
    decode_region_manifest,
    decode_version_hint,
    lance_manifest_file_name,
    parse_bitrev64_name,
)
from memwal_query.format.inline_snapshots import decode_inline_snapshots
from memwal_query.format.lance_open import lance_message, open_lance
from memwal_query.format.paths import generation_rel
from memwal_query.format.storage import Storage
from memwal_query.format.wal import TOMBSTONE, WalEntry, read_wal_entry, scan_generations, wal_entry_path
from memwal_query.regionspec.spec import decode_field_value, lance_field_ids, parse_result_type
from memwal_query.snapshot.generations import lacking_columns, missing_data_file, not_a_generation
from memwal_query.snapshot.manifests import folder_generation, misnamed
from memwal_query.snapshot.model import primary_key_of
from memwal_query.verify_files import base_file_problems
from memwal_query.verify_keys import repeated_key_problem
from memwal_query.verify_report import Finding, VerifyReport

__all__ = ["Finding", "VerifyReport", "verify_table", "Progress"]

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: called after each region is checked."""

_TRANSFORMS = {"unsharded", "bucket", "multi_bucket", "identity", "truncate", "year", "month", "day", "hour"}
_INT_PARAMS = {"bucket": "num_buckets", "multi_bucket": "num_buckets", "truncate": "width"}


def generation_unreadable(storage: Storage, rel: str, pk: Sequence[str]) -> str | None:
    """Why a generation directory cannot be read (None when it opens, has all its data files,
    and holds rows pylance writes: keys ``pk`` and boolean tombstones, none NULL)."""
    if not storage.exists(f"{rel}/_versions"):
        return "directory missing"
    try:
        ds = lance.dataset(storage.child_uri(rel), storage_options=dict(storage.storage_options) or None)
        ds.count_rows()
    except (ValueError, OSError, RuntimeError) as err:
        return f"does not open as a Lance dataset: {lance_message(err)}"
    missing = missing_data_file(storage, rel, ds)
    if missing is not None:
        return missing
    try:  # every row, batch by batch: a data file cut short or a deletion file missing
        for _ in ds.to_batches():
            pass
        lacking = lacking_columns(ds.schema.names, pk)
        return lacking or not_a_generation(ds.to_table(columns=[*pk, TOMBSTONE]), pk)
    except (ValueError, OSError, RuntimeError) as err:
        return f"its rows cannot be read: {lance_message(err)}"


class _Checker:
    def __init__(self, storage: Storage, report: VerifyReport) -> None:
        self.storage = storage
        self.report = report
        self.pk: list[str] = []  # the base's primary key (once the base is read)

    def problem(self, rel: str, message: str) -> None:
        self.report.problems.append(Finding(self.storage.child_uri(rel), message))

    def warn(self, rel: str, message: str) -> None:
        self.report.warnings.append(Finding(self.storage.child_uri(rel), message))

    # -- base + MemWAL index --------------------------------------------------
    def base(self) -> tuple[lance.LanceDataset, MemWalIndex | None, str]:
        uri = self.storage.uri
        ds = open_lance(self.storage, uri)
        self.report.base_version = ds.version
        self.pk = list(primary_key_of(ds.schema))
        rel = f"_versions/{lance_manifest_file_name(ds.version)}"
        data = self.storage.read_bytes(rel)
        if data is None:
            rel = f"_versions/{ds.version}.manifest"
            data = self.storage.read_bytes(rel)
        if data is None:
            self.problem(rel, f"manifest of base version {ds.version} not found")
            return ds, None, rel
        try:
            index = decode_mem_wal_index(data)
        except MALFORMED as err:
            self.problem(rel, f"MemWAL index does not decode: {one_line(err)}")
            return ds, None, rel
        if index is None:
            msg = f"{uri} has no MemWAL index at version {ds.version} (run LanceDataset.initialize_mem_wal() first)"
            raise NotAMemWalTableError(msg)
        if index.inline_snapshots:
            try:
                decode_inline_snapshots(index.inline_snapshots, where="MemWAL index")
            except MemWalCorruptionError as err:
                self.problem(rel, str(err))
        return ds, index, rel

    def base_files(self, ds: lance.LanceDataset) -> None:
        for rel, message, serious in base_file_problems(self.storage, ds):
            (self.problem if serious else self.warn)(rel, message)

    def base_keys(self, ds: lance.LanceDataset) -> None:
        try:
            self.report.checked["base_keys"] = ds.count_rows()
            problem = repeated_key_problem(ds)
        except (ValueError, OSError, RuntimeError, pa.ArrowException) as err:
            problem = f"the base's key columns cannot be read: {lance_message(err)}"
        if problem:
            self.problem("data", problem)

    def specs(self, index: MemWalIndex, field_ids: Mapping[int, str], index_rel: str) -> None:
        for spec in index.specs:
            self.report.checked["specs"] += 1
            for f in spec.fields:
                where = f"region spec {spec.spec_id} field {f.field_id!r}"
                if f.transform is None and not f.expression:
                    self.problem(index_rel, f"{where} has neither a transform nor an expression")
                elif f.transform is not None and f.transform not in _TRANSFORMS:
                    self.problem(index_rel, f"{where} has unknown transform {f.transform!r}")
                param = _INT_PARAMS.get(f.transform or "")
                if param is not None:
                    raw = f.parameters.get(param)
                    if raw is None or not raw.strip().isdigit() or int(raw) <= 0:
                        self.problem(index_rel, f"{where} needs a positive integer {param}, got {raw!r}")
                if f.result_type and parse_result_type(f.result_type) is None:
                    self.problem(index_rel, f"{where} has unknown result type {f.result_type!r}")
                for sid in f.source_ids:
                    if sid not in field_ids:
                        self.problem(index_rel, f"{where} names source field id {sid}, not in the base schema")

    # -- one region -----------------------------------------------------------
    def region(self, region_id: str, index: MemWalIndex, index_rel: str) -> None:
        self.report.checked["regions"] += 1
        latest = self.manifests(region_id, index)
        merged = index.merged_generation(region_id)
        if latest is None:
            if merged:
                self.problem(
                    index_rel,
                    f"MemWAL index says region {region_id} merged generation {merged}, but the region has no manifest",
                )
            return
        mdir = f"_mem_wal/{region_id}/manifest/{_bitrev_file(latest.version)}"
        if latest.spec_id != 0:
            spec = index.spec(latest.spec_id)
            if spec is None:
                self.problem(mdir, f"region spec {latest.spec_id} is not in the MemWAL index")
            else:
                self.field_values(latest, spec, mdir)
        self.generations(region_id, latest, merged, mdir, index_rel)
        self.wal(region_id, latest)
        for c in index.index_catchup:
            for mg in c.caught_up:
                if mg.region_id == region_id and mg.generation > merged:
                    self.problem(
                        index_rel,
                        f"index {c.index_name!r} caught up to generation {mg.generation} of "
                        f"region {region_id}, beyond its merged generation {merged}",
                    )

    def manifests(self, region_id: str, index: MemWalIndex) -> RegionManifest | None:
        rel_dir = f"_mem_wal/{region_id}/manifest"
        versions: dict[int, str] = {}
        hint: int | None = None
        for name, is_dir in self.storage.list_dir(rel_dir):
            v = parse_bitrev64_name(name) if name.endswith(".binpb") and not is_dir else None
            if v is not None:
                versions[v] = name
            elif name == "version_hint.json":
                hint = self.version_hint(f"{rel_dir}/{name}")
            else:
                self.warn(f"{rel_dir}/{name}", "unexpected entry in the region manifest folder")
        if not versions:
            self.problem(rel_dir, "region has no region manifest")
            return None
        top = max(versions)
        for v in range(1, top + 1):
            if v not in versions:
                self.problem(
                    f"{rel_dir}/{_bitrev_file(v)}",
                    f"region manifest version {v} is missing (versions 1..{top} expected)",
                )
        if hint is not None and hint > top:
            self.warn(f"{rel_dir}/version_hint.json", f"version hint {hint} is past the latest manifest v{top}")
        latest: RegionManifest | None = None
        prev: RegionManifest | None = None
        for v in sorted(versions):
            rel = f"{rel_dir}/{versions[v]}"
            self.report.checked["region_manifests"] += 1
            data = self.storage.read_bytes(rel)
            if data is None:
                self.problem(rel, "region manifest disappeared while verifying")
                continue
            try:
                m = decode_region_manifest(data)
            except MALFORMED as err:
                self.problem(rel, f"region manifest does not decode: {one_line(err)}")
                continue
            if m.version != v:
                self.problem(rel, f"region manifest says version {m.version}, its file name says {v}")
            if m.region_id != region_id:
                self.problem(rel, f"region manifest belongs to region {m.region_id}, not {region_id}")
            if prev is not None:
                # either file may be the wrong one (a value too high before, or too low now)
                before = f"in manifest v{prev.version}, {versions.get(prev.version, '?')}"
                if m.writer_epoch < prev.writer_epoch:
                    self.problem(rel, f"writer epoch went back from {prev.writer_epoch} ({before}) to {m.writer_epoch}")
                if m.current_generation < prev.current_generation:
                    self.problem(
                        rel,
                        f"current generation went back from {prev.current_generation} ({before}) "
                        f"to {m.current_generation}",
                    )
            prev = m
            if v == top:
                latest = m
        return latest

    def version_hint(self, rel: str) -> int | None:
        data = self.storage.read_bytes(rel, limit=MAX_HINT_BYTES + 1)
        if data is None:
            return None
        try:
            return decode_version_hint(data)
        except ValueError as err:
            self.problem(rel, f"version hint does not decode (readers probe from version 1): {err}")
            return None

    def field_values(self, m: RegionManifest, spec: RegionSpec, rel: str) -> None:
        types = {f.field_id: f.result_type for f in spec.fields}
        for fid, raw in m.field_values:
            if fid not in types:
                self.problem(rel, f"field value for {fid!r}, which region spec {spec.spec_id} does not have")
                continue
            rtype = parse_result_type(types[fid])
            if rtype is None:
                continue  # reported with the spec
            try:
                decode_field_value(raw, rtype)
            except (MemWalError, ValueError) as err:
                self.problem(rel, f"field value {fid!r} does not decode as {rtype}: {err}")

    def generations(self, region_id: str, m: RegionManifest, merged: int, mrel: str, index_rel: str) -> None:
        seen: set[int] = set()
        lost: list[tuple[FlushedGeneration, str]] = []
        for g in m.flushed_generations:
            if g.generation in seen:
                self.problem(mrel, f"generation {g.generation} is listed twice")
            seen.add(g.generation)
            if g.generation >= m.current_generation:
                self.problem(
                    mrel,
                    f"flushed generation {g.generation} is not below the current generation {m.current_generation}",
                )
            if folder_generation(g.path) not in (None, g.generation):
                self.problem(mrel, misnamed(g))
            try:
                rel = generation_rel(self.storage, region_id, g.path, what=f"flushed generation {g.generation}")
            except MemWalCorruptionError as err:
                self.problem(mrel, str(err))
                continue
            if g.generation <= merged:
                continue  # merged into the base: may be garbage-collected
            self.report.checked["generations"] += 1
            why = generation_unreadable(self.storage, rel, self.pk)
            if why is not None:
                lost.append((g, why))
                continue
            self.bloom_filter(f"{rel}/bloom_filter.bin")
        self.lost_generations(region_id, merged, lost)
        top = max(seen, default=m.current_generation - 1)
        if merged > top:
            self.problem(
                index_rel,
                f"MemWAL index says region {region_id} merged generation {merged}, but the "
                f"region flushed only up to generation {top}",
            )

    def lost_generations(self, region_id: str, merged: int, lost: list[tuple[FlushedGeneration, str]]) -> None:
        """One problem per lost generation (unmerged, unreadable), saying whether the WAL can rebuild it."""
        if not lost:
            return
        wal = scan_generations(self.storage, region_id, {g.generation: g.physical_rows for g, _ in lost})
        for g, why in lost:
            found = wal[g.generation]
            if found.complete:
                fix = (
                    f"the WAL can rebuild it ({found.describe()}): readers serve it from the WAL; "
                    "run memwal_write.merge_generations to repair"
                )
            else:
                fix = f"the WAL cannot rebuild it ({found.describe()}): its rows are lost"
            self.problem(
                f"_mem_wal/{region_id}/{g.path.strip('/')}",
                f"unmerged generation {g.generation} is lost ({why}; the region's merged generation is {merged}); "
                f"{fix}",
            )

    def bloom_filter(self, rel: str) -> None:
        try:
            read_bloom_filter(self.storage, rel)
        except MemWalCorruptionError as err:
            self.problem(rel, f"bloom filter does not decode (lookups scan the generation): {err.__cause__ or err}")

    def wal(self, region_id: str, m: RegionManifest) -> None:
        rel_dir = f"_mem_wal/{region_id}/wal"
        positions: list[int] = []
        for name, is_dir in self.storage.list_dir(rel_dir):
            p = parse_bitrev64_name(name) if name.endswith(".arrow") and not is_dir else None
            if p is None:
                self.warn(f"{rel_dir}/{name}", "unexpected entry in the WAL folder")
            elif p > m.replay_after_wal_position:
                positions.append(p)
        if not positions:
            return
        top = max(positions)
        present = set(positions)
        for p in range(m.replay_after_wal_position + 1, top + 1):
            if p not in present:
                self.problem(
                    wal_entry_path(region_id, p),
                    f"WAL position {p} is missing (positions "
                    f"{m.replay_after_wal_position + 1}..{top} must be contiguous)",
                )
        for p in sorted(present):
            self.report.checked["wal_entries"] += 1
            got = read_wal_entry(self.storage, region_id, p)
            if isinstance(got, WalEntry) or got is None:
                continue
            if p == top:
                self.warn(
                    wal_entry_path(region_id, p),
                    f"last WAL entry is torn (never acknowledged; readers skip it): {one_line(got.__cause__ or got)}",
                )
            else:
                self.problem(
                    wal_entry_path(region_id, p), f"WAL entry does not decode: {one_line(got.__cause__ or got)}"
                )


def _bitrev_file(v: int) -> str:
    return f"{bitrev64_name(v)}.binpb"


def verify_table(
    uri: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    check_keys: bool = False,
) -> VerifyReport:
    """Check a MemWAL table's layout (see the module docstring for the checks).

    Args:
        uri: Table URI (local path or object store).
        storage_options: Object store options, as pylance takes them.
        progress: Called as ``progress(done, total, region_id)`` after each region.
        check_keys: Also check that no primary key is stored on more than one live base
            row (reads every base key and its row address: one scan of the key columns).

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is False when problems were found.

    Raises:
        TableNotFoundError: No Lance table at ``uri``.
        NotAMemWalTableError: The table has no MemWAL index.
        ManifestError: The base table cannot be opened at all.
        StorageError: Storage cannot be listed or read.
    """
    storage = Storage.open(uri, storage_options)
    report = VerifyReport(storage.uri)
    checker = _Checker(storage, report)
    ds, index, index_rel = checker.base()
    if index is None:
        return report
    checker.specs(index, lance_field_ids(ds), index_rel)
    checker.base_files(ds)
    if check_keys:
        checker.base_keys(ds)
    regions: list[str] = []
    for name, is_dir in storage.list_dir("_mem_wal"):
        try:
            canonical = str(uuidlib.UUID(name))
        except ValueError:
            canonical = None
        if canonical != name:
            checker.warn(f"_mem_wal/{name}", "not a region folder (name is not a lowercase UUID); ignored")
        elif not is_dir:
            checker.problem(f"_mem_wal/{name}", "region entry is a file, not a folder")
        else:
            regions.append(name)
    regions.sort()
    for mg in index.merged_generations:
        if mg.region_id not in regions:
            checker.problem(
                index_rel,
                f"MemWAL index has merged generation {mg.generation} of region "
                f"{mg.region_id}, which has no folder under _mem_wal/",
            )
    for i, region_id in enumerate(regions):
        checker.region(region_id, index, index_rel)
        if progress is not None:
            progress(i + 1, len(regions), region_id)
    return report
