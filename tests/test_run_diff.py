"""`qac runs diff`: only what differs between two runs, and a paired test for each evaluation metric."""

from __future__ import annotations

import json

import pytest

QUERIES = [f"q{i}" for i in range(8)]


def _run(mlflow, lr: str, commit: str, corpus_md5: str, code: dict, rr: float, tmp_path, name: str) -> str:
    with mlflow.start_run(run_name=name) as run:
        mlflow.log_params({"lr": lr, "batch_size": "8"})
        mlflow.set_tags({"qac.git_commit": commit, "qac.input_md5.corpus": corpus_md5, "qac.host": "vm",
                         "qac.pid": name})
        mlflow.log_dict(code, "code/qac_modules.json")
        per_query = {"RR@10": {q: rr for q in QUERIES}}
        mlflow.log_dict(per_query, "per_query/tinyset/test.json")
        mlflow.log_metrics({"tinyset/test/RR_at_10": rr, "train/loss": 2.0})
        return run.info.run_id


@pytest.fixture()
def two_runs(mlflow_store, tmp_path):
    import mlflow

    mlflow.set_tracking_uri(mlflow_store)
    mlflow.set_experiment("diff")
    first = _run(mlflow, "1e-4", "a" * 40, "c0", {"qac/train/finetune.py": "m1", "qac/io.py": "io"}, 0.4,
                 tmp_path, "one")
    second = _run(mlflow, "2e-4", "b" * 40, "c1", {"qac/train/finetune.py": "m2", "qac/io.py": "io"}, 0.5,
                  tmp_path, "two")
    return mlflow.MlflowClient(mlflow_store), first, second


def test_only_the_differences_show_and_a_gain_on_every_query_is_more_than_noise(two_runs):
    from qac.reporting.run_diff import diff_runs, format_diff

    client, first, second = two_runs
    diff = diff_runs(client, first, second, permutations=2000)
    rows = {(section, key): (a, b) for section, key, a, b in diff.rows}
    assert rows[("params", "lr")] == ("1e-4", "2e-4")
    assert rows[("code", "qac.git_commit")] == ("a" * 40, "b" * 40)
    assert rows[("code", "qac/train/finetune.py")] == ("m1", "m2")
    assert rows[("data", "qac.input_md5.corpus")] == ("c0", "c1")
    assert not any(key in ("batch_size", "qac/io.py", "qac.host", "qac.pid") for _, key in rows)   # the same
    rr = next(row for row in diff.metrics if row["metric"] == "tinyset/test/RR_at_10")
    assert rr["delta"] == pytest.approx(0.1)
    # +0.1 on all 8 queries: 2 of the 2**8 sign assignments are as extreme, p = 1/128
    assert rr["p_value"] == pytest.approx(1 / 128, abs=0.006) and rr["ci"] == pytest.approx((0.1, 0.1))
    loss = next(row for row in diff.metrics if row["metric"] == "train/loss")
    assert loss["delta"] == 0 and "p_value" not in loss
    text = format_diff(diff, 120)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "more than query noise" in text


def test_the_command_takes_run_ids_or_outputs_and_prints_json(two_runs, tmp_path, capsys):
    from qac.cli import main

    client, first, second = two_runs
    data = tmp_path / "data" / "smoke"
    for variant, run_id in (("a", first), ("b", second)):
        record = data / ".runs" / "finetune" / variant / "r1" / "mlflow_run.json"
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"run_id": run_id, "tracking_uri": client.tracking_uri}))
    assert main(["runs", "diff", "finetune/a/r1", "finetune/b/r1", "--data", str(data), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["runs"] == [first, second]
    assert {"section": "params", "key": "lr", "a": "1e-4", "b": "2e-4"} in printed["differences"]
    assert main(["runs", "diff", "finetune/nowhere/r1", second, "--data", str(data)]) == 2
    assert "neither an MLflow run id" in capsys.readouterr().err
