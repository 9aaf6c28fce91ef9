"""Partitions of about equal work, one per CPU.

DataFusion runs each partition of a scan as a task on its worker threads, and a
poll that reads a large base fragment holds its worker until the read is done. With
more partitions than workers, the order tasks start in is the scheduler's: at 2M
base rows the second 1M-row base fragment started 46 ms after the first, once the
other worker had read every small source, and the two large reads ran one after
the other instead of side by side. :func:`balance` deals the partitions, largest
first, into one chain per CPU (longest-processing-time scheduling), so each worker
gets about the same work whatever order the tasks start in.
"""

from __future__ import annotations

import os

from memwal_query.scan.fragment import CompositeFragment, SourceFragment

__all__ = ["ChainFragment", "balance", "workers"]


def workers() -> int:
    """The CPUs this process may run on (DataFusion's default number of partitions)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class ChainFragment(CompositeFragment[SourceFragment]):
    """Several partitions scanned one after the other as one partition."""

    def __init__(self, parts: list[SourceFragment]) -> None:
        super().__init__(parts[0].context, parts)

    def __repr__(self) -> str:
        return f"<memwal chain of {len(self.parts)} partitions>"


def balance(frags: list[SourceFragment], bins: int) -> list[SourceFragment]:
    """At most ``bins`` partitions of about equal work (unchanged when there are no more).

    Example:
        >>> balance([], 2)
        []
    """
    if len(frags) <= bins:
        return frags
    work = [f.work_hint() for f in frags]
    load = [0] * bins
    chains: list[list[SourceFragment]] = [[] for _ in range(bins)]
    for i in sorted(range(len(frags)), key=lambda i: -work[i]):
        b = load.index(min(load))
        chains[b].append(frags[i])
        load[b] += work[i]
    return [c[0] if len(c) == 1 else ChainFragment(c) for c in chains if c]
