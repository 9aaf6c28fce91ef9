"""pytest, for the tests and the doctests alike.

Whatever a test (or a docstring example, a notebook kernel, a benchmark run as a child
process) creates with :mod:`tempfile` lands in that test's ``tmp_path``, which pytest prunes
to its last few runs: a run of the suite leaves nothing behind in the system temp dir.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _temp_files_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
