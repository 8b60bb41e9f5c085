"""Write tables as Markdown, CSV (one line per cell) and LaTeX.

Each table is preceded by a header block naming the profile, data and
models, so a scaled-down table is never taken for the paper's. A displayed
cell reads ``ours / paper``; a difference cell ``+1.2 (p=0.031; MDE 0.9) /
+0.4``; a missing value ``n/a`` with a numbered note saying why. The CSV
names, for every number, the DVC-tracked file it was computed from. The
MLflow run and git commit behind each cell are bookkeeping, not results:
:func:`runs_csv` lists them for a file outside the tracked report, so
equal values give a byte-identical report whichever runs produced them.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from qac.evaluation.significance import ALPHA, POWER
from qac.reporting.lineage import Study
from qac.reporting.precision import decimals
from qac.reporting.tables import Cell, Table, plural, seed_spread
from qac.deviations import recipe_summary
from qac.evaluation.trec_io import read_qrels

if TYPE_CHECKING:
    from qac.params.sections import Params

CSV_FIELDS = ["table", "row", "column", "kind", "ours", "paper", "unit", "p_value", "mde", "n_queries", "source",
              "compared_source", "metric", "paper_row", "published", "cited", "seeds", "recipe", "note",
              "p_holm", "ci_low", "ci_high"]
# The MLflow runs behind the cells: bookkeeping, kept out of the tracked report (see runs_csv).
RUN_FIELDS = ["table", "row", "column", "run_id", "git_commit", "compared_run_id", "compared_git_commit"]


# ---------------------------------------------------------------- header block

def _models(params: Params) -> str:
    common, generator = params.pretrain.common, params.query_generator
    inits = {common.init} | {variant.init for variant in params.pretrain.variants.values() if variant.init}
    parts = [f"pre-training starts from {', '.join(sorted(inits))}",
             f"{common.steps} steps at batch {common.batch_size} (per-variant overrides in params)",
             f"CoT-MAE decoder: {common.cotmae_decoder}",
             f"query generator: {generator.model} ({generator.mode})",
             f"{params.querygen.queries_per_passage} queries per passage"]
    return "; ".join(parts)


def _recipe(params: Params) -> str:
    return (f"{recipe_summary(params)}; per-variant overrides name their own in the CSV's recipe column; "
            "docs/deviations.md lists each switch")


def _judged_documents(folder: Path, facts: dict) -> int | None:
    """How many documents the qrels of a prepared folder judge (any split, any grade), or None when unread.

    The prepared folder is the record of what was kept: its qrels name only kept documents, and a subset that
    keeps the judged documents keeps every one of them. A folder of sub-collections sums its parts.
    """
    parts = [folder / subset for subset in facts.get("subsets") or ()] or [folder]
    total = 0
    for part in parts:
        files = sorted((part / "qrels").glob("*.tsv"))
        if not files:
            return None
        try:
            total += len({doc for path in files for judgements in read_qrels(path).values() for doc in judgements})
        except (OSError, ValueError):
            return None
    return total


def _documents(study: Study, name: str) -> str | None:
    """How many documents the prepared dataset holds and how it was cut, from the prepared folder itself
    (``dataset.json`` and its qrels, written by the prepare stage), never from the params.

    ``667 of 5183 documents: the 667 judged ones only (prepare.max_documents 120 leaves room for no other)``;
    ``1000 of 5183 documents: the 667 judged ones and the first 333 unjudged ones``; ``120 of 1398
    documents: the first 120``.
    """
    import json

    folder = study.root / "datasets" / name
    try:
        facts = json.loads((folder / "dataset.json").read_text(encoding="utf-8"))
        kept = int(facts["counts"]["documents"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    subset = facts.get("subset") or {}
    left_out = int((facts.get("skipped") or {}).get("documents_outside_subset") or 0)
    if not subset.get("max_documents") or not left_out:
        return plural(kept, "document")
    counted = f"{kept} of {plural(kept + left_out, 'document')}"
    if not subset.get("keep_judged_documents"):
        return f"{counted}: the first {kept}"
    judged = _judged_documents(folder, facts)
    if judged is None or judged > kept:
        return counted       # no readable qrels: how many were judged is not known here, so not said
    if judged == kept:
        return (f"{counted}: the {judged} judged ones only (prepare.max_documents {subset['max_documents']} "
                "leaves room for no other)")
    return f"{counted}: the {judged} judged ones and the first {kept - judged} unjudged ones"


def _data(params: Params, study: Study) -> str:
    def describe(name: str | None) -> str:
        spec = params.datasets.get(name) if name else None
        facts = [spec.format, f"splits {', '.join(spec.splits) or '-'}"] if spec else ["?", "splits -"]
        documents = _documents(study, name) if name else None
        return f"{name or '?'} ({'; '.join(facts + ([documents] if documents else []))})"

    corpus, train = params.pretrain_corpus, params.train_dataset
    parts = [f"pre-training corpus {describe(corpus)}",
             f"in-domain {f'{train} (as above)' if train == corpus and train else describe(train)}",
             "zero-shot " + (", ".join(describe(name) for name in params.zero_shot) or "none")]
    return "; ".join(parts)


def header_block(params: Params, study: Study, tables: Iterable[Table]) -> list[tuple[str, str]]:
    """``(field, text)`` lines that say what the tables were computed on.

    Only what the inputs determine: the same DVC outputs give the same header
    (no clock, no checkout state, no tracking URI), so the tables are
    byte-identical when rebuilt.
    """
    tables = list(tables)
    sources = {path for table in tables for cell in table.cells.values() if cell.value is not None
               for path in (cell.source, cell.compared_source) if path}
    profile = params["profile"]
    scale = ("the paper's scale (MS MARCO, BERT-base)" if profile == "paper"
             else "SCALED DOWN: small data and models; numbers are not comparable to the paper's")
    return [
        ("Profile", f"{profile} ({scale})"),
        ("Data", _data(params, study)),
        ("Models", _models(params)),
        ("Recipe", _recipe(params)),
        ("Source", f"{plural(len(sources), 'DVC-tracked output file')} under data/{profile}/ (per-query metrics, annotation "
                   f"labels); each CSV row names its file. The MLflow run and git commit behind each cell, where "
                   f"recorded: data/{profile}/.runs/report_runs.csv (not tracked: equal values give an equal report)"),
        ("Measures", "R@k (hit rate) = share of queries with a relevant document in the top k (MS MARCO's "
                     "official R@k); R@k (recall) = standard recall; RR@10 = MRR@10. Cells read ours / paper."),
        ("Differences", "Δ = with − without query context, mean over queries; p = paired randomization test "
                        "over the queries; MDE = the smallest true difference the test on these queries would "
                        f"detect at p<{ALPHA:g} (two-sided) with {POWER:.0%} power, (z_0.975 + z_0.8) · "
                        "sd(per-query Δ) / √n. The MDE describes the design's power, not the observed Δ: read a "
                        f"Δ by its p (a Δ below its MDE can still have p < {ALPHA:g}); where p ≥ {ALPHA:g}, a true effect "
                        "smaller than the MDE is not ruled out, so the Δ is no evidence of no effect. No MDE where "
                        "every per-query Δ is the same (sd 0 says nothing about the test's power)."),
    ]


# ---------------------------------------------------------------- cell text

def _number(value: float, table: Table, column: str, signed: bool = False, difference: bool = False,
            row: str | None = None) -> str:
    """``value`` at its printed precision (:mod:`qac.reporting.precision`); ``signed``: ``+`` or ``-``, none
    on a difference that rounds to zero; ``difference``: a Δ or MDE of ours, one digit finer than values;
    ``row``: a value of ours in that row, as fine as the row's finest number of ours."""
    text = f"{value:.{decimals(table, column, difference, row)}f}"
    if float(text) == 0:
        return text.lstrip("-")      # no sign on a zero: "-0.0" would claim a direction
    return ("+" + text if value > 0 else text) if signed else text


def _p_text(p: float) -> str:
    return f"p={p:.2g}" if p >= 0.001 else "p<0.001"


def _holm_text(cell: Cell) -> str:
    """Holm's adjusted p beside the test's own (qac.reporting.reviewer_statistics)."""
    if cell.p_holm is None:
        return ""
    return f", p_holm={cell.p_holm:.2g}" if cell.p_holm >= 0.001 else ", p_holm<0.001"


def _ci_text(table: Table, column: str, cell: Cell) -> str:
    """The Δ's 95% paired bootstrap interval, at the Δ's precision."""
    if cell.ci is None:
        return ""
    low, high = (_number(bound, table, column, signed=True, difference=True) for bound in cell.ci)
    return f"; 95% CI [{low}, {high}]"


def cell_text(table: Table, column: str, cell: Cell, footnote: int | None = None, row: str | None = None) -> str:
    """``ours / paper`` for display; difference cells carry the p-value, or the caveat that makes them no
    finding; ``row``: the cell's row, whose finest number of ours sets the precision of its values."""
    if cell.text is not None:
        return cell.text
    if cell.value is None:
        ours = f"n/a [{footnote}]" if footnote else "n/a"
    else:
        ours = _number(cell.value, table, column, signed=cell.difference, difference=cell.difference, row=row)
        if cell.seed_values:   # the spread across seeds (sample sd), as precise as a difference
            ours += (f" ±{_number(seed_spread(cell.seed_values), table, column, difference=True)} "
                     f"({len(cell.seed_values)} seeds)")
        if cell.caveat:        # no test printed beside a number that is no finding
            ours += f" ({cell.caveat})"
        elif cell.difference and cell.p_value is not None:
            mde = "" if cell.mde is None else f"; MDE {_number(cell.mde, table, column, difference=True)}"
            ours += f" ({_p_text(cell.p_value)}{_holm_text(cell)}{mde}{_ci_text(table, column, cell)})"
    if not table.paper_side:       # a table the paper has no counterpart of: ours alone
        return ours
    theirs = "–" if cell.paper is None else _number(cell.paper, table, column, signed=cell.difference)
    if cell.paper is None and cell.published is not None:
        theirs = f"{_number(cell.published, table, column)} published"
    if cell.paper is None and cell.cited is not None:
        theirs = f"{_number(cell.cited, table, column, signed=cell.difference)} cited"
    return f"{ours} / {theirs}"


def _footnote(cell: Cell, notes: list[str]) -> int | None:
    """The number of the note an ``n/a`` cell points to (added to ``notes`` on first use), else None."""
    if cell.value is None and cell.text is None and cell.note:
        if cell.note not in notes:
            notes.append(cell.note)
        return notes.index(cell.note) + 1
    return None


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
            footnote = _footnote(cell, notes)
            line.append(cell_text(table, column, cell, footnote, row))
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


def runs_csv(tables: Iterable[Table], study: Study) -> str:
    """One line per cell with a recorded run: the MLflow run id and git commit of its value (and of the compared one)."""
    tables = list(tables)
    used = {run for table in tables for cell in table.cells.values()
            for run in (cell.run_id, cell.compared_run_id) if run}
    commits = study.run_commits(used)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RUN_FIELDS, lineterminator="\n")
    writer.writeheader()
    for table in tables:
        for (row, column), cell in table.cells.items():
            if cell.run_id or cell.compared_run_id:
                writer.writerow({"table": table.key, "row": row, "column": column, "run_id": cell.run_id or "",
                                 "git_commit": commits.get(cell.run_id) or "",
                                 "compared_run_id": cell.compared_run_id or "",
                                 "compared_git_commit": commits.get(cell.compared_run_id) or ""})
    return buffer.getvalue()


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
                "mde": "" if cell.mde is None else repr(float(cell.mde)),
                "p_holm": "" if cell.p_holm is None else repr(cell.p_holm),
                "ci_low": "" if cell.ci is None else repr(float(cell.ci[0])),
                "ci_high": "" if cell.ci is None else repr(float(cell.ci[1])),
                "n_queries": "" if cell.n_queries is None else cell.n_queries,
                "source": cell.source or "", "compared_source": cell.compared_source or "",
                "metric": cell.metric or "", "paper_row": table.paper_rows.get(row, ""),
                "published": "" if cell.published is None else repr(float(cell.published)),
                "cited": "" if cell.cited is None else repr(float(cell.cited)),
                "seeds": ";".join(repr(float(v)) for v in cell.seed_values or ()),
                "recipe": cell.recipe or "",
                "note": cell.text if cell.text is not None else "; ".join(filter(None, [cell.caveat, cell.note])),
            })
    return buffer.getvalue()


_LATEX_ESCAPES = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                  "Δ": r"$\Delta$", "−": "-", "–": "--", "<": r"$<$", ">": r"$>$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(char, char) for char in text)


def _latex_cell(table: Table, column: str, cell: Cell, footnote: int | None, row: str | None = None) -> str:
    """A compact cell: ``ours / paper``; a difference marked ``*`` when p < alpha, a dagger when it is no
    finding (its caveat below the table); details in the CSV."""
    if cell.text is not None:
        return latex_escape(cell.text)
    if cell.value is None:
        ours = f"n/a\\textsuperscript{{{footnote}}}" if footnote else "n/a"
    else:
        ours = latex_escape(_number(cell.value, table, column, signed=cell.difference, difference=cell.difference,
                                    row=row))
        if cell.seed_values:
            ours += r"$\pm$" + latex_escape(_number(seed_spread(cell.seed_values), table, column, difference=True))
        if cell.caveat:
            ours += r"$^{\dagger}$"
        elif cell.difference and cell.p_value is not None and cell.p_value < ALPHA:
            ours += "$^{*}$"
    if not table.paper_side:
        return ours
    theirs = "--" if cell.paper is None else latex_escape(_number(cell.paper, table, column, signed=cell.difference))
    if cell.paper is None and cell.published is not None:
        theirs = latex_escape(_number(cell.published, table, column)) + " (pub.)"
    if cell.paper is None and cell.cited is not None:
        theirs = latex_escape(_number(cell.cited, table, column, signed=cell.difference)) + " (cited)"
    return f"{ours} / {theirs}"


def to_latex(table: Table, header: list[tuple[str, str]] | None = None) -> str:
    """A booktabs ``table`` ready to paste: compact heads, ``ours / paper`` cells, notes as a footnote block.

    Needs ``\\usepackage{booktabs}``. Long cell texts (Table 5's label source)
    move to the notes; p-values and MDEs stay in ``tables.md`` and the CSV.
    """
    notes: list[str] = []
    long_texts: list[str] = []
    rows = []
    for row in table.rows:
        line = [latex_escape(row)]
        for column in table.columns:
            if (row, column) not in table.cells:
                line.append("")
                continue
            cell = table.cells[(row, column)]
            footnote = _footnote(cell, notes)
            if cell.text is not None and len(cell.text) > 24:
                if cell.text not in long_texts:
                    long_texts.append(cell.text)
                line.append(f"see note {chr(ord('a') + long_texts.index(cell.text))}")
                continue
            line.append(_latex_cell(table, column, cell, footnote, row))
        rows.append(line)
    heads = ["" ] + [latex_escape(table.short_columns.get(column, column)) for column in table.columns]
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{@{}l" + "c" * len(table.columns) + "@{}}", r"\toprule",
             " & ".join(heads) + r" \\", r"\midrule"]
    for line in rows:
        if line[0].startswith(r"$\Delta$"):
            line[0] = r"\quad " + line[0]
        lines.append(" & ".join(line) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    below = [f"{latex_escape(short)}: {latex_escape(what)}" for short, what in table.column_notes.items()]
    if any(cell.difference and cell.p_value is not None for cell in table.cells.values()):
        below.append(f"$\\Delta$: with minus without query context; $^{{*}}$ p $<$ {ALPHA:g} "
                     "(paired randomization test over queries)")
    caveats = dict.fromkeys((row, cell.caveat) for (row, _), cell in table.cells.items() if cell.caveat)
    below += [f"$^{{\\dagger}}${latex_escape(row)}: {latex_escape(caveat)}" for row, caveat in caveats]
    below += [f"\\textsuperscript{{{number}}}{latex_escape(note)}" for number, note in enumerate(notes, start=1)]
    below += [f"({chr(ord('a') + index)}) {latex_escape(text)}" for index, text in enumerate(long_texts)]
    below += [latex_escape(note) for note in table.notes]
    below += [f"{latex_escape(name)}: {latex_escape(text)}" for name, text in header or [] if name == "Profile"]
    if below:
        lines.append(r"\par\smallskip\parbox{\linewidth}{\footnotesize " + r" \\ ".join(below) + "}")
    caption = table.title + (" (cells: ours / paper)" if table.paper_side else "")
    lines += [r"\caption{" + latex_escape(caption) + "}",
              r"\label{tab:" + table.key + "}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def header_markdown(header: list[tuple[str, str]]) -> str:
    return "\n".join(f"- **{name}**: {text}" for name, text in header) + "\n"


def report_markdown(tables: list[Table], header: list[tuple[str, str]], figures: Iterable[str] = (),
                    sections: Iterable[str] = ()) -> str:
    """The whole ``tables.md``: header block, Tables 1-5, further sections, then the figures."""
    parts = ["# Query-as-context pre-training: results", "", header_markdown(header)]
    parts += [to_markdown(table) for table in tables]
    parts += list(sections)
    figures = list(figures)
    if figures:
        parts.append("### Figures\n\n" + "\n".join(f"![{name}](figures/{name})" for name in figures) + "\n")
    return "\n".join(parts)
