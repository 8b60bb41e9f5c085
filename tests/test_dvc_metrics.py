"""A stage's DVC metrics split by kind: results in metrics/<stage>.json, wall-clock figures in metrics/timing/."""

from __future__ import annotations

import json


def test_timing_goes_to_its_own_file(tmp_path):
    from qac.reporting.dvc_metrics import write_stage_metrics

    write_stage_metrics(tmp_path, "split", {"documents": 40.0, "mean_tokens": 31.5, "seconds": 2.5,
                                            "documents_per_second": 16.0, "punkt": "trained"})
    assert json.loads((tmp_path / "split.json").read_text()) == {"documents": 40.0, "mean_tokens": 31.5,
                                                                 "punkt": "trained"}
    assert json.loads((tmp_path / "timing" / "split.json").read_text()) == {"documents_per_second": 16.0,
                                                                            "seconds": 2.5}


def test_which_keys_are_timing():
    from qac.reporting.dvc_metrics import is_timing

    assert [key for key in ("seconds", "train_seconds", "passages_per_second", "passages_per_second_per_process",
                            "queries_per_passage", "rougeL", "pairs/train") if is_timing(key)] == [
        "seconds", "train_seconds", "passages_per_second", "passages_per_second_per_process"]


def test_qac_metrics_lists_one_profiles_results_one_value_a_line(tmp_path, monkeypatch, capsys):
    """`qac metrics`: the profile's declared metrics files, narrow enough for a terminal; timing apart."""
    import json
    from pathlib import Path

    from qac.cli import main

    data = tmp_path / "data" / "smoke"
    files = {"metrics/split.json": {"passages": 120, "mean_tokens": 41.23456},
             "metrics/eval/none.json": {"r1": {"scifact": {"test": {"nDCG@10": 0.5, "RR@10": 0.25}}}},
             "bm25/metrics.json": {"scifact": {"test": {"nDCG@10": 0.75}}},
             "metrics/timing/split.json": {"seconds": 3.5}}
    for name, value in files.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text(json.dumps(value))
    (tmp_path / "data" / "default" / "metrics").mkdir(parents=True)   # another profile: never listed
    (tmp_path / "data" / "default" / "metrics" / "split.json").write_text('{"passages": 1}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QAC_PARAMS", str(Path(__file__).resolve().parent.parent / "profiles/smoke/params.yaml"))

    assert main(["metrics"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "metrics of profile smoke (data/smoke/)"
    assert [line.split() for line in lines[1:]] == [
        ["metrics/split.json", "passages", "120"], ["metrics/split.json", "mean_tokens", "41.2346"],
        ["metrics/eval/none.json", "r1/scifact/test/nDCG@10", "0.5000"],
        ["metrics/eval/none.json", "r1/scifact/test/RR@10", "0.2500"],
        ["bm25/metrics.json", "scifact/test/nDCG@10", "0.7500"]]
    assert max(map(len, lines)) <= 80

    assert main(["metrics", "nDCG@10", "--timing"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["metrics", "--timing"]) == 0
    assert "metrics/timing/split.json  seconds" in capsys.readouterr().out.replace("   ", "  ")
    assert main(["metrics", "no-such-measure"]) == 1


def test_qac_metrics_shows_a_file_of_undecodable_bytes_as_unreadable(tmp_path, monkeypatch, capsys):
    """Bytes that are not UTF-8 are one "(unreadable)" line with the line they are on, as malformed JSON is."""
    from pathlib import Path

    from qac.cli import main

    metrics = tmp_path / "data" / "smoke" / "metrics"
    (metrics / "eval").mkdir(parents=True)
    (metrics / "split.json").write_bytes(b"\xff\xfe")
    (metrics / "pairs.json").write_bytes(b'{"pairs":\n 3, "note": "\xe9"}')
    (metrics / "eval" / "none.json").write_text('{"nDCG@10": 0.5}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QAC_PARAMS", str(Path(__file__).resolve().parent.parent / "profiles/smoke/params.yaml"))

    assert main(["metrics"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert [line.split(None, 2) for line in out.splitlines()[1:]] == [
        ["metrics/pairs.json", "(unreadable)", "line 2: not UTF-8 text (byte 0xe9)"],
        ["metrics/split.json", "(unreadable)", "line 1: not UTF-8 text (byte 0xff)"],
        ["metrics/eval/none.json", "nDCG@10", "0.5000"]]
