"""A stand-in trial job for the HPO driver tests, and the study that runs it.

The job scores a trial by -(log10(lr) + 4)^2, a fixed function of its learning
rate, reporting it four times 0.2 s apart, so that a test is about the driver:
process handling, storage consistency, retries, MLflow bookkeeping. It first
writes its host name (``host``) and pid (``job.pid``) into its trial folder, and
hangs where the test says, so that the test can kill it mid-trial.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from qac.config import render_profile, write_params

JOB = textwrap.dedent('''
    """Scores a trial by -(log10(lr) + 4)^2, reporting it four times, 0.2 s apart (tests/hpo_stand_in.py)."""
    import argparse, math, os, socket, time
    from pathlib import Path
    import yaml
    from qac.hpo.trial_job import emit_event, stop_when_parent_goes

    stop_when_parent_goes()
    parser = argparse.ArgumentParser()
    parser.add_argument("--params"); parser.add_argument("--out")
    args = parser.parse_args()
    params = yaml.safe_load(open(args.params))
    lr = params["pretrain"]["variants"][params["hpo"]["variant"]]["lr"]
    Path(args.out, "host").write_text(socket.gethostname())
    Path(args.out, "job.pid").write_text(str(os.getpid()))
    value = -(math.log10(lr) + 4) ** 2
    if {hang_when}:
        time.sleep({hang_seconds})
    for step in range(4):
        time.sleep(0.2)
        emit_event("intermediate", step=step, value=value)
    emit_event("result", value=value, metrics={{"score": value}})
''')


def stand_in_study(tmp_path: Path, study_name: str, hang_when: str, hang_seconds: int, **hpo) -> Path:
    """The smoke params (written to ``tmp_path/params.yaml``, its path returned) of a study of 4 trials over
    ``pretrain.lr``, each trial retried once, no pruner, whose trials run the stand-in job; the job hangs
    ``hang_seconds`` where the Python condition ``hang_when`` (on ``args``, ``socket``, ...) holds.
    ``hpo`` sets further hpo keys."""
    job = tmp_path / "stand_in_job.py"
    job.write_text(JOB.format(hang_when=hang_when, hang_seconds=hang_seconds))
    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["mlflow"]["system_metrics"] = False
    params["hpo"].update({
        "study_name": study_name, "job": str(job), "n_trials": 4, "retry_failed": 1,
        "pruner": {"type": "none"}, "report_dir": str(tmp_path / "reports"),
        "space": {"pretrain.lr": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True}}, **hpo,
    })
    path = tmp_path / "params.yaml"
    write_params(params, path)
    return path
