"""benchmarks/bench_stages.py reads a `dvc repro` run's output: per stage its wall time, imports and clock."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_stages", REPO / "benchmarks" / "bench_stages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# (arrival second, line) as DVC prints them with PYTHONPROFILEIMPORTTIME=1; two variants of one stage.
LOG = [
    (0.5, "import time:       100 |     900000 | dvc"),                        # DVC's own start-up: no stage's
    (1.0, "Running stage 'profiles/smoke/dvc.yaml:pretrain@none':"),
    (1.0, "> QAC_PARAMS=profiles/smoke/params.yaml python pipelines/pretrain.py --variant none"),
    (1.2, "import time:       300 |       2000 |   torch._C"),                  # a child: inside torch's time
    (2.4, "import time:       500 |    1200000 | torch"),
    (3.0, "import time:       400 |     800000 | mlflow"),
    (5.5, "pretrain@none: 6 steps, final loss 25.302, 2.5 s"),
    (6.0, "Updating lock file 'profiles/smoke/dvc.lock'"),
    (6.5, "Running stage 'profiles/smoke/dvc.yaml:pretrain@cotmae-passage':"),
    (7.9, "import time:       500 |    1000000 | torch"),
    (70.5, "pretrain@cotmae-passage: 6 steps, final loss 12.1, 1 min 02 s"),
    (71.5, "Running stage 'profiles/smoke/dvc.yaml:tables':"),
    (73.0, "tables: wrote reports/smoke/tables.md (5 tables, 3 figures)"),
]


def test_each_stage_run_gets_its_wall_time_imports_and_clock(bench):
    runs = bench.parse_timed_lines(LOG, end=75.0)
    assert [run.name for run in runs] == ["pretrain@none", "pretrain@cotmae-passage", "tables"]
    first, second, tables = runs
    assert first.wall == pytest.approx(5.5) and first.imports == pytest.approx(2.0) and first.clock == 2.5
    assert first.modules == {"torch": pytest.approx(1.2), "mlflow": pytest.approx(0.8)}
    assert first.ended - first.last_line == pytest.approx(1.0)    # the lock line is DVC's, not the stage's
    assert second.clock == 62 and second.wall == pytest.approx(65.0)
    assert tables.clock is None and tables.wall == pytest.approx(3.5)


def test_rows_sum_the_variants_of_a_stage_and_total_every_run(bench):
    rows = bench.stage_rows(bench.parse_timed_lines(LOG, end=75.0))
    assert [row["stage"] for row in rows] == ["pretrain", "tables", "all stages"]
    pretrain, tables, total = rows
    assert pretrain["runs"] == 2 and pretrain["wall s"] == 70.5 and pretrain["wall s per run"] == 35.2
    assert pretrain["imports s"] == 3.0 and pretrain["stage clock s"] == 64.5
    assert pretrain["outside the clock s"] == 6.0
    assert tables["stage clock s"] == "" and total["runs"] == 3 and total["wall s"] == 74.0
    assert bench.heaviest_imports(bench.parse_timed_lines(LOG, end=75.0))[0] == ("torch", pytest.approx(2.2), 2)
    assert ("mlflow", pytest.approx(0.8), 1) in bench.heaviest_imports(bench.parse_timed_lines(LOG, end=75.0))


@pytest.mark.parametrize("line, seconds", [("bm25: 809 queries, 2.2 s", 2.2), ("bm25: 809 queries, 1 min 05 s", 65),
                                           ("bm25: 809 queries, 1 h 02 min", 3720), ("bm25 ran", None),
                                           ("evaluate@none: 2.2 s", None)])
def test_summary_seconds_read_as_the_console_writes_them(bench, line, seconds):
    assert bench.summary_seconds(line, "bm25") == seconds


# `qac repro --jobs 2`: two stages ran together; each arrives as one block after the runner's line.
SIDE_BY_SIDE = [
    (0.2, "Starting stage 'pretrain@none'"),
    (0.2, "Starting stage 'bm25'"),
    (4.0, "Stage 'bm25' done in 3.8 s"),
    (4.0, "import time:       100 |     700000 | dvc"),                          # the DVC process's own
    (4.0, "Running stage 'profiles/smoke/dvc.yaml:bm25':"),
    (4.0, "import time:       500 |    1000000 | torch"),
    (4.0, "bm25: 225 queries, 1.1 s"),
    (4.0, "Starting stage 'tables'"),
    (6.5, "Stage 'pretrain@none' done in 6.3 s"),
    (6.5, "Running stage 'profiles/smoke/dvc.yaml:pretrain@none':"),
    (6.5, "pretrain@none: 6 steps, final loss 25.302, 2.5 s"),
    (7.0, "Stage 'tables' FAILED (exit status 2) in 3.0 s"),
    (7.0, "Running stage 'profiles/smoke/dvc.yaml:tables':"),
]


def test_stages_run_side_by_side_take_the_wall_time_the_runner_reported(bench):
    runs = bench.parse_timed_lines(SIDE_BY_SIDE, end=8.0)
    assert [run.name for run in runs] == ["bm25", "pretrain@none", "tables"]
    bm25, pretrain, tables = runs
    assert bm25.wall == pytest.approx(3.8) and bm25.imports == pytest.approx(1.0) and bm25.clock == 1.1
    assert pretrain.wall == pytest.approx(6.3) and pretrain.clock == 2.5 and tables.wall == pytest.approx(3.0)
    assert all(run.measured for run in runs)
    assert bench.repro_command("smoke", True, [], jobs=2) == ["qac", "repro", "--jobs", "2", "--force", "smoke"]
