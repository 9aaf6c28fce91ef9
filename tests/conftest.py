from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from builders import build_events  # noqa: E402


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Any:
    t = build_events(str(tmp_path_factory.mktemp("events") / "events"))
    yield t
    t.flush()
