"""Faults of a multi-process run: each process ends in one paragraph, and none waits for hours.

Real processes on localhost with gloo: WORLD_SIZE and RANK left over in a shell without torchrun, a
global batch that the torchrun processes cannot share, and a rank killed while the other waits in a
collective.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qac.distributed import require_even_split
from qac.errors import UserError
from base_settings import pretrain_values

REPO = Path(__file__).resolve().parent.parent
LEFTOVERS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in LEFTOVERS}
    return {**env, "PYTHONPATH": str(REPO), "QAC_VERBOSE": "", "OMP_NUM_THREADS": "1", **extra}


def paragraphs(stderr: str, prog: str) -> list[str]:
    """The error paragraphs a process printed; no Python traceback beside them."""
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}: error: ")]


JOIN = "from qac.console import run_main\nfrom qac.distributed import init_distributed\n" \
       "run_main(lambda argv: init_distributed(), prog='join')\n"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_leftover_world_size_without_torchrun_ends_within_the_rendezvous_timeout(rank):
    """Rank 0 waits as the meeting's host, rank 1 as a guest: both give up after the bounded wait."""
    env = clean_env(WORLD_SIZE="2", RANK=rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                    QAC_RENDEZVOUS_TIMEOUT_MINUTES="0.05")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", JOIN], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    # Far below the collectives' 180 minutes; the bound itself is 3 s (plus the client's retry delay).
    assert time.monotonic() - started < 90
    (message,) = paragraphs(result.stderr, "join")
    assert f"rank {rank} of 2 could not meet the other ranks at 127.0.0.1:" in message
    assert "torchrun did not start this process" in message and "unset WORLD_SIZE" in message


def test_leftover_world_size_without_a_meeting_point_is_refused_at_once():
    result = subprocess.run([sys.executable, "-c", JOIN], env=clean_env(WORLD_SIZE="4", RANK="0"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    (message,) = paragraphs(result.stderr, "join")
    assert "WORLD_SIZE=4 and RANK=0 are set but MASTER_ADDR and MASTER_PORT not" in message


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "20000"])
def test_a_rendezvous_timeout_that_is_no_number_of_minutes_is_refused(value):
    env = clean_env(WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                    QAC_RENDEZVOUS_TIMEOUT_MINUTES=value)
    result = subprocess.run([sys.executable, "-c", JOIN], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    (message,) = paragraphs(result.stderr, "join")
    assert (f"QAC_RENDEZVOUS_TIMEOUT_MINUTES={value!r}: expected a number of minutes above 0 and at most 10080 "
            f"(a week), the wait for the other ranks") in message


@pytest.mark.parametrize("batch, world, accumulation, fits", [
    (8, 2, 1, True), (8, 2, 2, True), (8, 2, 4, True), (6, 4, 1, False), (8, 2, 3, False), (7, 1, 1, True),
    (12, 3, 2, True), (12, 3, 3, False)])
def test_a_global_batch_splits_only_into_equal_shares(batch, world, accumulation, fits):
    if fits:
        require_even_split(batch, world, "finetune.batch_size", accumulation, "grad_accumulation")
        return
    with pytest.raises(UserError) as refused:
        require_even_split(batch, world, "finetune.batch_size", accumulation, "grad_accumulation")
    message = str(refused.value)
    assert f"finetune.batch_size = {batch}" in message and f"a multiple of {world * accumulation}" in message
    # Every process count offered does divide the batch.
    offered = message.rsplit("(here: ", 1)[1].rstrip(")")
    counts = [] if offered == "none" else [int(n) for n in offered.split(", ")]
    assert all(batch % (n * accumulation) == 0 for n in counts)
    assert world not in counts


PRETRAIN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from qac.console import run_main
    from qac.train.pretrain import PretrainSettings, pretrain
    from base_settings import pretrain_values

    def main(argv):
        settings = PretrainSettings.from_mapping(pretrain_values(**{values!r}))
        # No corpus exists: the refusal has to come before any data is read.
        pretrain(settings, passages="missing/passages.arrow", queries="missing/queries.arrow",
                 work_dir="work", out_dir="out")

    run_main(main, prog="pretrain")
""")


@pytest.mark.slow
def test_a_batch_the_torchrun_processes_cannot_share_is_one_paragraph_per_rank_before_any_data(tmp_path):
    values = dict(seed=1, init="tiny:minilm", method="cocondenser", context_type="passage", batch_size=9,
                  grad_accumulation=1, steps=2, max_len=32, query_max_len=12)
    pretrain_values(**values)       # the values themselves are valid: only the process count makes them fail
    script = tmp_path / "worker.py"
    script.write_text(PRETRAIN.format(tests=str(REPO / "tests"), values=values))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(script)]
    result = subprocess.run(command, cwd=tmp_path, env=clean_env(HF_HUB_OFFLINE="1"), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0
    # torchrun's own summary of the failed workers follows; the workers themselves print no traceback.
    workers = result.stderr.split("Traceback (most recent call last)")[0]
    found = paragraphs(workers, "pretrain")
    # Each rank finds the problem before any data; torchrun stops the other rank (SIGTERM) as soon as the
    # first exits, so under load the second may be stopped before it prints: one paragraph or two, no more.
    assert 1 <= len(found) <= 2, result.stderr
    assert all("batch_size (pretrain.common or the variant's) = 9 does not split into equal shares over 2 "
               "torchrun process(es)" in line for line in found)
    assert not (tmp_path / "out").exists()


PEER = textwrap.dedent("""
    import os, signal, time
    import torch
    from qac.console import run_main
    from qac.distributed import init_distributed

    def main(argv):
        import torch.distributed as dist
        context = init_distributed()
        values = torch.ones(4)
        dist.all_reduce(values)
        if context.rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)    # killed: out of memory, a lost node, kill -9
        for _ in range(3):
            dist.all_reduce(values)

    run_main(main, prog="peer")
""")


@pytest.mark.slow
def test_the_survivor_of_a_killed_rank_ends_in_one_paragraph(tmp_path):
    port = str(free_port())
    processes = [subprocess.Popen([sys.executable, "-c", PEER], cwd=tmp_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=clean_env(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank),
                                                MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
                 for rank in (0, 1)]
    outcomes = [process.communicate(timeout=120) for process in processes]
    assert processes[1].returncode == -signal.SIGKILL
    assert processes[0].returncode == 2, outcomes[0][1]
    (message,) = paragraphs(outcomes[0][1], "peer")
    assert "rank 0 of 2 stopped because another process of this torchrun run ended" in message
    assert "GLHF" not in message     # the transport's cause, not its advice
