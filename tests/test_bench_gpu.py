"""benchmarks/bench_gpu.py --dry-run: every path of the GPU benchmark once, with a tiny model on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_benchmark_dry_run_writes_its_section(tmp_path):
    report = tmp_path / "benchmarks.md"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py"), "--dry-run", "--report",
                             str(report)], capture_output=True, text=True, env=env, timeout=580)
    assert result.returncode == 0, result.stderr[-3000:]
    text = report.read_text(encoding="utf-8")
    assert "<!-- bench:gpu -->" in text and "<!-- /bench:gpu -->" in text
    for heading in ("Pre-training step (isolated)", "GradCache", "Stage loop vs isolated step",
                    "Encoding and exact search", "Query generation", "Projection: the paper profile"):
        assert heading in text, heading
    assert "| cocondenser | ours" in text and "| cotmae | release" in text
    assert "| True |" in text                  # the torch search equals the reference on the benchmark's data
    assert "pretrain cocondenser-query-q20" in text and "encode MS MARCO passages" in text
    assert "generate 20 queries per passage, per million split passages" in text
    assert "no peak FLOP/s assumed" in text     # the CPU names no peak, so no MFU
    assert "host reads every 8 steps" in text and "| HF generate, fp32 (the release's settings) |" in text
    assert "Ours with sampling on the device / Hugging Face generate" in text
