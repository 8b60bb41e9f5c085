"""Every benchmark runs: each ``benchmarks/bench_*.py`` in its small mode (every path at small sizes),
writing its report section to a temporary file, so none can rot unnoticed between measurements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mlflow_stores import empty_store

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"

# script -> (arguments of its small mode, the report sections it writes); "{report}" and "{work}" are
# filled in per run.
SMALL_MODES = {
    "bench_baseline.py": (["--small", "--report", "{report}"], ["baseline"]),
    "bench_pretrain.py": (["--small", "--report", "{report}"], ["pretrain", "pretrain-ratios"]),
    "bench_querygen.py": (["--small", "--report", "{report}"], ["querygen", "querygen-tiny"]),
    "bench_llm_queries.py": (["--small", "--report", "{report}"], ["llm_queries"]),
    "bench_retrieval.py": (["--small", "--report", "{report}"], ["retrieval"]),
    "bench_scale.py": (["--small", "--work", "{work}"], []),
    "bench_split.py": (["--small", "--report", "{report}"], ["split"]),
    # `run` is make smoke per kernel set (minutes each); its judge reads the committed records.
    "bench_kernel_sets.py": (["judge", "--profile", "smoke", "--runs", str(REPO / "reports" / "kernel_sets" / "smoke"),
                              "--report", "{report}"], ["kernel_sets_smoke"]),
}
ELSEWHERE = {"bench_gpu.py": "tests/test_bench_gpu.py runs its --dry-run in a bare clone",
             "bench_stages.py": "tests/test_bench_stages.py runs its reading of a recorded `dvc repro` log "
                                "(the script itself times a whole profile's run)"}


def test_every_benchmark_has_a_small_mode_that_the_suite_runs():
    scripts = {path.name for path in BENCHMARKS.glob("bench_*.py")}
    assert scripts == set(SMALL_MODES) | set(ELSEWHERE)
    for script, test in ELSEWHERE.items():
        assert (REPO / test.split()[0]).exists(), test


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMALL_MODES))
def test_benchmark_runs_in_its_small_mode(script, tmp_path):
    arguments, sections = SMALL_MODES[script]
    report, work = tmp_path / "benchmarks.md", tmp_path / "work"
    command = [sys.executable, str(BENCHMARKS / script),
               *(a.format(report=report, work=work) for a in arguments)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": empty_store(tmp_path / "mlflow.db")}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    if sections:
        text = report.read_text(encoding="utf-8")
        for section in sections:
            assert f"<!-- bench:{section} -->" in text and f"<!-- /bench:{section} -->" in text, section
    if script == "bench_scale.py":
        figures = json.loads((work / "50.json").read_text(encoding="utf-8"))
        assert figures["documents"] == 50 and figures["passages"] > 50
        assert all(rank["anchors"] > 0 for rank in figures["pair_ranks"])
    assert not (REPO / "reports" / "bench_scale" / "50.json").exists()      # small runs stay out of reports/


@pytest.mark.parametrize("script, arguments, option", [
    ("bench_split.py", ["--workers", "0"], "--workers"), ("bench_split.py", ["--documents", "-1"], "--documents"),
    ("bench_retrieval.py", ["--docs", "-1"], "--docs"), ("bench_querygen.py", ["--passages", "0"], "--passages"),
    ("bench_scale.py", ["--documents", "-1"], "--documents"), ("bench_pretrain.py", ["--steps", "0"], "--steps"),
])
def test_a_count_below_one_is_refused_with_the_usage_line(script, arguments, option, tmp_path):
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--small", *arguments], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"argument {option}: expected " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_small_run_leaves_the_tracked_report_alone():
    """--small checks the paths, it measures nothing: without --report its section goes to a temporary file."""
    from qac.benchmarking import REPORT, report_destination

    assert report_destination(None, small=False) == REPORT
    assert report_destination("x.md", small=True) == Path("x.md")
    destination = report_destination(None, small=True)
    assert destination != REPORT and Path(tempfile.gettempdir()) in destination.parents
