"""DVC stage query_generator: the seq2seq query generator -> data/<profile>/generator/.

mode train:      fine-tune a bert2bert generator warm-started from query_generator.model
mode pretrained: save query_generator.model (e.g. doc2query T5) as a versioned folder
Both report ROUGE-L and self-retrieval of generated queries on held-out pairs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from qac.config import load_params, profile_dir
from qac.console import StageClock, add_verbose_flag, print_summary, setup_console


def quality_index(datasets_dir, corpora, heldout, max_documents, seed):
    """BM25 over the documents of ``corpora`` (the held-out sources always in, capped at ``max_documents``)."""
    from qac.data.prepared import load_prepared
    from qac.querygen.pairs import corpus_texts
    from qac.querygen.quality import SelfRetrieval
    from qac.retrieval import document_text

    documents = {}
    for name in dict.fromkeys(corpora):
        for doc_id, (title, text) in corpus_texts(load_prepared(datasets_dir / name)).items():
            documents[f"{name}/{doc_id}"] = document_text(title, text)
    if max_documents and len(documents) > max_documents:
        required = {f"{pair.dataset}/{pair.doc_id}" for pair in heldout}
        others = sorted(set(documents) - required)
        keep = required | set(random.Random(seed).sample(others, max(0, int(max_documents) - len(required))))
        documents = {key: documents[key] for key in sorted(keep)}
    return SelfRetrieval(list(documents), list(documents.values()))


def main(argv: list[str] | None = None) -> int:
    parser = add_verbose_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    setup_console(parser.parse_args([] if argv is None else argv).verbose)   # the command line comes from __main__
    clock = StageClock()

    import torch

    from qac.distributed import autocast_dtype, init_distributed
    from qac.io import atomic_path, write_json
    from qac.querygen.generate import QueryGenerator, SamplingSettings
    from qac.querygen.pairs import build_pairs, cap_training_pairs, split_heldout
    from qac.querygen.quality import evaluate_queries
    from qac.querygen.train_generator import (TrainSettings, build_bert2bert, load_pretrained_generator,
                                              save_generator, train_generator)
    from qac.tracking import log_metrics, stage_run, write_run_record

    params = load_params()
    section = params["query_generator"]
    mode, spec, seed = section["mode"], section["model"], int(params.get("seed", 42))
    if mode not in ("train", "pretrained"):
        raise ValueError(f"query_generator.mode must be train or pretrained, got {mode!r}")
    data = profile_dir(params)
    datasets_dir = data / "datasets"
    train_dataset = params["train_dataset"]
    corpora = [c for c in (params.get("pretrain_corpus"), train_dataset) if c]
    ctx = init_distributed()
    settings = TrainSettings.from_params(params)
    dtype = autocast_dtype(str(section.get("dtype", "auto")), ctx.device)

    pairs = build_pairs(datasets_dir, train_dataset, corpora, bool(section.get("use_titles", True)))
    train_pairs, heldout = split_heldout(pairs, section["heldout_fraction"], section["max_heldout"], seed)
    train_pairs = cap_training_pairs(train_pairs, section.get("max_train_pairs"), seed)
    counts = {"pairs/train": len(train_pairs), "pairs/heldout": len(heldout),
              "pairs/query": sum(p.kind == "query" for p in pairs), "pairs/title": sum(p.kind == "title" for p in pairs)}

    inputs = {name: datasets_dir / name for name in corpora}
    with stage_run(params, "query_generator", "query_generator", kind="query_generator",
                   stage_params={**section, "train_dataset": train_dataset, "corpora": corpora},
                   inputs=inputs, tags={"qac.generator_mode": mode}) as run:
        log_metrics(counts)
        started = time.perf_counter()
        if mode == "train":
            model, tokenizer = build_bert2bert(spec, seed=seed)
            train_generator(model, tokenizer, train_pairs, settings, ctx.device, dtype, log=log_metrics)
        else:
            model, tokenizer = load_pretrained_generator(spec)
        model.to(ctx.device).eval()
        train_seconds = time.perf_counter() - started

        metrics = {**counts, "train_seconds": train_seconds}
        if heldout:
            sampling = SamplingSettings(prefix=settings.prefix, queries_per_passage=1,
                                        max_new_tokens=settings.max_target_len,
                                        max_source_len=settings.max_source_len, seed=seed)
            generator = QueryGenerator(model, tokenizer, sampling, autocast_dtype=dtype, batch_invariant=False)
            with torch.inference_mode():
                generated, _ = generator.generate_candidates(
                    [(f"heldout-{i}", pair.source) for i, pair in enumerate(heldout)], settings.batch_size)
            index = quality_index(datasets_dir, corpora, heldout, section.get("quality_max_documents"), seed)
            metrics.update(evaluate_queries(heldout, [g[0] for g in generated], index, seed))
        log_metrics(metrics)

        with atomic_path(data / "generator", directory=True) as tmp:
            save_generator(model, tokenizer, tmp)
            write_run_record(tmp, run.info.run_id, model=spec, mode=mode)
        write_json(data / "metrics" / "query_generator.json", {**metrics, "mode": mode, "model": spec,
                                                                "mlflow_run_id": run.info.run_id})
    quality = [f"{key} {metrics[key]:.3f}" for key in ("rougeL", "self_retrieval/generated") if key in metrics]
    print_summary("query_generator", f"{mode} {spec}", f"{counts['pairs/train']} training pairs", *quality,
                  seconds=clock.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
