"""losses.tsv: the per-step losses a pre-training run logged (resumption: tests/test_pretrain_pipeline.py)."""

from __future__ import annotations

import pytest


def logged(log, steps, loss_of=lambda step: 10.0 - step):
    for step in steps:
        log(step, {"loss": loss_of(step), "mlm": 1.0, "lr": 1e-4, "samples_per_second": 123.0})


def read(path):
    from qac.reporting.lineage import read_losses

    return read_losses(path)


def test_every_logged_step_is_written_without_throughput(tmp_path):
    from qac.train.step_log import StepLog

    log = StepLog()
    logged(log, [1, 2, 3])
    assert log.write(tmp_path / "losses.tsv") == 3
    assert (tmp_path / "losses.tsv").read_text().splitlines() == [
        "step\tloss\tmlm", "1\t9.0\t1.0", "2\t8.0\t1.0", "3\t7.0\t1.0"]


def test_a_bad_losses_file_names_file_and_line(tmp_path):
    path = tmp_path / "losses.tsv"
    path.write_text("step\tloss\n1\t2.0\n2\tnan-ish\n")
    with pytest.raises(ValueError, match=r"losses.tsv:3: a field is missing or not a number"):
        read(path)
