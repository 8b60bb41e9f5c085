"""The BM25 baseline row and retriever 1's training negatives (the ``bm25`` stage's work).

BM25 settings (k1, b, tokenizer, stopwords, stemmer) come from the `bm25` section of params.yaml;
`bm25.in_domain_title` says whether the titles of `train_dataset` are indexed with the text (Anserini's
MS MARCO passage collection has none); zero-shot datasets index title and text, as BEIR does.

Outputs under data/<profile>/bm25/:
  negatives.jsonl              training queries of `train_dataset`: qid, positives, negatives: retriever 1's
                               (`finetune.r1_negatives`: `bm25`, our BM25 top `finetune.bm25_depth`, rank
                               order, positives removed; `official`, `finetune.official_negatives` drawn per
                               query from the official training triples, as the release did); with
                               `finetune.r1_queries: triples` the `bm25` records are only the queries whose
                               positive our BM25 finds within `bm25_depth`, the triples' rule
  runs/<dataset>/<split>.trec  BM25 runs (depth `evaluate.depth`) of every evaluated split
                               (all but `train`) of `train_dataset` and the `zero_shot` datasets
  runs/<dataset>/<split>.per_query.json  {measure: {qid: value}} of each run (the tables' source)
  metrics.json                 {dataset: {split: {measure: value}}}
The MLflow run `bm25 · baseline` (params method=bm25, retriever=bm25) is recorded in
data/<profile>/.runs/bm25/mlflow_run.json, outside the output.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from qac.config import profile_dir
from qac.data.errors import DataFormatError
from qac.data.prepared import TRAIN_NEGATIVES, load_prepared_parts
from qac.evaluation.split_evaluation import SUBSETS_FILE, TRAIN_SPLIT, combine_subsets, evaluate_split, evaluation_splits
from qac.evaluation.trec_io import write_run
from qac.io import atomic_path, write_json, write_jsonl
from qac.retrieval.bm25 import BM25Index, BM25Settings
from qac.retrieval.mining import negatives_records
from qac.tracking.lifecycle import tracked_stage
from qac.tracking.naming import baseline_description, run_name
from qac.data.textfile import iter_jsonl

if TYPE_CHECKING:
    from qac.params.sections import Params

log = logging.getLogger("bm25")


def official_negatives(folder: Path, dataset, per_query: int, seed: int):
    """Records of ``negatives.jsonl`` from the prepared official negatives (``negatives/train.jsonl``).

    As the release builds its retriever-1 training file: a query's negatives
    shuffled and the first ``per_query`` kept (128 in its scripts). The shuffle
    is seeded by (seed, qid), so the draw is the same on every run and machine.
    Positives come from the train qrels (at the split's threshold).
    """
    # here, not at the top: it loads pyarrow
    from qac.data.splitting import document_rng

    path = folder / TRAIN_NEGATIVES
    if not path.is_file():
        raise SystemExit(f"{path}: missing, but finetune.r1_negatives is 'official': declare the training triples "
                         f"of {dataset.name} (datasets.{dataset.name}.triples) and rerun its prepare stage")
    threshold = dataset.rel_threshold(TRAIN_SPLIT)
    for record in iter_jsonl(path):
        qid = str(record["qid"])
        positives = sorted(d for d, grade in dataset.qrels[TRAIN_SPLIT].get(qid, {}).items() if grade >= threshold)
        if not positives:
            continue
        negatives = [d for d in record["negatives"] if d not in positives]
        document_rng(seed, f"official-negatives\x00{qid}").shuffle(negatives)
        yield {"qid": qid, "positives": positives, "negatives": negatives[:per_query]}


def _retriever1_negatives(params: Params, folder: Path, dataset, index, path: Path) -> int:
    """Retriever 1's negatives for the training queries (the official triples', or BM25's ranking), written
    to ``path``; how many queries have them."""
    section = params.finetune
    if section.r1_negatives == "official":
        records = official_negatives(folder, dataset, section.official_negatives, params.seed)
    else:
        run = index.search(dataset.split_queries(TRAIN_SPLIT), k=section.bm25_depth)
        # finetune.r1_queries triples: as the official triples, only queries whose positive the ranking finds
        records = negatives_records(run, dataset.qrels[TRAIN_SPLIT], section.bm25_depth,
                                    rel_threshold=dataset.rel_threshold(TRAIN_SPLIT),
                                    found_positive_only=section.r1_queries == "triples")
    count = write_jsonl(path, records)
    log.info("%s: %s negatives for %d training queries", dataset.name, section.r1_negatives, count)
    return count


def _search_split(index, dataset, split: str, depth: int, measures: list[str], runs_dir: Path):
    """BM25's run of one split, written with its per-query values; its evaluation."""
    run = index.search(dataset.split_queries(split), k=depth)
    write_run(runs_dir / f"{split}.trec", run, tag="bm25")
    result = evaluate_split(dataset, split, run, measures)
    write_json(runs_dir / f"{split}.per_query.json", result.per_query)
    return result


def _one_result(results: dict, runs_dir: Path, split: str):
    """A split's result: the dataset's own, or for sub-collections (CQADupStack's forums) one figure, the mean
    of theirs, written beside their runs."""
    if None in results:
        return results[None]
    result = combine_subsets(results)
    write_json(runs_dir / f"{split}.per_query.json", result.per_query)
    write_json(runs_dir / SUBSETS_FILE, {"subsets": list(results)})
    return result


def bm25_baseline(params: Params) -> list[str]:
    """Index every evaluated dataset, write retriever 1's negatives and the BM25 runs and metrics; the
    summary line's facts."""
    root = profile_dir(params)
    train_name = params.train_dataset
    names = list(dict.fromkeys([train_name, *params.zero_shot]))
    depth, measures = params.evaluate.depth, list(params.evaluate.metrics)
    section = params.finetune
    negatives_depth, r1_negatives, r1_queries = section.bm25_depth, section.r1_negatives, section.r1_queries
    settings = BM25Settings.from_params(params.bm25)
    in_domain_title = params.bm25.in_domain_title
    stage_params = {"train_dataset": train_name, "zero_shot": names[1:], "depth": depth, "measures": measures,
                    "bm25_depth": negatives_depth, "r1_negatives": r1_negatives, "r1_queries": r1_queries,
                    "bm25": {**vars(settings), "in_domain_title": in_domain_title}, **baseline_description("bm25")}

    for name in names:     # before the output folder and the MLflow run are made
        if not (root / "datasets" / name).is_dir():
            raise DataFormatError(root / "datasets" / name, None, None, "not found: the dataset was not prepared")
    with atomic_path(root / "bm25", directory=True) as out:
        with tracked_stage(params, "bm25", run_name("bm25", "baseline"), kind="baseline", stage_params=stage_params,
                           inputs={name: root / "datasets" / name for name in names},
                           tags={"qac.retriever": "bm25"}, output=root / "bm25", root=root) as tracking:
            summary = {}
            for name in names:
                parts = load_prepared_parts(root / "datasets" / name)
                by_subset: dict[str, dict] = {}
                for subset, dataset in parts:
                    folder = root / "datasets" / name if subset is None else root / "datasets" / name / subset
                    tracking.log_dataset_inputs(folder, "evaluation", splits=evaluation_splits(dataset))
                    with_title = in_domain_title or name != train_name     # full_text: title + " " + text
                    texts = [document.full_text if with_title else document.text.strip()
                             for document in dataset.corpus.values()]
                    index = BM25Index(list(dataset.corpus), texts, settings)
                    if name == train_name:
                        if subset is not None or TRAIN_SPLIT not in dataset.splits:
                            raise ValueError(f"train_dataset {name!r} has no '{TRAIN_SPLIT}' split "
                                             f"(splits: {dataset.splits}) or is several sub-collections")
                        count = _retriever1_negatives(params, folder, dataset, index, Path(out) / "negatives.jsonl")
                    runs_dir = Path(out) / "runs" / name / (subset or "")
                    for split in evaluation_splits(dataset):
                        by_subset.setdefault(split, {})[subset] = _search_split(index, dataset, split, depth,
                                                                                measures, runs_dir)
                for split, results in by_subset.items():
                    result = _one_result(results, Path(out) / "runs" / name, split)
                    tracking.log_evaluation(result, name, split)
                    summary.setdefault(name, {})[split] = result.aggregate
                    log.info("%s/%s: %s", name, split, result.aggregate)
            write_json(Path(out) / "metrics.json", summary)
    measure = measures[0]
    return [f"negatives for {count} training queries",
            *[f"{name}/{split} {measure} {values[measure]:.3f}"
              for name, by_split in summary.items() for split, values in list(by_split.items())[:1]]]


