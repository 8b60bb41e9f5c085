"""One trial as a job: pre-train with the trial's values, fine-tune retriever 1, score it on dev.

The job's command line is :mod:`qac.cli.hpo_trial_command`::

    python -m qac.cli.hpo_trial_command --params TRIAL_PARAMS.yaml --out TRIAL_DIR
    torchrun --standalone --nproc-per-node 2 -m qac.cli.hpo_trial_command --params ... --out ...

The worker that starts this job reads its standard output. Lines starting
with ``@qac-hpo`` are events, one JSON object each::

    @qac-hpo {"kind": "intermediate", "step": 20, "value": 0.41}
    @qac-hpo {"kind": "result", "value": 0.45, "metrics": {"nDCG@10": 0.45, "RR@10": 0.40}}

An intermediate value is the dev metric after ``step`` fine-tuning steps; the
result is the dev metric of the finished retriever. Everything else on stdout
is log output. The job stops itself when its standard input reaches
end-of-file, which happens when the worker that started it dies.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from qac.config import profile_dir
from qac.data.prepared import load_prepared
from qac.distributed import barrier, init_distributed
from qac.hpo.study import HpoSettings
from qac.io import write_json
from qac.models.factory import INPUT_FILES, input_files
from qac.stages.finetune import retriever_texts
from qac.train.groups import GroupSampler, read_negatives, retriever1_queries, training_queries

if TYPE_CHECKING:
    from qac.params.sections import Params

EVENT_PREFIX = "@qac-hpo "
EVENT_KINDS = ("intermediate", "result")


def emit_event(kind: str, **fields: Any) -> None:
    """Print one event line for the worker (call on rank 0 only)."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    sys.stdout.write(EVENT_PREFIX + json.dumps({"kind": kind, **fields}) + "\n")
    sys.stdout.flush()


def parse_event(line: str) -> dict[str, Any] | None:
    """The event on ``line``, or None for an ordinary log line; a malformed event raises ValueError."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        event = json.loads(line[len(EVENT_PREFIX):])
    except json.JSONDecodeError as error:
        raise ValueError(f"malformed trial event ({error.msg}): {line.strip()!r}") from None
    if not isinstance(event, dict) or event.get("kind") not in EVENT_KINDS:
        raise ValueError(f"trial event without a known 'kind': {line.strip()!r}")
    value = event.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"trial event without a numeric 'value': {line.strip()!r}")
    if event["kind"] == "intermediate":
        step = event.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"intermediate event without a non-negative integer 'step': {line.strip()!r}")
        if not math.isfinite(value):
            raise ValueError(f"intermediate event with a non-finite value: {line.strip()!r}")
    return event


STOP_ON_EOF_ENV = "QAC_HPO_STOP_ON_EOF"


def stop_when_parent_goes() -> None:
    """Kill this process's group once standard input closes (the worker died).

    A pipe reaches end-of-file only when its last writer is gone; the worker
    holds the only write end, so this fires exactly when the worker exits,
    however it exits (``kill -9`` included). Every process of the job (the
    ``torchrun`` agent and each rank, which torchrun puts in groups of their
    own) inherits the pipe and runs the same watcher. Only active when the
    worker set ``QAC_HPO_STOP_ON_EOF=1`` (and so started the job in a process
    group of its own): a job started by hand from a shell is left alone.
    """
    if os.environ.get(STOP_ON_EOF_ENV) != "1":
        return

    def watch() -> None:
        # os.read on the raw descriptor: a daemon thread blocked in it does not
        # hold the lock of sys.stdin's buffer, which would abort interpreter exit.
        try:
            while os.read(0, 1 << 16):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="stop-when-parent-goes", daemon=True).start()



# --- the dev split ------------------------------------------------------------------

# Training queries a trial keeps for fine-tuning whatever hpo.dev.queries asks.
MIN_FINETUNE_QUERIES = 2


def queries_with_a_relevant_document(train_qrels: Mapping[str, Mapping[str, int]], rel_threshold: int = 1) -> list[str]:
    """The training queries that can be dev queries (sorted): those judged relevant to some document."""
    return sorted(qid for qid, judged in train_qrels.items()
                  if any(int(label) >= rel_threshold for label in judged.values()))


def carve_dev_queries(train_qrels: Mapping[str, Mapping[str, int]], n_queries: int, seed: int,
                      rel_threshold: int = 1) -> list[str]:
    """``n_queries`` training queries (with a relevant document) set aside for dev, by seeded hash.

    A query is chosen by the MD5 of ``"<seed>:<query id>"``, so the split does
    not depend on file order, on Python's hash seed or on the other queries:
    adding queries to the file never moves an existing query between train and
    dev unless it displaces one. At least two training queries must remain.
    """
    usable = queries_with_a_relevant_document(train_qrels, rel_threshold)
    if n_queries > len(usable) - MIN_FINETUNE_QUERIES:
        raise ValueError(f"hpo.dev.queries = {n_queries}, but the train split has only {len(usable)} queries "
                         f"with a relevant document; leave at least {MIN_FINETUNE_QUERIES} for fine-tuning")
    ranked = sorted(usable, key=lambda qid: hashlib.md5(f"{seed}:{qid}".encode()).hexdigest())
    return sorted(ranked[:n_queries])


def split_train_dev(train_qrels: Mapping[str, Mapping[str, int]], dev_qids: list[str]) -> tuple[dict, dict]:
    """The training judgements without the dev queries, and the dev queries' judgements."""
    dev = set(dev_qids)
    train = {qid: dict(judged) for qid, judged in train_qrels.items() if qid not in dev}
    return train, {qid: dict(train_qrels[qid]) for qid in dev_qids}


def dev_corpus_ids(corpus_ids: list[str], dev_qrels: Mapping[str, Mapping[str, int]],
                   negatives: Mapping[str, list[str]], max_documents: int | None, seed: int) -> list[str]:
    """The documents dev queries are searched in: the whole corpus, or a pool of ``max_documents``.

    A pool holds every document judged for a dev query, then the dev queries'
    BM25 negatives in query order (the hard part of the ranking) while there
    is room, then a seeded random sample of the rest; it keeps corpus order. Scores on a pool are higher than on the
    whole corpus: they rank trials, they are not results.
    """
    if max_documents is None or max_documents >= len(corpus_ids):
        return list(corpus_ids)
    known = set(corpus_ids)
    chosen = {doc for qid in dev_qrels for doc in dev_qrels[qid] if doc in known}   # always, even past the cap
    for qid in sorted(dev_qrels):
        for doc in negatives.get(qid, []):
            if len(chosen) >= max_documents:
                break
            if doc in known:
                chosen.add(doc)
    rest = [doc for doc in corpus_ids if doc not in chosen]
    room = max(max_documents - len(chosen), 0)
    chosen.update(random.Random(f"{seed}:dev-corpus").sample(rest, min(room, len(rest))))
    return [doc for doc in corpus_ids if doc in chosen]


# --- dev evaluation -----------------------------------------------------------------

class DevEvaluator:
    """Dense retrieval of the dev queries (exact inner-product search), scored with trec_eval semantics.

    ``passage_text`` holds the documents as the retriever reads them (titles joined as it was trained,
    :func:`qac.stages.finetune.retriever_texts`).
    """

    def __init__(self, dataset, passage_text: Mapping[str, str], doc_ids: list[str],
                 dev_qrels: Mapping[str, Mapping[str, int]], measures: list[str],
                 query_max_len: int, passage_max_len: int, depth: int, device, batch_size: int = 128):
        self.doc_ids = doc_ids
        self.doc_texts = [passage_text[doc_id] for doc_id in doc_ids]
        self.qids = sorted(dev_qrels)
        self.query_texts = [dataset.queries[qid] for qid in self.qids]
        self.qrels = dev_qrels
        self.measures = measures
        self.rel_threshold = dataset.rel_threshold("train")
        self.ignore_identical_ids = dataset.ignore_identical_ids
        self.query_max_len, self.passage_max_len = query_max_len, passage_max_len
        self.depth = depth
        self.device = device
        self.batch_size = batch_size

    def __call__(self, model, tokenizer) -> dict[str, float]:
        """Evaluate a :class:`~qac.models.biencoder.BiEncoder` (its training mode is restored)."""
        # here, not at the top: it loads numpy
        from qac.evaluation.metrics import evaluate
        # here, not at the top: it loads numpy
        from qac.retrieval.encode import encode_texts
        # here, not at the top: it loads numpy
        from qac.retrieval.search import dense_search

        def encode(texts: list[str], max_length: int):
            return encode_texts(model.encoder, tokenizer, texts, max_length=max_length, batch_size=self.batch_size,
                                pooling=model.pooling, normalize=model.normalize, device=self.device)

        passages = encode(self.doc_texts, self.passage_max_len)
        queries = encode(self.query_texts, self.query_max_len)
        # A dev corpus is small (hpo.dev.max_documents): exact search on the CPU leaves the GPU to training.
        run = dense_search(self.qids, queries, self.doc_ids, passages, k=self.depth, use_gpu=False)
        result = evaluate(self.qrels, run, self.measures, rel_threshold=self.rel_threshold,
                          ignore_identical_ids=self.ignore_identical_ids)
        return result.aggregate


# --- the job ------------------------------------------------------------------------------

def required_inputs(params: Params, variant: str) -> dict[Path, str]:
    """The files a trial reads, each with the DVC stage that writes it: the fine-tuning data, and what
    the pre-training stage reads for ``variant`` (:func:`qac.models.factory.input_files`)."""
    # here, not at the top: it loads pydantic, torch
    from qac.train.pretrain import PretrainSettings

    root = profile_dir(params)
    inputs = {root / "datasets" / str(params.train_dataset): f"prepare@{params.train_dataset}",
              root / "bm25" / "negatives.jsonl": "bm25"}
    for name, path in input_files(root, PretrainSettings.from_params(params, variant)).items():
        inputs[path] = INPUT_FILES[name][1]
    return inputs


def run_trial(params: Params, out_dir: Path) -> dict[str, Any]:
    """Pre-train, fine-tune retriever 1 and evaluate on dev; emits events on the main process.

    Returns the final dev metrics. Models go to ``out_dir/work`` (removed by the
    worker unless ``hpo.keep_models``); the dev query ids to ``out_dir/dev_queries.json``.
    """
    import dataclasses

    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer
    # here, not at the top: it loads numpy, torch
    from qac.train.finetune import FinetuneSettings, start_retriever, train_biencoder
    # here, not at the top: it loads pydantic, torch
    from qac.train.pretrain import PretrainSettings, pretrain

    settings = HpoSettings.from_params(params)
    dist = init_distributed()
    root = profile_dir(params)
    work = out_dir / "work"
    dataset_dir = root / "datasets" / params["train_dataset"]
    dataset = load_prepared(dataset_dir)
    if "train" not in dataset.qrels:
        raise SystemExit(f"{dataset_dir}: dataset {dataset.name!r} has no train split to carve dev queries from")
    rel_threshold = dataset.rel_threshold("train")
    dev_qids = carve_dev_queries(dataset.qrels["train"], settings.dev_queries, params["seed"], rel_threshold)
    train_qrels, dev_qrels = split_train_dev(dataset.qrels["train"], dev_qids)
    if dist.is_main:
        write_json(out_dir / "dev_queries.json", dev_qids)

    # Pre-training with the trial's values (written into the variant by the worker).
    pretrain_settings = PretrainSettings.from_params(params, settings.variant)
    if settings.pretrain_steps is not None and pretrain_settings.method != "none":
        pretrain_settings = dataclasses.replace(
            pretrain_settings, steps=settings.pretrain_steps,
            checkpoint_every=min(pretrain_settings.checkpoint_every, settings.pretrain_steps))
    # The files the pre-training stage reads for this variant (MASTER's continuations and word weights too).
    files = input_files(root, pretrain_settings)

    def log_pretrain(step: int, values: dict[str, float]) -> None:
        print(f"pretrain step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in values.items()), flush=True)

    pretrain(pretrain_settings, passages=root / "passages.arrow", queries=files.get("queries"),
             work_dir=work / "pretrain-work", out_dir=work / "pretrain", log=log_pretrain,
             extra_inputs={name: path for name, path in files.items() if name not in ("passages", "queries")})
    barrier()
    start = work / "pretrain" / "encoder"

    # Retriever 1 on BM25 negatives of the remaining training queries.
    section = params.finetune
    # Trained as the fine-tuning stage trains retriever 1 (qac.stages.finetune): its passage length, its model;
    # on_step every step, so that eval_every is honoured.
    r1 = FinetuneSettings.from_params(section, params.seed).for_retriever("r1")
    finetune_settings = dataclasses.replace(r1, log_every=1, epochs=settings.finetune_epochs or r1.epochs)
    all_negatives = read_negatives(root / "bm25" / "negatives.jsonl")
    negatives = {qid: docs for qid, docs in all_negatives.items() if qid in train_qrels}
    queries = training_queries(dataset.queries, train_qrels, negatives, rel_threshold=rel_threshold,
                               max_queries=section.max_train_queries, seed=params.seed,
                               corpus_ids=dataset.corpus)
    queries = retriever1_queries(queries, section.r1_queries)
    model, tokenizer = start_retriever(start, finetune_settings)
    # The documents as the stage's retrievers read them (finetune.title_join).
    passage_text, separator = retriever_texts(dataset, section.title_join, load_tokenizer(str(start)))
    sampler = GroupSampler(queries, list(dataset.corpus), finetune_settings.n_negatives, finetune_settings.seed)
    measures = list(dict.fromkeys([settings.metric, *params.evaluate.metrics]))
    doc_ids = dev_corpus_ids(list(dataset.corpus), dev_qrels, all_negatives, settings.dev_max_documents,
                             params["seed"])
    evaluator = DevEvaluator(dataset, passage_text, doc_ids, dev_qrels, measures, finetune_settings.query_max_len,
                             finetune_settings.corpus_length, params.evaluate.depth,
                             dist.device)
    last: dict[str, Any] = {}

    def on_step(step: int, values: dict[str, float]) -> None:
        if step % settings.eval_every or not dist.is_main:
            return
        metrics = evaluator(model, tokenizer)
        last.update(step=step, metrics=metrics)
        print(f"finetune step {step}: loss {values['loss']:.4f}, dev {settings.metric} "
              f"{metrics[settings.metric]:.4f}", flush=True)
        emit_event("intermediate", step=step, value=metrics[settings.metric])

    losses = train_biencoder(model, tokenizer, sampler, passage_text, finetune_settings,
                             device=dist.device, rank=dist.rank, world_size=dist.world_size, on_step=on_step)
    if not dist.is_main:
        return {}
    metrics = last["metrics"] if last.get("step") == len(losses) else evaluator(model, tokenizer)
    if settings.keep_models:
        model.save(work / "r1", tokenizer, query_max_len=finetune_settings.query_max_len,
                   passage_max_len=finetune_settings.corpus_length, title_separator=separator)
    emit_event("result", value=metrics[settings.metric], metrics=metrics,
               finetune_steps=len(losses), dev_queries=len(dev_qids), dev_documents=len(doc_ids))
    return metrics
