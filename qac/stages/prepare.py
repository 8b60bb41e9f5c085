"""Stage `prepare@<dataset>`: one declared dataset, read, checked and normalised.

Finds ``datasets.<name>`` in the mirror or downloads it (failing before any work when
neither is possible), reads and validates it, keeps the subset that ``prepare`` asks
for, and writes data/<profile>/datasets/<name>/ (BEIR layout plus dataset.json) atomically, logging
the MLflow run `<name> · prepare` with the prepared files as dataset inputs. A TSV collection (MS MARCO
documents, 22 GB) is streamed: memory holds its document ids, not its texts (``qac.data.streamed``).
"""

from __future__ import annotations

from qac.config import data_mirror, profile_dir
from qac.params import load_params
from qac.stages.arguments import dataset_stage_arguments
from qac.console import StageClock, print_summary
from qac.data.errors import DatasetUnavailableError
from qac.data.prepared import prepare_dataset, write_prepared_parts
from qac.data.sources import (DatasetSpec, download_dir, fetch_dataset, locate_dataset, read_dataset_parts,
                              subset_settings, triples_path)
from qac.tracking.lifecycle import tracked_stage
from qac.tracking.naming import run_name


def main(argv: list[str] | None = None) -> int:
    args = dataset_stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    params = load_params()
    declared = params.datasets
    if args.dataset not in declared:
        raise SystemExit(f"dataset {args.dataset!r} is not declared in params.yaml (declared: {', '.join(declared)})")
    spec = DatasetSpec.from_params(args.dataset, declared[args.dataset])
    settings = subset_settings(params, args.dataset)     # a dataset entry may override the profile-wide ones
    mirror, downloads = data_mirror(), download_dir(params)
    try:
        locate_dataset(spec, mirror, downloads)  # fail here, before any work, if the data cannot be had
    except DatasetUnavailableError as error:
        raise SystemExit(str(error)) from None   # one paragraph that says what to do; a traceback would bury it
    out = profile_dir(params) / "datasets" / spec.name

    with tracked_stage(params, f"prepare@{spec.name}", run_name(spec.name, "prepare"), kind="prepare",
                       stage_params={"prepare": settings, "dataset": declared[spec.name]},
                       tags={"qac.dataset": spec.name}) as tracking:
        try:   # and the official training triples (retriever 1's negatives in the release), when declared
            source = fetch_dataset(spec, mirror, downloads)
            triples = triples_path(spec, source, mirror=mirror, downloads=downloads) if spec.triples else None
        except DatasetUnavailableError as error:
            raise SystemExit(str(error)) from None
        tracking.set_tags({"qac.data_source": source.location})
        parts = read_dataset_parts(spec, source, mirror=mirror, min_text_chars=settings.min_text_chars)
        for _, dataset in parts:   # a dataset of sub-collections (CQADupStack's forums) prepares each alike
            prepare_dataset(dataset, max_documents=settings.max_documents,
                            keep_judged_documents=settings.keep_judged_documents)
        record = write_prepared_parts(parts, out, spec.name, triples)
        counts = record["counts"]
        metrics = {"documents": counts["documents"], "queries": counts["queries"]}
        metrics.update({f"qrels/{split}": rows for split, rows in counts["qrels"].items()})
        metrics.update({f"queries/{split}": n for split, n in counts["queries_per_split"].items()})
        metrics.update({f"skipped/{reason}": n for reason, n in record["skipped"].items()})
        metrics.update({f"train_negatives/{key}": n for key, n in record.get("train_negatives", {}).items()})
        tracking.log_metrics(metrics)
        for subset, _ in parts:
            tracking.log_dataset_inputs(out if subset is None else out / subset, "prepared")
    skipped = ", ".join(f"{reason} {n}" for reason, n in record["skipped"].items()) or "none"
    print_summary(f"prepare@{spec.name}", f"{counts['documents']} documents", f"{counts['queries']} queries",
                  f"qrels {counts['qrels']} from {source.location}", f"skipped: {skipped}", seconds=clock.seconds)
    return 0

