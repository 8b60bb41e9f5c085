"""Write tables as Markdown, CSV (one line per cell, with run ids) and LaTeX.

Each table is preceded by a header block naming the profile, data, models,
git commits and date, so a scaled-down table is never taken for the paper's.
A displayed cell reads ``ours / paper``; a difference cell
``+1.2 (p=0.031) / +0.4``; a missing value ``n/a`` with a numbered note
saying why.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
from typing import Any, Iterable, Mapping

from qac.redaction import redact_url
from qac.reporting.runs import StudyRuns
from qac.reporting.tables import FRACTION, Cell, Table

CSV_FIELDS = ["table", "row", "column", "kind", "ours", "paper", "unit", "p_value", "n_queries", "run_id",
              "compared_run_id", "metric", "paper_row", "note"]


# ---------------------------------------------------------------- header block

def _models(params: Mapping[str, Any]) -> str:
    pretrain = params.get("pretrain", {})
    inits = {pretrain.get("common", {}).get("init")}
    inits |= {v.get("init") for v in (pretrain.get("variants") or {}).values() if v and v.get("init")}
    generator = params.get("query_generator", {})
    parts = [f"pre-training starts from {', '.join(sorted(filter(None, inits))) or 'n/a'}",
             f"{pretrain.get('common', {}).get('steps', 'n/a')} steps at batch {pretrain.get('common', {}).get('batch_size', 'n/a')} "
             "(per-variant overrides in params)",
             f"CoT-MAE decoder: {pretrain.get('common', {}).get('cotmae_decoder', 'n/a')}",
             f"query generator: {generator.get('model', 'n/a')} ({generator.get('mode', 'n/a')})",
             f"{params.get('querygen', {}).get('queries_per_passage', 'n/a')} queries per passage"]
    if params.get("finetune", {}).get("init_none"):
        parts.append(f"no-pre-training rows start from {params['finetune']['init_none']}")
    return "; ".join(parts)


def _data(params: Mapping[str, Any]) -> str:
    def describe(name: str) -> str:
        spec = (params.get("datasets") or {}).get(name) or {}
        return f"{name} ({spec.get('format', '?')}, splits {', '.join(spec.get('splits') or []) or '-'})"

    max_documents = params.get("prepare", {}).get("max_documents")
    parts = [f"pre-training corpus {describe(params.get('pretrain_corpus') or '?')}",
             f"in-domain {describe(params.get('train_dataset') or '?')}",
             "zero-shot " + (", ".join(describe(name) for name in params.get("zero_shot") or []) or "none")]
    if max_documents:
        parts.append(f"corpora cut to the first {max_documents} documents")
    return "; ".join(parts)


def header_block(params: Mapping[str, Any], study: StudyRuns, tables: Iterable[Table], experiment: str,
                 tracking_uri: str | None = None, generated: _dt.datetime | None = None) -> list[tuple[str, str]]:
    """``(field, text)`` lines that say what the tables were computed on."""
    from qac.tracking import git_state

    used = {cell.run_id for table in tables for cell in table.cells.values() if cell.run_id}
    used |= {cell.compared_run_id for table in tables for cell in table.cells.values() if cell.compared_run_id}
    commits = {}
    for run_id in used:
        run = study.get(run_id)
        if run is not None:
            commit = run.tags.get("qac.git_commit", "unknown")
            dirty = run.tags.get("qac.git_dirty") == "true"
            commits[commit] = commits.get(commit, False) or dirty
    current, current_dirty = git_state()
    profile = params["profile"]
    scale = ("the paper's scale (MS MARCO, BERT-base)" if profile == "paper"
             else "SCALED DOWN: small data and models; numbers are not comparable to the paper's")
    generated = generated or _dt.datetime.now(_dt.timezone.utc)
    return [
        ("Profile", f"{profile} ({scale})"),
        ("Data", _data(params)),
        ("Models", _models(params)),
        ("Runs", f"{len(used)} MLflow runs of experiment {experiment} at {redact_url(tracking_uri or 'the default store')}"),
        ("Git commits of the runs", ", ".join(f"{c[:12]}{' (dirty)' if d else ''}" for c, d in sorted(commits.items()))
         or "none"),
        ("Tables generated", f"{generated.strftime('%Y-%m-%d %H:%M UTC')} at commit {current[:12]}"
                             f"{' (dirty)' if current_dirty else ''}"),
        ("Measures", "R@k (hit rate) = share of queries with a relevant document in the top k (MS MARCO's "
                     "official R@k); R@k (recall) = standard recall; RR@10 = MRR@10. Cells read ours / paper."),
    ]


# ---------------------------------------------------------------- cell text

def _number(value: float, table: Table, column: str, signed: bool = False) -> str:
    if column in table.count_columns:
        text = f"{value:.0f}"
    else:
        text = f"{value:.3f}" if table.unit == FRACTION else f"{value:.1f}"
    return ("+" + text if value >= 0 else text) if signed else text


def _p_text(p: float) -> str:
    return f"p={p:.2g}" if p >= 0.001 else "p<0.001"


def cell_text(table: Table, column: str, cell: Cell, footnote: int | None = None) -> str:
    """``ours / paper`` for display; difference cells carry the p-value."""
    if cell.text is not None:
        return cell.text
    if cell.value is None:
        ours = f"n/a [{footnote}]" if footnote else "n/a"
    else:
        ours = _number(cell.value, table, column, signed=cell.difference)
        if cell.difference and cell.p_value is not None:
            ours += f" ({_p_text(cell.p_value)})"
    theirs = "–" if cell.paper is None else _number(cell.paper, table, column, signed=cell.difference)
    return f"{ours} / {theirs}"


def _grid(table: Table) -> tuple[list[list[str]], list[str]]:
    """Display rows and the numbered notes the ``n/a`` cells point to."""
    notes: list[str] = []
    grid = []
    for row in table.rows:
        line = [row]
        for column in table.columns:
            if (row, column) not in table.cells:
                line.append("")
                continue
            cell = table.cells[(row, column)]
            footnote = None
            if cell.value is None and cell.text is None and cell.note:
                if cell.note not in notes:
                    notes.append(cell.note)
                footnote = notes.index(cell.note) + 1
            line.append(cell_text(table, column, cell, footnote))
        grid.append(line)
    return grid, notes


# ---------------------------------------------------------------- formats

def to_markdown(table: Table) -> str:
    grid, notes = _grid(table)
    lines = [f"### {table.title}", "", "| row | " + " | ".join(table.columns) + " |",
             "|---|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in grid]
    lines.append("")
    lines += [f"[{number}] {note}" + "  " for number, note in enumerate(notes, start=1)]
    lines += [f"Note: {note}" + "  " for note in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def to_csv(table: Table) -> str:
    """One line per cell with its run id(s) and metric key: the trace from a number to its run."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in table.rows:
        for column in table.columns:
            if (row, column) not in table.cells:
                continue
            cell = table.cells[(row, column)]
            kind = "text" if cell.text is not None else "difference" if cell.difference else "value"
            writer.writerow({
                "table": table.key, "row": row, "column": column, "kind": kind,
                "ours": "" if cell.value is None else repr(float(cell.value)),
                "paper": "" if cell.paper is None else repr(float(cell.paper)),
                "unit": "count" if column in table.count_columns else table.unit,
                "p_value": "" if cell.p_value is None else repr(cell.p_value),
                "n_queries": "" if cell.n_queries is None else cell.n_queries,
                "run_id": cell.run_id or "", "compared_run_id": cell.compared_run_id or "",
                "metric": cell.metric or "", "paper_row": table.paper_rows.get(row, ""),
                "note": cell.text if cell.text is not None else (cell.note or ""),
            })
    return buffer.getvalue()


_LATEX_ESCAPES = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                  "Δ": r"$\Delta$", "−": "-", "–": "--", "<": r"$<$", ">": r"$>$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(char, char) for char in text)


def to_latex(table: Table, header: list[tuple[str, str]] | None = None) -> str:
    """A ``table`` environment (booktabs rules) with the notes and the header block below it."""
    grid, notes = _grid(table)
    lines = [r"\begin{table}[t]", r"\centering", r"\scriptsize",
             r"\begin{tabular}{l" + "c" * len(table.columns) + "}", r"\toprule",
             " & ".join(["row"] + [latex_escape(column) for column in table.columns]) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(cell) for cell in line) + r" \\" for line in grid]
    lines += [r"\bottomrule", r"\end{tabular}"]
    below = [f"[{number}] {note}" for number, note in enumerate(notes, start=1)] + list(table.notes)
    below += [f"{name}: {text}" for name, text in header or []]
    if below:
        lines.append(r"\par\smallskip\parbox{\linewidth}{\tiny " + r" \\ ".join(latex_escape(t) for t in below) + "}")
    lines += [r"\caption{" + latex_escape(table.title + " (cells: ours / paper)") + "}",
              r"\label{tab:" + table.key + "}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def header_markdown(header: list[tuple[str, str]]) -> str:
    return "\n".join(f"- **{name}**: {text}" for name, text in header) + "\n"


def report_markdown(tables: list[Table], header: list[tuple[str, str]], figures: Iterable[str] = ()) -> str:
    """The whole ``tables.md``: header block, Tables 1-5, then the figures."""
    parts = ["# Query-as-context pre-training: results", "", header_markdown(header)]
    parts += [to_markdown(table) for table in tables]
    figures = list(figures)
    if figures:
        parts.append("### Figures\n\n" + "\n".join(f"![{name}](figures/{name})" for name in figures) + "\n")
    return "\n".join(parts)
