from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from builders import build_events  # noqa: E402

_CACHE_DIR = tempfile.mkdtemp(prefix="memwal-test-cache-")


def pytest_configure(config: pytest.Config) -> None:
    """Key runs (memwal_query.key_runs) are kept in a directory of this test run, never the user's."""
    os.environ["MEMWAL_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Any:
    t = build_events(str(tmp_path_factory.mktemp("events") / "events"))
    yield t
    t.flush()
