"""Figures: the points drawn are the table cells and the logged loss history."""

from __future__ import annotations

import pytest

from qac.reporting.runs import RunRecord, StudyRuns
from qac.reporting.tables import Cell, Table


@pytest.fixture()
def drawn_figures(monkeypatch):
    """Keep every figure the plotting code closes, to read back what it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure=None: kept.append(figure))
    yield kept
    for figure in kept:
        real_close(figure)


def table3() -> Table:
    table = Table("table3", "Table 3", "percent", ["RR@10", "R@50", "Δ RR@10 vs passage context"])
    for method, count, rr, r50 in [("cocondenser", 1, 30.0, 80.0), ("cocondenser", 5, 32.0, 82.0),
                                   ("cotmae", 5, 35.0, 85.0)]:
        row = f"{method} C={count}"
        table.put(row, "RR@10", Cell(value=rr))
        table.put(row, "R@50", Cell(value=r50))
        table.put(row, "Δ RR@10 vs passage context", Cell(value=1.0, difference=True))
        table.row_info[row] = {"method": method, "query_count": count}
    return table


def test_query_count_figure_plots_table3_cells(tmp_path, drawn_figures):
    from qac.reporting.figures import plot_query_count

    path = plot_query_count(table3(), tmp_path / "query_count.png")
    assert path.stat().st_size > 1000
    (figure,) = drawn_figures
    rr_axis, r50_axis = figure.axes                       # the Δ column is not a panel
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in rr_axis.lines}
    assert lines == {"coCondenser": ([1, 5], [30.0, 32.0]), "CoT-MAE": ([5], [35.0])}
    assert [list(line.get_ydata()) for line in r50_axis.lines] == [[80.0, 82.0], [85.0]]


def test_zero_shot_figure_has_a_bar_per_dataset_and_system(tmp_path, drawn_figures):
    from qac.reporting.figures import plot_zero_shot

    table = Table("table2", "Table 2", "fraction", ["A w/o", "A w/", "A Δ"])
    for dataset, without, with_ in [("nfcorpus", 0.3, 0.4), ("scifact", 0.5, 0.6)]:
        table.put(dataset, "A w/o", Cell(value=without))
        table.put(dataset, "A w/", Cell(value=with_))
        table.put(dataset, "A Δ", Cell(value=with_ - without, difference=True))
    table.put("average", "A w/o", Cell(value=0.4))
    plot_zero_shot(table, tmp_path / "zero_shot.png")
    (figure,) = drawn_figures
    heights = sorted(round(bar.get_height(), 6) for bar in figure.axes[0].patches)
    assert heights == [0.3, 0.4, 0.5, 0.6]                # no average bar, no Δ bar


def test_nothing_to_draw_gives_no_file(tmp_path):
    from qac.reporting.figures import plot_query_count, plot_zero_shot

    empty3 = Table("table3", "Table 3", "percent", ["RR@10"])
    empty2 = Table("table2", "Table 2", "fraction", ["A w/o"])
    assert plot_query_count(empty3, tmp_path / "a.png") is None
    assert plot_zero_shot(empty2, tmp_path / "b.png") is None
    assert list(tmp_path.iterdir()) == []


def test_loss_key_prefers_the_configured_total():
    from qac.reporting.figures import loss_key

    assert loss_key(["mlm", "loss", "lr"]) == "loss"
    assert loss_key(["loss/mlm", "loss/total"]) == "loss/total"
    assert loss_key(["train/loss", "lr"]) == "train/loss"
    assert loss_key(["loss/mlm", "lr"]) == "loss/mlm"
    assert loss_key(["lr", "samples_per_second"]) is None


class HistoryStudy(StudyRuns):
    """StudyRuns whose metric history comes from a dict instead of MLflow."""

    histories: dict = {}

    def metric_history(self, run, key):
        return self.histories[(run.run_id, key)]


def test_pretrain_loss_panels_per_method_latest_run(tmp_path, drawn_figures):
    from qac.reporting.figures import plot_pretrain_losses

    def run(run_id, variant, method, start):
        return RunRecord(run_id, f"pretrain/{variant}", {"qac.kind": "pretrain", "qac.variant": variant,
                                                          "qac.method": method}, {"loss": 1.0}, {}, start)

    study = HistoryStudy([run("old", "cocondenser-passage", "cocondenser", 1),
                          run("new", "cocondenser-passage", "cocondenser", 2),
                          run("mae", "cotmae-passage", "cotmae", 3)])
    study.histories = {("old", "loss"): [(1, 9.0)], ("new", "loss"): [(1, 4.0), (2, 3.0)],
                       ("mae", "loss"): [(1, 12.0), (2, 11.0)]}
    plot_pretrain_losses(study, tmp_path / "loss.png")
    (figure,) = drawn_figures
    panels = {axis.get_title(): [list(line.get_ydata()) for line in axis.lines] for axis in figure.axes}
    assert panels == {"coCondenser": [[4.0, 3.0]], "CoT-MAE": [[12.0, 11.0]]}
