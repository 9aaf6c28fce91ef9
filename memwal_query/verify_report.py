"""What ``memwal verify`` found: problems and warnings, each naming its file, and what was checked."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from memwal_query.text import counted

__all__ = ["Finding", "VerifyReport"]


@dataclass(frozen=True)
class Finding:
    """One problem or warning: the file (or folder) it is about and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class VerifyReport:
    """The outcome of :func:`verify_table`."""

    uri: str
    base_version: int | None = None
    problems: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(
        default_factory=lambda: {
            "regions": 0,
            "region_manifests": 0,
            "wal_entries": 0,
            "generations": 0,
            "specs": 0,
        }
    )

    @property
    def ok(self) -> bool:
        """True when no problem was found (warnings allowed)."""
        return not self.problems

    def summary(self) -> str:
        """One line: ``ok: ...`` or ``N problems: ...`` with what was checked."""
        c = self.checked
        what = (
            f"base version {self.base_version}; checked {counted(c['regions'], 'region')}, "
            f"{counted(c['region_manifests'], 'region manifest')}, "
            f"{counted(c['wal_entries'], 'WAL tail entry', 'WAL tail entries')}, "
            f"{counted(c['generations'], 'generation')}, {counted(c['specs'], 'spec')}"
        )
        if "base_keys" in c:
            what += f", {counted(c['base_keys'], 'base key')}"
        warn = f", {len(self.warnings)} warning{'s' if len(self.warnings) != 1 else ''}" if self.warnings else ""
        if self.ok:
            return f"ok: {what}{warn}"
        n = len(self.problems)
        return f"{n} problem{'s' if n != 1 else ''}{warn}: {what}"

    def to_json(self) -> str:
        """The report as JSON (``ok``, ``problems``, ``warnings``, ``checked``)."""
        return json.dumps(
            {
                "uri": self.uri,
                "ok": self.ok,
                "base_version": self.base_version,
                "problems": [{"path": p.path, "message": p.message} for p in self.problems],
                "warnings": [{"path": w.path, "message": w.message} for w in self.warnings],
                "checked": self.checked,
            },
            indent=2,
        )
