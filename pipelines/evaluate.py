"""DVC stage ``evaluate@<variant>``: dense retrieval with r1 and r2 on every evaluation set.

For each retriever of the variant (``finetune/<variant>/r1``, ``r2``; for the
variant ``none`` with ``evaluate.untuned_baseline`` also the start encoder,
``untuned``) and each dataset (``train_dataset`` in-domain, then every
``zero_shot`` one), the corpus is encoded once and every split except
``train`` is searched (top ``evaluate.depth``, exact inner product). Writes,
as one unit, ``data/<profile>/eval/<variant>/<retriever>/<dataset>/<split>.trec``
and ``<split>.per_query.json``, plus ``metrics/eval/<variant>.json``. Metrics
go into the retriever's fine-tuning run as ``<dataset>/<split>/<measure>``
with the per-query values as the artifact ``per_query/<dataset>/<split>.json``;
the untuned encoder gets its own run ``eval/untuned/<variant>`` under the
pre-training run. Graded sets count labels >= the split's ``rel_threshold``
(``dataset.json``) as relevant in binary measures.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EVAL_EXCLUDED_SPLITS = ("train",)


def retrievers_of(params: dict, variant: str, root: Path) -> list[tuple[str, Path, str | None]]:
    """``(name, encoder folder, fine-tuning run id or None)`` for every retriever to evaluate."""
    from qac.tracking import read_run_record

    found = []
    for name in ("r1", "r2"):
        folder = root / "finetune" / variant / name
        record = read_run_record(folder)
        if record is None:
            raise SystemExit(f"{folder}/mlflow_run.json: missing (run the finetune@{variant} stage)")
        found.append((name, folder, record["run_id"]))
    if variant == "none" and params["evaluate"].get("untuned_baseline", False):
        found.append(("untuned", root / "pretrain" / variant / "encoder", None))
    return found


def evaluation_datasets(params: dict) -> list[str]:
    """The in-domain dataset first, then the zero-shot ones, each once."""
    names = [params["train_dataset"], *params.get("zero_shot", [])]
    return list(dict.fromkeys(names))


def evaluate_retriever_on(model, tokenizer, dataset, *, settings: dict, device, out_dir: Path) -> dict:
    """Search every evaluation split of ``dataset``; write runs and per-query values; ``{split: EvalResult}``."""
    from qac.evaluation.metrics import evaluate
    from qac.io import write_json
    from qac.retrieval import document_text
    from qac.retrieval.dense import dense_search
    from qac.evaluation.runs import write_trec_run

    splits = [split for split in dataset.splits if split not in EVAL_EXCLUDED_SPLITS]
    doc_ids = list(dataset.corpus)
    doc_texts = [document_text(dataset.corpus[d].title, dataset.corpus[d].text) for d in doc_ids]
    results = {}
    for split in splits:
        queries = dataset.split_queries(split)
        run = dense_search(model, tokenizer, queries, doc_ids, doc_texts, depth=settings["depth"])
        write_trec_run(out_dir / f"{split}.trec", run, tag=out_dir.parent.name)
        result = evaluate(dataset.qrels[split], run, settings["metrics"],
                          rel_threshold=dataset.rel_threshold(split),
                          ignore_identical_ids=dataset.ignore_identical_ids)
        write_json(out_dir / f"{split}.per_query.json", result.per_query)
        results[split] = result
    return results


def log_results(run, results: dict, dataset_name: str) -> None:
    """Metrics ``<dataset>/<split>/<measure>`` and per-query artifacts into the active MLflow run."""
    import mlflow

    from qac.tracking import log_metrics, metric_key

    for split, result in results.items():
        log_metrics({metric_key(dataset_name, split, measure): value for measure, value in result.aggregate.items()})
        mlflow.log_dict(result.per_query, f"per_query/{dataset_name}/{split}.json")


def main(argv: list[str] | None = None) -> None:
    import mlflow

    from qac.config import load_params, profile_dir
    from qac.data.prepared import load_prepared
    from qac.distributed import init_distributed
    from qac.io import atomic_path, write_json
    from qac.models.loading import load_tokenizer
    from qac.tracking import read_run_record, stage_run, tracking_uri, write_run_record
    from qac.train.biencoder import BiEncoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True, help="a key of pretrain.variants")
    args = parser.parse_args(argv)

    params = load_params()
    variant = args.variant
    if variant not in (params["pretrain"].get("variants") or {}):
        raise SystemExit(f"unknown variant {variant!r}: not a key of pretrain.variants in params.yaml")
    root = profile_dir(params)
    settings = params["evaluate"]
    retrievers = retrievers_of(params, variant, root)
    device = init_distributed().device
    out_dir = root / "eval" / variant
    summary: dict = {}
    logged: dict[str, dict] = {name: {} for name, _, _ in retrievers}
    with atomic_path(out_dir, directory=True) as staging:
        # Datasets outside, retrievers inside: each corpus is read once.
        for dataset_name in evaluation_datasets(params):
            dataset = load_prepared(root / "datasets" / dataset_name)
            for name, folder, _ in retrievers:
                model = BiEncoder.from_pretrained(folder, pooling=params["finetune"].get("pooling", "cls")).eval()
                results = evaluate_retriever_on(model.to(device), load_tokenizer(str(folder)), dataset,
                                                settings=settings, device=device,
                                                out_dir=Path(staging) / name / dataset_name)
                logged[name][dataset_name] = results
                summary.setdefault(name, {})[dataset_name] = {
                    split: result.aggregate for split, result in results.items()}

        mlflow.set_tracking_uri(tracking_uri())
        for name, folder, run_id in retrievers:
            if run_id is None:
                parent = read_run_record(root / "pretrain" / variant)
                opened = stage_run(params, f"evaluate@{variant}", f"eval/{name}/{variant}", kind="baseline",
                                   stage_params={"encoder": str(folder), **settings},
                                   tags={"qac.retriever": name, "qac.variant": variant},
                                   parent_run_id=parent["run_id"] if parent else None)
            else:
                opened = mlflow.start_run(run_id=run_id)
            with opened as run:
                for dataset_name, results in logged[name].items():
                    log_results(run, results, dataset_name)
                if run_id is None:
                    write_run_record(Path(staging) / name, run.info.run_id, variant=variant, retriever=name)
    write_json(root / "metrics" / "eval" / f"{variant}.json", summary)


if __name__ == "__main__":
    main()
