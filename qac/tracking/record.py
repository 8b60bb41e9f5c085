"""What a stage run records besides metrics: its config, its datasets, its study, its models.

- :func:`log_stage_config`: the resolved parameters the stage ran with, as the
  artifact ``config/params.yaml`` (the profile rendered, not the overlay files).
- :func:`log_dataset_inputs` / :func:`log_file_input`: MLflow dataset inputs
  (``mlflow.log_input``) for a prepared dataset's corpus, queries and qrels, or
  any stage file, named and digested by the file's MD5 (the hash DVC uses).
  They are metadata datasets: nothing is loaded into memory or copied.
- :func:`describe_study_run`: the study run's parameters (profile, commit).
- :func:`mark_training_experiment`: MLflow 3 opens an experiment of unknown
  kind on its GenAI overview; the tag ``mlflow.experimentKind`` makes it open
  on the table of training runs instead.
- :func:`reopened_run`: log more into a finished run without moving its end
  time, so a run's duration stays the duration of the work it describes.
- :func:`models_requested` / :func:`log_encoder`: trained encoders as run
  artifacts, only when asked (``--log-models`` or ``mlflow.log_models``).
- :func:`loaded_code`: the qac source files the stage ran, with their MD5, as
  the artifact ``code/qac_modules.json``: the code behind an output, file by
  file, which the stage must declare as DVC dependencies (a test checks it).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from qac.io import path_md5
from qac.redaction import redact_values
from qac.tracking.interrupted import process_tags

if TYPE_CHECKING:
    from qac.params.sections import Params

CONFIG_ARTIFACT = "config/params.yaml"
CODE_ARTIFACT = "code/qac_modules.json"
# Columns of the files between stages (docs/architecture.md), shown in the dataset view.
_COLUMNS = {
    "corpus": ("_id", "title", "text"),
    "queries": ("_id", "text"),
    "qrels": ("query-id", "corpus-id", "score"),
}


def log_stage_config(params: Params) -> None:
    """Log the resolved parameters to the active run as ``config/params.yaml``, credentials redacted (a
    dataset's URL, a search's database)."""
    import mlflow

    mlflow.log_dict(redact_values(_plain(params)), CONFIG_ARTIFACT)


def loaded_code() -> dict[str, str]:
    """``{path relative to the repository: MD5}`` of every qac module this process has imported.

    Imports inside functions count as they happen, so logged at the end of a
    stage this is the code the stage ran, not the code it could have reached.
    """
    import sys

    root = Path(__file__).resolve().parents[2]
    files = {}
    for name, module in list(sys.modules.items()):
        source = getattr(module, "__file__", None)
        if (name == "qac" or name.startswith("qac.")) and source:
            files[Path(source).resolve().relative_to(root).as_posix()] = path_md5(source)
    return dict(sorted(files.items()))


def _plain(value: Any) -> Any:
    """Mappings and sequences as plain dicts and lists, so YAML writes them without Python tags."""
    if isinstance(value, Mapping):
        return {str(key): _plain(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(child) for child in value]
    return value


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"   # shown as "Machine learning" in the UI's experiment type selector


def mark_training_experiment(client, experiment) -> None:
    """Tag ``experiment`` as a model-training one, unless someone chose its kind already."""
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)


def describe_study_run(client, run_id: str, params: Params, commit: str, dirty: bool) -> None:
    """Give a new study run the parameters a reader filters on: profile and git commit."""
    from mlflow.entities import Param

    values = {"profile": params.profile, "git_commit": commit, "git_dirty": str(dirty).lower(),
              "train_dataset": params.train_dataset, "pretrain_corpus": params.pretrain_corpus,
              "zero_shot": ",".join(params.zero_shot), "variants": ",".join(params.pretrain.variants)}
    client.log_batch(run_id, params=[Param(key, str(value)) for key, value in values.items()])


def _dataset(path: Path, name: str, columns: tuple[str, ...] | None):
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import ColSpec, Schema

    with warnings.catch_warnings():
        # MLflow registers its local-file source twice and warns that the choice is ambiguous.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(str(path.resolve()))
    schema = Schema([ColSpec("string", column) for column in columns]) if columns else None
    return MetaDataset(source=source, name=name, digest=path_md5(path), schema=schema)


def log_file_input(path: str | os.PathLike, name: str, context: str, columns: tuple[str, ...] | None = None) -> None:
    """Log one file as a dataset input of the active run (``context``: training, evaluation, ...)."""
    import mlflow

    path = Path(path)
    if path.exists():
        mlflow.log_input(_dataset(path, name, columns), context=context)


def dataset_files(dataset_dir: str | os.PathLike, splits: list[str] | None = None) -> dict[str, tuple[Path, str]]:
    """``{input name: (file, kind)}`` of a prepared dataset: corpus, queries and the qrels of ``splits``."""
    folder = Path(dataset_dir)
    name = folder.name
    files = {f"{name}/corpus": (folder / "corpus.jsonl", "corpus"),
             f"{name}/queries": (folder / "queries.jsonl", "queries")}
    qrels = sorted((folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
    for path in qrels:
        if splits is None or path.stem in splits:
            files[f"{name}/qrels/{path.stem}"] = (path, "qrels")
    return files


def log_dataset_inputs(dataset_dir: str | os.PathLike, context: str, splits: list[str] | None = None) -> None:
    """Log a prepared dataset's corpus, queries and qrels (of ``splits``, default all) as run inputs."""
    import mlflow

    datasets, contexts, tags = [], [], []
    for name, (path, kind) in dataset_files(dataset_dir, splits).items():
        if path.exists():
            datasets.append(_dataset(path, name, _COLUMNS[kind]))
            contexts.append(context)
            tags.append({"qac.file_kind": kind})
    if datasets:
        mlflow.log_inputs(datasets=datasets, contexts=contexts, tags_list=tags)


@contextlib.contextmanager
def reopened_run(run_id: str) -> Iterator[Any]:
    """Reopen a finished run to log into it, then restore its status and end time.

    ``mlflow.start_run(run_id=...)`` ends a run at the current time, which would
    add the evaluation's time to a fine-tuning run's duration.
    """
    import mlflow

    client = mlflow.MlflowClient()
    before = client.get_run(run_id)
    # While reopened, the run is this process's: a sweep must not take it for an orphan.
    owner = {key: before.data.tags[key] for key in process_tags() if key in before.data.tags}
    with mlflow.start_run(run_id=run_id) as run:
        mlflow.set_tags(process_tags())
        yield run
        mlflow.set_tags(owner)
    if before.info.end_time is not None:
        client.set_terminated(run_id, status=before.info.status, end_time=before.info.end_time)


def models_requested(params: Params, flag: bool = False) -> bool:
    """Whether trained encoders go to MLflow: the stage's ``--log-models`` or ``mlflow.log_models``."""
    return flag or params.mlflow.log_models


def log_encoder(folder: str | os.PathLike, artifact_path: str) -> None:
    """Log an encoder folder (weights, config, tokenizer) as artifacts of the active run."""
    import mlflow

    mlflow.log_artifacts(str(folder), artifact_path)
    mlflow.set_tag("qac.model_artifact", artifact_path)
