"""What a reviewer asks of a results table beyond the values: multiple-comparison control and Judged@10.

- **Holm's correction within each table.** A table's Δ cells are many paired
  tests on shared queries (Table 2 runs one per dataset and method); at
  p < 0.05 each, one false "significant" cell in twenty is expected by chance.
  :func:`correct_within_table` puts each test's Holm-adjusted p-value beside its
  own (``Cell.p_holm``) and says in a note how many tests the family holds and
  how many stay below 0.05. Holm, not Benjamini-Hochberg: it controls the
  family-wise error rate under any dependence between the tests, and the
  tables' claims are about single cells.
- **Judged@10 beside nDCG@10 on pooled graded collections** (TREC DL: a split
  whose binary threshold is above 1): :func:`add_judged_note` reads each row's
  run file beside its per-query values and the split's qrels and lists the share
  of the top 10 that the assessors judged (:mod:`qac.evaluation.judged`).
"""

from __future__ import annotations

import math
from pathlib import Path

from qac.evaluation.significance import ALPHA, holm_adjust
from qac.evaluation.judged import judged_at_k
from qac.evaluation.trec_io import read_qrels, read_run
from qac.reporting.lineage import read_json

_PER_QUERY = ".per_query.json"


def correct_within_table(table) -> None:
    """Set ``p_holm`` on every Δ cell of ``table`` that has a p-value; a note states the family."""
    tested = [cell for cell in table.cells.values() if cell.difference and cell.p_value is not None]
    if not tested:
        return
    for cell, adjusted in zip(tested, holm_adjust([cell.p_value for cell in tested])):
        cell.p_holm = adjusted
    before = sum(cell.p_value < ALPHA for cell in tested)
    after = sum(cell.p_holm < ALPHA for cell in tested)
    table.notes.append(
        f"Multiple comparisons: Holm-Bonferroni over this table's {len(tested)} paired tests (p_holm beside p): "
        f"{before} below {ALPHA:g} before the correction, {after} after. Each Δ's 95% CI is the paired bootstrap "
        "interval over queries (of the seed-averaged per-query values where several seeds ran).")


def graded_split(dataset_folder: Path, split: str) -> bool:
    """Whether ``split`` of a prepared dataset counts only labels above 1 as relevant (TREC DL's pools)."""
    record = dataset_folder / "dataset.json"
    if not record.is_file():
        return False
    threshold = (read_json(record).get("rel_threshold") or {}).get(split, 1)
    return int(threshold) > 1


def judged_of_cell(root: Path, source: str, qrels) -> float | None:
    """Mean Judged@10 of the run beside the per-query file ``source`` (relative to ``root``); None without one."""
    if not source.endswith(_PER_QUERY):
        return None
    run_file = root / (source[: -len(_PER_QUERY)] + ".trec")
    if not run_file.is_file():
        return None
    values = judged_at_k(qrels, read_run(run_file), 10)
    return math.fsum(values.values()) / len(values) if values else None


def add_judged_note(table, ctx) -> None:
    """A note on ``table`` (Table 1) with each row's Judged@10 on every nDCG column of a graded split."""
    root = ctx.study.root
    for column in ctx.columns:
        dataset = column.dataset or ctx.params.train_dataset
        if column.missing or not (column.measure or "").startswith("nDCG") or not column.split:
            continue
        folder = root / "datasets" / dataset
        qrels_file = folder / "qrels" / f"{column.split}.tsv"
        if not graded_split(folder, column.split) or not qrels_file.is_file():
            continue
        qrels = read_qrels(qrels_file)
        shares = []
        for row in table.rows:
            cell = table.cells.get((row, column.header))
            if cell is None or cell.difference or cell.source is None:
                continue
            judged = judged_of_cell(root, cell.source, qrels)
            if judged is not None:
                shares.append(f"{row} {judged:.2f}")
        if shares:
            table.notes.append(
                f"Judged@10 on {dataset}/{column.split} (share of the top 10 with a judgement; unjudged documents "
                f"count as non-relevant in {column.measure}, which is then a lower bound): {'; '.join(shares)}.")
