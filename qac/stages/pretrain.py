"""Pre-training one variant's encoder (the ``pretrain@<variant>`` stage's work), tracked and resumable.

Writes ``data/<profile>/pretrain/<variant>/`` as one unit: ``encoder/`` (the
Hugging Face folder fine-tuning starts from), ``checkpoint/`` (everything
needed to resume), ``losses.tsv`` (the logged losses per step, for the
report and ``dvc plots``); the MLflow run is recorded in
``data/<profile>/.runs/pretrain/<variant>/mlflow_run.json``. The in-progress checkpoint
lives in ``data/<profile>/.work/pretrain/<variant>/``, which DVC does not
delete, so a rerun after an interruption resumes, if the settings and the
input files are unchanged (else it starts over; the log and the run's
``qac.resume.*`` tags say why). A resumed run ends the killed run as KILLED,
links to it and re-logs the loss history of the checkpoint
(:mod:`qac.tracking.interrupted`). The work checkpoint is deleted only after the
output folder is in place. Runs alone or under ``torchrun``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from qac.config import profile_dir
from qac.data.errors import DataFormatError
from qac.distributed import cleanup, init_distributed
from qac.io import atomic_path, remove_orphaned_staging
from qac.models.factory import input_files
from qac.tracking.lifecycle import tracked_stage
from qac.tracking.naming import variant_description, variant_run_name
from qac.train.step_log import LOSSES_FILE, StepLog


def result_facts(summary: dict) -> list[str]:
    """The summary line's facts: steps and final loss, or what method none did."""
    if summary.get("method") == "none":
        return ["no pre-training (start encoder exported)"]
    facts = [f"{summary['steps']} steps"]
    if summary.get("resumed_from_step"):
        facts.append(f"resumed at step {summary['resumed_from_step']}")
    loss = (summary.get("final_metrics") or {}).get("loss")
    if loss is not None:
        facts.append(f"final loss {loss:.3f}")
    return facts


def _require_inputs(files: Mapping[str, Path]) -> None:
    """Every input file the method and context read, before any folder, process group or MLflow run is made."""
    for path in files.values():
        if not Path(path).exists():
            raise DataFormatError(path, None, None, "file not found")   # the console adds the stage to rerun


def _pretrain_run(params: Mapping[str, Any], variant: str, settings, inputs: Mapping[str, Path], is_main: bool,
                  log_models: bool, stage: str, described: Mapping[str, Any]):
    """The variant's MLflow run, not yet open: its identity as tags too, each only where it means something
    (qac.tracking.naming); a setting that plays no part in it (C of a passage-context run) is not logged."""
    description = {**variant_description(params, variant), **described}
    tags = {f"qac.{key}": value for key, value in description.items() if key != "init"}
    unused = {"query_count", "cotmae_decoder", "master_decoders"} - set(description)
    return tracked_stage(params, stage, variant_run_name(description, "pretrain"), kind="pretrain",
                         stage_params={**{k: v for k, v in settings.to_dict().items() if k not in unused},
                                       **description}, inputs=inputs, tags=tags, main=is_main, log_models=log_models)


def _record_outputs(tracking, variant: str, settings, summary: dict, step_log, staging: Path, out_dir: Path) -> None:
    """The run's description, output hashes, summary, loss curve and encoder; its record written before the
    output is renamed into place, so a kill in between leaves no output."""
    tracking.describe(variant=variant, method=settings.method)
    tracking.hash_outputs({name: (staging / name, out_dir / name) for name in ("encoder", "checkpoint")})
    tracking.log_dict(summary, "pretrain_summary.json")
    if settings.method != "none":
        step_log.write(staging / LOSSES_FILE)
    tracking.log_model(staging / "encoder", "encoder")
    tracking.write_record(out_dir)


def _pretrain_inputs(root: Path, settings, query_set: Path | None) -> tuple[dict, dict, dict]:
    """``(files, inputs, described)``: what the method and context read, the run's logged inputs and, with
    ``query_set`` in place of the generator's queries, the run's description of it."""
    files = input_files(root, settings)      # what this method and context read (qac.models.factory)
    inputs = {"passages": root / "passages.arrow", "queries": root / "queries.arrow"}
    described = {}
    if query_set is not None:
        files["queries"] = inputs["queries"] = query_set
        described = {"query_set": str(query_set.relative_to(root))}
    return files, inputs, described


def _pretrain_in_run(tracking, settings, files: Mapping[str, Path], inputs: Mapping[str, Path], work_dir: Path,
                     staging: Path, is_main: bool, step_log) -> dict:
    """The tracked body: the training inputs logged, then the encoder pre-trained (or exported) into ``staging``,
    its losses and any resume logged by the main process; returns the summary."""
    # here, not at the top: it loads pydantic, torch
    from qac.train.pretrain import pretrain

    queries = files.get("queries")
    extra = {name: path for name, path in files.items() if name not in ("passages", "queries")}

    def log_step(step: int, metrics: dict[str, float]) -> None:
        tracking.log_metrics(metrics, step=step)
        step_log(step, metrics)

    def on_resume(info: dict) -> None:
        tracking.resumes(info["previous_run_id"], resumed=not info["discarded_checkpoint"],
                         from_step=info["resumed_from_step"],
                         discarded_checkpoint=str(info["discarded_checkpoint"]).lower(),
                         discard_reason=info["discard_reason"] or "")

    if settings.method != "none":
        tracking.log_file_inputs({"passages": inputs["passages"], "generated-queries": queries,
                                  **{name.replace("_", "-"): path for name, path in extra.items()}},
                                 "training")
    return pretrain(settings, passages=inputs["passages"], queries=queries, work_dir=work_dir,
                    out_dir=staging, log=log_step if is_main else None, run_id=tracking.run_id,
                    on_resume=on_resume if is_main else None, remove_work=False,
                    extra_inputs=extra)


def pretrain_variant(params: Mapping[str, Any], variant: str, *, log_models: bool = False,
                     query_set: Path | None = None, stage: str | None = None,
                     write_extra: Callable[[Path], None] | None = None) -> dict:
    """Pre-train (or, for method none, export) ``variant``'s encoder; returns the run's summary
    (:func:`qac.train.pretrain.pretrain`). ``log_models``: the encoder goes to MLflow as an artifact
    (also ``mlflow.log_models``).

    Another stage pre-trains the same way on other queries (``pretrain_llm``, :mod:`qac.stages.pretrain_llm`):
    ``query_set`` replaces the generator's ``queries.arrow``, ``stage`` names the stage's run, and
    ``write_extra(staging)`` adds files to the output folder before its record is written."""
    import contextlib
    import shutil

    # here, not at the top: it loads pydantic, torch
    from qac.train.pretrain import PretrainSettings

    settings = PretrainSettings.from_params(params, variant)
    root = profile_dir(params)
    out_dir = root / "pretrain" / variant
    work_dir = root / ".work" / "pretrain" / variant
    files, inputs, described = _pretrain_inputs(root, settings, query_set)
    _require_inputs(files)

    dist = init_distributed()
    step_log = StepLog()    # a resumed run replays the checkpoint's history into it: the whole curve
    if dist.is_main:    # what an earlier run killed while writing left behind
        for path in (out_dir, work_dir / "checkpoint"):
            remove_orphaned_staging(path)
    tracked = _pretrain_run(params, variant, settings, inputs, dist.is_main, log_models,
                            stage or f"pretrain@{variant}", described)
    # Only the main process writes the output folder, as one atomic unit.
    output = atomic_path(out_dir, directory=True) if dist.is_main else contextlib.nullcontext(out_dir)
    try:
        with tracked as tracking, output as staging:
            staging = Path(staging)
            summary = _pretrain_in_run(tracking, settings, files, inputs, work_dir, staging, dist.is_main, step_log)
            if dist.is_main:
                if write_extra is not None:
                    write_extra(staging)
                _record_outputs(tracking, variant, settings, summary, step_log, staging, out_dir)
        # The output is in place (renamed by atomic_path): only now may the work state go.
        if dist.is_main:
            shutil.rmtree(work_dir, ignore_errors=True)
    finally:
        cleanup()
    return summary
