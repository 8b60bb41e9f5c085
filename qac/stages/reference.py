"""DVC stage ``reference``: publicly released retrievers evaluated as published (:mod:`qac.reference`).

Each retriever of ``reference_retrievers`` is loaded by its spec, encodes the in-domain corpus as
``encoders.<spec>`` says it was trained, and is searched and scored with this project's code.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from qac.reference import INDEX_FILE, REFERENCE_DIR, reference_settings, reference_slug, reference_specs
from qac.config import profile_dir
from qac.data.prepared import load_prepared_parts, prepared_folders
from qac.distributed import init_distributed
from qac.io import atomic_path, write_json
from qac.retrieval import document_text, title_separator
from qac.tracking.lifecycle import tracked_stage
from qac.tracking.naming import run_name

if TYPE_CHECKING:
    from qac.params.sections import EvaluateSection, Params


def evaluate_reference(model, tokenizer, dataset, *, settings: EvaluateSection, encoding: Mapping[str, Any],
                       separator: str, device, out_dir: Path) -> dict:
    """Encode ``dataset``'s corpus with a released retriever, search every evaluation split, score it.

    Writes ``<split>.trec`` and ``<split>.per_query.json`` into ``out_dir``;
    returns ``{split: EvalResult}``.
    """
    # here, not at the top: it loads numpy
    from qac.evaluation.split_evaluation import evaluate_split
    # here, not at the top: it loads numpy
    from qac.evaluation.trec_io import write_run
    # here, not at the top: it loads numpy
    from qac.retrieval.dense import search_splits
    # here, not at the top: it loads numpy
    from qac.retrieval.encode import encode_texts

    options = dict(batch_size=settings.batch_size, device=device, normalize=encoding["normalize"],
                   loader_workers=settings.loader_workers)
    doc_ids = list(dataset.corpus)
    texts = [document_text(dataset.corpus[d].title, dataset.corpus[d].text, separator) for d in doc_ids]
    vectors = encode_texts(model.encoder, tokenizer, texts, max_length=encoding["passage_max_len"],
                           pooling=model.pooling, desc=f"encode {dataset.name} corpus", **options)
    runs = search_splits(model, tokenizer, dataset, doc_ids, vectors, query_max_len=encoding["query_max_len"],
                         depth=settings.depth, **options)
    results = {}
    for split, run in runs.items():
        write_run(out_dir / f"{split}.trec", run, tag="reference")
        result = evaluate_split(dataset, split, run, settings.metrics)
        write_json(out_dir / f"{split}.per_query.json", result.per_query)
        results[split] = result
    return results


def evaluate_references(params: Params) -> list[str]:
    """Stage ``reference``: every ``reference_retrievers`` model evaluated as published on the in-domain set.

    Writes ``data/<profile>/reference/`` as one unit (``references.json`` naming the retrievers, even
    when there are none); each retriever's MLflow run ``reference · <spec>`` is recorded under
    ``data/<profile>/.runs/reference/<slug>/``. Returns the summary line's facts. A retriever
    without its ``encoders`` entry stops the stage before any model loads.
    """
    # here, not at the top: it loads numpy, torch
    from qac.models.biencoder import BiEncoder
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    root = profile_dir(dict(params))
    specs = reference_specs(params)
    try:    # every retriever's encoding is known before a model loads
        encodings = {spec: reference_settings(params, spec) for spec in specs}
    except ValueError as error:
        raise SystemExit(str(error)) from None
    dataset_name = params.train_dataset
    dataset_dir = root / "datasets" / dataset_name
    settings = params.evaluate
    device = init_distributed().device
    out_dir = root / REFERENCE_DIR
    facts = []
    with atomic_path(out_dir, directory=True) as staging:
        parts = load_prepared_parts(dataset_dir) if specs else []
        for spec in specs:
            encoding = encodings[spec]
            with tracked_stage(params, "reference", run_name("reference", spec), kind="baseline",
                               stage_params={"model": spec, "depth": settings.depth, "retriever": "reference",
                                             **{k: v for k, v in encoding.items() if k != "published"}},
                               inputs={"dataset": dataset_dir}, tags={"qac.retriever": "reference",
                                                                      "qac.reference": spec},
                               output=out_dir / reference_slug(spec), root=root) as tracking:
                tokenizer = load_tokenizer(spec)
                model = BiEncoder.from_pretrained(spec, pooling=encoding["pooling"],
                                                  normalize=encoding["normalize"]).to(device)
                separator = title_separator(encoding["title_join"], tokenizer)   # as it was trained
                target = Path(staging) / reference_slug(spec) / dataset_name
                results = {}
                for subset, dataset in parts:
                    results.update(evaluate_reference(model, tokenizer, dataset, settings=settings,
                                                      encoding=encoding, separator=separator, device=device,
                                                      out_dir=target / (subset or "")))
                for folder in prepared_folders(dataset_dir):
                    tracking.log_dataset_inputs(folder, "evaluation", splits=list(results))
                for split, result in results.items():
                    tracking.log_evaluation(result, dataset_name, split)
            measure = settings.metrics[0]
            facts += [f"{spec} {dataset_name}/{split} {measure} {result.aggregate[measure]:.3f}"
                      for split, result in results.items()]
        write_json(Path(staging) / INDEX_FILE, {"reference_retrievers": specs})
    return facts or ["no reference retrievers in this profile"]
