"""Reference rows: publicly released retrievers evaluated as published, beside the study's own.

An inference-only reproduction is the cheapest check at full scale: before
any GPU-hour goes into pre-training, a released retriever (params
``reference_retrievers``, e.g. ``Luyu/co-condenser-marco-retriever``) is
loaded by its hub name, encodes the in-domain corpus the way it was trained
(``encoders.<spec>``: pooling, normalisation, query and passage lengths) and
is searched and scored with this project's code. Its published figures
(``encoders.<spec>.published``) are the expected values of the paper
profile's reproduction check, so encoding, search and metrics on 8.8M
passages are verified on their own.

Outputs of stage ``reference``: ``data/<profile>/reference/<slug>/<dataset>/<split>.trec``
and ``.per_query.json`` for each retriever (``slug``: the spec with ``/`` as
``--``), and ``references.json`` naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from qac.params.sections import EvaluateSection, Params

REFERENCE_DIR = "reference"
INDEX_FILE = "references.json"


def reference_slug(spec: str) -> str:
    """The folder name of a retriever's outputs: its spec with ``/`` written ``--``."""
    return spec.replace("/", "--")


def reference_specs(params: Params) -> list[str]:
    return list(params.reference_retrievers)


def reference_settings(params: Params, spec: str) -> dict[str, Any]:
    """How ``spec`` was trained to encode (``encoders.<spec>``), and its published figures.

    A reference retriever without an ``encoders`` entry would be scored with
    settings it was not trained with, so that is refused with the key to add.
    """
    entry = params.encoders.get(spec)
    if entry is None:
        raise ValueError(f"params: reference_retrievers names {spec!r}, but encoders.{spec} is missing: give its "
                         "pooling, normalize, query_max_len, passage_max_len and published figures")
    return {key: getattr(entry, key)
            for key in ("pooling", "normalize", "query_max_len", "passage_max_len", "published")}


def published_figure(params: Params, spec: str, dataset: str | None, split: str | None,
                     measure: str | None) -> dict[str, Any] | None:
    """The published figure of ``spec`` for one measure (``value`` a fraction, ``source``), or None."""
    for figure in reference_settings(params, spec)["published"]:
        if (figure["dataset"], figure["split"], figure["measure"]) == (dataset, split, measure):
            return figure
    return None


def evaluate_reference(model, tokenizer, dataset, *, settings: EvaluateSection, encoding: Mapping[str, Any],
                       separator: str, device, out_dir: Path) -> dict:
    """Encode ``dataset``'s corpus with a released retriever, search every evaluation split, score it.

    Writes ``<split>.trec`` and ``<split>.per_query.json`` into ``out_dir``;
    returns ``{split: EvalResult}``.
    """
    from qac.evaluation.split_evaluation import evaluate_split
    from qac.evaluation.trec_io import write_run
    from qac.io import write_json
    from qac.retrieval import document_text
    from qac.retrieval.dense import search_splits
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
    from qac.config import profile_dir
    from qac.data.prepared import load_prepared_parts, prepared_folders
    from qac.distributed import init_distributed
    from qac.io import atomic_path, write_json
    from qac.models.biencoder import BiEncoder
    from qac.models.loading import load_tokenizer
    from qac.retrieval import title_separator
    from qac.tracking.lifecycle import tracked_stage
    from qac.tracking.naming import run_name

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
                separator = title_separator(params.finetune.title_join, tokenizer)
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
