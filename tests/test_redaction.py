"""No credentials in what we write or log: user:password in URLs is redacted (qac.redaction)."""

from __future__ import annotations

import json

import pytest

from qac.config import render_profile
from qac.params import validate_params
from qac.redaction import redact_url, redact_values

SECRET = "s3cr3t"


@pytest.mark.parametrize("url, expected", [
    (f"postgresql://optuna:{SECRET}@db:5432/optuna", "postgresql://***@db:5432/optuna"),
    ("postgresql://optuna@db/optuna", "postgresql://***@db/optuna"),
    (f"https://user:{SECRET}@mlflow.example.org/", "https://***@mlflow.example.org/"),
    (f"mysql+pymysql://db/optuna?user=u&password={SECRET}", "mysql+pymysql://db/optuna?user=u&password=***"),
    ("sqlite:////work/repo/mlflow.db", "sqlite:////work/repo/mlflow.db"),
    ("https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip",
     "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip"),
    ("data/smoke/hpo/journal.log", "data/smoke/hpo/journal.log"),
    (f"stored at https://u:{SECRET}@host/x, see there", "stored at https://***@host/x, see there"),
])
def test_redact_url(url, expected):
    assert redact_url(url) == expected


def test_nested_params_are_redacted_and_other_values_kept():
    params = {"hpo": {"storage": f"postgresql://u:{SECRET}@db/optuna", "n_trials": 3, "list": [f"http://a:{SECRET}@b"]}}
    redacted = redact_values(params)
    assert SECRET not in json.dumps(redacted)
    assert redacted["hpo"]["n_trials"] == 3 and params["hpo"]["storage"].endswith("@db/optuna")


def test_the_run_record_holds_no_credentials(tmp_path, monkeypatch):
    from qac.tracking import write_run_record

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"https://user:{SECRET}@mlflow.example.org")
    path = write_run_record(tmp_path, tmp_path / "bm25", "abc")
    assert path == tmp_path / ".runs" / "bm25" / "mlflow_run.json"
    record = json.loads(path.read_text())
    assert record["run_id"] == "abc" and record["tracking_uri"] == "https://***@mlflow.example.org"
    assert SECRET not in json.dumps(record)


def test_params_logged_to_mlflow_hold_no_credentials(mlflow_store):
    import mlflow

    from qac.tracking import stage_run

    params = validate_params(render_profile("smoke"))
    with stage_run(params, "hpo", "hpo/x", kind="hpo",
                   stage_params={"storage": f"postgresql://u:{SECRET}@db/optuna"}) as run:
        pass
    mlflow.set_tracking_uri(mlflow_store)
    assert mlflow.get_run(run.info.run_id).data.params["storage"] == "postgresql://***@db/optuna"


def test_the_report_holds_no_credentials(tmp_path, monkeypatch):
    """The tables are built from DVC outputs; a tracking URI with a password never reaches them."""
    from dvc_study import PARAMS, write_study

    from qac.reporting.profile_report import write_report

    data = write_study(tmp_path / "study")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"https://user:{SECRET}@mlflow.example.org")
    report = write_report(PARAMS, tmp_path / "reports", data)
    for path in report.directory.rglob("*"):
        if path.is_file() and path.suffix in (".md", ".csv", ".tex"):
            assert SECRET not in path.read_text(encoding="utf-8"), path


def test_hpo_workers_get_the_storage_credentials_from_the_environment_not_the_params_copy(monkeypatch):
    from qac.hpo.study import STORAGE_ENV, HpoSettings

    full = f"postgresql://optuna:{SECRET}@db/optuna"
    params = render_profile("smoke")
    params["hpo"]["storage"] = full
    copy = redact_values(params)                     # what `qac hpo` writes for its workers
    assert SECRET not in json.dumps(copy)
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    assert HpoSettings.from_params(copy).storage == "postgresql://***@db/optuna"
    monkeypatch.setenv(STORAGE_ENV, full)
    assert HpoSettings.from_params(copy).storage == full
    other = render_profile("smoke")
    other["hpo"]["storage"] = "postgresql://***@elsewhere/optuna"   # another database: not this password
    assert HpoSettings.from_params(other).storage == "postgresql://***@elsewhere/optuna"


def test_checked_parameters_are_redacted_as_plain_data():
    from pathlib import Path

    from qac.params import load_params, with_values

    smoke = load_params(Path(__file__).resolve().parent.parent / "profiles" / "smoke" / "params.yaml")
    params = with_values(smoke, {"hpo.storage": "postgresql://user:s3cret@db:5432/optuna"})
    redacted = redact_values(params)
    assert redacted["hpo"]["storage"] == "postgresql://***@db:5432/optuna"
    assert "s3cret" not in repr(redacted) and redacted["finetune"] == smoke.finetune.to_dict()


def test_credentials_are_split_from_the_address_and_unquoted():
    from qac.redaction import split_credentials

    assert split_credentials("https://u:p%40ss%2F@host:8443/x?y=1") == ("https://host:8443/x?y=1", "u", "p@ss/")
    assert split_credentials("http://tok3n-only@host/") == ("http://host/", "tok3n-only", None)
    assert split_credentials("sqlite:///mlflow.db") == ("sqlite:///mlflow.db", None, None)


def test_a_secret_quoted_without_its_url_is_redacted_too(monkeypatch):
    from qac.redaction import redact_text

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "env-s3cret")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")     # not a secret: its name only contains TOKEN
    text = "nonnumeric port: 'pw%2F12@host'; login env-s3cret refused; parallelism false"
    assert redact_text(text, "https://user:pw%2F12@host/a.zip") == \
        "nonnumeric port: '***@host'; login *** refused; parallelism false"
