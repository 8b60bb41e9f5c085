"""Two nodes under torchrun give what one node gives with the same global batch.

``torchrun --nnodes 2 --nproc-per-node 1`` with c10d rendezvous on localhost:
two launcher processes, each a "node" with one process of LOCAL_RANK 0, global
ranks 0 and 1 assigned by the rendezvous in arrival order. Code that took
LOCAL_RANK for the rank would see two rank-0 processes: both would write
outputs, and the gathers would be out of order.

What is deterministic (tests/test_pretrain_distributed.py, test_finetune_ddp.py):
pre-training in float64 without dropout (losses to float64 rounding), the
fine-tuning loss and weights up to float32 padding rounding, encoding (each
text is encoded alone in its share), and query generation (byte-identical).

Each node runs in its own working directory with relative output paths, as two
machines without shared storage would: only global rank 0's directory may hold
outputs. Query generation commits chunks from every rank to a work directory
that rank 0 merges, so it needs storage both nodes see (docs/cluster.md); its
two nodes share one directory here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from mlflow_stores import empty_store
from test_pretrain_corpus import write_corpus
from test_pretrain_distributed import ROUNDING, weight_tolerance
from test_querygen_stage import STAGE, make_project, reference, subprocess_env, t5_dir  # noqa: F401 (fixtures)
# Speed figures (padding efficiency included: each process pads its own share) depend on the layout.
from qac.train.throughput import SPEED_KEYS
from base_settings import finetune_settings, pretrain_values

REPO = Path(__file__).resolve().parent.parent

PRETRAIN = pretrain_values(method="cocondenser", seed=42, init="tiny:minilm", context_type="mixed", query_count=3,
                           max_len=40, query_max_len=12, steps=3, batch_size=8, skip_from=1, n_head_layers=1, lr=1e-3,
                           warmup_ratio=0.0, checkpoint_every=100, log_every=1, dropout=0.0, dtype="fp64")
FINETUNE = dataclasses.asdict(finetune_settings(query_max_len=8, passage_max_len=12, train_n_passages=3, batch_size=4,
                                                epochs=1, lr=1e-3, warmup_ratio=0.25, seed=7, dtype="fp32",
                                                log_every=1, loader_workers=0))
TEXTS = [f"passage {i} about topic {i % 3} with {'many ' * (i % 5)}words" for i in range(7)]

# Pre-training, fine-tuning of its encoder, and encoding with it: outputs under ./out, written by rank 0.
WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from qac.distributed import broadcast_object, cleanup, init_distributed
    from qac.models.loading import load_model
    from qac.retrieval.encode import encode_distributed
    from qac.models.biencoder import BiEncoder
    from qac.train.finetune import FinetuneSettings, train_biencoder
    from qac.train.groups import GroupSampler, TrainingQuery
    from qac.train.pretrain import PretrainSettings, pretrain

    torch.set_num_threads(1)
    pretrain_settings, data, texts = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    context = init_distributed()
    losses = {}
    pretrain(PretrainSettings.from_mapping(pretrain_settings), passages=f"{data}/passages.arrow",
             queries=f"{data}/queries.arrow", work_dir="out/pretrain-work", out_dir="out/pretrain",
             log=lambda step, metrics: losses.__setitem__(step, metrics))
    # Every node reads the encoder from rank 0's directory (after its write: the broadcast waits for it).
    encoder = broadcast_object(lambda: os.path.abspath("out/pretrain/encoder"))

    queries = [TrainingQuery(f"q{i}", f"query {i} about subject {i % 3}", (f"d{i}",),
                             tuple(f"d{(i + j) % 12}" for j in range(1, 5))) for i in range(8)]
    passage_text = {f"d{i}": f"document {i} with words {i * 7} and {i % 4}" for i in range(12)}
    settings = FinetuneSettings(**json.loads(sys.argv[4]))
    tokenizer = AutoTokenizer.from_pretrained(encoder)
    model = BiEncoder(load_model(encoder, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    finetune_losses = train_biencoder(model, tokenizer, GroupSampler(queries, sorted(passage_text), n_negatives=2,
                                      seed=3), passage_text, settings, device=context.device, rank=context.rank,
                                      world_size=context.world_size)

    embeddings = encode_distributed(load_model(encoder), tokenizer, texts, context, max_length=32, batch_size=2)
    if context.is_main:
        json.dump({"pretrain": losses, "finetune": finetune_losses, "ranks": context.world_size},
                  open("out/losses.json", "w"))
        torch.save(model.state_dict(), "out/finetuned.pt")
        np.save("out/embeddings.npy", embeddings)
    else:
        assert embeddings is None
    cleanup()
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **(extra or {})}


def run_two_nodes(command: list[str], directories: list[Path], env: dict, logs: Path, timeout: int = 300) -> None:
    """``command`` (a script and its arguments) under two torchrun launchers, node i started in ``directories[i]``."""
    endpoint, job = f"127.0.0.1:{_free_port()}", uuid.uuid4().hex
    logs.mkdir(parents=True, exist_ok=True)
    launchers = []
    for node, directory in enumerate(directories):
        with open(logs / f"node-{node}.log", "w") as log:
            launchers.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job, *command],
                cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        for launcher in launchers:
            launcher.wait(timeout=timeout)
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
    for node, launcher in enumerate(launchers):
        assert launcher.returncode == 0, (logs / f"node-{node}.log").read_text()[-4000:]


def files_under(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


@pytest.mark.slow
def test_two_nodes_pretrain_finetune_and_encode_like_one_node(tmp_path):
    data = tmp_path / "data"
    write_corpus(data, documents=6, spans=3, queries=4)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    nodes = [tmp_path / "node-a", tmp_path / "node-b"]
    single = tmp_path / "single"
    for directory in (*nodes, single):
        directory.mkdir()
    arguments = [json.dumps(PRETRAIN), str(data), json.dumps(TEXTS), json.dumps(FINETUNE)]

    result = subprocess.run([sys.executable, str(script), *arguments], cwd=single, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    # Which launcher the rendezvous makes rank 0 is not known in advance: run, then find the writer.
    run_two_nodes([str(script), *arguments], nodes, _env(), tmp_path / "logs")
    written = [node for node in nodes if (node / "out" / "losses.json").exists()]
    assert len(written) == 1, "exactly one node (global rank 0) writes the outputs"
    other = next(node for node in nodes if node not in written)
    assert files_under(other) == [], "the node of rank 1 wrote files"
    two = written[0] / "out"

    one_losses = json.loads((single / "out" / "losses.json").read_text())
    two_losses = json.loads((two / "losses.json").read_text())
    assert (one_losses["ranks"], two_losses["ranks"]) == (1, 2)
    assert one_losses["pretrain"].keys() == two_losses["pretrain"].keys() == {"1", "2", "3"}
    for step, metrics in one_losses["pretrain"].items():
        for part, value in metrics.items():
            if part != "lr" and part not in SPEED_KEYS:
                assert two_losses["pretrain"][step][part] == pytest.approx(value, rel=ROUNDING, abs=ROUNDING)
    one_weights = torch.load(single / "out" / "pretrain" / "checkpoint" / "model.pt", weights_only=True)
    two_weights = torch.load(two / "pretrain" / "checkpoint" / "model.pt", weights_only=True)
    tolerance = weight_tolerance(PRETRAIN["steps"], PRETRAIN["lr"])
    for key, value in one_weights.items():
        torch.testing.assert_close(two_weights[key], value, rtol=0, atol=tolerance, msg=key)

    # Fine-tuning in float32: each process pads to its own longest text (test_finetune_ddp.py's tolerances).
    assert len(one_losses["finetune"]) == 2
    assert two_losses["finetune"] == pytest.approx(one_losses["finetune"], abs=1e-5)
    one_tuned = torch.load(single / "out" / "finetuned.pt", weights_only=True)
    two_tuned = torch.load(two / "finetuned.pt", weights_only=True)
    for key, value in one_tuned.items():
        torch.testing.assert_close(two_tuned[key], value, rtol=0, atol=1e-4, msg=key)

    # Encoding: every text alone in its share, gathered on rank 0 in input order.
    one_embeddings, two_embeddings = np.load(single / "out" / "embeddings.npy"), np.load(two / "embeddings.npy")
    assert two_embeddings.shape == (len(TEXTS), one_embeddings.shape[1])
    np.testing.assert_allclose(two_embeddings, one_embeddings, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_two_nodes_generate_the_same_queries_as_one_node(tmp_path, t5_dir, reference):  # noqa: F811
    params = make_project(tmp_path, t5_dir)
    env = subprocess_env(params, empty_store(tmp_path / "mlflow.db"))
    run_two_nodes([str(STAGE)], [tmp_path, tmp_path], env, tmp_path / "logs")
    assert (tmp_path / "data" / "smoke" / "queries.arrow").read_bytes() == reference
    assert not (tmp_path / "data" / "smoke" / ".queries.work").exists()
    metrics = json.loads((tmp_path / "data" / "smoke" / "metrics" / "queries.json").read_text())
    assert metrics["passages"] == 14

    import mlflow

    runs = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs(["0"]) or [
        run for experiment in mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"]).search_experiments()
        for run in mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs([experiment.experiment_id])]
    generation = [run for run in runs if run.info.run_name == "generate_queries"]
    assert len(generation) == 1, "one MLflow run, opened by rank 0 alone"
    assert generation[0].data.tags["qac.world_size"] == "2"
