"""Every notebook in notebooks/ runs top to bottom in a fresh kernel (small data)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_exist() -> None:
    names = {p.stem for p in NOTEBOOKS}
    assert {"01_quickstart", "02_analysis", "03_lookup_and_vectors"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean(path: Path) -> None:
    """Stored without outputs, and without any path of the machine it was written on."""
    text = path.read_text()
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, path.name
    assert not re.search(r"(/home/|/root/|/Users/|/work/|/tmp/|[A-Z]:\\\\)", text), path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    nb = nbformat.read(path, as_version=4)
    # The kernel starts in the repository root so that an uninstalled checkout imports too.
    # No LANCE_LOG of ours: the notebooks import memwal_query before lance, which hides
    # pylance's known log line (it showed 8 times in 02_analysis, which imported lance first).
    env = {**{k: v for k, v in os.environ.items() if k != "LANCE_LOG"}, "MPLBACKEND": "Agg"}
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute(env=env)
    errors = [
        out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs if out.output_type == "error"
    ]
    assert not errors
    streams = [out.text for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs if "text" in out]
    # A kernel shows Rust's log lines in the cell (Jupyter) or on its own stderr (here).
    logged = [line for text in [*streams, capfd.readouterr().err] for line in text.splitlines() if "lance::" in line]
    assert not logged, path.name
