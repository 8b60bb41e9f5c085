"""One stage's MLflow run from start to end: ``with tracked_stage(...) as tracking:``.

A stage script never talks to MLflow itself. It opens its run here and logs
through the :class:`StageTracking` it gets back, which owns everything a run
of ours carries:

- the rank-0 rule: under ``torchrun`` only the main process tracks; every
  other rank gets a handle whose methods do nothing (``main=False``), so the
  stage's code reads the same on every rank;
- the parent run: the run that produced an upstream output (:class:`Upstream`,
  found through its run record), else the profile's study run;
- the inputs with their MD5 as tags, and as MLflow dataset inputs;
- the outputs with their MD5 (:meth:`StageTracking.hash_outputs`);
- the run record of the stage's output (``data/<profile>/.runs/...``), written
  when the work inside the ``with`` ends without an error;
- resume links to a run an interrupted earlier attempt left
  (:meth:`StageTracking.resumes`);
- model artifacts, only when asked (``--log-models`` or ``mlflow.log_models``);
- what the work cost: device-seconds, peak memory and, where readable, energy, measured around the
  work inside the ``with`` and logged however it ends (:mod:`qac.tracking.cost`).

A finished run is reopened to add to it (evaluation metrics into a fine-tuning
run) with :func:`reopened_stage`, which yields the same handle.

The tracking store is reached in one place, :func:`_store_run`, after one quick
probe (:func:`qac.tracking.store.usable_store`): a store that cannot be used
(unreachable, a damaged database) is said in one paragraph and the stage goes
on with an inactive handle, as no stage needs the store.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from qac.io import path_md5
from qac.model_specs import loaded_models, loads_noted
from qac.params import profile_params_path
from qac.tracking import linked_run_id, log_evaluation, log_metrics, read_run_record, stage_run, tracking_uri
from qac.tracking.cost import CostMeter
from qac.tracking.interrupted import end_interrupted_run
from qac.tracking.record import log_dataset_inputs, log_encoder, log_file_input, models_requested, reopened_run
from qac.tracking.store import is_store_error, store_failed

if TYPE_CHECKING:
    from qac.params.sections import Params


@dataclass
class Upstream:
    """The output an upstream stage wrote (``data/<profile>/pretrain/<variant>``), whose run is the parent.

    ``what`` names it in the note printed when its run is not linked (``pretrain@none``). The
    lookup happens once, on the main process only, however many runs nest under it.
    """

    root: Path
    output: Path
    what: str
    _run_id: str | None = field(default=None, init=False, repr=False)
    _looked_up: bool = field(default=False, init=False, repr=False)

    def run_id(self) -> str | None:
        if not self._looked_up:
            self._run_id = linked_run_id(read_run_record(self.root, self.output), self.what)
            self._looked_up = True
        return self._run_id

    def record(self) -> dict[str, Any] | None:
        """The upstream run record itself (what the upstream stage wrote beside its run id)."""
        return read_run_record(self.root, self.output)


def _untracked_on_store_failure(method):
    """A logging method that, when the store fails mid-stage, says so once and leaves the run: the stage's
    work goes on untracked instead of ending on the store's error."""
    import functools

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            if not self.active or not is_store_error(error):
                raise
            store_failed(error)
            self.run = None
    return guarded


class StageTracking:
    """A stage's handle on its MLflow run; inactive (every method a no-op) off the main process."""

    def __init__(self, run=None, *, root: Path | None = None, log_models: bool = False):
        self.run = run
        self.root = root
        self.log_models = log_models
        self._record: dict[str, Any] = {}
        self.first_load: int | None = None     # the hub-model loads noted before the work (tracked_stage)

    @property
    def active(self) -> bool:
        return self.run is not None

    @property
    def run_id(self) -> str | None:
        return self.run.info.run_id if self.run is not None else None

    @_untracked_on_store_failure
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Metrics, keys mangled as MLflow needs (:func:`qac.tracking.metric_key`)."""
        if self.active:
            log_metrics(metrics, step=step)

    @_untracked_on_store_failure
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.active:
            import mlflow

            mlflow.set_tags(dict(tags))

    @_untracked_on_store_failure
    def log_evaluation(self, result, dataset_name: str, split: str) -> None:
        """A split's evaluation (:class:`qac.evaluation.metrics.EvalResult`): measures as
        ``<dataset>/<split>/<measure>``, per-query values as ``per_query/<dataset>/<split>.json``."""
        if self.active:
            log_evaluation(result, dataset_name, split)

    @_untracked_on_store_failure
    def log_dict(self, value: Mapping[str, Any], artifact: str) -> None:
        if self.active:
            import mlflow

            mlflow.log_dict(dict(value), artifact)

    @_untracked_on_store_failure
    def log_artifacts(self, *paths: str | os.PathLike) -> None:
        """Files, each as an artifact at the run's root."""
        if self.active:
            import mlflow

            for path in paths:
                mlflow.log_artifact(str(path))

    @_untracked_on_store_failure
    def log_file_inputs(self, files: Mapping[str, str | os.PathLike | None], context: str,
                        columns: tuple[str, ...] | None = None) -> None:
        """Stage files as MLflow dataset inputs (``name -> path``; a None or absent path is skipped)."""
        if self.active:
            for name, path in files.items():
                if path is not None:
                    log_file_input(path, name, context, columns=columns)

    @_untracked_on_store_failure
    def log_dataset_inputs(self, dataset_dir: str | os.PathLike, context: str,
                           splits: list[str] | None = None) -> None:
        """A prepared dataset's corpus, queries and qrels of ``splits`` as dataset inputs."""
        if self.active:
            log_dataset_inputs(dataset_dir, context, splits=splits)

    @_untracked_on_store_failure
    def hash_outputs(self, outputs: Mapping[str, tuple[str | os.PathLike, str | os.PathLike]]) -> None:
        """Tag each output present (``name -> (where it is now, where it will be)``) with its place and MD5.

        The MD5 is the hash DVC gives it; it also goes into the run record as ``<name>_md5``.
        """
        if not self.active:
            return

        for name, (now, final) in outputs.items():
            if Path(now).exists():
                md5 = path_md5(now)
                self.set_tags({f"qac.{name}": str(final), f"qac.{name}_md5": md5})
                self._record[f"{name}_md5"] = md5

    def describe(self, **facts: Any) -> None:
        """Facts the run record carries beside the run id (variant, retriever, steps, ...)."""
        self._record.update(facts)

    @_untracked_on_store_failure
    def resumes(self, previous_run_id: str | None, *, resumed: bool, **facts: Any) -> None:
        """This run continues (``resumed``) or replaces the work of ``previous_run_id``, which an
        interruption left: tag ``qac.resume.<fact>`` and link the two runs
        (:func:`qac.tracking.interrupted.end_interrupted_run`)."""
        if not self.active:
            return

        if facts:
            self.set_tags({f"qac.resume.{key}": value for key, value in facts.items()})
        end_interrupted_run(previous_run_id, self.run_id, resumed=resumed)

    @_untracked_on_store_failure
    def log_model(self, folder: str | os.PathLike, artifact: str) -> None:
        """A trained model folder as artifacts, when models were asked for (``--log-models``, ``mlflow.log_models``)."""
        if self.active and self.log_models:
            log_encoder(folder, artifact)

    def write_record(self, output: str | os.PathLike, **extra: Any) -> None:
        """The run record of ``output`` now, with the facts described so far."""
        if self.active:
            # looked up when called: tests stand in for it
            from qac.tracking import write_run_record

            loaded = self.loaded_models()
            write_run_record(self.root, output, self.run_id,
                             **{**self._record, **({"loaded_models": loaded} if loaded else {}), **extra})

    def loaded_models(self) -> list[dict]:
        """The hub models the work loaded so far, each with the revision asked for and the commit its files came
        from (:func:`qac.model_specs.loaded_models`); the run's tag ``qac.loaded_models`` says the same."""
        if self.first_load is None:
            return []

        loaded = loaded_models(self.first_load)
        if loaded:
            import json

            self.set_tags({"qac.loaded_models": json.dumps(loaded, sort_keys=True)})
        return loaded


# Stages whose runs open once the work is done, only to log it: what runs inside is not their cost (the evaluate
# stage logs its time as eval/seconds).
OPENED_AFTER_THE_WORK = ("evaluate@",)


def verify_inputs(params: Params, inputs) -> int:
    """Check a stage's inputs (and, under ``dvc repro``, the data of its lock entry) against the hashes the
    profile's ``dvc.lock`` records for them (:mod:`qac.tracking.recorded_inputs`); the number checked. Only the
    global rank 0 of a ``torchrun`` job hashes; if it stops, torchrun ends the other ranks."""
    if os.environ.get("RANK", "0") != "0":
        return 0
    # looked up when called: tests stand in for it
    from qac.tracking.recorded_inputs import verify_stage_inputs

    return verify_stage_inputs(profile_params_path(params.profile).parent / "dvc.lock", inputs)


def _profile_root(params: Params, root: str | os.PathLike | None) -> Path:
    if root is not None:
        return Path(root)
    return Path(params.data_dir) / params.profile


@contextlib.contextmanager
def _store_run(opened) -> Iterator[Any]:
    """Enter a run of the tracking store: the one place the store is reached when a stage starts.

    A store that fails while the run opens or closes (unreachable, a damaged database:
    :mod:`qac.tracking.store`) is said in one paragraph and the stage goes on without a run (None),
    as no stage needs the store; an error of the stage itself passes through as it is.
    """
    import sys

    stack = contextlib.ExitStack()
    try:
        run = stack.enter_context(opened)
    except Exception as error:
        if not is_store_error(error):
            raise
        store_failed(error)
        run = None
    try:
        yield run
    except BaseException:
        if not stack.__exit__(*sys.exc_info()):
            raise
    else:
        try:
            stack.__exit__(None, None, None)
        except Exception as error:
            if not is_store_error(error):
                raise
            store_failed(error)


@contextlib.contextmanager
def _measured(tracking: StageTracking, measure: bool) -> Iterator[None]:
    """The work inside measured (:class:`qac.tracking.cost.CostMeter`) and its cost logged into the run,
    whether it ends or fails."""
    if not (measure and tracking.active):
        yield
        return

    meter = CostMeter()
    try:
        with meter:
            yield
    finally:
        if meter.cost is not None:
            tracking.log_metrics(meter.cost.metrics())
            tracking.set_tags(meter.cost.tags())


@contextlib.contextmanager
def tracked_stage(
    params: Params,
    stage: str,
    run_name: str,
    *,
    kind: str,
    stage_params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, str | os.PathLike] | None = None,
    tags: Mapping[str, Any] | None = None,
    parent: Upstream | str | None = None,
    output: str | os.PathLike | None = None,
    main: bool = True,
    log_models: bool = False,
    root: str | os.PathLike | None = None,
) -> Iterator[StageTracking]:
    """Open the MLflow run of one stage (:func:`qac.tracking.stage_run`) and yield its handle.

    ``parent``: the upstream output whose run this one nests under, or a run id; the study run
    when None or when the upstream run is not linked. ``output``: the stage output whose run record
    is written when the work ends without an error (under ``root``, default ``data/<profile>``).
    ``main``: whether this process tracks (rank 0). ``log_models``: the stage's ``--log-models``;
    ``mlflow.log_models`` in params asks too. The work inside is measured (:mod:`qac.tracking.cost`) unless
    the stage opens its runs only after its work (:data:`OPENED_AFTER_THE_WORK`).
    """
    root = _profile_root(params, root)
    if main:    # inputs whose bytes are not those the lock records stop the stage before it reads them
        verify_inputs(params, (inputs or {}).values())
    # looked up when called: tests stand in for it
    from qac.tracking.store import usable_store

    parent_run_id = None
    if main and usable_store() and isinstance(parent, Upstream):
        parent_run_id = parent.run_id()
    elif isinstance(parent, str):
        parent_run_id = parent
    # An unusable store is said once and the stage goes on without it; asked again because looking the
    # parent up can find the store locked.
    if not main or not usable_store():
        yield StageTracking(root=root)
        return

    opened = stage_run(params, stage, run_name, kind=kind, stage_params=stage_params, inputs=inputs, tags=tags,
                       parent_run_id=parent_run_id)
    with _store_run(opened) as run:
        tracking = StageTracking(run, root=root, log_models=models_requested(params, log_models))
        tracking.first_load = loads_noted()
        with _measured(tracking, not stage.startswith(OPENED_AFTER_THE_WORK)):
            yield tracking
        tracking.loaded_models()       # tagged on the run, whether or not an output's record is written
        if output is not None:
            tracking.write_record(output)


@contextlib.contextmanager
def reopened_stage(params: Params, run_id: str, *, main: bool = True,
                   root: str | os.PathLike | None = None) -> Iterator[StageTracking]:
    """Reopen the finished run ``run_id`` to log more into it; its status and end time are kept
    (:func:`qac.tracking.record.reopened_run`)."""
    root = _profile_root(params, root)
    # looked up when called: tests stand in for it
    from qac.tracking.store import usable_store

    if not main or not usable_store():
        yield StageTracking(root=root)
        return
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    with _store_run(reopened_run(run_id)) as run:
        yield StageTracking(run, root=root)
