"""What `qac hpo` checks before it creates a study, a journal, an MLflow run or a worker.

A mistake found here ends the command in one paragraph that names the params
file and line (or the command-line option). Found in a trial instead, it would
fail every trial that meets it, after the slow work had started.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from qac.hpo.study import SettingsError
from qac.config import profile_dir
from qac.data.beir import read_qrels_tsv
from qac.data.errors import DataFormatError
from qac.data.prepared import DATASET_JSON
from qac.hpo.space import SpaceError, check_space_against_params, check_values_are_taken
from qac.hpo.trial_job import MIN_FINETUNE_QUERIES, queries_with_a_relevant_document
from qac.params.yaml_io import key_lines

if TYPE_CHECKING:
    from qac.hpo.study import HpoSettings
    from qac.params.sections import Params

# CUDA_VISIBLE_DEVICES takes indices, or UUIDs as nvidia-smi -L prints them (a unique prefix is enough).
_GPU_ID = re.compile(r"\d+|(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F-]*")


def parse_gpu_ids(value: str) -> list[str]:
    """The ids of ``--gpus`` (``0,1`` or ``GPU-1a2b...``), each checked; empty for an empty value."""
    if not value.strip():
        return []
    ids = [item.strip() for item in value.split(",")]
    for item in ids:
        if not _GPU_ID.fullmatch(item):
            shown = repr(item) if item else "an empty id"
            raise SettingsError(f"--gpus {value!r}: {shown} is not a GPU id; give non-negative indices "
                                "(--gpus 0,1) or GPU UUIDs as `nvidia-smi -L` prints them (GPU-1a2b3c4d-...), "
                                "separated by commas")
    return ids


def params_file_error(path: str | Path, key: str, message: str):
    """A :class:`~qac.params.ParamsError` for ``key``, with its line in the params file at ``path``."""
    # here, not at the top: it loads pydantic
    from qac.params import ParamsError, Problem

    try:
        lines = key_lines(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        lines = {}
    return ParamsError(path, [Problem(key, message)], lines)


def check_search_space(params: Params, settings: HpoSettings, path: str | Path) -> None:
    """Every ``hpo.space`` key names a setting a trial may change, and each value it can draw is one that
    setting takes (a partial params file skips the rules across keys when it is read: they run here)."""
    try:
        check_space_against_params(settings.dimensions, params.to_dict(), settings.variant)
        check_values_are_taken(params, settings.dimensions, settings.variant)
    except SpaceError as error:
        key, _, message = str(error).partition(": ")
        raise params_file_error(path, key, message) from None


def check_dev_split(params: Params, settings: HpoSettings, path: str | Path) -> None:
    """``hpo.dev.queries`` leaves training queries to fine-tune on: the count the trial job checks, read
    from the prepared dataset's training judgements only (no corpus)."""
    dataset_dir = profile_dir(params) / "datasets" / str(params.train_dataset)
    record = _dataset_record(dataset_dir / DATASET_JSON)
    if "train" not in record.get("splits", ()):
        raise params_file_error(path, "train_dataset", f"{dataset_dir} has no train split to carve the "
                                                       "search's dev queries (hpo.dev.queries) from")
    threshold = int(record.get("rel_threshold", {}).get("train", 1))
    usable = len(queries_with_a_relevant_document(read_qrels_tsv(dataset_dir / "qrels" / "train.tsv"), threshold))
    most = usable - MIN_FINETUNE_QUERIES
    if settings.dev_queries > most:
        raise params_file_error(path, "hpo.dev.queries", (
            f"{settings.dev_queries} dev queries, but the train split of {dataset_dir} has only {usable} queries "
            f"with a relevant document and fine-tuning keeps at least {MIN_FINETUNE_QUERIES}: "
            + (f"at most {most}" if most >= 1 else "too few for any dev query")))


def _dataset_record(path: Path) -> Mapping[str, Any]:
    if not path.is_file():
        raise DataFormatError(path, None, None, "not found: is this a prepared dataset (run the prepare stage)?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DataFormatError(path, error.lineno, None, f"malformed JSON ({error.msg})") from None
