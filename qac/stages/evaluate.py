"""Evaluating one variant's retrievers on every evaluation set (the ``evaluate@<variant>`` stage's work).

For each retriever of the variant (``finetune/<variant>/r1``, ``r2``; for the
variant ``none`` with ``evaluate.untuned_baseline`` also the start encoder,
``untuned``) and each dataset (``train_dataset`` in-domain, then every
``zero_shot`` one), the corpus is encoded once and every split except
``train`` is searched (top ``evaluate.depth``, exact inner product). A
fine-tuned retriever is encoded as its folder says (pooling, normalisation,
lengths, title separator: :func:`qac.models.encoding.read_encoding`); the
untuned start encoder as its model was trained (``encoders.<spec>``), else as
retriever 1 was fine-tuned. Retriever 1's in-domain runs were searched by the
fine-tuning stage with the corpus vectors it mined with (``r1_runs``) and are
scored from there when their encoding record matches (:mod:`qac.train.indomain_runs`).
Writes, as one unit, ``data/<profile>/eval/<variant>/<retriever>/<dataset>/<split>.trec``
and ``<split>.per_query.json``, plus ``metrics/eval/<variant>.json``. Metrics
go into the retriever's fine-tuning run as ``<dataset>/<split>/<measure>``
with the per-query values as the artifact ``per_query/<dataset>/<split>.json``;
the untuned encoder gets its own run ``untuned · none`` under the pre-training
run. Fine-tuning runs keep their end time, so their duration stays the
training's; each run gets ``eval/seconds`` and the evaluated datasets as MLflow
inputs (context ``evaluation``). Graded sets count labels >= the split's
``rel_threshold`` (``dataset.json``) as relevant in binary measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qac.config import profile_dir
from typing import TYPE_CHECKING

from qac.data.prepared import load_prepared_parts, prepared_folders
from qac.distributed import init_distributed
from qac.io import atomic_path, write_json
from qac.models.encoding import Encoding, read_encoding
from qac.retrieval import document_text
from qac.retrieval.untuned import start_encoder
from qac.tracking.lifecycle import Upstream, reopened_stage, tracked_stage, verify_inputs
from qac.tracking.naming import variant_description, variant_run_name
from qac.train.indomain_runs import RUNS_FOLDER, read_indomain_runs, run_encoding

if TYPE_CHECKING:
    from qac.params.sections import EvaluateSection, Params


def retrievers_of(params: Params, variant: str, root: Path) -> list[tuple[str, Path, str | None]]:
    """``(name, encoder folder, fine-tuning run id or None)`` for every retriever to evaluate.

    The run id is None for the untuned encoder, and for a fine-tuned one whose run this tracking
    store does not hold (no record: DVC restored or pulled the output; or another store): its
    measures then go to a run of their own.
    """
    found = []
    for name in ("r1", "r2"):
        folder = root / "finetune" / variant / name
        if not folder.is_dir():
            raise SystemExit(f"{folder}: missing (run the finetune@{variant} stage)")
        found.append((name, folder, Upstream(root, folder, f"finetune@{variant} {name}").run_id()))
    if variant == "none" and params.evaluate.untuned_baseline:
        found.append(("untuned", root / "pretrain" / variant / "encoder", None))
    return found


def evaluation_datasets(params: Params) -> list[str]:
    """The in-domain dataset first, then the zero-shot ones, each once."""
    names = [params.train_dataset, *params.zero_shot]
    return list(dict.fromkeys(names))


def evaluates_zero_shot(params: Params, variant: str, retriever: str) -> bool:
    """Whether ``retriever`` of ``variant`` is evaluated on the zero-shot datasets.

    ``evaluate.zero_shot_variants`` (null: all) and ``evaluate.zero_shot_retrievers``
    (null: all) let a scaled-down profile spend its time on the cells Table 2 shows.
    """
    variants, retrievers = params.evaluate.zero_shot_variants, params.evaluate.zero_shot_retrievers
    return (variants is None or variant in variants) and (retrievers is None or retriever in retrievers)


def evaluate_retriever_on(model, tokenizer, dataset, *, settings: EvaluateSection, encoding, device,
                          out_dir: Path, separator: str = " ") -> dict:
    """Encode ``dataset``'s corpus once, search every evaluation split; write runs and per-query values.

    Returns ``{split: EvalResult}``. ``encoding`` (:class:`qac.models.encoding.Encoding`) gives the
    query and passage lengths, the pooling and the normalisation; ``separator`` joins a document's
    title and text (:func:`qac.retrieval.title_separator`).
    """
    # here, not at the top: it loads numpy
    from qac.retrieval.dense import search_splits
    # here, not at the top: it loads numpy
    from qac.retrieval.encode import encode_texts

    query_max_len, passage_max_len = encoding.query_max_len, encoding.passage_max_len
    options = dict(batch_size=settings.batch_size, device=device, normalize=encoding.normalize,
                   loader_workers=settings.loader_workers)
    doc_ids = list(dataset.corpus)
    doc_vectors = encode_texts(model.encoder, tokenizer,
                               [document_text(dataset.corpus[d].title, dataset.corpus[d].text, separator)
                                for d in doc_ids],
                               max_length=passage_max_len, pooling=encoding.pooling,
                               desc=f"encode {dataset.name} corpus", **options)
    runs = search_splits(model, tokenizer, dataset, doc_ids, doc_vectors, query_max_len=query_max_len,
                         depth=settings.depth, **options)
    return score_runs(dataset, runs, settings, out_dir)


def score_runs(dataset, runs: dict, settings: EvaluateSection, out_dir: Path) -> dict:
    """Write each split's run and per-query values into ``out_dir``; ``{split: EvalResult}``."""
    # here, not at the top: it loads numpy
    from qac.evaluation.split_evaluation import evaluate_split
    # here, not at the top: it loads numpy
    from qac.evaluation.trec_io import write_run

    results = {}
    for split, run in runs.items():
        write_run(out_dir / f"{split}.trec", run, tag=out_dir.parent.name)
        result = evaluate_split(dataset, split, run, settings.metrics)
        write_json(out_dir / f"{split}.per_query.json", result.per_query)
        results[split] = result
    return results


def finetuning_runs(root: Path, variant: str, dataset, encoding: dict, depth: int) -> dict | None:
    """Retriever 1's in-domain runs as the fine-tuning stage searched them with the vectors it mined with
    (qac.train.indomain_runs), when made with this encoding and depth; None otherwise."""
    # here, not at the top: it loads numpy
    from qac.evaluation.split_evaluation import evaluation_splits

    expected = run_encoding(depth=depth, **encoding)
    return read_indomain_runs(root / "finetune" / variant / RUNS_FOLDER, expected, evaluation_splits(dataset))


def combine_parts(by_subset: dict, out_dir: Path) -> dict:
    """``{split: EvalResult}`` of a dataset from its sub-collections' results (``{subset: {split: result}}``).

    A plain dataset (subset None) is its own result; sub-collections (CQADupStack's
    forums, each searched in its own corpus) give one figure per split, the mean
    of theirs (:func:`qac.evaluation.split_evaluation.combine_subsets`), written beside
    their folders with ``subsets.json`` naming them.
    """
    # here, not at the top: it loads numpy
    from qac.evaluation.split_evaluation import SUBSETS_FILE, combine_subsets

    if None in by_subset:
        return by_subset[None]
    combined = {}
    for split in next(iter(by_subset.values())):
        combined[split] = combine_subsets({subset: results[split] for subset, results in by_subset.items()})
        write_json(out_dir / f"{split}.per_query.json", combined[split].per_query)
    write_json(out_dir / SUBSETS_FILE, {"subsets": list(by_subset)})
    return combined


def headline(params: Params, results: dict[str, dict[str, dict]]) -> list[str]:
    """The summary line's facts: each retriever's first measure on the in-domain set's first split."""
    measure, train_dataset = params.evaluate.metrics[0], params.train_dataset
    facts = []
    for name, by_dataset in results.items():
        by_split = by_dataset.get(train_dataset) or {}
        if by_split:
            split, result = next(iter(by_split.items()))
            facts.append(f"{name} {train_dataset}/{split} {measure} {result.aggregate[measure]:.3f}")
    zero_shot = sum(len(by_dataset) - (train_dataset in by_dataset) for by_dataset in results.values())
    if zero_shot:
        facts.append(f"{zero_shot} zero-shot evaluations")
    return facts




def encoding_of(params: Params, name: str, folder: Path, fine_tuned: Path):
    """How retriever ``name`` (its folder ``folder``) is encoded: as its folder says; the untuned start
    encoder as its model was trained (``encoders.<spec>``: pooling, normalisation, lengths), else as
    retriever 1 (``fine_tuned``) was fine-tuned."""
    declared = read_encoding(fine_tuned if name == "untuned" else folder)
    if declared is None:
        raise SystemExit(f"{fine_tuned if name == 'untuned' else folder}: a retriever folder without its "
                         "encoding (modules.json, retriever.json): rerun its fine-tuning stage")
    spec = start_encoder(params)
    trained = params.encoder(spec) if name == "untuned" else None
    if trained is None:
        return declared
    return Encoding(pooling=trained.pooling, normalize=trained.normalize, query_max_len=trained.query_max_len,
                    passage_max_len=trained.passage_max_len, title_separator=declared.title_separator)


@dataclass
class EvaluationOutcome:
    """``{retriever: {dataset: {split: EvalResult}}}`` and what was scored from the fine-tuning stage's runs."""

    results: dict[str, dict[str, dict]] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)

    def facts(self, params: Params) -> list[str]:
        return [*headline(params, self.results),
                f"{', '.join(self.reused)} from the fine-tuning stage's runs" if self.reused else ""]


def _evaluate_one(params: Params, variant: str, name: str, folder: Path, encoding, dataset_name: str, parts,
                  out: Path, device) -> tuple[dict, bool]:
    """``(subset -> split -> result, reused)`` of retriever ``name`` on one dataset's parts, its runs written
    under ``out``; ``reused``: retriever 1's in-domain runs from fine-tuning were scored, not searched again."""
    # here, not at the top: it loads numpy, torch
    from qac.models.biencoder import BiEncoder
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    settings, root = params.evaluate, profile_dir(params)
    # In-domain documents are encoded as fine-tuning saw them (the folder's title separator);
    # zero-shot ones as BEIR encodes them, title and text joined by a space.
    separator = encoding.title_separator if dataset_name == params.train_dataset else " "
    shared = None
    if name == "r1" and dataset_name == params.train_dataset and len(parts) == 1:
        shared = finetuning_runs(root, variant, parts[0][1], dict(
            query_max_len=encoding.query_max_len, passage_max_len=encoding.passage_max_len,
            pooling=encoding.pooling, separator=separator), settings.depth)
    if shared is not None:      # the corpus as retriever 1 encoded it for mining, not encoded again
        return {None: score_runs(parts[0][1], shared, settings, out)}, True
    model = BiEncoder.from_pretrained(folder, pooling=encoding.pooling)
    tokenizer = load_tokenizer(str(folder))
    return {subset: evaluate_retriever_on(model.to(device), tokenizer, dataset, settings=settings, encoding=encoding,
                                          device=device, out_dir=out / (subset or ""), separator=separator)
            for subset, dataset in parts}, False


def _log_evaluations(params: Params, variant: str, name: str, folder: Path, run_id: str | None, results: dict,
                     seconds: float, parent, out_dir: Path) -> None:
    """One retriever's metrics into its fine-tuning run, reopened by id without moving its end time (its
    duration stays the training's); a retriever without one (the untuned encoder) gets its own run."""
    settings, root = params.evaluate, profile_dir(params)
    if run_id is None:
        description = variant_description(params, variant)
        untuned = name == "untuned"
        opened = tracked_stage(params, f"evaluate@{variant}",
                               variant_run_name(description, name if untuned else f"{name} eval"),
                               kind="baseline" if untuned else "evaluate",
                               stage_params={"encoder": str(folder), **settings, **description, "retriever": name},
                               tags={"qac.retriever": name, "qac.variant": variant}, parent=parent)
    else:
        opened = reopened_stage(params, run_id)
    with opened as tracking:
        tracking.set_tags({"qac.eval.stage": f"evaluate@{variant}", "qac.eval.depth": settings.depth})
        tracking.log_metrics({"eval/seconds": seconds})
        for dataset_name, by_split in results.items():
            for prepared in prepared_folders(root / "datasets" / dataset_name):
                tracking.log_dataset_inputs(prepared, "evaluation", splits=list(by_split))
            for split, result in by_split.items():
                tracking.log_evaluation(result, dataset_name, split)
        if name == "untuned":
            tracking.write_record(out_dir / name, variant=variant, retriever=name)


def evaluate_variant(params: Params, variant: str) -> EvaluationOutcome:
    """Evaluate ``variant``'s retrievers on every evaluation set; write its runs, per-query values and
    ``metrics/eval/<variant>.json``, and log the metrics into the retrievers' runs (the module's doc)."""
    import time

    root = profile_dir(params)
    retrievers = retrievers_of(params, variant, root)
    # This stage opens its runs after the work: its inputs are checked against the lock here, before it.
    verify_inputs(params, [folder for _, folder, _ in retrievers]
                  + [root / "datasets" / name for name in evaluation_datasets(params)])
    fine_tuned = root / "finetune" / variant / "r1"
    encodings = {name: encoding_of(params, name, folder, fine_tuned) for name, folder, _ in retrievers}
    parent = Upstream(root, root / "pretrain" / variant, f"pretrain@{variant}")
    device = init_distributed().device
    out_dir = root / "eval" / variant
    outcome = EvaluationOutcome(results={name: {} for name, _, _ in retrievers})
    seconds: dict[str, float] = {name: 0.0 for name, _, _ in retrievers}
    with atomic_path(out_dir, directory=True) as staging:
        # Datasets outside, retrievers inside: each corpus is read once.
        for dataset_name in evaluation_datasets(params):
            parts = load_prepared_parts(root / "datasets" / dataset_name)
            for name, folder, _ in retrievers:
                if dataset_name != params.train_dataset and not evaluates_zero_shot(params, variant, name):
                    continue
                started = time.perf_counter()
                by_subset, reused = _evaluate_one(params, variant, name, folder, encodings[name], dataset_name,
                                                  parts, Path(staging) / name / dataset_name, device)
                if reused:
                    outcome.reused.append(f"{name} {dataset_name}")
                outcome.results[name][dataset_name] = combine_parts(by_subset, Path(staging) / name / dataset_name)
                seconds[name] += time.perf_counter() - started
        for name, folder, run_id in retrievers:
            _log_evaluations(params, variant, name, folder, run_id, outcome.results[name], seconds[name],
                             parent, out_dir)
    summary = {name: {dataset_name: {split: result.aggregate for split, result in by_split.items()}
                      for dataset_name, by_split in by_dataset.items()}
               for name, by_dataset in outcome.results.items()}
    write_json(root / "metrics" / "eval" / f"{variant}.json", summary)
    return outcome
