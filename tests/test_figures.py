"""Figures: the points drawn are the table cells and the loss files; titles name profile and commit."""

from __future__ import annotations

import pytest

from dvc_study import COMMIT, LOSSES, PARAMS, write_study
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


def legend_is_outside(figure, legend) -> bool:
    """The legend's box starts right of the axes it belongs to (so it covers no data)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    return legend.get_window_extent(renderer).x0 >= legend.axes.get_window_extent(renderer).x1


def table3() -> Table:
    table = Table("table3", "Table 3", "percent", ["RR@10", "R@50", "Δ RR@10 vs passage context"])
    for method, count, rr, r50, paper_rr in [("cocondenser", 1, 30.0, 80.0, 37.7), ("cocondenser", 5, 32.0, 82.0, 37.4),
                                             ("cotmae", 5, 35.0, 85.0, None)]:
        row = f"{method} C={count}"
        table.put(row, "RR@10", Cell(value=rr, paper=paper_rr))
        table.put(row, "R@50", Cell(value=r50))
        table.put(row, "Δ RR@10 vs passage context", Cell(value=1.0, difference=True))
        table.row_info[row] = {"method": method, "query_count": count}
    table.baselines = {"cocondenser": {"RR@10": 29.0, "R@50": 79.0}}
    return table


def test_query_count_figure_plots_table3_with_passage_baseline_and_paper(tmp_path, drawn_figures):
    from qac.reporting.figures import plot_query_count

    path = plot_query_count(table3(), tmp_path / "query_count.png", "smoke profile, runs at 0123")
    assert path.stat().st_size > 1000
    (figure,) = drawn_figures
    rr_axis, r50_axis = figure.axes                       # the Δ column is not a panel
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in rr_axis.lines}
    assert lines["coCondenser query context"] == ([1, 5], [30.0, 32.0])
    assert lines["CoT-MAE query context"] == ([5], [35.0])
    assert lines["coCondenser passage context"][1] == [29.0, 29.0]          # a horizontal line
    assert lines["coCondenser paper (MS MARCO)"] == ([1, 5], [37.7, 37.4])
    assert "CoT-MAE passage context" not in lines                         # no baseline cell: no line
    assert [list(line.get_ydata()) for line in r50_axis.lines if "query" in line.get_label()] == [[80.0, 82.0], [85.0]]
    assert figure._suptitle.get_text() == "smoke profile, runs at 0123"
    assert legend_is_outside(figure, r50_axis.get_legend())


def test_query_count_figure_scales_to_our_values_and_marks_the_papers_on_their_own_axis(tmp_path, drawn_figures):
    """A scaled-down profile's RR@10 of 2-3 beside the paper's 37: our lines fill the panel, the paper's points
    sit on a right axis of their own instead of squashing ours into the bottom tenth."""
    from qac.reporting.figures import plot_query_count

    table = Table("table3", "Table 3", "percent", ["RR@10 [paper: MS MARCO dev MRR@10]"])
    column = table.columns[0]
    for count, ours, paper in [(1, 2.7, 37.7), (4, 2.2, None), (5, None, 37.4), (10, None, 37.6)]:
        table.put(f"coCondenser C={count}", column, Cell(value=ours, paper=paper))
        table.row_info[f"coCondenser C={count}"] = {"method": "cocondenser", "query_count": count}
    table.baselines = {"cocondenser": {column: 2.1}}
    plot_query_count(table, tmp_path / "query_count.png")
    (figure,) = drawn_figures
    ours_axis, paper_axis = figure.axes
    low, high = ours_axis.get_ylim()
    assert low <= 2.1 and high >= 2.7                          # every one of ours (and the baseline) shown
    assert high - low < 3 * (2.7 - 2.1)                        # and they fill at least a third of the height
    assert {line.get_label() for line in ours_axis.lines} == {"coCondenser query context", "coCondenser passage context"}
    (paper_line,) = paper_axis.lines
    assert list(paper_line.get_ydata()) == [37.7, 37.4, 37.6] and paper_axis.get_ylim()[0] > high
    assert paper_axis.get_ylabel() == "paper: MS MARCO dev MRR@10 (%)"
    assert paper_line.get_label() == "coCondenser paper (MS MARCO, right axis)"
    legend = ours_axis.get_legend()
    assert "coCondenser paper (MS MARCO, right axis)" in [text.get_text() for text in legend.get_texts()]
    assert legend_is_outside(figure, legend)


def test_the_papers_points_share_our_axis_where_they_fit_its_scale():
    from qac.reporting.figures import shares_scale

    assert shares_scale([30.0, 32.0, 35.0], [37.7, 37.4])       # the paper's scale: one axis
    assert not shares_scale([2.1, 2.7], [37.7])                 # a scaled-down profile: an axis of its own
    assert shares_scale([2.5], [2.6]) and not shares_scale([2.5], [3.0])


def test_query_count_figure_draws_retriever_1_only_beside_retriever_2_and_dl_columns(tmp_path, drawn_figures):
    """Table 3's retriever-2 columns and a DL column without numbers draw no panel; RR@10 is retriever 1's."""
    from dvc_study import HIT50, RR
    from qac.reporting.figures import plot_query_count
    from qac.reporting.lineage import load_study
    from qac.reporting.tables import TableContext, table3_query_count

    table = table3_query_count(TableContext.from_params(load_study(PARAMS, write_study(tmp_path)), PARAMS))
    assert f"retriever 2 {RR}" in table.columns                      # retriever 2's values are in the table
    plot_query_count(table, tmp_path / "query_count.png")
    (figure,) = drawn_figures
    assert [axis.get_ylabel() for axis in figure.axes] == [RR.split(" [")[0] + " (%)", HIT50.split(" [")[0] + " (%)"]
    lines = {line.get_label(): list(line.get_ydata()) for line in figure.axes[0].lines}
    # coCondenser retriever 1 RR@10: C=1 30, C=5 40 (retriever 2's C=5 is 50); passage context 30.
    assert lines["coCondenser query context"] == pytest.approx([30.0, 40.0])
    assert lines["coCondenser passage context"] == pytest.approx([30.0, 30.0])
    assert lines["coCondenser paper (MS MARCO)"] == [37.7, 37.4]


def test_zero_shot_figure_marks_the_papers_values(tmp_path, drawn_figures):
    from qac.reporting.figures import plot_zero_shot

    table = Table("table2", "Table 2", "fraction", ["A w/o", "A w/", "A Δ"])
    for dataset, without, with_, paper in [("nfcorpus", 0.3, 0.4, 0.33), ("scifact", 0.5, 0.6, None)]:
        table.put(dataset, "A w/o", Cell(value=without, paper=paper))
        table.put(dataset, "A w/", Cell(value=with_))
        table.put(dataset, "A Δ", Cell(value=with_ - without, difference=True))
    table.put("average", "A w/o", Cell(value=0.4))
    plot_zero_shot(table, tmp_path / "zero_shot.png")
    (figure,) = drawn_figures
    axis = figure.axes[0]
    heights = sorted(round(bar.get_height(), 6) for bar in axis.patches)
    assert heights == [0.3, 0.4, 0.5, 0.6]                # no average bar, no Δ bar
    [marks] = axis.collections
    assert [round(y, 6) for _, y in marks.get_offsets()] == [0.33]
    assert marks.get_label() == "paper (BEIR)"
    assert legend_is_outside(figure, axis.get_legend())


def test_nothing_to_draw_gives_no_file(tmp_path):
    from qac.reporting.figures import plot_query_count, plot_zero_shot

    empty3 = Table("table3", "Table 3", "percent", ["RR@10"])
    empty2 = Table("table2", "Table 2", "fraction", ["A w/o"])
    assert plot_query_count(empty3, tmp_path / "a.png") is None
    assert plot_zero_shot(empty2, tmp_path / "b.png") is None
    assert list(tmp_path.iterdir()) == []


def test_pretrain_losses_come_from_the_loss_files_a_panel_per_method(tmp_path, drawn_figures):
    from qac.reporting.figures import plot_pretrain_losses
    from qac.reporting.lineage import load_study

    study = load_study(PARAMS, write_study(tmp_path))
    plot_pretrain_losses(study, tmp_path / "loss.png", "title")
    (figure,) = drawn_figures
    panels = {axis.get_title(): {line.get_label(): (list(line.get_ydata()), line.get_color()) for line in axis.lines}
              for axis in figure.axes}
    assert panels["CoT-MAE"] == {"passage": (LOSSES["cotmae-passage"], "tab:blue"),
                                 "query C=5": (LOSSES["cotmae-query-q5"], "tab:orange")}
    assert set(panels["coCondenser"]) == {"passage", "query C=1", "query C=5", "mixed C=5"}
    assert panels["coCondenser"]["mixed C=5"] == (LOSSES["cocondenser-mixed"], "tab:green")


def test_report_figures_are_titled_with_the_profile_and_no_run_bookkeeping(tmp_path, drawn_figures):
    from qac.reporting.figures import draw_figures
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    study = load_study(PARAMS, write_study(tmp_path))
    reasons = draw_figures(study, build_tables(study, PARAMS), tmp_path / "figures", PARAMS)
    assert reasons == {"query_count.png": None, "zero_shot.png": None, "pretrain_loss.png": None}
    titles = [figure._suptitle.get_text() for figure in drawn_figures]
    # the profile, never the commit or run: a retrain that reproduces the values redraws the same figure
    assert len(titles) == 3 and all(title.endswith("\nsmoke profile") for title in titles)
    assert not any(COMMIT[:7] in title for title in titles)


def test_missing_loss_files_say_why(tmp_path):
    from qac.reporting.figures import draw_figures
    from qac.reporting.lineage import load_study

    data = write_study(tmp_path)
    for path in (data / "pretrain").glob("*/losses.tsv"):
        path.unlink()
    reasons = draw_figures(load_study(PARAMS, data), [], tmp_path / "figures", PARAMS)
    assert reasons["pretrain_loss.png"] == "no pretrain/<variant>/losses.tsv in the DVC outputs"
