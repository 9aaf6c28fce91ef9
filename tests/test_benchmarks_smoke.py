"""The benchmark scripts run end to end at tiny sizes (their correctness guards included).

Timings are not asserted here: performance claims live in benchmarks/results/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "bench_read.py": ["--base-rows", "20000", "--newer-rows", "2000", "--skip-slow", "--repeat", "1"],
    "bench_first_query.py": ["--sizes", "20000", "--newer-rows", "2000", "--repeat", "1", "--warm", "1"],
    "bench_open_large.py": ["--base-rows", "30000", "--newer-rows", "2000", "--repeat", "1", "--tail-rows", "100"],
    "bench_refresh.py": ["--generations", "8", "--repeat", "2", "--base-rows", "2000"],
    "bench_pruning.py": ["--base-rows", "20000", "--regions", "4", "--newer-rows", "2000", "--repeat", "1"],
    "bench_lookup_knn.py": [
        *("--base-rows", "5000", "--dim", "16", "--partitions", "4", "--newer-rows", "500"),
        *("--lookups", "20", "--queries", "3", "--catchup-rows", "2000"),
        *("--tail-rows", "200", "--batch-repeat", "2", "--lag-base-rows", "3000", "--lag-regions", "2"),
        *("--lag-rounds", "3", "--lag-rows", "3000", "--batch-keys", "100", "--fresh-runs", "1"),
    ],
    "bench_lookup_string.py": [
        *("--base-rows", "3000", "--regions", "2", "--rounds", "2", "--round-rows", "300"),
        *("--tail-rows", "50", "--lookups", "20", "--batch-repeat", "2"),
    ],
    "bench_stream.py": [
        "--base-rows",
        "20000",
        "--newer-rows",
        "2000",
        "--tail-rows",
        "200",
        "--repeat",
        "1",
        "--skip-spark",
    ],
    "bench_knn.py": [
        *("--base-rows", "4000", "--dim", "16", "--clusters", "8", "--partitions", "4", "--regions", "2"),
        *("--rounds", "2", "--round-rows", "300", "--tail-rows", "50", "--lag-regions", "2", "--lag-small", "6"),
        *("--lag-rows", "1200", "--queries", "4", "--fresh", "1", "--refine", "5", "--nprobes", "2"),
    ],
    "bench_fts.py": [
        "--base-rows",
        "3000",
        "--vocab",
        "1000",
        "--regions",
        "4",
        "--newer-rows",
        "400",
        "--queries",
        "5",
        "--fresh",
        "1",
    ],
}


SPARK_CASES = {
    "bench_spark.py": [
        *("--rows", "20000", "--regions", "4", "--repeat", "1"),
        *("--stream-files", "3", "--stream-rows", "500"),
    ],
    "bench_stream.py": ["--base-rows", "20000", "--newer-rows", "2000", "--tail-rows", "200", "--repeat", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(CASES))
def test_benchmark_script_runs(script: str, tmp_path: Path) -> None:
    _run(script, CASES[script], tmp_path)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("script", sorted(SPARK_CASES))
def test_spark_benchmark_script_runs(script: str, tmp_path: Path) -> None:
    _run(script, SPARK_CASES[script], tmp_path)


def _run(script: str, args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["targets"] and all({"target", "value", "pass"} <= set(t) for t in result["targets"])


def test_report_renders_measurements_flat_ratios_and_targets(tmp_path: Path) -> None:
    """report.py on a bench_spark-style file: one row per measurement, flat ratios, targets with limits."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import report

    data = {
        "repeat": 3,
        "results": {"write": {"seconds": 2.0, "rows_per_s": 1000, "runs_s": [2.5, 2.0, 1.9]}},
        "ratios": {"write_vs_plain": 0.25},
        "targets": [{"target": "write >= 50% of plain", "value": 0.25, "limit": 0.5, "pass": False}],
    }
    (tmp_path / "spark.json").write_text(json.dumps(data))
    text = report.build_report(tmp_path, tmp_path / "REPORT.md").read_text()
    assert "| write | 2.000 | 1,000 | 2.5, 2, 1.9 |" in text
    assert "| write_vs_plain | 0.25 |" in text
    assert "### Targets: 0 of 1 pass" in text and "| MISS | write >= 50% of plain | 0.25 | 0.5 |" in text


def test_report_renders_nested_fresh_and_warm_timings(tmp_path: Path) -> None:
    """report.py on a bench_first_query-style file: each {median, min, max} leaf and ratio is a row."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import report

    runs = {"median": 12.5, "min": 11.0, "max": 40.0}
    data = {
        "results": {
            "2000": {
                "count": {
                    "memwal": {"first_ms": runs, "first_runs_ms": [40.0, 12.5, 11.0]},
                    "lance": {"first_ms": {"median": 2.0, "min": 1.5, "max": 3.0}},
                    "first_ratio": 6.25,
                }
            }
        }
    }
    (tmp_path / "first_query.json").write_text(json.dumps(data))
    text = report.build_report(tmp_path, tmp_path / "REPORT.md").read_text()
    assert "| 2000 / count / memwal / first_ms | 12.5 | 11.0 | 40.0 |" in text
    assert "| 2000 / count / lance / first_ms | 2.00 | 1.50 | 3.00 |" in text
    assert "| 2000 / count / first_ratio | 6.25 x |  |  |" in text
    assert "| - |" not in text
