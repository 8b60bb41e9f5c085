"""A run killed with SIGKILL resumes from its checkpoint and ends with the same weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from test_pretrain_corpus import write_corpus, write_master_inputs
from base_settings import pretrain_values

REPO = Path(__file__).resolve().parent.parent

# Dropout stays on: resuming must restore the generator state too.
SETTINGS = pretrain_values(method="cocondenser", seed=42, init="tiny:minilm", context_type="query", query_count=3,
                           max_len=40, query_max_len=12, steps=8, batch_size=8, grad_accumulation=2, skip_from=1,
                           n_head_layers=1, lr=1e-3, checkpoint_every=2, log_every=2, dtype="fp32")
# The run is killed once a checkpoint of this step (or a later one) is on disk, with steps still to go.
KILL_AFTER = 2
# MASTER under the same guarantees: all five decoders, NPR on the next span, no GradCache.
MASTER = {**SETTINGS, "method": "master", "context_type": "passage", "passage_context": "next",
          "master_dor_queries": 2}
# CoT-MAE with the release decoder (GPT-2 block, dropout on its input, attention and residuals).
COTMAE = {**SETTINGS, "method": "cotmae", "cotmae_decoder": "release"}
RESUMED = {"cocondenser": SETTINGS, "master": MASTER, "cotmae-release": COTMAE}

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from qac.train.pretrain import PretrainSettings, pretrain
    torch.set_num_threads(1)
    settings, data, work, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    extra = ({"continuations": f"{data}/continuations.arrow", "word_frequencies": f"{data}/word_frequencies.json"}
             if settings["method"] == "master" else None)
    summary = pretrain(PretrainSettings.from_mapping(settings), passages=f"{data}/passages.arrow",
                       queries=f"{data}/queries.arrow", work_dir=work, out_dir=out, extra_inputs=extra)
    print(json.dumps(summary))
""")


def _command(script, data, work, out, settings=SETTINGS):
    return [sys.executable, str(script), json.dumps(settings), str(data), str(work), str(out)]


@pytest.mark.slow
@pytest.mark.parametrize("method", list(RESUMED))
def test_killed_run_resumes_to_the_uninterrupted_weights(tmp_path, method):
    settings = RESUMED[method]
    data = tmp_path / "data"
    write_corpus(data, documents=6, spans=3, queries=4)
    write_master_inputs(data)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}

    straight = subprocess.run(_command(script, data, tmp_path / "w1", tmp_path / "o1", settings), env=env,
                              capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]

    work, out = tmp_path / "w2", tmp_path / "o2"
    process = subprocess.Popen(_command(script, data, work, out, settings), env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    state_file = work / "checkpoint" / "state.json"
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if state_file.exists() and json.loads(state_file.read_text())["step"] >= KILL_AFTER:
            os.kill(process.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be interrupted"
    killed_at = json.loads(state_file.read_text())["step"]
    assert KILL_AFTER <= killed_at < SETTINGS["steps"] and not (out / "encoder").exists()

    resumed = subprocess.run(_command(script, data, work, out, settings), env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["resumed_from_step"] >= killed_at
    assert not work.exists()                       # the work checkpoint is moved out when done

    expected = torch.load(tmp_path / "o1" / "checkpoint" / "model.pt", weights_only=True)
    actual = torch.load(out / "checkpoint" / "model.pt", weights_only=True)
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    optimizer_a = torch.load(tmp_path / "o1" / "checkpoint" / "optimizer.pt", weights_only=True)
    optimizer_b = torch.load(out / "checkpoint" / "optimizer.pt", weights_only=True)
    assert all(torch.equal(optimizer_a["state"][k]["exp_avg"], optimizer_b["state"][k]["exp_avg"])
               for k in optimizer_a["state"])
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == SETTINGS["steps"]


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path):
    from qac.train.pretrain import PretrainSettings, pretrain

    data = tmp_path / "data"
    write_corpus(data, documents=3, spans=2, queries=2)
    settings = PretrainSettings.from_mapping({**SETTINGS, "steps": 2, "checkpoint_every": 1})
    work = tmp_path / "work"
    work.joinpath("checkpoint").mkdir(parents=True)
    work.joinpath("checkpoint", "state.json").write_text(json.dumps({"step": 1, "fingerprint": "other"}))
    summary = pretrain(settings, passages=data / "passages.arrow", queries=data / "queries.arrow",
                       work_dir=work, out_dir=tmp_path / "out")
    assert summary["discarded_checkpoint"] and summary["resumed_from_step"] == 0
    assert (tmp_path / "out" / "encoder" / "model.safetensors").exists()


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoint" / "model.pt", weights_only=True)


class Interrupt(Exception):
    """Stands for a kill: raised from the log callback after a checkpoint was written."""


def test_a_checkpoint_trained_on_other_inputs_is_not_resumed(tmp_path, capsys):
    from qac.train.pretrain import PretrainSettings, pretrain

    settings = PretrainSettings.from_mapping({**SETTINGS, "steps": 3, "checkpoint_every": 1})
    old, new = tmp_path / "old", tmp_path / "new"
    write_corpus(old, documents=3, spans=2, queries=2, seed=0)
    write_corpus(new, documents=3, spans=2, queries=2, seed=0)
    # The queries were regenerated (another top_k): same passages, other queries.
    from qac.data.arrowstore import open_queries, write_queries

    from qac.models.loading import load_tokenizer

    records = open_queries(old / "queries.arrow").to_pylist()
    write_queries(new / "queries.arrow", [{"pid": record["pid"], "queries": [f"{query} again" for query in
                                                                           record["queries"]]}
                                          for record in records], tokenizer=load_tokenizer("minilm"),
                  tokenizer_name="minilm")
    work = tmp_path / "work"
    pretrain(settings, passages=old / "passages.arrow", queries=old / "queries.arrow", work_dir=work,
             out_dir=tmp_path / "out-old", remove_work=False)    # leaves the checkpoint of step 3 behind
    notes = []
    summary = pretrain(settings, passages=new / "passages.arrow", queries=new / "queries.arrow", work_dir=work,
                       out_dir=tmp_path / "out-new", on_resume=notes.append)
    assert summary["discarded_checkpoint"] and summary["resumed_from_step"] == 0
    assert summary["discard_reason"].startswith("inputs changed: queries ")
    assert "passages" not in summary["discard_reason"]
    assert notes == [{"resumed_from_step": 0, "discarded_checkpoint": True,
                      "discard_reason": summary["discard_reason"], "previous_run_id": None}]
    assert "discarding the work checkpoint at step 3" in capsys.readouterr().err
    clean = tmp_path / "out-clean"
    pretrain(settings, passages=new / "passages.arrow", queries=new / "queries.arrow",
             work_dir=tmp_path / "work-clean", out_dir=clean)
    expected, actual = _weights(clean), _weights(tmp_path / "out-new")
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key


# optimizer.pt is read after model.pt, which loads: the model must still be untouched when it fails.
@pytest.mark.parametrize("file, how", [("state.json", "garbage"), ("optimizer.pt", "truncated")])
def test_a_damaged_work_checkpoint_is_discarded_and_the_run_starts_over(tmp_path, capsys, file, how):
    """The work checkpoint is a cache: one that cannot be read is said and replaced, never a traceback,
    and nothing of it reaches the model (every file is read before any state is set)."""
    from qac.train.pretrain import PretrainSettings, pretrain

    settings = PretrainSettings.from_mapping({**SETTINGS, "steps": 3, "checkpoint_every": 1})
    data = tmp_path / "data"
    write_corpus(data, documents=3, spans=2, queries=2, seed=0)
    work = tmp_path / "work"
    inputs = dict(passages=data / "passages.arrow", queries=data / "queries.arrow", work_dir=work)
    pretrain(settings, out_dir=tmp_path / "first", remove_work=False, **inputs)   # the checkpoint of step 3 stays
    path = work / "checkpoint" / file
    if how == "garbage":
        path.write_bytes(b"\xff{ not json")
    else:
        path.write_bytes(path.read_bytes()[:100])
    summary = pretrain(settings, out_dir=tmp_path / "again", **inputs)
    assert summary["discarded_checkpoint"] and summary["resumed_from_step"] == 0
    assert "damaged" in summary["discard_reason"] and file in summary["discard_reason"]
    assert "pretrain: discarding the work checkpoint" in capsys.readouterr().err
    expected, actual = _weights(tmp_path / "first"), _weights(tmp_path / "again")
    assert all(torch.equal(expected[key], actual[key]) for key in expected)     # trained again from the start


def test_a_resumed_run_logs_the_whole_loss_history_again(tmp_path):
    from qac.train.pretrain import PretrainSettings, pretrain

    settings = PretrainSettings.from_mapping({**SETTINGS, "steps": 4, "checkpoint_every": 2, "log_every": 1})
    data = tmp_path / "data"
    write_corpus(data, documents=3, spans=2, queries=2)
    files = dict(passages=data / "passages.arrow", queries=data / "queries.arrow")
    straight: dict[int, dict] = {}
    pretrain(settings, **files, work_dir=tmp_path / "w1", out_dir=tmp_path / "o1", log=straight.__setitem__)

    def killed_at_step_3(step, metrics):
        if step == 3:
            raise Interrupt
    with pytest.raises(Interrupt):
        pretrain(settings, **files, work_dir=tmp_path / "w2", out_dir=tmp_path / "o2", log=killed_at_step_3,
                 run_id="first-run")
    resumed: dict[int, dict] = {}
    notes = []
    summary = pretrain(settings, **files, work_dir=tmp_path / "w2", out_dir=tmp_path / "o2",
                       log=resumed.__setitem__, on_resume=notes.append)
    assert summary["resumed_from_step"] == 2
    assert notes[0]["previous_run_id"] == "first-run" and not notes[0]["discarded_checkpoint"]
    assert sorted(resumed) == sorted(straight) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert resumed[step]["loss"] == straight[step]["loss"], step


def test_the_work_checkpoint_outlives_an_unpublished_output(tmp_path):
    from qac.train.pretrain import PretrainSettings, pretrain

    settings = PretrainSettings.from_mapping({**SETTINGS, "steps": 2, "checkpoint_every": 1})
    data = tmp_path / "data"
    write_corpus(data, documents=3, spans=2, queries=2)
    work = tmp_path / "work"
    pretrain(settings, passages=data / "passages.arrow", queries=data / "queries.arrow", work_dir=work,
             out_dir=tmp_path / "staging", remove_work=False)
    assert json.loads((work / "checkpoint" / "state.json").read_text())["step"] == 2
    # Killed before the staged output was published: the rerun redoes no step.
    summary = pretrain(settings, passages=data / "passages.arrow", queries=data / "queries.arrow", work_dir=work,
                       out_dir=tmp_path / "out")
    assert summary["resumed_from_step"] == 2 and not work.exists()
    assert (tmp_path / "out" / "encoder" / "model.safetensors").exists()
