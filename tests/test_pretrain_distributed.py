"""Two processes under torchrun train like one process on the same global batch, where that is deterministic.

Which layouts give identical weights (docs/architecture.md, "Resuming and repeatability"):

- dropout 0 and float64: one process and two compute the same mathematics on
  the same global batch (DDP averages the gradients; the losses are written to
  equal the one-process loss), so losses and weights agree to float64
  rounding, ~1e-12, on any thread count, BLAS or machine. This is tested.
- dropout on: every process draws its own masks (seeded with ``seed + rank``),
  so 1 and 2 processes give different weights; this is tested too, so that the
  documentation is changed if it ever stops being true.
- float32: the same mathematics, but its rounding (1e-7 of a gradient) is
  amplified by Adam's division by the root of tiny second moments into weight
  differences of up to a fraction of a step that depend on the machine; not
  compared here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from qac.train.pretrain import PretrainSettings, pretrain
from test_pretrain_corpus import write_corpus, write_master_inputs
# Speed figures (padding efficiency included: each process pads its own share) depend on the layout.
from qac.train.throughput import SPEED_KEYS
from base_settings import pretrain_values

REPO = Path(__file__).resolve().parent.parent

# The deterministic layouts: dropout 0, float64.
CONFIGS = {
    "cocondenser": dict(method="cocondenser"),
    "cocondenser-cached": dict(method="cocondenser", grad_cache_chunk=3),
    "cotmae-release": dict(method="cotmae", cotmae_decoder="release"),
    "master": dict(method="master", passage_context="next", master_dor_queries=2),
}
# A layout that is not: dropout masks are drawn per process.
DROPOUT = {"cocondenser-dropout": dict(method="cocondenser", dropout=0.1)}
COMMON = pretrain_values(seed=42, init="tiny:minilm", context_type="mixed", query_count=3, max_len=40, query_max_len=12,
                         steps=3, batch_size=8, skip_from=1, n_head_layers=1, lr=1e-3, warmup_ratio=0.0,
                         checkpoint_every=100, log_every=1, dropout=0.0, dtype="fp64")
EPS = torch.finfo(torch.float64).eps
ADAM_EPS = 1e-8     # torch.optim.AdamW's default, which qac.train.optim keeps
ROUNDING = 1e4 * EPS  # relative rounding of a loss or gradient summed through the network, ~2e-12


def weight_tolerance(steps: int, lr: float) -> float:
    """How far float64 rounding alone can move a weight in ``steps`` AdamW steps.

    A step moves a weight by ``lr * m / (sqrt(v) + ADAM_EPS)``. Gradients of
    order 1 that differ by ``ROUNDING`` change that by at most
    ``lr * ROUNDING / ADAM_EPS`` (where the gradient itself is tiny; less
    elsewhere). About 7e-7 here: measured differences are ~6e-13, while any
    real difference in the computation (dropout masks, a wrong gradient) moves
    weights by 1e-4 or more.
    """
    return steps * lr * ROUNDING / ADAM_EPS


WORKER = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, {tests!r})
    from qac.distributed import cleanup, init_distributed
    from qac.train.pretrain import PretrainSettings, pretrain
    from test_pretrain_distributed import extra
    torch.set_num_threads(1)
    configs, common, data, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist = init_distributed()
    for name, overrides in configs.items():
        losses = {{}}
        settings = PretrainSettings.from_mapping({{**common, **overrides}})
        pretrain(settings, passages=f"{{data}}/passages.arrow", queries=f"{{data}}/queries.arrow",
                 work_dir=f"{{out}}/{{name}}/work", out_dir=f"{{out}}/{{name}}",
                 log=lambda step, metrics: losses.__setitem__(step, metrics), extra_inputs=extra(settings, data))
        if dist.is_main:
            json.dump(losses, open(f"{{out}}/{{name}}/losses.json", "w"))
    cleanup()
""")


def extra(settings, data) -> dict[str, str]:
    """MASTER's continuations and word frequencies (written by write_master_inputs); nothing for the others."""
    if settings.method != "master":
        return {}
    return {"continuations": f"{data}/continuations.arrow", "word_frequencies": f"{data}/word_frequencies.json"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    data = tmp_path / "data"
    write_corpus(data, documents=6, spans=3, queries=4)
    write_master_inputs(data)
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(REPO / "tests")))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(script),
               json.dumps({**CONFIGS, **DROPOUT}), json.dumps(COMMON), str(data), str(tmp_path / "ddp")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stderr[-4000:]

    def train_one_process(name: str, overrides: dict) -> dict[str, dict]:
        losses: dict[str, dict] = {}
        settings = PretrainSettings.from_mapping({**COMMON, **overrides})
        pretrain(settings, passages=data / "passages.arrow", queries=data / "queries.arrow",
                 work_dir=tmp_path / "one" / name / "work", out_dir=tmp_path / "one" / name,
                 log=lambda step, metrics: losses.__setitem__(str(step), metrics), extra_inputs=extra(settings, data))
        return losses

    def weights(layout: str, name: str) -> dict[str, torch.Tensor]:
        return torch.load(tmp_path / layout / name / "checkpoint" / "model.pt", weights_only=True)

    tolerance = weight_tolerance(COMMON["steps"], COMMON["lr"])
    for name, overrides in CONFIGS.items():
        single = train_one_process(name, overrides)
        ddp = json.loads((tmp_path / "ddp" / name / "losses.json").read_text())
        assert ddp.keys() == single.keys() == {"1", "2", "3"}
        for step in single:
            for part, value in single[step].items():
                if part == "lr" or part in SPEED_KEYS:
                    continue
                assert ddp[step][part] == pytest.approx(value, rel=ROUNDING, abs=ROUNDING), (name, step, part)
        one, two = weights("one", name), weights("ddp", name)
        assert one.keys() == two.keys()
        for key in one:
            assert one[key].dtype == torch.float64, key
            torch.testing.assert_close(two[key], one[key], rtol=0, atol=tolerance, msg=f"{name}: {key}")

    for name, overrides in DROPOUT.items():
        train_one_process(name, overrides)
        one, two = weights("one", name), weights("ddp", name)
        largest = max((two[key] - one[key]).abs().max().item() for key in one)
        assert largest > 10 * tolerance, f"{name}: 1 and 2 processes agree ({largest:.3g}) despite dropout"
