"""The benchmark report's helpers: the machine line and section replacement."""

from __future__ import annotations

import os

import torch

from qac.benchmarking import machine_summary, write_section


def test_machine_summary_names_cores_and_the_cpu_kernels_in_use():
    line = machine_summary()
    assert f"({torch.backends.cpu.get_cpu_capability()} kernels)" in line
    assert f"{os.cpu_count()} CPU cores" in line and f"torch {torch.__version__}" in line


def test_write_section_replaces_only_its_own_section(tmp_path):
    report = tmp_path / "benchmarks.md"
    write_section("a", "first", report)
    write_section("b", "other", report)
    write_section("a", "second", report)
    text = report.read_text()
    assert "second" in text and "first" not in text and text.count("<!-- bench:a -->") == 1
    assert text.index("bench:a") < text.index("bench:b") and "other" in text
