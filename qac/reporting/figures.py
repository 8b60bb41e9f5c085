"""Figures of the report (matplotlib, Agg backend), drawn from the tables and the DVC outputs.

- ``query_count.png``: Table 3's retriever-1 measures against the number C of
  generated queries per passage, one line per method, the passage-context retriever as
  a horizontal line and the paper's values as a dashed line, on our axis where they
  fit its scale, else on a right axis of their own (the y axis scales to ours);
- ``zero_shot.png``: Table 2's per-dataset nDCG@10 without and with query
  context, the paper's value marked on each bar it has one for;
- ``pretrain_loss.png``: each variant's pre-training loss per step
  (``pretrain/<variant>/losses.tsv``), a panel per method, coloured by context type.

Every figure is titled with the profile and the git commit(s) of the runs
behind it, and keeps its legend outside the data. Each function returns the
path it wrote, or None when there is nothing to draw (the report then says so
instead of showing an empty plot).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from qac.reporting.lineage import Study
from qac.reporting.tables import Table
from qac.reporting.paper import METHOD_NAMES
from qac.reporting.precision import rounded_losses

QUERY_COUNT = "query_count.png"
ZERO_SHOT = "zero_shot.png"
PRETRAIN_LOSS = "pretrain_loss.png"
CONTEXT_COLOURS = {"passage": "tab:blue", "query": "tab:orange", "mixed": "tab:green"}
# No matplotlib version and no creation date in a file: it depends on the values alone.
FIXED_METADATA = {".png": {"Software": None}, ".svg": {"Creator": None, "Date": None},
                  ".pdf": {"Creator": None, "Producer": None, "CreationDate": None}}
LEGEND_OUTSIDE = dict(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    # Byte-identical files for equal values: no random ids in an SVG, no date or version in any format.
    matplotlib.rcParams["svg.hashsalt"] = "qac"
    import matplotlib.pyplot as plt

    return plt


# One colour per pre-training method, from one palette, in the order the tables list the methods.
PALETTE = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def method_colour(method: str) -> str:
    """The colour of ``method`` in every figure: its place among the known methods in :data:`PALETTE`
    (the no-pre-training baseline grey), a method the project does not know yet the next free one."""
    if method == "none":
        return "tab:gray"
    known = [name for name in METHOD_NAMES if name != "none"]
    index = known.index(method) if method in known else len(known) + sum(map(ord, method)) % (
        len(PALETTE) - len(known))
    return PALETTE[index % len(PALETTE)]


def _save(figure, path: str | os.PathLike, title: str | None) -> Path:
    plt = _pyplot()
    if title:
        # Above the panels' own titles; bbox_inches="tight" grows the image to keep it.
        figure.suptitle(title, fontsize="medium", y=1.0, va="bottom")
    # bbox_inches="tight" keeps the legends placed outside the axes inside the image.
    figure.savefig(path, dpi=120, bbox_inches="tight", metadata=FIXED_METADATA.get(Path(path).suffix, {}))
    plt.close(figure)
    return Path(path)


def figure_title(what: str, profile: str) -> str:
    """``<what>`` and ``<profile> profile``: a figure is never taken for another profile's.

    No run ids or commits: equal values draw a byte-identical figure.
    """
    return f"{what}\n{profile} profile"


def shares_scale(ours: Sequence[float], theirs: Sequence[float]) -> bool:
    """Whether the paper's points can share the axis of ours without squashing them: each lies within our
    span stretched by that span on either side, so our points keep at least a third of the height.
    A flat set of ours (one value) counts a span of a tenth of its size."""
    low, high = min(ours), max(ours)
    span = max(high - low, 0.1 * max(abs(low), abs(high)), 1e-9)
    return all(low - span <= value <= high + span for value in theirs)


def _query_count_panel(axis, column: str, series: dict[str, list[tuple[int, float]]],
                       papers: dict[str, list[tuple[int, float]]], baselines: dict[str, float]) -> None:
    """One measure: our lines on the left axis, scaled to them; the paper's on it too where they fit its
    scale (:func:`shares_scale`), else on a right axis of their own, so they never squash ours."""
    ours = [value for points in series.values() for _, value in points] + list(baselines.values())
    theirs = [value for points in papers.values() for _, value in points]
    paper_axis = axis if not theirs or shares_scale(ours, theirs) else axis.twinx()
    paper_where = "" if paper_axis is axis else ", right axis"
    for method, points in sorted(series.items()):
        name, colour = METHOD_NAMES.get(method, method), method_colour(method)
        axis.plot([p[0] for p in sorted(points)], [p[1] for p in sorted(points)], marker="o", color=colour,
                  label=f"{name} query context")
        if method in baselines:
            axis.axhline(baselines[method], color=colour, linestyle=":", label=f"{name} passage context")
    for method, points in sorted(papers.items()):
        name, colour = METHOD_NAMES.get(method, method), method_colour(method)
        paper_axis.plot([p[0] for p in sorted(points)], [p[1] for p in sorted(points)], marker="s",
                        linestyle="--", color=colour, alpha=0.5, label=f"{name} paper (MS MARCO{paper_where})")
    measure = column.split(" [")[0]
    axis.set_ylabel(f"{measure} (%)")
    if paper_axis is not axis:
        paper_label = column.split("[paper: ", 1)[1].rstrip("]") if "[paper: " in column else measure
        paper_axis.set_ylabel(f"paper: {paper_label} (%)", color="dimgray")
        paper_axis.tick_params(axis="y", colors="dimgray")


def plot_query_count(table3: Table, path: str | os.PathLike, title: str | None = None) -> Path | None:
    """Table 3 as lines: a panel per measure, x = queries per passage; passage context and paper as references."""
    # Retriever 1's measures only (the figure's subject); a column no row has a number in draws no panel.
    measures = [column for column in table3.columns
                if not column.startswith("Δ") and table3.column_retrievers.get(column, "r1") == "r1"
                and any(table3.cell(row, column).value is not None or table3.cell(row, column).paper is not None
                        for row in table3.row_info)]
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    papers: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for row, info in table3.row_info.items():
        for column in measures:
            cell = table3.cell(row, column)
            if cell.value is not None:
                series.setdefault(column, {}).setdefault(info["method"], []).append((info["query_count"], cell.value))
            if cell.paper is not None:
                papers.setdefault(column, {}).setdefault(info["method"], []).append((info["query_count"], cell.paper))
    if not series:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(measures), figsize=(5.0 * len(measures), 3.6), squeeze=False)
    counts = sorted({info["query_count"] for info in table3.row_info.values()})
    for axis, column in zip(axes[0], measures):
        baselines = {method: columns[column] for method, columns in table3.baselines.items()
                     if columns.get(column) is not None and method in series.get(column, {})}
        _query_count_panel(axis, column, series.get(column, {}), papers.get(column, {}), baselines)
        axis.set_xlabel("generated queries per passage (C)")
        axis.set_xscale("log")   # the paper's C = 1, 5, 10, 20 spread evenly
        axis.set_xticks(counts, [str(c) for c in counts])
        axis.minorticks_off()
    if len(figure.axes) > len(measures):
        figure.subplots_adjust(wspace=0.6)   # room between panels for a right axis's ticks and label
    _legend_outside(figure, axes[0][-1])
    return _save(figure, path, title or "Retriever 1 against the number of generated queries (Table 3)")


def _legend_outside(figure, last_axis) -> None:
    """One legend right of the last panel, with every label of the figure's axes (right axes included) once."""
    handles: dict[str, Any] = {}
    for axis in figure.axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    # Right of a panel's right axis too: its tick labels sit where the legend would start.
    place = dict(LEGEND_OUTSIDE)
    if any(axis is not last_axis and axis.get_position().bounds == last_axis.get_position().bounds
           for axis in figure.axes):
        place["bbox_to_anchor"] = (1.3, 1.0)
    last_axis.legend(list(handles.values()), list(handles), **place)


def plot_zero_shot(table2: Table, path: str | os.PathLike, title: str | None = None) -> Path | None:
    """Table 2 as grouped bars: a group per dataset, a bar per (method, context); paper values as black ticks."""
    import numpy as np

    columns = [column for column in table2.columns if not column.endswith("Δ")]
    datasets = [row for row in table2.rows if row != "average"]
    if not datasets or not any(table2.cell(d, c).value is not None for d in datasets for c in columns):
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(max(5.0, 1.4 * len(datasets) + 2), 3.8))
    width = 0.8 / max(1, len(columns))
    positions = np.arange(len(datasets))
    paper_marked = False
    for index, column in enumerate(columns):
        values = [table2.cell(d, column).value for d in datasets]
        x = positions + index * width
        axis.bar(x, [np.nan if v is None else v for v in values], width, label=column)
        papers = [(xi, table2.cell(d, column).paper) for xi, d in zip(x, datasets)
                  if table2.cell(d, column).paper is not None]
        if papers:
            axis.scatter([p[0] for p in papers], [p[1] for p in papers], marker="_", s=300, color="black",
                         zorder=3, label=None if paper_marked else "paper (BEIR)")
            paper_marked = True
    axis.set_xticks(positions + width * (len(columns) - 1) / 2, datasets, rotation=20, ha="right")
    axis.set_ylabel("nDCG@10")
    axis.legend(**LEGEND_OUTSIDE)
    return _save(figure, path, title or "Zero-shot retrieval (Table 2)")


def plot_pretrain_losses(study: Study, path: str | os.PathLike, title: str | None = None) -> Path | None:
    """Every variant's total pre-training loss per step, a panel per method, a colour per context type.

    coCondenser (MLM + contrastive) and CoT-MAE (encoder + decoder MLM) losses
    are on different scales, so each method gets its own axis; within a
    panel the query count C sets the line style.
    """
    curves: dict[str, list[tuple[Any, list[dict[str, float]]]]] = {}

    for variant in study.variants():
        rows = rounded_losses(study.pretrain_losses(variant.name))
        if variant.method != "none" and rows and "loss" in rows[0]:
            curves.setdefault(variant.method, []).append((variant, rows))
    if not curves:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 3.8), squeeze=False)
    from matplotlib.ticker import MaxNLocator

    styles = ["--", "-.", ":"]
    for axis, (method, found) in zip(axes[0], sorted(curves.items())):
        # Passage context is solid; generated-query contexts get a dash pattern per C.
        counts = sorted({variant.query_count or 0 for variant, _ in found if variant.context_type != "passage"})
        for variant, rows in found:
            style = "-" if variant.context_type == "passage" else \
                styles[counts.index(variant.query_count or 0) % len(styles)]
            label = variant.context_type if variant.context_type == "passage" else \
                f"{variant.context_type} C={variant.query_count}"
            axis.plot([row["step"] for row in rows], [row["loss"] for row in rows], linestyle=style,
                      color=CONTEXT_COLOURS.get(variant.context_type or "", "grey"), label=label)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel("pre-training loss (total)")
        axis.set_title(METHOD_NAMES.get(method, method))
        axis.legend(**LEGEND_OUTSIDE)
    figure.subplots_adjust(wspace=0.6)
    return _save(figure, path, title or "Pre-training loss by context type")


def draw_figures(study: Study, tables: Sequence[Table], directory: str | os.PathLike,
                 params: Mapping[str, Any]) -> dict[str, str | None]:
    """Draw every figure into ``directory``; ``{file name: None or why it is missing}``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    by_key = {table.key: table for table in tables}
    profile = params["profile"]

    def title(what: str, keys: Sequence[str]) -> str:
        return figure_title(what, profile)

    drawn = {
        QUERY_COUNT: plot_query_count(by_key["table3"], directory / QUERY_COUNT,
                                      title("Retriever 1 against the number of generated queries (Table 3)",
                                            ["table3"])) if "table3" in by_key else None,
        ZERO_SHOT: plot_zero_shot(by_key["table2"], directory / ZERO_SHOT,
                                  title("Zero-shot nDCG@10 (Table 2)", ["table2"])) if "table2" in by_key else None,
        PRETRAIN_LOSS: plot_pretrain_losses(study, directory / PRETRAIN_LOSS,
                                            figure_title("Pre-training loss by context type", profile)),
    }
    reasons = {QUERY_COUNT: "no Table 3 values", ZERO_SHOT: "no Table 2 values",
               PRETRAIN_LOSS: "no pretrain/<variant>/losses.tsv in the DVC outputs"}
    return {name: None if path else reasons[name] for name, path in drawn.items()}
