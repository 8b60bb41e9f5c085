"""Table 2's zero-shot retriever, trained and evaluated (the ``beir_retriever`` stage's work).

Runs only when ``tables.zero_shot_retriever`` is ``beir`` (otherwise it writes
an empty output and Table 2 reads retriever 1 or 2 of the evaluation). For
each variant Table 2 reports (``evaluate.zero_shot_variants``; null: all) it
starts again from ``pretrain/<variant>/encoder`` and trains with the
``beir_retriever`` recipe (:mod:`qac.train.zero_shot`: pooling, loss and scale,
batch, lengths) on the train dataset's queries with negatives from
sentence-transformers' ``msmarco-hard-negatives.jsonl.gz``
(:mod:`qac.data.hard_negatives`; ``beir_retriever.negatives: bm25`` uses the
bm25 stage's instead), through the fine-tuning stage's own
:func:`qac.stages.finetune.train_retriever`. The retriever is then evaluated on
every ``zero_shot`` dataset, encoded as its saved folder says (its pooling and
similarity: unit-length vectors for cosine). Writes, as one unit,
``data/<profile>/beir/<variant>/encoder/`` (its MLflow run, recorded under
``data/<profile>/.runs/``, nests under the pre-training run and holds the
evaluation's metrics) and ``data/<profile>/beir/<variant>/eval/<dataset>/<split>.per_query.json``
and ``.trec``, plus ``data/<profile>/metrics/beir.json``. A killed run loses no
training: each variant's retriever is kept in ``data/<profile>/.work/beir_retriever/<variant>/``
once trained, and checkpointed while it trains (every ``finetune.checkpoint_every``
steps; :class:`qac.stages.finetune.RecipeWork`); the rerun evaluates again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from qac.config import profile_dir
from qac.data.hard_negatives import HardNegativesError, locate_hard_negatives, read_hard_negatives
from qac.data.prepared import load_prepared, load_prepared_parts
from qac.distributed import cleanup, init_distributed, require_even_split
from qac.io import atomic_path, write_json
from qac.models.encoding import read_encoding
from qac.retrieval import document_text
from qac.stages.finetune import RecipeWork, input_hashes, recipe_fingerprint, train_retriever
from qac.tracking.lifecycle import Upstream, reopened_stage, verify_inputs
from qac.train.groups import read_negatives

if TYPE_CHECKING:
    from qac.params.sections import Params


def training_negatives(params: Params, dataset, root: Path) -> tuple[dict, dict]:
    """``(qid -> negatives, facts)`` from the recipe's source, before any model loads."""
    section = params.beir_retriever
    if section.negatives == "bm25":
        path = root / "bm25" / "negatives.jsonl"
        if not path.is_file():
            raise SystemExit(f"{path}: missing, but beir_retriever.negatives is 'bm25' (run the bm25 stage)")
        return read_negatives(path), {"source": str(path)}
    path = locate_hard_negatives(section.hard_negatives)
    try:
        selected = read_hard_negatives(path, per_system=section.negatives_per_system,
                                       ce_score_margin=section.ce_score_margin, systems=section.systems,
                                       keep=dataset.qrels["train"])
    except HardNegativesError as error:
        raise SystemExit(str(error)) from None
    if not selected.negatives:
        raise SystemExit(f"{path}: no query of {dataset.name}'s train split has a hard negative "
                         f"({selected.lines} lines, {selected.outside} outside the train split)")
    return selected.negatives, {"source": str(path), **selected.stats()}



def _pretrained_starts(root: Path, variants: list[str]) -> dict[str, Path]:
    """Each variant's pre-trained encoder folder; a missing one stops the stage, naming its stage."""
    starts = {}
    for variant in variants:
        start = root / "pretrain" / variant / "encoder"
        if not start.is_dir():
            raise SystemExit(f"{start}: no pre-trained encoder (run the pretrain@{variant} stage)")
        starts[variant] = start
    return starts


def _evaluate_zero_shot(params: Params, root: Path, model, tokenizer, encoding, device, folder: Path) -> dict:
    """``dataset -> split -> result`` of one retriever on every zero-shot dataset (a forum set's parts combined),
    its runs written under ``folder/eval/<dataset>/``."""
    # looked up when called: tests stand in for it
    from qac.stages.evaluate import combine_parts, evaluate_retriever_on

    results = {}
    for dataset_name in params.zero_shot:
        parts = load_prepared_parts(root / "datasets" / dataset_name)
        by_subset = {subset: evaluate_retriever_on(
            model, tokenizer, part, settings=params.evaluate, encoding=encoding, device=device,
            out_dir=folder / "eval" / dataset_name / (subset or ""), separator=" ")
            for subset, part in parts}
        results[dataset_name] = combine_parts(by_subset, folder / "eval" / dataset_name)
    return results


def _log_to_training_run(params: Params, trained, results: dict, is_main: bool) -> None:
    """The zero-shot results logged to the retriever's own training run, when the store holds it."""
    record = trained.record()
    if record is None:
        return
    with reopened_stage(params, record["run_id"], main=is_main) as tracking:
        for dataset_name, by_split in results.items():
            for split, result in by_split.items():
                tracking.log_evaluation(result, dataset_name, split)


def _train_one(params: Params, variant: str, start: Path, negatives: dict, settings, dataset, passage_text, folder: Path,
               dist, *, shared_md5: dict, work_folder: Path):
    """``(model, tokenizer, losses)`` of ``variant``'s zero-shot retriever, trained from ``start`` and saved in
    ``folder``. A retriever trained before a kill is kept in ``work_folder``, and one in training continues
    from its checkpoint; its run nests under the pre-training run, when this store holds it."""
    root = profile_dir(params)
    inputs_md5 = {**shared_md5, **input_hashes({"encoder": start})}
    work = RecipeWork.open(work_folder, recipe_fingerprint(params, variant, inputs_md5, section_key="beir_retriever"),
                           params.finetune.checkpoint_every, dist, stage="beir_retriever")
    model, tokenizer, _, losses, _ = train_retriever(
        "encoder", negatives, variant=variant, params=params, settings=settings, dataset=dataset,
        passage_text=passage_text, start=start,
        parent=Upstream(root, root / "pretrain" / variant, f"pretrain@{variant}"), staging=folder,
        out_dir=root / "beir" / variant, root=root, dist=dist,
        # "triples": only the queries with negatives (retriever 1's release set, the same rule)
        query_set="triples" if params.beir_retriever.without_negatives == "drop" else "judged",
        inputs={"encoder": start, "dataset": root / "datasets" / params.train_dataset},
        section_key="beir_retriever", stage="beir_retriever", work=work)
    return model, tokenizer, losses


def _checked_training_dataset(params: Params, root: Path, variants: list[str]) -> tuple:
    """``(starts, dataset_dir, dataset)``: every variant's pre-trained encoder and the train dataset, checked as
    the lock records them before any model loads, the dataset loaded (it must have a train split)."""
    starts = _pretrained_starts(root, variants)      # every input checked before any model loads
    dataset_dir = root / "datasets" / params.train_dataset
    verify_inputs(params, [*starts.values(), dataset_dir])     # as the lock records them, before reading
    dataset = load_prepared(dataset_dir)
    if "train" not in dataset.qrels:
        raise SystemExit(f"{dataset_dir}: dataset {dataset.name!r} has no train split to train on")
    return starts, dataset_dir, dataset


def _train_and_evaluate(params: Params, root: Path, variant: str, start: Path, negatives: dict, facts: dict,
                        settings, dataset, passage_text, staging: Path, dist, *, shared_md5: dict,
                        work_folder: Path) -> dict:
    """One variant's zero-shot retriever trained into ``staging/<variant>``, evaluated, its results logged to its
    training run; returns its summary (each dataset's aggregates and the training's facts)."""
    folder = staging / variant
    folder.mkdir(parents=True, exist_ok=True)
    model, tokenizer, losses = _train_one(
        params, variant, start, negatives, settings, dataset, passage_text, folder, dist,
        shared_md5=shared_md5, work_folder=work_folder)
    # Encoded as its saved folder says (only the main process saves it; the others hold the same model).
    encoding = (read_encoding(folder / "encoder") if dist.is_main
                else model.encoding(settings.query_max_len, settings.corpus_length))
    results = _evaluate_zero_shot(params, root, model, tokenizer, encoding, dist.device, folder)
    _log_to_training_run(params, Upstream(root, root / "beir" / variant / "encoder", "beir_retriever"),
                         results, dist.is_main)
    summary = {dataset_name: {split: result.aggregate for split, result in by_split.items()}
               for dataset_name, by_split in results.items()}
    summary["train"] = {"steps": len(losses), **facts}
    return summary


def train_zero_shot_retrievers(params: Params) -> list[str]:
    """Train and evaluate the zero-shot retriever of every variant Table 2 reports; the summary line's facts."""
    # here, not at the top: it loads numpy, torch
    from qac.train.zero_shot import RETRIEVER, recipe_settings, trained_variants

    root = profile_dir(params)
    out_dir = root / "beir"
    metrics_path = root / "metrics" / "beir.json"
    variants = trained_variants(params)
    if not variants:
        with atomic_path(out_dir, directory=True) as staging:
            (Path(staging) / "variants.json").write_text("[]\n", encoding="utf-8")
        write_json(metrics_path, {})
        return [f"nothing to train (tables.zero_shot_retriever: {params.tables.zero_shot_retriever})"]

    starts, dataset_dir, dataset = _checked_training_dataset(params, root, variants)
    try:
        settings = recipe_settings(params)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    negatives, facts = training_negatives(params, dataset, root)
    # train_msmarco_v3.py trains on the passage text alone (BEIR's MS MARCO corpus has no titles).
    passage_text = {doc_id: document_text("", doc.text, " ") for doc_id, doc in dataset.corpus.items()}

    dist = init_distributed()
    require_even_split(settings.batch_size, dist.world_size, "beir_retriever.batch_size")
    work_root = root / ".work" / "beir_retriever"
    # What every variant's retriever reads besides its own start, hashed once for their work fingerprints.
    shared_md5 = input_hashes({"dataset": dataset_dir, "negatives": Path(facts["source"])})
    summary: dict[str, dict] = {}
    try:
        with atomic_path(out_dir, directory=True) as staging:
            staging = Path(staging)
            for variant in variants:
                summary[variant] = _train_and_evaluate(
                    params, root, variant, starts[variant], negatives, facts, settings, dataset, passage_text,
                    staging, dist, shared_md5=shared_md5, work_folder=work_root / variant)
            (staging / "variants.json").write_text(json.dumps(variants) + "\n", encoding="utf-8")
        # The output is in place (renamed whole): only now may the work go.
        if dist.is_main:
            shutil.rmtree(work_root, ignore_errors=True)
    finally:
        cleanup()
    write_json(metrics_path, summary)
    return [f"{len(variants)} zero-shot retrievers ({RETRIEVER} recipe)",
            f"{facts.get('queries', len(negatives))} training queries with negatives"]
