"""pylance interop: a snapshot as pylance ``ShardSnapshot``s, for pylance's own readers."""

from __future__ import annotations

from lance.mem_wal import ShardSnapshot

from memwal_query.errors import GenerationLostError
from memwal_query.snapshot.model import Snapshot

__all__ = ["shard_snapshots"]


def shard_snapshots(snap: Snapshot) -> list[ShardSnapshot]:
    """``snap`` as pylance ``ShardSnapshot``s (regions, unmerged generations).

    For pylance's own readers over the same data (``LsmScanner.from_snapshots``,
    ``LsmPointLookupPlanner``, ``LsmVectorSearchPlanner``), e.g. to compare answers;
    they cannot see other writers' MemTables.

    Raises:
        GenerationLostError: A generation was rebuilt from the WAL (its directory is
            lost): pylance's readers cannot read it.
    """
    shards = []
    for r in snap.regions:
        for g in r.generations:
            if g.rebuilt_from_wal:
                msg = (
                    f"{snap.uri}: region {r.region_id}: generation {g.generation} ({g.lost_uri}) is lost and "
                    "was rebuilt from the WAL; pylance's readers cannot read it"
                )
                raise GenerationLostError(msg)
        s = ShardSnapshot(r.region_id).with_spec_id(r.spec_id)
        if r.manifest is not None:
            paths = {g.generation: g.path for g in r.manifest.flushed_generations}
            s = s.with_current_generation(r.manifest.current_generation)
            for g in r.generations:
                s = s.with_sstable(g.generation, paths[g.generation])
        shards.append(s)
    return shards
