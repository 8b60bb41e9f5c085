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
