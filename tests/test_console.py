"""A stage's console: one summary line, no library noise unless asked for (``QAC_VERBOSE=1`` / ``-v``).

The evaluation stage runs as a subprocess, as ``dvc repro`` runs it, on a tiny
study whose start encoder lacks its pooler weights (as exported encoders do),
so transformers has a load report to print, and with MLflow system metrics on,
so MLflow has its monitoring lines to print. The quiet run must show neither;
the verbose run shows both, which proves the quiet run had them to hide.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from test_finetune_stage import REPO, load_stage, shared_mlflow_store, study_dir  # noqa: F401  (fixture)

SUMMARY = re.compile(r"^evaluate@none: r1 tinyset/test RR@10 \d\.\d{3}, r2 tinyset/test RR@10 \d\.\d{3}, "
                     r"untuned tinyset/test RR@10 \d\.\d{3}, 3 zero-shot evaluations, "
                     r"r1 tinyset from the fine-tuning stage's runs, (?:[\d.]+ s|\d+ min \d\d s)$", re.MULTILINE)


def _drop_pooler(encoder_dir):
    from safetensors.torch import load_file, save_file

    weights = load_file(encoder_dir / "model.safetensors")
    save_file({name: tensor for name, tensor in weights.items() if not name.startswith("pooler.")},
              encoder_dir / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_bert_dir, shared_mlflow_store):  # noqa: F811
    from qac.config import write_params

    root = tmp_path_factory.mktemp("console") / "study"
    with study_dir(root, tiny_bert_dir) as params:
        params["mlflow"]["system_metrics"] = True
        params["evaluate"]["untuned_baseline"] = True
        write_params(params, root / "params.yaml")
        _drop_pooler(root / "data" / "smoke" / "pretrain" / "none" / "encoder")
        load_stage("finetune").main(["--variant", "none"])
    return root


def _evaluate(root, store, **env) -> str:
    environment = {**os.environ, "QAC_PARAMS": str(root / "params.yaml"), "MLFLOW_TRACKING_URI": store,
                   "PYTHONPATH": str(REPO), **env}
    for name in ("QAC_VERBOSE", "PYTHONWARNINGS", "TRANSFORMERS_VERBOSITY", "MLFLOW_LOGGING_LEVEL"):
        if name not in env:
            environment.pop(name, None)   # as a user's shell has them: unset
    done = subprocess.run([sys.executable, str(REPO / "pipelines" / "evaluate.py"), "--variant", "none"],
                          cwd=root, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_stage_prints_its_summary_and_no_library_noise(study, shared_mlflow_store):  # noqa: F811
    output = _evaluate(study, shared_mlflow_store)
    assert "LOAD REPORT" not in output
    assert "system_metrics" not in output
    assert "Loading weights" not in output
    assert len(SUMMARY.findall(output)) == 1, output
    # Off a terminal there are no progress bars either: the summary is all there is.
    assert output.strip().splitlines() == SUMMARY.findall(output), output


def test_verbose_brings_the_library_output_back(study, shared_mlflow_store):  # noqa: F811
    output = _evaluate(study, shared_mlflow_store, QAC_VERBOSE="1")
    assert "LOAD REPORT" in output
    assert "system_metrics" in output
    assert len(SUMMARY.findall(output)) == 1


def test_summary_line_and_durations_read_as_people_write_them():
    from qac.console import format_seconds, summary_line

    assert summary_line("pretrain@cocondenser-query-q5", "200 steps", "final loss 3.210", seconds=41.2) == (
        "pretrain@cocondenser-query-q5: 200 steps, final loss 3.210, 41 s")
    assert format_seconds(3.24) == "3.2 s"
    assert format_seconds(185) == "3 min 05 s"
    assert format_seconds(3720) == "1 h 02 min"


def test_verbose_is_asked_for_by_flag_or_environment(monkeypatch):
    from qac.console import verbose_requested

    monkeypatch.delenv("QAC_VERBOSE", raising=False)
    assert not verbose_requested()
    assert verbose_requested(True)
    for value, expected in (("1", True), ("yes", True), ("0", False), ("false", False), ("", False)):
        monkeypatch.setenv("QAC_VERBOSE", value)
        assert verbose_requested() is expected, value


def test_a_library_that_lowers_its_own_log_level_after_set_up_stays_quiet():
    # bm25s sets its logger to DEBUG when it is imported, after the stage set up its console.
    code = ("import logging; from qac.console import setup_console; setup_console(); "
            "library = logging.getLogger('bm25s'); library.setLevel(logging.DEBUG); "
            "library.debug('Building index from IDs objects'); logging.getLogger('qac').warning('a real warning')")
    environment = {key: value for key, value in os.environ.items() if key != "QAC_VERBOSE"}
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                          timeout=120, check=True)
    assert "Building index" not in done.stderr + done.stdout
    assert "a real warning" in done.stderr


STAGES_WITHOUT_OPTIONS = ("annotation", "beir_retriever", "bm25", "reference", "split_passages", "tables",
                          "train_query_generator", "word_frequencies")


@pytest.mark.parametrize("name", STAGES_WITHOUT_OPTIONS)
def test_a_stage_without_options_refuses_one_it_does_not_know_before_any_work(name, capsys):
    """An unknown option or a stray argument ends the stage with argparse's usage line, before params are read."""
    from qac.console import call_main

    stage = load_stage(name)
    for argv in (["--bogus"], ["extra"]):
        with pytest.raises(SystemExit) as stopped:
            call_main(stage.main, argv)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert "unrecognized arguments" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as stopped:
        call_main(stage.main, ["--help"])
    assert stopped.value.code == 0 and "usage:" in capsys.readouterr().out


def test_a_stage_run_as_a_script_reads_its_command_line(tmp_path):
    """DVC and people start stages as scripts: their arguments reach the parser (`--help` too), and an
    unknown one stops the stage before it touches the params file it would read."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "QAC_PARAMS": str(tmp_path / "absent.yaml")}
    script = str(REPO / "pipelines" / "tables.py")
    refused = subprocess.run([sys.executable, script, "--bogus"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "unrecognized arguments: --bogus" in refused.stderr, refused.stderr
    helped = subprocess.run([sys.executable, script, "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: tables.py")


def test_a_stage_of_one_checkout_refuses_the_qac_of_another(tmp_path):
    """The code DVC hashes is the stage's own checkout's: a Python that imports qac from another clone (an
    environment installed there) stops in one line naming both and the fix."""
    import shutil

    other = tmp_path / "other-clone"
    shutil.copytree(REPO / "pipelines", other / "pipelines")
    env = {**os.environ, "PYTHONPATH": str(REPO)}           # qac from this checkout, the stage from the other
    done = subprocess.run([sys.executable, str(other / "pipelines" / "tables.py")], env=env, cwd=other,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"pipelines/tables.py: Python imports qac from {REPO.resolve()}, not from this "
                                  f"checkout {other.resolve()}"), done.stderr


# --- the streams a command writes to: a reader gone, an ASCII terminal, no stdout at all --------------------

def _qac(args: list[str], **options) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("QAC_VERBOSE", None)
    environment.update(options.pop("env", {}))
    return subprocess.Popen([sys.executable, "-m", "qac.cli", *args], cwd=REPO, env=environment, **options)


def test_a_reader_that_closes_the_pipe_ends_the_command_as_a_pipe_writer_without_a_traceback():
    """`qac profile show smoke | head -1`: the reader has what it wanted; status 141, as SIGPIPE ends a writer."""
    process = _qac(["profile", "show", "smoke"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()                  # before the command has written anything
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert stderr == "", stderr


def test_text_an_ascii_terminal_cannot_show_is_escaped_not_an_error(tmp_path):
    script = tmp_path / "accents.py"
    script.write_text("from qac.console import run_main\n\n\n"
                      "def main(argv):\n    print('caf\\u00e9 \\u00b1 0.01')\n    return 0\n\n\n"
                      "run_main(main)\n")
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"caf\\xe9 \\xb1 0.01\n" and done.stderr == b""


@pytest.mark.parametrize("status", [0, 3])
def test_a_command_started_with_stdout_closed_exits_with_its_own_status(tmp_path, status):
    """`stage.py >&-`: Python starts with no sys.stdout; the status is still the one the command chose."""
    script = tmp_path / "stage.py"
    script.write_text("from qac.console import run_main\n\n\n"
                      "def main(argv):\n    print('written to no stdout')\n    return int(argv[0])\n\n\n"
                      "run_main(main)\n")
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(f"exec {sys.executable} {script} {status} >&-", shell=True, env=environment,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == status, done.stderr
    assert done.stderr == ""
