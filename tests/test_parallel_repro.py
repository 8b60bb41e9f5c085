"""`qac repro --jobs N`: DVC's stages, in DVC's order, with independent ones side by side.

The scheduling is tested on real processes; the whole path on a real DVC
project of five stages (a -> b, a -> c, b + c -> d, and e alone), whose
commands note when they start and end in a file outside DVC's view.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qac.parallel_repro import (ForkedCommand, StageJob, forked_dvc_starter, reproduce, run_stages,
                                shown_output, stages_to_consider)

BIN = Path(sys.executable).parent
GRAPH = [("a", "", ()), ("e", "", ()), ("b", "", ("a",)), ("c", "", ("a",)), ("d", "", ("b", "c"))]


def test_the_changed_stages_and_everything_downstream_are_considered():
    assert stages_to_consider(GRAPH, {"b"}) == [StageJob("b", ()), StageJob("d", ("b",))]
    assert [job.name for job in stages_to_consider(GRAPH, {"a"})] == ["a", "b", "c", "d"]
    assert stages_to_consider(GRAPH, {"a"})[-1] == StageJob("d", ("b", "c"))
    assert stages_to_consider(GRAPH, set()) == []
    assert [job.name for job in stages_to_consider(GRAPH, set(), force=True)] == ["a", "e", "b", "c", "d"]


def _timed_starter(folder: Path, seconds: float = 0.6, failing: frozenset = frozenset()):
    """``start(name, log)``: a process that notes its start and end in ``folder/<name>`` and sleeps."""
    script = ("import sys, time; from pathlib import Path; name, folder, pause, code = sys.argv[1:]; "
              "Path(folder, name + '.start').write_text(repr(time.time())); time.sleep(float(pause)); "
              "print(name, 'said this'); Path(folder, name + '.end').write_text(repr(time.time())); "
              "sys.exit(int(code))")

    def start(name: str, log: Path) -> subprocess.Popen:
        with open(log, "w") as handle:
            return subprocess.Popen([sys.executable, "-c", script, name, str(folder), str(seconds),
                                     "3" if name in failing else "0"], stdout=handle, stderr=subprocess.STDOUT)
    return start


def _interval(folder: Path, name: str) -> tuple[float, float]:
    return float((folder / f"{name}.start").read_text()), float((folder / f"{name}.end").read_text())


def _overlap(first: tuple[float, float], second: tuple[float, float]) -> bool:
    return first[0] < second[1] and second[0] < first[1]


def test_independent_stages_overlap_and_each_starts_after_its_upstream(tmp_path):
    jobs = stages_to_consider(GRAPH, set(), force=True)
    outcome = run_stages(jobs, _timed_starter(tmp_path), parallel=2)
    assert not outcome.failed and not outcome.not_started
    assert sorted(done.name for done in outcome.finished) == ["a", "b", "c", "d", "e"]
    times = {name: _interval(tmp_path, name) for name in "abcde"}
    for job in jobs:
        for upstream in job.upstream:
            assert times[upstream][1] <= times[job.name][0], (job, times)
    assert _overlap(times["a"], times["e"]) and _overlap(times["b"], times["c"])
    assert all(done.output.strip() == f"{done.name} said this" for done in outcome.finished)
    # never more than two at once: no stage overlaps two others that overlap each other
    names = list(times)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            for z in names[names.index(y) + 1:]:
                assert not (_overlap(times[x], times[y]) and _overlap(times[x], times[z])
                            and _overlap(times[y], times[z])), times


def test_one_job_at_a_time_runs_in_the_given_order(tmp_path):
    jobs = stages_to_consider(GRAPH, set(), force=True)
    outcome = run_stages(jobs, _timed_starter(tmp_path, 0.1), parallel=1)
    assert [done.name for done in outcome.finished] == ["a", "e", "b", "c", "d"]
    times = [_interval(tmp_path, name) for name in "aebcd"]
    assert all(earlier[1] <= later[0] for earlier, later in zip(times, times[1:]))


def test_a_failure_stops_new_starts_and_lets_the_running_stage_finish(tmp_path):
    jobs = stages_to_consider(GRAPH, set(), force=True)
    outcome = run_stages(jobs, _timed_starter(tmp_path, 0.4, failing=frozenset({"c"})), parallel=2)
    assert [done.name for done in outcome.failed] == ["c"] and outcome.failed[0].returncode == 3
    assert "d" in outcome.not_started and not (tmp_path / "d.start").exists()
    assert all(done.returncode == 0 for done in outcome.finished if done.name != "c")
    assert {"a", "b", "c"} <= {done.name for done in outcome.finished}


def test_stages_side_by_side_keep_their_thread_count_and_let_idle_threads_sleep():
    from qac.threads import shared_cores_environment

    assert shared_cores_environment(1, {"PATH": "/bin"}) == {"PATH": "/bin"}
    assert shared_cores_environment(2, {}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert shared_cores_environment(2, {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3"}) == {
        "OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3"}


def test_a_forked_command_reports_status_signals_and_errors_as_a_process_would(capfd):
    assert ForkedCommand.fork(lambda: 3).wait(timeout=30) == 3
    assert ForkedCommand.fork(lambda: sys.exit(4)).wait(timeout=30) == 4
    failing = ForkedCommand.fork(lambda: 1 / 0)
    assert failing.wait(timeout=30) == 1 and "ZeroDivisionError" in capfd.readouterr().err
    sleeping = ForkedCommand.fork(lambda: time.sleep(60) or 0)
    assert sleeping.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(timeout=0.2)
    sleeping.terminate()
    assert sleeping.wait(timeout=30) == -signal.SIGTERM
    sleeping.kill()                                    # after the end: nothing to signal, no error


def test_the_lock_waiting_notice_is_not_shown():
    output = "Running stage 'x':\nWaiting to acquire lock. If DVC froze, see ...\n> cmd\nx: done\n\n"
    assert shown_output(output) == "Running stage 'x':\n> cmd\nx: done"


# ---- a real DVC project ------------------------------------------------------------------------------------

STAGE_SCRIPT = """\
import sys, time
from pathlib import Path

name, pause = sys.argv[1], float(sys.argv[2])
with open("timeline.txt", "a") as timeline:
    timeline.write(f"{name} start {time.time()!r}\\n")
if Path(f"fail-{name}").exists():
    sys.exit(f"{name}: told to fail")
text = "".join(Path(dep).read_text() for dep in sys.argv[3:]) + Path("inputs", name + ".txt").read_text()
time.sleep(pause)
Path("out").mkdir(exist_ok=True)
Path("out", name + ".txt").write_text(text + name + "\\n")
with open("timeline.txt", "a") as timeline:
    timeline.write(f"{name} end {time.time()!r}\\n")
print(f"{name}: done")
"""


def _dvc_project(root: Path, pause: float = 1.5) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stage.py").write_text(STAGE_SCRIPT)
    (root / "inputs").mkdir()
    upstream = {"a": [], "e": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    stages = {}
    for name, deps in upstream.items():
        (root / "inputs" / f"{name}.txt").write_text(f"input of {name}\n")
        dep_files = [f"out/{dep}.txt" for dep in deps]
        stages[name] = {"cmd": " ".join([sys.executable, "stage.py", name, str(pause), *dep_files]),
                        "deps": ["stage.py", f"inputs/{name}.txt", *dep_files],
                        "outs": [f"out/{name}.txt"]}
    (root / "dvc.yaml").write_text(json.dumps({"stages": stages}, indent=1))
    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=root, check=True)
    return root


def _timeline(root: Path) -> dict[str, tuple[float, float]]:
    marks: dict[str, dict[str, float]] = {}
    for line in (root / "timeline.txt").read_text().splitlines():
        name, what, when = line.split()
        marks.setdefault(name, {})[what] = float(when)
    return {name: (mark["start"], mark.get("end", mark["start"])) for name, mark in marks.items()}


def _dvc_status(root: Path) -> dict:
    done = subprocess.run([str(BIN / "dvc"), "status", "--json"], cwd=root, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout or "{}")


@pytest.fixture(params=[False, True], ids=["dvc-command", "dvc-forked"])
def warm_dvc(request, monkeypatch):
    """Each stage through the ``dvc`` command, or through DVC's ``main`` in a forked copy of the runner (what
    ``preload`` does besides the launcher, which starts only with HF_HUB_OFFLINE set: unset here)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return request.param


@pytest.mark.slow
def test_dvc_runs_every_stage_once_two_at_a_time_and_then_has_nothing_to_do(tmp_path, warm_dvc):
    root = _dvc_project(tmp_path / "project")
    outcome, stages = reproduce(root / "dvc.yaml", root, parallel=2, preload=warm_dvc)
    assert stages == 5 and not outcome.failed, [done.output for done in outcome.finished]
    assert sorted(done.name for done in outcome.finished) == ["a", "b", "c", "d", "e"]
    times = _timeline(root)
    assert _overlap(times["b"], times["c"]), times
    assert times["b"][1] <= times["d"][0] and times["c"][1] <= times["d"][0] and times["a"][1] <= times["b"][0]
    a = "input of a\na\n"
    assert (root / "out" / "d.txt").read_text() == (a + "input of b\nb\n" + a + "input of c\nc\n"
                                                    + "input of d\nd\n")
    assert _dvc_status(root) == {}                     # DVC itself: every stage recorded and up to date
    import yaml

    assert set(yaml.safe_load((root / "dvc.lock").read_text())["stages"]) == {"a", "b", "c", "d", "e"}
    (root / "timeline.txt").unlink()
    again, _ = reproduce(root / "dvc.yaml", root, parallel=2, preload=warm_dvc)
    assert again.finished == [] and not (root / "timeline.txt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["pretrain@none", "a-new-stage"])
def test_a_lock_rewritten_from_a_plain_read_is_the_bytes_dvc_writes(stage, tmp_path, monkeypatch):
    """The forked DVC reads dvc.lock plainly before rewriting it (qac.parallel_repro.read_locks_plainly): on the
    smoke profile's lock, replacing a stage's entry or adding one gives DVC's own bytes, and so does a lock
    written for the first time."""
    from dvc import dvcfile
    from dvc.utils.serialize import _yaml

    from qac.parallel_repro import read_locks_plainly

    monkeypatch.setattr(dvcfile, "modify_yaml", _yaml.modify_yaml)      # put back after the test
    read_locks_plainly()
    assert dvcfile.modify_yaml is not _yaml.modify_yaml
    entry = {"cmd": "python pipelines/pretrain.py --variant none",
             "deps": [{"path": "data/smoke/passages.arrow", "hash": "md5", "md5": "0" * 32, "size": 1}],
             "params": {"profiles/smoke/params.yaml": {"pretrain.common": {"lr": 5e-05, "time": "24:00:00"}}},
             "outs": [{"path": "data/smoke/pretrain/none", "hash": "md5", "md5": "1" * 32 + ".dir", "size": 2,
                       "nfiles": 3}]}
    smoke_lock = (Path(__file__).resolve().parent.parent / "profiles" / "smoke" / "dvc.lock").read_text()
    written = {}
    for name, modify in (("round trip", _yaml.modify_yaml), ("plain", dvcfile.modify_yaml)):
        for start in ("smoke", "none"):
            lock = tmp_path / name / start / "dvc.lock"
            lock.parent.mkdir(parents=True)
            if start == "smoke":
                lock.write_text(smoke_lock)
            with modify(str(lock)) as data:
                data.setdefault("schema", "2.0")
                data.setdefault("stages", {})[stage] = entry
            written[name, start] = lock.read_bytes()
    assert written["plain", "smoke"] == written["round trip", "smoke"]
    assert written["plain", "none"] == written["round trip", "none"]
    assert written["plain", "smoke"] != smoke_lock.encode()
    params = tmp_path / "params.yaml"          # any other file keeps DVC's round trip, comments and all
    params.write_text("# kept\nseed: 1\n")
    with dvcfile.modify_yaml(str(params)) as data:
        data["seed"] = 2
    assert params.read_text() == "# kept\nseed: 2\n"


def test_a_forked_dvc_runs_the_stage_in_the_given_folder_and_environment_and_logs_as_the_command(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    script = "import os, pathlib; pathlib.Path('out.txt').write_text(os.environ['QAC_TEST_MARK']); print('wrote')"
    (root / "dvc.yaml").write_text(json.dumps({"stages": {"only": {
        "cmd": f"{sys.executable} -c \"{script}\"", "outs": ["out.txt"]}}}))
    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=root, check=True)
    log = tmp_path / "only.log"
    start = forked_dvc_starter("dvc.yaml", root, {**os.environ, "QAC_TEST_MARK": "from the runner"}, force=False)
    handle = start("only", log)
    assert isinstance(handle, ForkedCommand) and handle.wait(timeout=120) == 0, log.read_text()
    assert (root / "out.txt").read_text() == "from the runner"
    assert "QAC_TEST_MARK" not in os.environ and Path.cwd() != root     # the runner itself is untouched
    output = log.read_text()
    assert "Running stage 'only'" in output and "wrote" in output and "\x1b[" not in output
    assert _dvc_status(root) == {}


@pytest.mark.slow
def test_a_changed_input_reruns_its_stage_and_what_depends_on_it(tmp_path):
    root = _dvc_project(tmp_path / "project", pause=0.1)
    reproduce(root / "dvc.yaml", root, parallel=2, preload=False)
    (root / "timeline.txt").unlink()
    (root / "inputs" / "c.txt").write_text("another input of c\n")
    outcome, _ = reproduce(root / "dvc.yaml", root, parallel=2, preload=False)
    assert sorted(done.name for done in outcome.finished) == ["c", "d"]
    assert set(_timeline(root)) == {"c", "d"}
    assert "another input of c" in (root / "out" / "d.txt").read_text()
    assert _dvc_status(root) == {}


@pytest.mark.slow
def test_a_failed_stage_leaves_the_finished_ones_recorded_and_the_next_run_resumes(tmp_path, warm_dvc):
    import logging

    root = _dvc_project(tmp_path / "project", pause=0.1)
    (root / "fail-c").write_text("")
    # A runner with a console handler of its own (as a command has): DVC's errors are still DVC's lines alone.
    stream = open(2, "w", closefd=False)          # the descriptor a forked DVC writes its log to
    console = logging.StreamHandler(stream)
    logging.root.addHandler(console)
    try:
        outcome, _ = reproduce(root / "dvc.yaml", root, parallel=2, preload=warm_dvc)
    finally:
        logging.root.removeHandler(console)
        stream.close()
    assert [done.name for done in outcome.failed] == ["c"] and "c: told to fail" in outcome.failed[0].output
    assert "Traceback" not in outcome.failed[0].output, outcome.failed[0].output
    assert outcome.not_started == ["d"] and not (root / "out" / "d.txt").exists()
    assert set(_dvc_status(root)) == {"c", "d"}        # a, b and e are recorded; c and d still to run
    (root / "fail-c").unlink()
    (root / "timeline.txt").unlink()
    resumed, _ = reproduce(root / "dvc.yaml", root, parallel=2, preload=warm_dvc)
    assert sorted(done.name for done in resumed.finished) == ["c", "d"] and not resumed.failed
    assert _dvc_status(root) == {}


def test_the_command_names_a_profile_that_does_not_exist_in_one_line(tmp_path):
    done = subprocess.run([str(BIN / "qac"), "repro", "no-such-profile"], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "no such pipeline" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    bad = subprocess.run([str(BIN / "qac"), "repro", "--jobs", "0", "smoke"],
                         cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
    assert bad.returncode == 2 and "--jobs must be at least 1" in bad.stderr
    path = subprocess.run([str(BIN / "qac"), "repro", "../etc"], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True)
    assert path.returncode == 2 and "Traceback" not in path.stderr


def test_a_pipeline_dvc_cannot_read_is_refused_before_any_stage_starts(tmp_path):
    from qac.errors import UserError

    root = _dvc_project(tmp_path / "project", pause=0.1)
    (root / "dvc.yaml").write_text("stages:\n  a:\n    cmd: [unclosed\n")
    with pytest.raises(UserError, match=r"dvc.yaml: DVC cannot plan this pipeline"):
        reproduce(root / "dvc.yaml", root, parallel=2, preload=False)
    assert not (root / "timeline.txt").exists()
    outside = tmp_path / "not-a-project"
    outside.mkdir()
    (outside / "dvc.yaml").write_text("stages: {}\n")
    with pytest.raises(UserError, match="DVC cannot plan this pipeline"):
        reproduce(outside / "dvc.yaml", outside, parallel=2, preload=False)
