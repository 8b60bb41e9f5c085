"""DVC stage ``finetune@<variant>``: two-stage fine-tuning of one pre-trained encoder.

Retriever 1 starts from ``pretrain/<variant>/encoder`` and trains on the BM25
hard negatives (``bm25/negatives.jsonl``). It then encodes the corpus and
retrieves the top ``mine_depth`` documents for every training query; the
non-positives there (below ``mine_skip_top``) are the mined negatives.
Retriever 2 starts again from the same pre-trained encoder and trains on the
mined negatives (plus the BM25 ones with ``r2_use_bm25_negatives``).

Writes ``data/<profile>/finetune/<variant>/`` as one unit: ``r1/``, ``r2/``
(Hugging Face encoder folders with tokenizer and ``mlflow_run.json``) and
``mined_negatives.jsonl``. Each retriever is an MLflow run
``finetune/<r1|r2>/<variant>`` nested under the pre-training run. Only the
train split of ``train_dataset`` is read. Runs alone or under ``torchrun``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def broadcast_path(path: Path | None, dist) -> Path:
    """The main process's staging folder, known to every process."""
    if not dist.enabled:
        return Path(path)
    import torch.distributed

    holder = [str(path) if dist.is_main else None]
    torch.distributed.broadcast_object_list(holder, src=0)
    return Path(holder[0])


def train_retriever(name: str, negatives: dict, *, variant: str, params: dict, settings, dataset, passage_text,
                    start: Path, parent_run_id: str, staging: Path, dist, inputs: dict):
    """Fine-tune one retriever from ``start``, save it to ``staging/<name>``; returns the model and the queries."""
    from qac.tracking import log_metrics, stage_run, write_run_record
    from qac.train.finetune import fine_tune_retriever
    from qac.train.groups import negative_pool_stats, training_queries

    section = params["finetune"]
    queries = training_queries(dataset.queries, dataset.qrels["train"], negatives,
                               rel_threshold=dataset.rel_threshold("train"),
                               max_queries=section.get("max_train_queries"), seed=params["seed"],
                               corpus_ids=dataset.corpus)
    tracked = (stage_run(params, f"finetune@{variant}", f"finetune/{name}/{variant}", kind="finetune",
                         stage_params={**section, "seed": params["seed"], "train_dataset": params["train_dataset"]},
                         inputs=inputs, tags={"qac.retriever": name, "qac.variant": variant},
                         parent_run_id=parent_run_id)
               if dist.is_main else contextlib.nullcontext())
    with tracked as run:
        if dist.is_main:
            stats = negative_pool_stats(queries, settings.n_negatives)
            log_metrics({f"train_queries/{key}": value for key, value in stats.items()})
        model, tokenizer, losses = fine_tune_retriever(
            start, queries, list(dataset.corpus), passage_text, settings,
            device=dist.device, rank=dist.rank, world_size=dist.world_size,
            on_step=(lambda step, values: log_metrics(values, step=step)) if dist.is_main else None)
        if dist.is_main:
            model.save(staging / name, tokenizer)
            write_run_record(staging / name, run.info.run_id, variant=variant, retriever=name,
                             start=str(start), steps=len(losses))
    return model, tokenizer, queries


def main(argv: list[str] | None = None) -> None:
    from qac.config import checked_variant, load_params, profile_dir
    from qac.data.prepared import load_prepared
    from qac.distributed import barrier, cleanup, init_distributed
    from qac.io import atomic_path, write_jsonl
    from qac.retrieval import document_text
    from qac.tracking import read_run_record
    from qac.train.finetune import FinetuneSettings
    from qac.train.groups import merge_negatives, read_negatives
    from qac.train.mining import mine_with_retriever

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True, help="a key of pretrain.variants")
    args = parser.parse_args(argv)

    params = load_params()
    variant = checked_variant(params, args.variant)
    root = profile_dir(params)
    pretrain_dir = root / "pretrain" / variant
    start = pretrain_dir / "encoder"
    if not start.is_dir():
        raise SystemExit(f"{start}: no pre-trained encoder (run the pretrain@{variant} stage)")
    parent = read_run_record(pretrain_dir)
    if parent is None:
        raise SystemExit(f"{pretrain_dir}/mlflow_run.json: missing, so the fine-tuning runs cannot nest "
                         f"under the pre-training run (run the pretrain@{variant} stage)")
    bm25_negatives_path = root / "bm25" / "negatives.jsonl"
    dataset_dir = root / "datasets" / params["train_dataset"]
    dataset = load_prepared(dataset_dir)
    if "train" not in dataset.qrels:
        raise SystemExit(f"{dataset_dir}: dataset {dataset.name!r} has no train split to fine-tune on")
    section = params["finetune"]
    settings = FinetuneSettings.from_params(section, params["seed"])
    passage_text = {doc_id: document_text(doc.title, doc.text) for doc_id, doc in dataset.corpus.items()}
    inputs = {"encoder": start, "bm25_negatives": bm25_negatives_path, "dataset": dataset_dir}
    common = dict(variant=variant, params=params, settings=settings, dataset=dataset, passage_text=passage_text,
                  start=start, parent_run_id=parent["run_id"])

    dist = init_distributed()
    out_dir = root / "finetune" / variant
    # Only the main process writes the output folder, as one atomic unit.
    output = atomic_path(out_dir, directory=True) if dist.is_main else contextlib.nullcontext(None)
    try:
        with output as staging:
            staging = broadcast_path(staging, dist)
            bm25_negatives = read_negatives(bm25_negatives_path)
            r1, tokenizer, queries = train_retriever("r1", bm25_negatives, staging=staging, dist=dist,
                                                     inputs=inputs, **common)
            mined_path = staging / "mined_negatives.jsonl"
            records = mine_with_retriever(
                r1, tokenizer, queries, passage_text, depth=section["mine_depth"],
                skip_top=section.get("mine_skip_top", 0), query_max_len=settings.query_max_len,
                passage_max_len=settings.passage_max_len, batch_size=section.get("encode_batch_size", 128),
                dist=dist)
            if dist.is_main:
                write_jsonl(mined_path, records)
            barrier()
            negatives = read_negatives(mined_path)
            if section.get("r2_use_bm25_negatives", False):
                negatives = merge_negatives(negatives, bm25_negatives)
            del r1
            train_retriever("r2", negatives, staging=staging, dist=dist,
                            inputs={**inputs, "mined_negatives": mined_path}, **common)
            barrier()
    finally:
        cleanup()


if __name__ == "__main__":
    main()
