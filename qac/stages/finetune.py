"""The two-stage fine-tuning recipe of one pre-trained encoder (the ``finetune@<variant>`` stage's work).

Retriever 1 starts from ``pretrain/<variant>/encoder`` and trains on the BM25
hard negatives (``bm25/negatives.jsonl``): every judged training query, or with
``r1_queries: triples`` only those the file gives negatives (the release's
stage-1 set). It then encodes the corpus and retrieves the top ``mine_depth``
documents for every judged training query; the non-positives there (below
``mine_skip_top``) are the mined negatives. With
the same corpus vectors it searches the in-domain evaluation splits to
``evaluate.depth`` (``r1_runs/``, :mod:`qac.train.indomain_runs`), which the
evaluation scores instead of encoding the corpus a second time. Retriever 2
starts again from the same pre-trained encoder and trains on the mined
negatives (plus the BM25 ones with ``r2_use_bm25_negatives``).

Each retriever is saved as a folder that says how it encodes (pooling,
normalisation, lengths, title separator; a sentence-transformers model folder,
:mod:`qac.models.encoding`) and tracked as its own MLflow run nested under the
pre-training run (:func:`train_retriever`). The hyperparameter search trains
its retriever 1 from the same pieces (:func:`retriever_texts`,
:func:`qac.train.finetune.start_retriever`), so a trial tunes on the text and model the stage uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from qac.config import profile_dir, variant_seed
from qac.data.prepared import load_prepared
from qac.distributed import barrier, broadcast_object, cleanup, init_distributed, require_even_split
from qac.io import atomic_path, path_md5, write_json, write_jsonl
from qac.models.encoding import read_encoding
from qac.retrieval import document_text, title_separator
from qac.tracking.lifecycle import Upstream, tracked_stage, verify_inputs
from qac.tracking.naming import variant_description, variant_run_name
from qac.train.groups import negative_pool_stats, read_negatives, retriever1_queries, training_queries
from qac.train.indomain_runs import RUNS_FOLDER, run_encoding, write_indomain_runs
from qac.train.step_log import THROUGHPUT

if TYPE_CHECKING:
    from qac.params.sections import BeirRetrieverSection, FinetuneSection, Params
    from qac.train.finetune import WorkCheckpoint


def retriever_texts(dataset, title_join: str, tokenizer) -> tuple[dict[str, str], str]:
    """``({doc id: text}, separator)``: each document as a retriever reads it, its title and body joined by
    ``finetune.title_join`` (``sep``: the release's, Tevatron's, ``title [SEP] text``; ``space``)."""
    try:
        separator = title_separator(title_join, tokenizer)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    return {doc_id: document_text(doc.title, doc.text, separator) for doc_id, doc in dataset.corpus.items()}, separator


def judged_queries(dataset, negatives: dict, section: FinetuneSection | BeirRetrieverSection, seed: int):
    """The judged training queries of ``dataset`` (a seeded subset with ``max_train_queries``), their pools
    from ``negatives``."""
    return training_queries(dataset.queries, dataset.qrels["train"], negatives,
                            rel_threshold=dataset.rel_threshold("train"), max_queries=section.max_train_queries,
                            seed=seed, corpus_ids=dataset.corpus)


def broadcast_path(path: Path | None, dist) -> Path:
    """The main process's staging folder, known to every process."""
    if not dist.enabled:
        return Path(path)
    import torch.distributed

    holder = [str(path) if dist.is_main else None]
    torch.distributed.broadcast_object_list(holder, src=0)
    return Path(holder[0])


def _log_training_queries(tracking, dataset_dir: Path, queries, settings, left_out: int) -> None:
    """The training set as the run's dataset input, and its queries' negative pools and the queries whole
    batches left out as metrics."""
    tracking.log_dataset_inputs(dataset_dir, "training", splits=["train"])
    if tracking.active:
        stats = negative_pool_stats(queries, settings.n_negatives)
        tracking.log_metrics({f"train_queries/{key}": value for key, value in stats.items()}
                             | {"train_queries/left_out": left_out})


def _finished_retriever(work: RecipeWork, name: str, settings, tracking, is_main: bool):
    """``(model, tokenizer, losses)`` of a retriever an earlier run of the recipe finished, its logged steps
    replayed into this run and the run marked as resuming that one."""
    import json

    # here, not at the top: it loads numpy, torch
    from qac.train.finetune import start_retriever

    model, tokenizer = start_retriever(work.result(name) / "model", settings.for_retriever(name))
    training = json.loads((work.result(name) / "training.json").read_text(encoding="utf-8"))
    if is_main:
        for step, values in training["history"]:
            tracking.log_metrics(values, step=step)
        tracking.resumes(training.get("mlflow_run_id"), resumed=True, finished_phase=name)
    return model, tokenizer, training["losses"]


def _retriever_run(params: Params, name: str, variant: str, section, seed: int, stage: str, *, inputs, parent,
                   output: Path, is_main: bool, log_models: bool, root: Path):
    """The retriever's MLflow run, not yet open, nested under ``parent``: its settings, seed and identity."""
    description = {**variant_description(params, variant), "retriever": name}
    return tracked_stage(params, stage, variant_run_name(description, name), kind="finetune",
                         stage_params={**section, "seed": seed, "train_dataset": params.train_dataset,
                                       **description},
                         inputs=inputs, tags={"qac.retriever": name, "qac.variant": variant, "qac.seed": seed},
                         parent=parent, output=output, main=is_main, log_models=log_models, root=root)


def _fine_tune_in_run(name: str, start: Path, queries, dataset, passage_text: Mapping[str, str], settings, dist,
                      tracking, work: RecipeWork | None, encoding: dict, section_key: str):
    """``(model, tokenizer, losses)`` of a retriever trained in this run (from its work checkpoint, if any), its
    steps logged; with a work folder, saved there as a finished phase by the main process."""
    # here, not at the top: it loads numpy, torch
    from qac.train.finetune import fine_tune_retriever

    history: list[list] = []

    def on_step(step: int, values: dict) -> None:
        tracking.log_metrics(values, step=step)
        history.append([step, {key: value for key, value in values.items() if key not in THROUGHPUT}])

    def on_resume(info: dict) -> None:
        tracking.resumes(info["previous_run_id"], resumed=True, from_step=info["from_step"])

    checkpoint = work.checkpoint(name, tracking.run_id, on_resume) if work is not None else None
    model, tokenizer, losses = fine_tune_retriever(
        start, queries, list(dataset.corpus), passage_text, settings.for_retriever(name),
        device=dist.device, rank=dist.rank, world_size=dist.world_size,
        on_step=on_step if dist.is_main else None, checkpoint=checkpoint, section_key=section_key)
    if dist.is_main and work is not None:
        work.save_retriever(name, model, tokenizer, {"losses": losses, "history": history,
                                                     "mlflow_run_id": tracking.run_id}, **encoding)
    return model, tokenizer, losses


def _save_retriever_output(name: str, model, tokenizer, losses: list, encoding: dict, work: RecipeWork | None,
                           staging: Path, tracking, variant: str, start: Path) -> None:
    """The retriever's folder in the output (copied from its finished phase, or saved), logged and described."""
    import shutil

    if work is not None:
        shutil.copytree(work.result(name) / "model", staging / name)
    else:
        model.save(staging / name, tokenizer, **encoding)
    tracking.log_model(staging / name, "encoder")
    tracking.describe(variant=variant, retriever=name, start=str(start), steps=len(losses))


def train_retriever(name: str, negatives: dict, *, variant: str, params: Params, settings, dataset,
                    passage_text: Mapping[str, str], start: Path, parent, staging: Path, out_dir: Path, root: Path,
                    dist, inputs: Mapping[str, Path], title_separator: str = " ", log_models: bool = False,
                    section_key: str = "finetune", stage: str | None = None, query_set: str = "judged",
                    work: RecipeWork | None = None):
    """Fine-tune one retriever from ``start``, save it to ``staging/<name>``.

    ``section_key`` names the params section of the recipe (``finetune``; ``beir_retriever`` for
    Table 2's zero-shot retriever) and ``stage`` the DVC stage (default ``finetune@<variant>``);
    ``title_separator`` joined the documents' titles and bodies in ``passage_text``, which the saved
    folder records with the pooling and lengths it encodes with (:mod:`qac.models.encoding`);
    ``parent`` is the upstream output (:class:`qac.tracking.lifecycle.Upstream`) whose run it nests under;
    ``query_set`` chooses the training queries (:func:`qac.train.groups.retriever1_queries`).
    ``work``: the recipe's work folder (:class:`RecipeWork`): a retriever an earlier run finished is
    loaded from it (its logged steps replayed into this run), an unfinished one continues from its
    checkpoint. Returns the model, the tokenizer, the training queries, the per-step losses and the queries
    whole batches left out.
    """
    # here, not at the top: it loads numpy, torch
    from qac.train.finetune import check_whole_batches

    section = params[section_key]
    stage = stage or f"finetune@{variant}"
    # A seed copy of a variant (pretrain.variants.<name>.seed) trains with its own seed.
    seed = variant_seed(params, variant)
    queries = retriever1_queries(judged_queries(dataset, negatives, section, seed), query_set)
    # Before the model loads: the queries must fill whole batches (or be left out knowingly).
    left_out = check_whole_batches(len(queries), settings, where=f"{stage} {name}")
    with _retriever_run(params, name, variant, section, seed, stage, inputs=inputs, parent=parent,
                        output=out_dir / name, is_main=dist.is_main, log_models=log_models, root=root) as tracking:
        _log_training_queries(tracking, inputs["dataset"], queries, settings, left_out)
        encoding = dict(query_max_len=settings.query_max_len, passage_max_len=settings.corpus_length,
                        title_separator=title_separator)
        if work is not None and work.done(name):
            model, tokenizer, losses = _finished_retriever(work, name, settings, tracking, dist.is_main)
        else:
            model, tokenizer, losses = _fine_tune_in_run(name, start, queries, dataset, passage_text, settings, dist,
                                                         tracking, work, encoding, section_key)
        if dist.is_main:
            _save_retriever_output(name, model, tokenizer, losses, encoding, work, staging, tracking, variant, start)
    return model, tokenizer, queries, losses, left_out


# Settings that change how fast the recipe runs or what it logs, not what it computes: a work folder made
# with other values is still this run's.
NOT_SHAPING = ("log_every", "loader_workers", "prefetch_batches", "checkpoint_every")


def input_hashes(inputs: Mapping[str, Path]) -> dict[str, str]:
    """MD5 of each input file or folder (the hashes DVC uses), computed on the main process, known to all."""
    return broadcast_object(lambda: {name: path_md5(path) for name, path in inputs.items()})


def recipe_fingerprint(params: Params, variant: str, inputs_md5: Mapping[str, str],
                       section_key: str = "finetune") -> str:
    """Hash of what shapes a recipe's outputs: its settings (``finetune``, or ``beir_retriever`` for Table 2's
    zero-shot retriever), the seeds, the runs' depth and the MD5 of every input (:func:`input_hashes`: the
    pre-trained encoder, the negatives, the dataset)."""
    import hashlib
    import json

    shaping = {section_key: {key: value for key, value in params[section_key].items() if key not in NOT_SHAPING},
               "seed": params.seed, "variant_seed": variant_seed(params, variant), "depth": params.evaluate.depth,
               "train_dataset": params.train_dataset, "inputs_md5": dict(inputs_md5)}
    return hashlib.md5(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class RecipeWork:
    """A recipe's work folder, ``data/<profile>/.work/finetune/<variant>/`` (``.work/beir_retriever/<variant>/``
    for Table 2's zero-shot retriever; DVC sees neither).

    Each finished phase (``r1``, ``mined``, ``r2``; ``encoder``) is a folder ``<phase>/result`` renamed into place
    whole; each retriever's training saves its step checkpoint in ``<phase>/checkpoint`` every
    ``checkpoint_every`` steps. A run of the same fingerprint takes the finished phases as they are and
    continues an unfinished retriever from its checkpoint, so a killed stage loses at most
    ``checkpoint_every`` steps and its outputs are those of an uninterrupted run. A run of another
    fingerprint clears the folder first, saying so. The folder goes once the stage's output is in place.
    """

    folder: Path
    fingerprint: str
    checkpoint_every: int
    stage: str = "finetune"         # what its messages are signed with

    @classmethod
    def open(cls, folder: Path, fingerprint: str, checkpoint_every: int, dist,
             stage: str = "finetune") -> "RecipeWork":
        import shutil
        import sys

        if dist.is_main:
            stamp = folder / "fingerprint"
            try:
                found = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else None
            except (OSError, ValueError):          # unreadable: the work cannot be trusted
                found = None
            if (folder.exists() or folder.is_symlink()) and found != fingerprint:
                print(f"{stage}: discarding the work of an earlier run in {folder}: "
                      f"{'settings or inputs changed' if found else 'it has no readable fingerprint'}",
                      file=sys.stderr)
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder)
                else:                               # a file (or a link) where the folder belongs
                    folder.unlink()
            folder.mkdir(parents=True, exist_ok=True)
            stamp.write_text(fingerprint + "\n", encoding="utf-8")
        barrier()
        return cls(folder, fingerprint, checkpoint_every, stage)

    def result(self, phase: str) -> Path:
        return self.folder / phase / "result"

    # What a finished phase holds (a trained retriever's, unless named here); a result missing one of them,
    # or with one that cannot be read, is damaged.
    PHASE_FILES = {"mined": ("mined_negatives.jsonl", "r1_runs")}
    RETRIEVER_FILES = ("model", "training.json")

    def done(self, phase: str) -> bool:
        """Whether ``phase`` finished in an earlier run (decided on the main process, known to all). A result
        that cannot be used (a file missing or unreadable: a disk fault, a copy cut short) is discarded,
        saying why, and the phase runs again."""
        import shutil
        import sys

        def check() -> bool:
            result = self.result(phase)
            if not result.is_dir():
                return False
            problem = self._problem(phase)
            if problem is None:
                print(f"{self.stage}: {phase} taken as an earlier run finished it ({result})", file=sys.stderr)
                return True
            print(f"{self.stage}: discarding {result}: {problem}; {phase} runs again", file=sys.stderr)
            shutil.rmtree(result, ignore_errors=True)
            return False

        return broadcast_object(check)

    def _problem(self, phase: str) -> str | None:
        import json

        result = self.result(phase)
        missing = [name for name in self.PHASE_FILES.get(phase, self.RETRIEVER_FILES) if not (result / name).exists()]
        if missing:
            return f"{', '.join(missing)} missing"
        try:
            if phase == "mined":
                read_negatives(result / "mined_negatives.jsonl")
            else:
                training = json.loads((result / "training.json").read_text(encoding="utf-8"))
                if not (isinstance(training, dict) and isinstance(training.get("losses"), list)
                        and isinstance(training.get("history"), list)):
                    return "training.json lacks its losses or logged steps"

                read_encoding(result / "model")
                weights = sorted((result / "model").glob("*.safetensors"))
                if not weights:
                    return "model/ holds no weights"
                for path in weights:
                    weights_problem = _safetensors_problem(path)
                    if weights_problem:
                        return weights_problem
        except (OSError, ValueError) as error:      # DataFormatError and JSON errors are ValueErrors
            return f"it cannot be read ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
        return None

    def checkpoint(self, phase: str, run_id: str | None, on_resume) -> "WorkCheckpoint":
        # here, not at the top: it loads numpy, torch
        from qac.train.finetune import WorkCheckpoint

        return WorkCheckpoint(self.folder / phase / "checkpoint", self.checkpoint_every, self.fingerprint,
                              run_id=run_id, on_resume=on_resume)

    def save_retriever(self, phase: str, model, tokenizer, training: dict, **encoding) -> None:
        """The trained retriever and its training record (losses, logged steps, run) as the finished phase."""
        with atomic_path(self.result(phase), directory=True) as tmp:
            model.save(tmp / "model", tokenizer, **encoding)
            write_json(tmp / "training.json", training)


def _safetensors_problem(path: Path) -> str | None:
    """Why a weights file cannot be loaded (its header and sizes checked, as loading checks them), or None."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except Exception as error:      # noqa: BLE001 - safetensors raises its own error type for every fault
        return f"{path.name} cannot be read ({str(error).splitlines()[0][:200]})"
    return None


def loss_fact(name: str, losses: list[float]) -> str:
    """``r1 40 steps, final loss 1.234`` (the mean of the last tenth of the steps, less noisy than one step)."""
    if not losses:
        return f"{name} 0 steps"
    tail = losses[-max(1, len(losses) // 10):]
    return f"{name} {len(losses)} steps, final loss {sum(tail) / len(tail):.3f}"


@dataclass
class FinetuneOutcome:
    """What the two-stage recipe did, for the stage's summary line."""

    r1_losses: list[float] = field(default_factory=list)
    r2_losses: list[float] = field(default_factory=list)
    mined_per_query: float = 0.0
    training_queries: int = 0
    left_out: int = 0

    def facts(self) -> list[str]:
        return [loss_fact("r1", self.r1_losses), f"{self.mined_per_query:.1f} mined negatives per query",
                loss_fact("r2", self.r2_losses),
                f"{self.left_out} of {self.training_queries} training queries left out by whole batches"
                if self.left_out else ""]


def _mine_with_retriever1(r1, tokenizer, mining_queries, passage_text, dataset, settings, separator, *, params: Params,
                          variant: str, dist, into: Path, file_name: str) -> None:
    """Retriever 1's mined negatives and its in-domain runs, written whole into ``into`` (the recipe's work
    folder for the phase ``mined``) by the main process. The corpus is encoded once for both."""
    # here, not at the top: it loads numpy
    from qac.retrieval.dense import search_splits
    # here, not at the top: it loads numpy, torch
    from qac.train.mining import encode_corpus, mine_with_retriever

    section = params.finetune
    encode_options = dict(batch_size=section.encode_batch_size, loader_workers=section.loader_workers, dist=dist)
    corpus = encode_corpus(r1, tokenizer, passage_text, passage_max_len=settings.corpus_length, **encode_options)
    records = mine_with_retriever(
        r1, tokenizer, mining_queries, passage_text, depth=section.mine_depth,
        skip_top=section.mine_skip_top, sample=section.mine_sample, seed=variant_seed(params, variant),
        query_max_len=settings.query_max_len, passage_max_len=settings.corpus_length, corpus=corpus,
        **encode_options)
    encoding = run_encoding(query_max_len=settings.query_max_len, passage_max_len=settings.corpus_length,
                            pooling=r1.pooling, separator=separator, depth=params.evaluate.depth)
    runs = search_splits(r1, tokenizer, dataset, *corpus, query_max_len=settings.query_max_len,
                         depth=encoding["depth"], device=dist.device, **encode_options)
    del corpus
    if dist.is_main:
        with atomic_path(into, directory=True) as mined:
            write_jsonl(mined / file_name, records)
            write_indomain_runs(mined / RUNS_FOLDER, runs, encoding, tag=variant)


def _checked_inputs(params: Params, variant: str) -> dict[str, Path]:
    """The recipe's inputs (the pre-trained encoder, BM25's negatives, the in-domain dataset), each present
    and as the lock records it, before anything is read."""
    root = profile_dir(params)
    start = root / "pretrain" / variant / "encoder"
    if not start.is_dir():
        raise SystemExit(f"{start}: no pre-trained encoder (run the pretrain@{variant} stage)")
    inputs = {"encoder": start, "bm25_negatives": root / "bm25" / "negatives.jsonl",
              "dataset": root / "datasets" / params.train_dataset}
    verify_inputs(params, list(inputs.values()))
    return inputs


def _copy_phase(phase: Path, staging: Path, file_name: str, is_main: bool) -> None:
    """The mined negatives and retriever 1's in-domain runs, from the finished phase into the output folder
    (by the main process; every process waits for it)."""
    import shutil

    if is_main:
        shutil.copy2(phase / file_name, staging / file_name)
        shutil.copytree(phase / RUNS_FOLDER, staging / RUNS_FOLDER)
    barrier()


def _training_data(params: Params, variant: str, inputs: Mapping[str, Path]):
    """``(dataset, settings, passage_text, separator)``: the in-domain dataset (it must have a train split), the
    recipe's settings and the documents as the retrievers read them, before any process group is made."""
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer
    # here, not at the top: it loads numpy, torch
    from qac.train.finetune import FinetuneSettings

    dataset = load_prepared(inputs["dataset"])
    if "train" not in dataset.qrels:
        raise SystemExit(f"{inputs['dataset']}: dataset {dataset.name!r} has no train split to fine-tune on")
    section = params.finetune
    settings = FinetuneSettings.from_params(section, variant_seed(params, variant))
    passage_text, separator = retriever_texts(dataset, section.title_join, load_tokenizer(str(inputs["encoder"])))
    return dataset, settings, passage_text, separator


def _mined_negatives(r1, tokenizer, bm25_negatives: dict, mined_path: Path, *, params: Params, variant: str,
                     dataset, settings, passage_text, separator: str, work: RecipeWork, staging: Path, dist,
                     outcome: FinetuneOutcome) -> dict:
    """Retriever 1's mined negatives (mined now unless an earlier run finished the phase), copied into the output
    with its in-domain runs; their count per query goes to ``outcome``."""
    if not work.done("mined"):
        # Mined for every judged training query, those retriever 1 did not train on too (tevatron issue 81).
        mining_queries = judged_queries(dataset, bm25_negatives, params.finetune, variant_seed(params, variant))
        _mine_with_retriever1(r1, tokenizer, mining_queries, passage_text, dataset, settings, separator,
                              params=params, variant=variant, dist=dist, into=work.result("mined"),
                              file_name=mined_path.name)
    _copy_phase(work.result("mined"), staging, mined_path.name, dist.is_main)
    negatives = read_negatives(mined_path)
    outcome.mined_per_query = sum(map(len, negatives.values())) / len(negatives) if negatives else 0.0
    return negatives


def _train_both_retrievers(params: Params, variant: str, staging: Path, inputs: Mapping[str, Path], common: dict,
                           outcome: FinetuneOutcome) -> None:
    """The recipe in the output folder ``staging``: retriever 1 on BM25's negatives, its mined negatives, then
    retriever 2 on those; their losses and counts go to ``outcome``."""
    # looked up when called: tests stand in for it
    from qac.train.groups import read_negatives, retriever2_negatives

    section = params.finetune
    bm25_negatives = read_negatives(inputs["bm25_negatives"])
    r1, tokenizer, queries, outcome.r1_losses, outcome.left_out = train_retriever(
        "r1", bm25_negatives, staging=staging, inputs=inputs, query_set=section.r1_queries,
        **common)
    outcome.training_queries = len(queries)
    mined_path = staging / "mined_negatives.jsonl"
    negatives = _mined_negatives(r1, tokenizer, bm25_negatives, mined_path, params=params, variant=variant,
                                 dataset=common["dataset"], settings=common["settings"],
                                 passage_text=common["passage_text"], separator=common["title_separator"],
                                 work=common["work"], staging=staging, dist=common["dist"], outcome=outcome)
    negatives = retriever2_negatives(negatives, bm25_negatives, section.r2_use_bm25_negatives)
    del r1
    _, _, _, outcome.r2_losses, _ = train_retriever(
        "r2", negatives, staging=staging, inputs={**inputs, "mined_negatives": mined_path}, **common)


def fine_tune_variant(params: Params, variant: str, *, log_models: bool = False) -> FinetuneOutcome:
    """Run the two-stage recipe on ``variant``'s pre-trained encoder; writes ``data/<profile>/finetune/<variant>/``
    (``r1/``, ``r2/``, ``mined_negatives.jsonl``, ``r1_runs/``) as one unit. Runs alone or under ``torchrun``.

    ``log_models``: the retrievers go to MLflow as artifacts (also ``mlflow.log_models``).
    """
    import contextlib
    import shutil

    root = profile_dir(params)
    pretrain_dir = root / "pretrain" / variant
    inputs = _checked_inputs(params, variant)
    start = inputs["encoder"]
    dataset, settings, passage_text, separator = _training_data(params, variant, inputs)

    dist = init_distributed()
    require_even_split(settings.batch_size, dist.world_size, "finetune.batch_size")
    out_dir = root / "finetune" / variant
    work = RecipeWork.open(root / ".work" / "finetune" / variant,
                           recipe_fingerprint(params, variant, input_hashes(inputs)),
                           params.finetune.checkpoint_every, dist)
    # The pre-training run, when this store holds it; else the runs nest under the study run.
    common = dict(variant=variant, params=params, settings=settings, dataset=dataset, passage_text=passage_text,
                  start=start, title_separator=separator, log_models=log_models, dist=dist,
                  parent=Upstream(root, pretrain_dir, f"pretrain@{variant}"), out_dir=out_dir, root=root, work=work)
    outcome = FinetuneOutcome()
    # Only the main process writes the output folder, as one atomic unit.
    output = atomic_path(out_dir, directory=True) if dist.is_main else contextlib.nullcontext(None)
    try:
        with output as staging:
            staging = broadcast_path(staging, dist)
            _train_both_retrievers(params, variant, staging, inputs, common, outcome)
            barrier()
        # The output is in place (renamed whole): only now may the work go.
        if dist.is_main:
            shutil.rmtree(work.folder, ignore_errors=True)
    finally:
        cleanup()
    return outcome
