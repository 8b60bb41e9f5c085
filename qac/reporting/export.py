"""``qac export <profile>``: a profile's retrievers, runs, results, tables and lineage in one folder.

The folder is fit for an archive (Zenodo, a paper's supplement) and every part
is in a format the field's own tools read as it is:

- ``retrievers/<variant>/<r1|r2>/``: the sentence-transformers folder with its
  model card (``README.md``, :mod:`qac.models.model_card`);
- ``runs/<variant>/<retriever>/<dataset>/<split>.trec``: TREC runs headed by
  ir_metadata (PRIMAD: platform, implementation, method, data);
- ``results/mteb/qac__<profile>-<variant>-<retriever>/<revision>/<Task>.json`` and ``model_meta.json``
  (:mod:`qac.evaluation.mteb_results`), the revision being the MD5 of the
  retriever folder;
- ``ranx/<dataset>/<split>/qrels.json`` and ``runs/<system>.json``
  (``ranx.Qrels.from_file`` / ``ranx.Run.from_file`` read them), and
  ``ranx/comparison.md``, which run beats which per measure
  (:mod:`qac.reporting.comparison`);
- ``tables/``: the committed report of the profile (``reports/<profile>/``);
- ``lineage/``: the profile's ``params.yaml``, ``dvc.yaml``, ``dvc.lock`` and
  every output's MLflow run record;
- ``MANIFEST.json``: every file with its size and MD5.

The stage outputs stay as DVC wrote them (byte-identical on a rerun); what
depends on the machine or the moment (the card's training time and host, the
library versions) is written here, at export.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
from pathlib import Path
from typing import Any

from qac.io import atomic_path, file_md5, path_md5
from qac.config import profile_dir
from qac.errors import UserError
from qac.models.encoding import read_encoding
from qac.models.model_card import CardFacts, model_card
from qac.tracking import RECORDS_DIR

RETRIEVERS = ("r1", "r2")
LANGUAGES = ["eng-Latn"]
MTEB_FORMAT = "2.26.24"     # the mteb release whose TaskResult schema the result files follow
_VERSIONED = ("torch", "transformers", "sentence-transformers", "faiss-cpu", "numpy", "mlflow", "dvc")


def versions() -> dict[str, str]:
    """The installed versions of the libraries an exported retriever and its runs depend on."""
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def mlflow_facts(record: dict | None) -> dict[str, Any]:
    """Time, host and last logged loss of the run a record names, where its store answers; else {}."""
    if not record or not record.get("tracking_uri") or not record.get("run_id"):
        return {}
    uri = record["tracking_uri"]
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return {}
    try:
        import mlflow

        run = mlflow.MlflowClient(uri).get_run(record["run_id"])
    except Exception:       # an unreachable or foreign store: the card says the run was not at hand
        return {}
    facts = {"MLflow run": record["run_id"], "status": run.info.status,
             "host": run.data.tags.get("qac.host", "not recorded")}
    if run.info.end_time and run.info.start_time:
        facts["seconds"] = round((run.info.end_time - run.info.start_time) / 1000, 1)
    for key in sorted(run.data.metrics):
        if key.startswith(("train/", "loss", "eval/seconds")):
            facts[key] = round(run.data.metrics[key], 6)
    return facts


def evaluated_sets(folder: Path) -> dict[str, list[str]]:
    """``{dataset: [split, ...]}`` of an evaluation folder (``eval/<variant>/<retriever>``)."""
    found = {}
    for dataset in sorted(p for p in folder.iterdir() if p.is_dir()):
        splits = sorted(path.name.removesuffix(".per_query.json") for path in dataset.glob("*.per_query.json"))
        if splits:
            found[dataset.name] = splits
    return found


def aggregates(source, dataset: str, splits: list[str]) -> dict[str, dict[str, float]]:
    """``{split: {measure: mean}}`` as the tables compute them (sub-collections averaged, as BEIR does)."""
    result = {}
    for split in splits:
        measures = json.loads(source.path(dataset, split).read_text(encoding="utf-8"))
        result[split] = {measure: source.metric(dataset, split, measure) for measure in measures}
    return result


def parameter_count(folder: Path) -> int:
    """Weights in a folder's safetensors files, counted from their headers (nothing is loaded)."""
    from safetensors import safe_open

    total = 0
    for weights in sorted(folder.glob("*.safetensors")):
        with safe_open(str(weights), "np") as handle:
            total += sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())
    return total


def card_facts(params, root: Path, variant: str, retriever: str, source, record: dict | None,
               dataset_md5: dict[str, str]):
    """What the model card of ``variant``'s ``retriever`` says (:class:`qac.models.model_card.CardFacts`)."""
    settings = params.pretrain.variants[variant]
    encoder = root / "pretrain" / variant / "encoder"
    base = settings.init or params.pretrain.common.init
    encoding = read_encoding(root / "finetune" / variant / retriever)
    sets = evaluated_sets(source.folder)
    metrics = {f"{dataset}/{split}": values for dataset, splits in sets.items()
               for split, values in aggregates(source, dataset, splits).items()}
    record = record or {}
    return CardFacts(
        name=f"qac {params.profile} {variant} {retriever}", base_model=str(base),
        base_revision=path_md5(encoder) if encoder.is_dir() else "no pre-trained checkpoint (variant none)",
        variant={key: value for key, value in dict(settings).items() if value is not None},
        finetune={key: value for key, value in dict(params.finetune).items() if not isinstance(value, dict)},
        encoding=dict(pooling=encoding.pooling, normalize=encoding.normalize, query_max_len=encoding.query_max_len,
                      passage_max_len=encoding.passage_max_len, title_separator=encoding.title_separator),
        datasets={name: dataset_md5[name] for name in [params.train_dataset, *sets] if name in dataset_md5},
        metrics=metrics,
        lineage={"profile": params.profile, "stage": f"finetune@{variant}", "MLflow run": record.get("run_id"),
                 "git commit": record.get("git_commit"), "dirty files": record.get("git_dirty"),
                 "reproduce": f"`qac repro {params.profile}` (or `dvc repro -R profiles/{params.profile} "
                              f"finetune@{variant}`) from lineage/params.yaml at that commit"},
        training=mlflow_facts(record), versions=versions())


def run_metadata(variant: str, retriever: str, dataset: str, split: str, encoding, record: dict | None,
                 host: str, dataset_md5: str | None) -> dict:
    """The ir_metadata (PRIMAD) facts of one exported run."""
    record = record or {}
    return {
        "tag": f"{variant}.{retriever}",
        "research goal": {"description": "query-as-context pre-training of dense passage retrievers "
                                         "(Wu et al., EMNLP 2023), reproduced with qac"},
        "platform": {"hardware": {"host": host},
                     "software": {"libraries": {"python": [f"{k}=={v}" for k, v in versions().items()]}}},
        "implementation": {"source": {"lang": "python", "repository": "qac", "commit": record.get("git_commit"),
                                      "dirty": record.get("git_dirty")}},
        "method": {"retrieval": [{"name": f"dense {retriever}", "method": "bi-encoder, exact inner-product search",
                                  "pre-training": variant, "pooling": encoding.pooling,
                                  "similarity": "cosine" if encoding.normalize else "dot",
                                  "query tokens": encoding.query_max_len,
                                  "document tokens": encoding.passage_max_len}]},
        "data": {"test collection": {"name": dataset, "split": split, "md5": dataset_md5}},
    }


def export_profile(params, out: str | Path, root: str | Path | None = None, repo: str | Path = ".") -> Path:
    """Write the export of the profile in ``params`` (its outputs under ``root``, default ``data/<profile>``)
    into the folder ``out``, atomically; returns it."""
    root, repo, out = Path(root or profile_dir(params)), Path(repo), Path(out)
    systems = [(variant, retriever) for variant in params.pretrain.variants for retriever in RETRIEVERS
               if (root / "eval" / variant / retriever).is_dir() and (root / "finetune" / variant / retriever).is_dir()]
    if not systems:
        raise UserError(f"{root}: no fine-tuned and evaluated retriever (finetune/<variant>/r1 with eval/<variant>/r1)"
                        f" to export: run the profile's pipeline first (qac repro {params.profile})")
    prepared = root / "datasets"
    datasets = sorted(p.name for p in prepared.iterdir() if p.is_dir()) if prepared.is_dir() else []
    dataset_md5 = {name: path_md5(root / "datasets" / name) for name in datasets}
    with atomic_path(out, directory=True) as staging:
        staging = Path(staging)
        per_query: dict[tuple[str, str], dict] = {}
        for variant, retriever in systems:
            export_system(params, root, staging, variant, retriever, dataset_md5, per_query)
        write_ranx(root, staging, per_query)
        copy_lineage(params, root, repo, staging)
        write_manifest(staging)
    return out


def export_system(params, root: Path, out: Path, variant: str, retriever: str, dataset_md5: dict[str, str],
                  per_query: dict) -> None:
    """One retriever: its folder and card, its runs with ir_metadata, its MTEB results; its per-query values
    go into ``per_query[(dataset, split)][system]`` for the ranx files."""
    # here, not at the top: it loads numpy
    from qac.evaluation.mteb_results import model_folder, model_meta, mteb_task_name, task_result
    # here, not at the top: it loads numpy
    from qac.evaluation.trec_io import read_run, write_run
    # here, not at the top: it loads numpy
    from qac.reporting.lineage import Source, read_record

    folder, evaluated = root / "finetune" / variant / retriever, root / "eval" / variant / retriever
    record = read_record(root, folder)
    source = Source(f"{variant}.{retriever}", root, evaluated, record)
    facts = card_facts(params, root, variant, retriever, source, record, dataset_md5)
    revision = path_md5(folder)
    shutil.copytree(folder, out / "retrievers" / variant / retriever)
    (out / "retrievers" / variant / retriever / "README.md").write_text(model_card(facts), encoding="utf-8")
    encoding = read_encoding(folder)
    model = f"qac/{params.profile}-{variant}-{retriever}"
    results = out / "results" / "mteb" / model_folder(model) / revision
    for dataset, splits in evaluated_sets(evaluated).items():
        # No per-task time: the evaluate stage times a retriever's whole evaluation (eval/seconds in its run).
        result = task_result(dataset, dataset_md5.get(dataset, ""), aggregates(source, dataset, splits), None,
                             MTEB_FORMAT, LANGUAGES)
        _write_json(results / f"{result['task_name']}.json", result)
        for split in splits:
            run_file = evaluated / dataset / f"{split}.trec"
            values = json.loads(source.path(dataset, split).read_text(encoding="utf-8"))
            per_query.setdefault((dataset, split), {})[source.name] = values
            if run_file.is_file():
                write_run(out / "runs" / variant / retriever / dataset / f"{split}.trec", read_run(run_file),
                          tag=source.name, metadata=run_metadata(variant, retriever, dataset, split, encoding, record,
                                                                 facts.training.get("host", "not recorded"),
                                                                 dataset_md5.get(dataset)))
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    _write_json(results / "model_meta.json", model_meta(
        model, revision, n_parameters=parameter_count(folder), max_tokens=encoding.passage_max_len,
        embed_dim=int(pooling["word_embedding_dimension"]), similarity="cosine" if encoding.normalize else "dot",
        training_datasets=[mteb_task_name(params.train_dataset)], languages=LANGUAGES))


def write_ranx(root: Path, out: Path, per_query: dict) -> None:
    """``ranx/<dataset>/<split>/qrels.json`` and ``runs/<system>.json`` for every split with a run file,
    and ``ranx/comparison.md`` (:mod:`qac.reporting.comparison`) over each split's systems."""
    # here, not at the top: it loads numpy
    from qac.evaluation.trec_io import read_qrels, read_run
    # here, not at the top: it loads numpy
    from qac.reporting.comparison import comparison_table

    report = ["# Which run beats which", "",
              "Per evaluation split, one row per run and one column per measure: the mean over the qrels' queries, "
              "then the letters of the runs it beats with p < 0.05 in the paired randomization test (1,000 "
              "permutations, no correction across the pairs). ranx reproduces it from the files beside this one:",
              "", "```python", "from pathlib import Path", "", "from ranx import Qrels, Run, compare", "",
              'qrels = Qrels.from_file("ranx/<dataset>/<split>/qrels.json")',
              'runs = [Run.from_file(str(path), name=path.stem)',
              '        for path in sorted(Path("ranx/<dataset>/<split>/runs").glob("*.json"))]',
              'print(compare(qrels, runs, metrics=["mrr@10", "ndcg@10"], stat_test="fisher", max_p=0.05))',
              "```", ""]
    for (dataset, split), systems in sorted(per_query.items()):
        qrels_file = root / "datasets" / dataset / "qrels" / f"{split}.tsv"
        if not qrels_file.is_file():
            continue       # sub-collections (CQADupStack) are judged per forum: their mean has no one qrels
        folder = out / "ranx" / dataset / split
        _write_json(folder / "qrels.json", read_qrels(qrels_file))
        for system in systems:
            variant, retriever = system.rsplit(".", 1)
            run_file = root / "eval" / variant / retriever / dataset / f"{split}.trec"
            if run_file.is_file():
                _write_json(folder / "runs" / f"{system}.json", read_run(run_file))
        measures = sorted(set.intersection(*(set(values) for values in systems.values())))
        report += [f"## {dataset} / {split}", "", comparison_table(systems, measures), ""]
    (out / "ranx").mkdir(parents=True, exist_ok=True)
    (out / "ranx" / "comparison.md").write_text("\n".join(report).rstrip() + "\n", encoding="utf-8")


def copy_lineage(params, root: Path, repo: Path, out: Path) -> None:
    """The profile's params, pipeline and lock, every output's run record, and the committed report."""
    profile = repo / "profiles" / params.profile
    for name in ("params.yaml", "dvc.yaml", "dvc.lock"):
        if (profile / name).is_file():
            (out / "lineage").mkdir(parents=True, exist_ok=True)
            shutil.copy2(profile / name, out / "lineage" / name)

    if (root / RECORDS_DIR).is_dir():
        shutil.copytree(root / RECORDS_DIR, out / "lineage" / "runs")
    if (repo / "reports" / params.profile).is_dir():
        shutil.copytree(repo / "reports" / params.profile, out / "tables")


def write_manifest(out: Path) -> None:
    """``MANIFEST.json``: every file of the export with its size and MD5."""
    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        files[path.relative_to(out).as_posix()] = {"bytes": path.stat().st_size, "md5": file_md5(path)}
    _write_json(out / "MANIFEST.json", {"files": files})
