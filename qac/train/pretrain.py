"""The pre-training loop, shared by coCondenser, CoT-MAE and MASTER.

The model owns its forward pass and loss (qac.models); the loop samples pairs,
runs the optimisation steps, logs and checkpoints, whatever the method. Method
``none`` trains nothing: it exports the initial encoder, so the
no-pre-training baseline flows through the same pipeline.

Under ``torchrun`` every process builds the same global batch and trains on its
contiguous share (qac.data.context_pairs.shard); DDP averages the gradients and the
losses are written so that the result equals one process on the whole batch
(qac.models.losses).

The in-progress checkpoint lives in ``work_dir`` (outside the DVC output,
which DVC deletes before a stage runs); a rerun resumes from it only when the
settings and the input files (their MD5) are those that produced it, and
re-logs the loss history kept in it, so the resumed run's curve is complete.
At the end the final checkpoint and the exported encoder are written to
``out_dir``; the work directory is removed once the output is in its final
place (by :func:`pretrain` itself, or by the caller with ``remove_work=False``
after it has published a staged output), never before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from qac.config import checked_variant
from qac.console import progress
from qac.distributed import (autocast_dtype as pick_autocast, barrier, broadcast_object, init_distributed,
                             require_even_split)
from qac.io import atomic_path, file_md5
from qac.params.variants import variant_settings
from qac.train.checkpoint import DamagedCheckpoint, STATE_FILE, load_checkpoint, read_state, save_checkpoint
from qac.train.finite import check_step, suspects_of
from qac.train.optim import build_optimizer
from qac.train.step_log import THROUGHPUT

LogFn = Callable[[int, dict[str, float]], None]
# Settings that change how fast a run goes, not what it computes: left out of the fingerprint,
# so a resume with other values continues the same run.
NOT_SHAPING = ("log_every", "checkpoint_every", "loader_workers", "prefetch_batches")

# Keys added after runs were fingerprinted, with the value every earlier run had: left out of the hash at that
# value, so the work checkpoints of those runs keep their fingerprints and resume.
BEFORE_SWITCHES = {"unpadded": False, "passage_context_draw": "step", "decay_exempt": "names",
                   "master_decoder_init": "bert", "master_dor_crop": "start", "master_empty_continuation": "no_label"}


@dataclass(frozen=True)
class PretrainSettings:
    """One variant's settings: ``pretrain.common`` overridden by ``pretrain.variants.<name>``."""

    method: str
    init: str
    context_type: str
    query_count: int
    max_len: int
    query_max_len: int
    steps: int
    batch_size: int  # pairs per optimizer step, over all processes
    grad_accumulation: int
    lr: float
    weight_decay: float
    warmup_ratio: float
    mlm_probability: float
    temperature: float
    grad_cache_chunk: int  # 0: no gradient caching (coCondenser only)
    n_head_layers: int
    skip_from: int
    cocondenser_loss_weights: str  # paper: MLM + head MLM + contrastive (Eq. 7); release: 2:2:1
    cotmae_mask_ratio: float
    cotmae_decoder: str
    cotmae_decoder_layers: int
    cotmae_decoder_weight: float
    cotmae_attention_window: int
    cotmae_decoder_mask_ratio: float
    master_decoders: tuple[str, ...]  # any subset of mkp, cmp, npr, dor, gor
    master_mask_ratio: float
    master_decoder_mask_ratio: float
    master_decoder_layers: int
    master_weights: dict[str, float]
    master_dor_queries: int  # generated queries joined into the DOR decoder's text
    master_npr_mask: str  # uniform | keyword: NPR's words masked with MKP's TF-IDF weights (MASTER's)
    master_decoder_init: str  # bert | torch: the decoder layers' start (torch: PyTorch's defaults, the release's)
    master_dor_crop: str  # start | window: where DOR's joined queries over max_len are cut (window: the release's)
    master_empty_continuation: str  # no_label | anchor: GOR's target for an empty continuation (anchor: the release's)
    mixed_query_prob: float
    passage_context: str | list[str]  # one kind, or the kinds a pair draws among (the release's mixed)
    decay_exempt: str  # names: biases and LayerNorm-named weights; norm_layers: every LayerNorm module (HF Trainer)
    passage_context_draw: str  # step: drawn again at every step; once: one partner per anchor for the run (release)
    single_span_documents: str  # drop | self: a single-span document's passage paired with itself (release)
    spans: str  # split.spans: overflow crops a passage over max_len at random (release)
    pad_to: int | None  # None: dynamic padding to the longest sequence of a batch side
    pad_to_multiple_of: int  # dynamic lengths and masked-position counts rounded up to a multiple of this
    unpadded: bool  # each batch side one token stream (qac.data.streams): no compute on padding
    dropout: float | None  # None: the init checkpoint's dropout; 0 for exactly repeatable runs
    checkpoint_every: int
    log_every: int
    dtype: str  # auto, bf16, fp16, fp32; fp64 trains in float64 (repeatability checks)
    compile: bool  # torch.compile the model (same loss to float tolerance)
    loader_workers: int  # DataLoader worker processes collating batches (0: in the loop)
    prefetch_batches: int  # steps collated ahead per worker
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any], variant: str) -> "PretrainSettings":
        """Variant ``variant`` of a checked params file: ``pretrain.common`` with the variant's keys over it,
        its seed (a seed copy's own, else the global one) and how the split stage cut the passages
        (``split.spans``)."""
        return cls.from_mapping(variant_settings(params, checked_variant(params, variant)))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "PretrainSettings":
        """Settings from one mapping holding every key (``pretrain.common``'s, the variant's, seed and spans)."""
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self, inputs_md5: Mapping[str, str] | None = None) -> str:
        """Hash of everything that shapes the weights: the settings (logging cadence left
        out) and the MD5 of each input file (``{"passages": ..., "queries": ...}``)."""
        shaping = {k: v for k, v in self.to_dict().items() if k not in NOT_SHAPING
                   and not (k in BEFORE_SWITCHES and v == BEFORE_SWITCHES[k])}
        if inputs_md5:
            shaping["inputs_md5"] = dict(inputs_md5)
        return hashlib.md5(json.dumps(shaping, sort_keys=True).encode()).hexdigest()

    @property
    def run_name(self) -> str:
        if self.method == "none":
            return "pretrain/none"
        return f"pretrain/{self.method}/{self.context_type}/q{self.query_count}"


def export_init_encoder(settings: PretrainSettings, path: str | Path) -> None:
    """Write the initial encoder unchanged as a Hugging Face folder (method ``none``)."""
    from transformers import BertModel

    # here, not at the top: it loads safetensors
    from qac.models.loading import load_model, load_tokenizer

    model = load_model(settings.init, BertModel, seed=settings.seed)
    with atomic_path(path, directory=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(settings.init).save_pretrained(tmp)


def inputs_md5(passages: str | Path, queries: str | Path | None,
               extra: Mapping[str, str | Path | None] | None = None) -> dict[str, str]:
    """MD5 of the files a run reads (the hash DVC uses), computed once and shared by every process."""
    def compute() -> dict[str, str]:
        files = {"passages": passages, "queries": queries, **(extra or {})}
        return {name: file_md5(path) for name, path in files.items() if path is not None}

    return broadcast_object(compute)


def resume_decision(state: Mapping[str, Any] | None, fingerprint: str,
                    inputs: Mapping[str, str]) -> tuple[bool, str | None]:
    """``(resume, why_not)`` for the work checkpoint ``state`` (None: there is none).

    A checkpoint is resumed only when its fingerprint (settings and inputs) is
    this run's; otherwise ``why_not`` says which inputs changed, or that the
    settings did.
    """
    if state is None:
        return False, None
    if "damaged" in state:
        return False, f"it is damaged: {state['damaged']}"
    if state.get("fingerprint") == fingerprint:
        return True, None
    before = state.get("inputs_md5")
    if not before:
        return False, "settings or inputs changed (the checkpoint records no input hashes)"
    changed = [f"{name} {before.get(name, 'unknown')} -> {md5}" for name, md5 in inputs.items()
               if before.get(name) != md5]
    if changed:
        return False, "inputs changed: " + ", ".join(changed)
    return False, "settings changed"


def results_only_state(checkpoint: str | Path) -> None:
    """Strip bookkeeping from a checkpoint's ``state.json`` that becomes a DVC output.

    The work checkpoint keeps the MLflow run id (a resumed run links the killed
    one) and the throughput of each logged step; in the output they would give
    a byte-identical retrain another hash and rerun every stage downstream.
    """
    import json

    path = Path(checkpoint) / STATE_FILE
    state = json.loads(path.read_text(encoding="utf-8"))
    state.pop("mlflow_run_id", None)
    state["history"] = [[step, {key: value for key, value in metrics.items() if key not in THROUGHPUT}]
                        for step, metrics in state.get("history") or []]
    path.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")


def _to_device(batch: dict, device: torch.device) -> dict:
    # here, not at the top: it loads numpy
    from qac.data.streams import to_device

    return {side: to_device(tensors, device) for side, tensors in batch.items()}


class StepBatches(torch.utils.data.Dataset):
    """Item ``k``: this process's collated micro-batches of step ``first_step + k``.

    A step's pairs and masks are a pure function of ``(seed, step)``
    (qac.data.context_pairs), so the batches are the same whichever worker process
    collates them, and with any number of workers.
    """

    def __init__(self, sampler, collator, batch_size: int, accumulation: int, rank: int, world: int,
                 first_step: int, steps: int):
        self.sampler, self.collator = sampler, collator
        self.batch_size, self.accumulation, self.rank, self.world = batch_size, accumulation, rank, world
        self.first_step, self.steps = first_step, steps

    def __len__(self) -> int:
        return max(0, self.steps - self.first_step)

    def __getitem__(self, index: int) -> tuple[int, list[dict]]:
        # here, not at the top: it loads numpy, pyarrow
        from qac.data.context_pairs import shard

        step = self.first_step + index
        pairs = self.sampler.batch(step, self.batch_size)
        micro = self.batch_size // self.accumulation
        return step, [self.collator(shard(pairs[m * micro:(m + 1) * micro], self.rank, self.world), step)
                      for m in range(self.accumulation)]


def step_loader(batches: StepBatches, workers: int, prefetch: int, device: torch.device):
    """A DataLoader over :class:`StepBatches`, in step order: ``workers`` processes collate
    ahead (``prefetch`` steps each), into pinned memory when the model is on a GPU."""
    # Its own generator: the loader draws its workers' base seed from it, and a draw from the
    # global one would move the dropout masks (and a resumed run would draw it twice).
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False, num_workers=workers,
                                       pin_memory=device.type == "cuda",
                                       prefetch_factor=prefetch if workers else None,
                                       persistent_workers=False, generator=torch.Generator().manual_seed(0))


def build_step(module, model, settings: PretrainSettings, device, autocast_dtype):
    """Gradient-cached step for coCondenser when ``grad_cache_chunk`` is set, the plain step otherwise."""
    # here, not at the top: it loads numpy
    from qac.models.grad_cache import FullBatchStep, GradCachedStep

    # CoT-MAE has no in-batch loss, so there is nothing to cache: the chunk setting is ignored.
    if settings.grad_cache_chunk and model.supports_grad_cache:
        return GradCachedStep(module, settings.grad_cache_chunk, device, autocast_dtype)
    return FullBatchStep(module, device, autocast_dtype)


def pretrain(settings: PretrainSettings, *, passages: str | Path, queries: str | Path | None,
             work_dir: str | Path, out_dir: str | Path, log: LogFn | None = None,
             full_vocab_logits: bool = False, run_id: str | None = None,
             on_resume: Callable[[dict[str, Any]], None] | None = None,
             remove_work: bool = True, extra_inputs: Mapping[str, str | Path] | None = None) -> dict[str, Any]:
    """Run (or resume) one variant; writes ``out_dir/encoder`` and ``out_dir/checkpoint``.

    ``log(step, metrics)`` is called on the main process every ``log_every``
    steps; on a resume it is first called again for every step the checkpoint
    had logged. ``on_resume(info)`` is called once on the main process when a
    work checkpoint was found: ``resumed_from_step``, ``discarded_checkpoint``,
    ``discard_reason`` and ``previous_run_id`` (the ``run_id`` of the run that
    wrote it). ``remove_work=False`` leaves the work directory for the caller
    to remove once it has published ``out_dir``. ``extra_inputs`` names the
    other files a method reads (MASTER: ``continuations``, ``word_frequencies``;
    :func:`qac.models.factory.required_inputs`); they join the fingerprint. Returns a summary: steps run,
    where training resumed, corpus counts, the model's settings.
    """
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.context_pairs import load_pair_corpus
    # looked up when called: tests stand in for it
    from qac.models.factory import build_batches, build_pretraining_model
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer
    # here, not at the top: it loads numpy
    from qac.models.losses import all_reduce_sum

    out_dir, work_dir = Path(out_dir), Path(work_dir)
    dist = init_distributed()
    if settings.method == "none":
        if dist.is_main:
            export_init_encoder(settings, out_dir / "encoder")
        return {"method": "none", "steps": 0}

    world = dist.world_size
    require_even_split(settings.batch_size, world, "batch_size (pretrain.common or the variant's)",
                       settings.grad_accumulation, "grad_accumulation")
    device = dist.device
    torch.manual_seed(settings.seed + dist.rank)   # each process draws its own dropout masks

    tokenizer = load_tokenizer(settings.init)
    model = build_pretraining_model(settings, seed=settings.seed,
                                    full_vocab_logits=full_vocab_logits).to(device)
    if settings.dtype in ("fp64", "float64"):
        # Float64 makes runs that compute the same mathematics agree to ~1e-12
        # whatever the process count or BLAS (docs/architecture.md, "Resuming and repeatability").
        model = model.double()
    corpus = load_pair_corpus(passages, queries, settings.context_type, passage_context=settings.passage_context,
                              query_count=settings.query_count, tokenizer=tokenizer, tokenizer_name=settings.init,
                              single_span=settings.single_span_documents)
    extra_inputs = dict(extra_inputs or {})
    sampler, collator = build_batches(settings, model, tokenizer, corpus, {"queries": queries, **extra_inputs})
    optimizer, scheduler = build_optimizer(model, lr=settings.lr, weight_decay=settings.weight_decay,
                                           warmup_ratio=settings.warmup_ratio, total_steps=settings.steps,
                                           device=device, decay_exempt=settings.decay_exempt)
    amp_dtype = pick_autocast(settings.dtype, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    checkpoint_dir = work_dir / "checkpoint"
    start_step = 0
    inputs = inputs_md5(passages, queries, extra_inputs)
    fingerprint = settings.fingerprint(inputs)
    history: list[list] = []        # [step, metrics] of every logged step, kept in the checkpoint
    state = read_state(checkpoint_dir)
    # A checkpoint of other settings or other input data is not resumed; the
    # first checkpoint of this run replaces it.
    resume, discard_reason = resume_decision(state, fingerprint, inputs)
    if resume:
        try:
            state = load_checkpoint(checkpoint_dir, model=model, optimizer=optimizer, scheduler=scheduler,
                                    scaler=scaler, device=device, rank=dist.rank)
        except DamagedCheckpoint as damaged:      # nothing was restored: the run starts over
            resume, discard_reason = False, f"it is damaged: {damaged}"
        else:
            start_step = state["step"]
            history = list(state.get("history") or [])
    discarded_checkpoint = state is not None and not resume
    if state is not None and dist.is_main:
        if discarded_checkpoint:
            at = f" at step {state['step']}" if state.get("step") is not None else ""
            print(f"pretrain: discarding the work checkpoint{at} in {checkpoint_dir}: "
                  f"{discard_reason}", file=sys.stderr)
        else:
            print(f"pretrain: resuming from step {start_step} ({checkpoint_dir})", file=sys.stderr)
        if on_resume is not None:
            on_resume({"resumed_from_step": start_step, "discarded_checkpoint": discarded_checkpoint,
                       "discard_reason": discard_reason, "previous_run_id": state.get("mlflow_run_id")})
    if log is not None and dist.is_main:
        for logged_step, logged in history:      # the resumed run's curve starts at step 1 too
            log(logged_step, logged)

    module = model
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel

        module = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                         broadcast_buffers=False)
    if settings.compile:
        module = torch.compile(module)
    step_fn = build_step(module, model, settings, device, amp_dtype)
    accumulation = settings.grad_accumulation

    def checkpoint(step: int) -> None:
        save_checkpoint(checkpoint_dir, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                        step=step, data_position=step * settings.batch_size,
                        fingerprint=fingerprint, device=device, rank=dist.rank,
                        extra={"inputs_md5": inputs, "history": history, "mlflow_run_id": run_id})

    # here, not at the top: it loads numpy
    from qac.train.flops import META
    # looked up when called: tests stand in for it
    from qac.train.throughput import SPEED_KEYS, ThroughputWindow, peak_flops

    suspects = suspects_of(settings, lambda field: f"pretrain.common.{field}")
    model.train()
    device_name, peak = peak_flops(device)
    window = ThroughputWindow(peak)
    window_parts: dict[str, torch.Tensor] = {}
    last_metrics: dict[str, float] = {}
    batches = step_loader(StepBatches(sampler, collator, settings.batch_size, accumulation, dist.rank, world,
                                      start_step, settings.steps),
                          settings.loader_workers, settings.prefetch_batches, device)
    bar = progress(total=settings.steps, initial=start_step, desc=f"pretrain {settings.method}", unit="step")
    loader = iter(batches)
    for step in range(start_step, settings.steps):
        waited = time.perf_counter()
        loaded_step, micro_batches = next(loader)
        window.waiting += time.perf_counter() - waited
        assert loaded_step == step
        step_loss = torch.zeros((), dtype=torch.float64, device=device)
        for micro, batch in enumerate(micro_batches):
            if window.flops_per_token is None:       # this run's first micro-batch: count a step's FLOPs once
                window.count_flops(model, batch, lambda replica, meta_batch: build_step(
                    replica, replica, settings, META, None).forward_backward(meta_batch))
            window.add_batch(batch)
            batch = _to_device(batch, device)
            last_micro = micro == accumulation - 1
            with contextlib.nullcontext() if last_micro or not dist.enabled else module.no_sync():
                parts = step_fn.forward_backward(batch, lambda loss: scaler.scale(loss / accumulation))
            # summed on the device: read only at logging steps (a read waits for the device)
            for name, value in parts.items():
                window_parts[name] = window_parts.get(name, 0.0) + value.double() / accumulation
            step_loss += parts["loss"].double()
        # The step's one read of the device: a NaN or infinite loss or gradient stops the run before the
        # update; the fp16 scaler's infinite gradients are its own signal to skip a step.
        check_step("pretrain", step + 1, step_loss, None if scaler.is_enabled() else model.parameters(), suspects)
        learning_rate = scheduler.get_last_lr()[0]
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        window.steps += 1
        window.pairs += settings.batch_size

        done = step + 1
        if done % settings.log_every == 0 or done == settings.steps:
            counts = all_reduce_sum(torch.tensor(window.counts(), dtype=torch.float64, device=device)).tolist()
            metrics = {name: float(value) / window.steps for name, value in window_parts.items()}
            metrics["lr"] = learning_rate
            metrics.update(window.report(*counts))
            if dist.is_main:
                history.append([done, {k: v for k, v in metrics.items() if k not in SPEED_KEYS}])
                if log is not None:
                    log(done, metrics)
            last_metrics = metrics
            bar.set_postfix({name: f"{value:.3f}" for name, value in metrics.items() if name.startswith("loss")},
                            refresh=False)
            window_parts = {}
        if done % settings.checkpoint_every == 0 or done == settings.steps:
            paused = time.perf_counter()
            checkpoint(done)
            window.pause(time.perf_counter() - paused)    # throughput leaves checkpoint writing out
        bar.update(1)
    bar.close()

    if dist.is_main:
        model.save_encoder(out_dir / "encoder", tokenizer)
        with atomic_path(out_dir / "checkpoint", directory=True) as tmp:
            shutil.copytree(checkpoint_dir, tmp, dirs_exist_ok=True)
            results_only_state(tmp)

    barrier()
    if remove_work and dist.is_main:
        shutil.rmtree(work_dir, ignore_errors=True)     # only now is the output complete in out_dir
    return {"method": settings.method, "steps": settings.steps, "resumed_from_step": start_step,
            "discarded_checkpoint": discarded_checkpoint, "discard_reason": discard_reason,
            "inputs_md5": inputs,
            "grad_cache": type(step_fn).__name__ == "GradCachedStep", "corpus": corpus.stats(),
            "model": model.describe(), "world_size": world, "final_metrics": last_metrics,
            "device": device_name, "peak_flops": peak, "loader_workers": settings.loader_workers,
            "flops_per_padded_token": window.flops_per_token or None}
