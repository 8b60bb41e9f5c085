"""Fine-tuning under torchrun equals fine-tuning in one process with the same global batch.

Two CPU processes (gloo) each encode half of every global batch; the gathered
InfoNCE loss (other processes' passages as negatives, loss times world size
against DDP's gradient averaging) must give the losses and the weights of a
single process that sees the whole batch. Dropout is off so both are exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from qac.models.biencoder import BiEncoder
from base_settings import finetune_settings

WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoTokenizer
    from qac.distributed import cleanup, init_distributed
    from qac.models.loading import load_model
    from qac.models.biencoder import BiEncoder
    from qac.train.finetune import FinetuneSettings, collate, train_biencoder
    from qac.train.groups import GroupSampler, TrainingQuery

    model_dir, out, settings = sys.argv[1], sys.argv[2], FinetuneSettings(**json.loads(sys.argv[3]))
    torch.set_num_threads(1)
    context = init_distributed()
    queries = [TrainingQuery(f"q{i}", f"query {i} about subject {i % 3}", (f"d{i}",),
                             tuple(f"d{(i + j) % 12}" for j in range(1, 5))) for i in range(8)]
    passage_text = {f"d{i}": f"document {i} with words {i * 7} and {i % 4}" for i in range(12)}
    sampler = GroupSampler(queries, sorted(passage_text), n_negatives=2, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    # The gradient of one global batch, before any optimizer (Adam hides gradient scale).
    model = BiEncoder(load_model(model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    wrapped = model
    if context.enabled:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    local = settings.batch_size // context.world_size
    batch = sampler.epoch(0)[context.rank * local:(context.rank + 1) * local]
    wrapped(*collate(batch, passage_text, tokenizer, settings)).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model = BiEncoder(load_model(model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    losses = train_biencoder(model, tokenizer, sampler, passage_text, settings,
                             device=context.device, rank=context.rank, world_size=context.world_size)
    if context.is_main:
        torch.save(model.state_dict(), out + ".pt")
        torch.save(grads, out + ".grad.pt")
        with open(out, "w") as handle:
            json.dump(losses, handle)
    cleanup()
    """
)


SETTINGS = json.dumps(dataclasses.asdict(finetune_settings(
    log_every=1, loader_workers=0, query_max_len=8, passage_max_len=12, train_n_passages=3, batch_size=4, epochs=2,
    lr=1e-3, warmup_ratio=0.25, seed=7, dtype="fp32")))


def _run(command: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_two_process_training_matches_single_process(tiny_bert_dir, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    _run([sys.executable, str(script), str(tiny_bert_dir), str(tmp_path / "single.json"), SETTINGS], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
          str(script), str(tiny_bert_dir), str(tmp_path / "ddp.json"), SETTINGS], tmp_path)

    single = json.loads((tmp_path / "single.json").read_text())
    ddp = json.loads((tmp_path / "ddp.json").read_text())
    assert len(single) == len(ddp) == 4  # 8 queries / batch 4 x 2 epochs
    # The two ranks' gradients are averaged by an all-reduce, the single process sums one batch: the same
    # float32 sums in another order (float32's epsilon relative each), carried through every update. A few
    # hundred epsilons per step bounds that; a rank training on other data moves the losses by far more.
    steps = len(single)
    assert ddp == pytest.approx(single, rel=256 * steps * float(np.finfo(np.float32).eps))

    single_grads = torch.load(tmp_path / "single.json.grad.pt")
    ddp_grads = torch.load(tmp_path / "ddp.json.grad.pt")
    assert single_grads.keys() == ddp_grads.keys()
    for name, value in single_grads.items():
        assert torch.allclose(value, ddp_grads[name], rtol=1e-4, atol=1e-7), name

    single_weights = torch.load(tmp_path / "single.json.pt")
    ddp_weights = torch.load(tmp_path / "ddp.json.pt")
    # Each process pads to its own longest text, so activations differ by float
    # rounding; Adam turns such noise on near-zero gradients into steps of up to
    # lr (1e-3) times a small factor, hence a tolerance of a tenth of one step.
    for name, value in single_weights.items():
        assert torch.allclose(value, ddp_weights[name], atol=1e-4), name
    start = BiEncoder.from_pretrained(tiny_bert_dir).state_dict()
    moved = max((single_weights[name] - start[name]).abs().max().item() for name in start)
    assert moved > 1e-4  # training changed the weights, so the comparison is not vacuous
