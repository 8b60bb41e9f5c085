"""losses.tsv: the per-step losses a pre-training run logged, kept whole across an interruption and resume."""

from __future__ import annotations

import pytest


def logged(log, steps, loss_of=lambda step: 10.0 - step):
    for step in steps:
        log(step, {"loss": loss_of(step), "mlm": 1.0, "lr": 1e-4, "samples_per_second": 123.0})


def read(path):
    from qac.reporting.lineage import read_losses

    return read_losses(path)


def test_an_uninterrupted_run_writes_every_logged_step_without_throughput(tmp_path):
    from qac.train.step_log import StepLog

    log = StepLog(tmp_path / "work" / "v.losses.jsonl")
    logged(log, [1, 2, 3])
    assert log.write(tmp_path / "losses.tsv", resumed_from_step=0) == 3
    assert (tmp_path / "losses.tsv").read_text().splitlines() == [
        "step\tloss\tmlm", "1\t9.0\t1.0", "2\t8.0\t1.0", "3\t7.0\t1.0"]
    assert not (tmp_path / "work" / "v.losses.jsonl").exists()


def test_a_resumed_run_keeps_the_rows_up_to_its_checkpoint(tmp_path):
    from qac.train.step_log import StepLog

    journal = tmp_path / "v.losses.jsonl"
    # First process: steps 1-5 logged, checkpoint at 4, killed after step 5.
    logged(StepLog(journal), [1, 2, 3, 4, 5], loss_of=lambda step: 100.0 + step)
    # Second process resumes from step 4 and logs 5 and 6 again (other values: step 5 is redone).
    second = StepLog(journal)
    logged(second, [5, 6])
    second.write(tmp_path / "losses.tsv", resumed_from_step=4)
    assert [(row["step"], row["loss"]) for row in read(tmp_path / "losses.tsv")] == [
        (1, 101.0), (2, 102.0), (3, 103.0), (4, 104.0), (5, 5.0), (6, 4.0)]


def test_two_interruptions_and_a_discarded_checkpoint(tmp_path):
    from qac.train.step_log import StepLog

    journal = tmp_path / "v.losses.jsonl"
    logged(StepLog(journal), [1, 2, 3], loss_of=lambda step: 100.0 + step)       # checkpoint at 2, killed
    logged(StepLog(journal), [3, 4, 5], loss_of=lambda step: 200.0 + step)       # resumed at 2, checkpoint 4, killed
    third = StepLog(journal)
    assert [(row["step"], row["loss"]) for row in third.previous] == [
        (1, 101.0), (2, 102.0), (3, 203.0), (4, 204.0), (5, 205.0)]
    logged(third, [5, 6])
    assert [row["step"] for row in third.rows(resumed_from_step=4)] == [1, 2, 3, 4, 5, 6]
    assert third.rows(resumed_from_step=4)[2]["loss"] == 203.0
    # Settings changed since: the checkpoint is discarded (resumed from 0) and no earlier row survives.
    assert [row["step"] for row in third.rows(resumed_from_step=0)] == [5, 6]


def test_a_torn_last_line_is_ignored(tmp_path):
    from qac.train.step_log import StepLog

    journal = tmp_path / "v.losses.jsonl"
    logged(StepLog(journal), [1, 2])
    with open(journal, "a") as handle:
        handle.write('{"step": 3, "lo')
    assert [row["step"] for row in StepLog(journal).previous] == [1, 2]


def test_a_bad_losses_file_names_file_and_line(tmp_path):
    path = tmp_path / "losses.tsv"
    path.write_text("step\tloss\n1\t2.0\n2\tnan-ish\n")
    with pytest.raises(ValueError, match=r"losses.tsv:3: a field is missing or not a number"):
        read(path)
