"""The query generator of a profile, made and measured (the ``query_generator`` stage's work).

mode train:      fine-tune a generator built from query_generator.model (architecture prefix_lm or
                 bert2bert), stopping early on the loss of validation pairs
mode pretrained: save query_generator.model (e.g. doc2query T5) as a versioned folder
Both report the quality of generated queries on held-out pairs and documents
(:mod:`qac.querygen.quality`) to MLflow, ``data/<profile>/metrics/query_generator.json`` and
``reports/query_generator/<profile>.md``; the generator goes to ``data/<profile>/generator/``.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from qac.config import profile_dir
from qac.errors import UserError
from qac.params import params_path
from qac.data.prepared import load_prepared
from qac.distributed import autocast_dtype, init_distributed
from qac.evaluation.annotation import EncoderCosineJudge, calibration_pairs
from qac.io import atomic_path
from qac.querygen.generator_pairs import corpus_texts, with_evidence_windows
from qac.querygen.quality import SelfRetrieval, evaluate_queries, judge_anchors, judge_shares
from qac.querygen.quality_table import quality_table
from qac.reporting.dvc_metrics import is_timing, write_stage_metrics
from qac.retrieval import document_text
from qac.tracking.lifecycle import tracked_stage

if TYPE_CHECKING:
    from qac.params.sections import Params


def quality_index(datasets_dir, corpora, heldout, max_documents, seed):
    """BM25 over the documents of ``corpora`` (the held-out sources always in, capped at ``max_documents``)."""
    documents = corpus_documents(datasets_dir, corpora)
    if max_documents and len(documents) > max_documents:
        required = {f"{pair.dataset}/{pair.doc_id}" for pair in heldout}
        others = sorted(set(documents) - required)
        keep = required | set(random.Random(seed).sample(others, max(0, int(max_documents) - len(required))))
        documents = {key: documents[key] for key in sorted(keep)}
    return SelfRetrieval(list(documents), [document_text(title, text) for title, text in documents.values()])


def corpus_documents(datasets_dir, corpora) -> dict[str, tuple[str, str]]:
    """``"<dataset>/<doc id>" -> (title, text)`` over ``corpora``."""
    return {f"{name}/{doc_id}": entry for name in dict.fromkeys(corpora)
            for doc_id, entry in corpus_texts(load_prepared(datasets_dir / name)).items()}


def evidence_sources(pairs, datasets_dir, train_dataset, tokenizer, settings):
    """``pairs`` with each query pair read from its evidence window, as many tokens as the generator reads."""
    documents = {tuple(key.split("/", 1)): entry for key, entry in corpus_documents(datasets_dir, [train_dataset]).items()}
    prefix = len(tokenizer(settings.source_prefix("query"), add_special_tokens=False)["input_ids"])
    budget = settings.max_source_len - tokenizer.num_special_tokens_to_add(pair=False) - prefix

    def lengths(texts):
        return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    return with_evidence_windows(pairs, documents, lengths, budget)


def generate(model, tokenizer, settings, dtype, texts, candidates, batch_size):
    """``candidates`` sampled queries per text, as generate_queries samples them."""
    import torch

    # here, not at the top: it loads torch
    from qac.querygen.generate import QueryGenerator

    sampling = settings.__class__(**{**settings.__dict__, "queries_per_passage": candidates})
    generator = QueryGenerator(model, tokenizer, sampling, autocast_dtype=dtype, batch_invariant=False)
    with torch.inference_mode():
        generated, _ = generator.generate_candidates([(f"quality-{i}", text) for i, text in enumerate(texts)],
                                                     batch_size)
    return generated


def judge_figures(params: Params, data, heldout, model, tokenizer, sampling, dtype, candidates, batch_size, seed):
    """Table 5's automatic judge on held-out documents cut into passages as the split stage cuts the corpus:
    high-correlation shares, their paired test and mean scores of query and passage pairs (every one of
    ``candidates`` queries per anchor passage, the first as Table 5's)."""
    # here, not at the top: it loads nltk
    from qac.data.punkt import load_sentence_splitter
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.splitting import SplitSettings, TokenCounter, split_documents
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    section, annotation = params.query_generator, params.annotation
    datasets_dir, train_dataset = data / "datasets", params.train_dataset
    documents = corpus_documents(datasets_dir, [train_dataset])
    keys = sorted({f"{p.dataset}/{p.doc_id}" for p in heldout if p.dataset == train_dataset})
    splits = split_documents([(key, document_text(*documents[key])) for key in keys], load_sentence_splitter(data / "punkt"),
                             TokenCounter(load_tokenizer(params.split.tokenizer)), SplitSettings.from_params(params))
    anchors = judge_anchors({split.doc_id: split.passages for split in splits}, section.judge_anchors, seed)
    if not anchors:
        return {}
    # every candidate, in order, as the study draws its queries from them: the first is Table 5's query
    queries = generate(model, tokenizer, sampling, dtype, [a.anchor for a in anchors], candidates, batch_size)
    judge = EncoderCosineJudge(annotation.judge_model, max_length=annotation.judge_max_len)
    split = annotation.calibration_split
    positives, negatives = calibration_pairs(
        datasets_dir / train_dataset, split, section.judge_calibration_pairs or annotation.calibration_pairs,
        seed, load_prepared(datasets_dir / train_dataset).rel_threshold(split))
    calibration = judge.calibrate(positives, negatives)
    return {**judge_shares(judge, calibration.threshold, anchors, queries, params.tables.permutations, seed),
            "judge/calibration_accuracy": calibration.accuracy}


def _heldout_sampling(params: Params, settings, data: Path):
    """How held-out candidates are sampled: as generate_queries samples them (its prefix, top-k/top-p, repeat
    penalty, lengths and precision), cut at the generator's source length; a prefix other than the one the
    generator learns queries with, or a judge without the split stage's sentence splitter, is refused."""
    # here, not at the top: it loads torch
    from qac.querygen.generate import SamplingSettings

    section = params.query_generator
    sampling = SamplingSettings.from_params(params)
    sampling = SamplingSettings(**{**sampling.__dict__, "max_source_len": settings.max_source_len})
    if section.mode == "train" and sampling.prefix != settings.source_prefix("query"):
        raise UserError(f"{params_path()}: querygen.prefix {sampling.prefix!r} differs from the prefix the "
                        f"generator learns queries with ({settings.source_prefix('query')!r}, "
                        "query_generator.kind_prefixes.query or query_generator.prefix)")
    if section.judge_anchors and not (data / "punkt").is_dir():
        raise UserError(f"{data / 'punkt'}: the sentence splitter of the split_passages stage, which cuts the "
                        "held-out documents of the Table 5 judge; run that stage first")
    return sampling


def _generator_pairs(params: Params, settings, corpora: list[str]):
    """``(training, validation, held-out pairs, their counts)`` of (passage, query or title) pairs."""
    # looked up when called: tests stand in for it
    from qac.querygen.generator_pairs import build_pairs, cap_training_pairs, split_heldout

    section, seed = params.query_generator, params.seed
    datasets_dir = profile_dir(params) / "datasets"
    pairs = build_pairs(datasets_dir, params.train_dataset, corpora, section.use_titles)
    if section.evidence_windows:
        # here, not at the top: it loads safetensors
        from qac.data.tokenizer import load_tokenizer

        pairs = evidence_sources(pairs, datasets_dir, params.train_dataset, load_tokenizer(section.model), settings)
    train_pairs, heldout = split_heldout(pairs, section.heldout_fraction, section.max_heldout, seed)
    train_pairs, validation = split_heldout(train_pairs, 1.0, section.validation_pairs, seed + 1)
    train_pairs = cap_training_pairs(train_pairs, section.max_train_pairs, seed)
    counts = {"pairs/train": len(train_pairs), "pairs/validation": len(validation), "pairs/heldout": len(heldout),
              "pairs/query": sum(p.kind == "query" for p in pairs), "pairs/title": sum(p.kind == "title" for p in pairs)}
    return train_pairs, validation, heldout, counts


def _heldout_quality(params: Params, model, tokenizer, sampling, generation_dtype, heldout, candidates: int,
                     batch_size: int, corpora: list[str]) -> dict:
    """The quality figures of the generator's queries for the held-out passages (sampled and greedy), and the
    Table 5 judge's where asked."""
    # here, not at the top: it loads torch
    from qac.querygen.generate import SamplingSettings

    section, seed, data = params.query_generator, params.seed, profile_dir(params)
    sources = [p.source for p in heldout]
    generated = generate(model, tokenizer, sampling, generation_dtype, sources, candidates, batch_size)
    greedy = SamplingSettings(**{**sampling.__dict__, "top_k": 1})
    most_likely = [texts[0] if texts else "" for texts in
                   generate(model, tokenizer, greedy, generation_dtype, sources, 1, batch_size)]
    index = quality_index(data / "datasets", corpora, heldout, section.quality_max_documents, seed)
    figures = evaluate_queries(heldout, generated, index, seed, greedy=most_likely)
    if section.judge_anchors:
        figures.update(judge_figures(params, data, heldout, model, tokenizer, sampling,
                                     generation_dtype, candidates, batch_size, seed))
    return figures


def _made_generator(params: Params, settings, train_pairs, validation, device, dtype, log) -> tuple:
    """``(model, tokenizer, training figures)``: the generator built and trained (mode train, its metrics to
    ``log``) or the pretrained one loaded (no figures), on ``device`` in evaluation mode."""
    # here, not at the top: it loads torch
    from qac.querygen.train_generator import build_generator, load_pretrained_generator, train_generator

    section = params.query_generator
    figures = {}
    if section.mode == "train":
        model, tokenizer = build_generator(section.architecture, section.model, seed=params.seed,
                                           copy_bias=section.copy_bias, dropout=section.dropout)
        figures = train_generator(model, tokenizer, train_pairs, settings, device, dtype, log=log,
                                  validation=validation)
    else:
        model, tokenizer = load_pretrained_generator(section.model)
    model.to(device).eval()
    return model, tokenizer, figures


def _write_generator_outputs(params: Params, data: Path, model, tokenizer, metrics: dict, tracking) -> None:
    """The generator's folder and its run record, the stage's DVC metrics and the tracked quality report."""
    # here, not at the top: it loads torch
    from qac.querygen.train_generator import save_generator

    section = params.query_generator
    mode, spec = section.mode, section.model
    with atomic_path(data / "generator", directory=True) as tmp:
        save_generator(model, tokenizer, tmp)
    tracking.write_record(data / "generator", model=spec, mode=mode)
    described = {"mode": mode, "model": spec, "architecture": section.architecture if mode == "train" else "pretrained"}
    # Results only: the run id is bookkeeping (its record above), so equal results give an equal file.
    write_stage_metrics(data / "metrics", "query_generator", {**metrics, **described})
    # A tracked report: the same inputs give the same file, so no wall-clock figures in it.
    results = {key: value for key, value in metrics.items() if not is_timing(key)}
    with atomic_path(f"reports/query_generator/{params.profile}.md") as tmp:
        tmp.write_text(quality_table({**results, **described},
                                     f"Query generator quality ({params.profile} profile, held-out pairs)"))


def make_query_generator(params: Params) -> list[str]:
    """Train (or save the pretrained) query generator and measure its queries; the summary line's facts."""
    # here, not at the top: it loads torch
    from qac.querygen.train_generator import TrainSettings

    section = params.query_generator
    mode, spec = section.mode, section.model
    data = profile_dir(params)
    datasets_dir = data / "datasets"
    train_dataset = params.train_dataset
    corpora = [c for c in (params.pretrain_corpus, train_dataset) if c]
    ctx = init_distributed()
    settings = TrainSettings.from_params(params)
    dtype = autocast_dtype(section.dtype, ctx.device)
    generation_dtype = autocast_dtype(params.querygen.dtype, ctx.device)
    sampling = _heldout_sampling(params, settings, data)
    candidates = section.quality_candidates or sampling.queries_per_passage
    train_pairs, validation, heldout, counts = _generator_pairs(params, settings, corpora)

    inputs = {name: datasets_dir / name for name in corpora}
    with tracked_stage(params, "query_generator", "query_generator", kind="query_generator",
                       stage_params={**section, "train_dataset": train_dataset, "corpora": corpora},
                       inputs=inputs, tags={"qac.generator_mode": mode}, root=data) as tracking:
        tracking.log_metrics(counts)
        started = time.perf_counter()
        model, tokenizer, figures = _made_generator(params, settings, train_pairs, validation, ctx.device, dtype,
                                                    tracking.log_metrics)
        train_seconds = time.perf_counter() - started

        metrics = {**counts, **figures, "train_seconds": train_seconds}
        started = time.perf_counter()
        if heldout:
            metrics.update(_heldout_quality(params, model, tokenizer, sampling, generation_dtype, heldout,
                                            candidates, settings.batch_size, corpora))
        metrics["quality_seconds"] = time.perf_counter() - started
        tracking.log_metrics(metrics)
        _write_generator_outputs(params, data, model, tokenizer, metrics, tracking)
    quality = [f"{key} {metrics[key]:.3f}" for key in ("rougeL", "self_retrieval/generated/top10") if key in metrics]
    return [f"{mode} {spec}", f"{counts['pairs/train']} training pairs", *quality]
