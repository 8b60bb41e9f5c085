"""The launcher server: a stage's process hands its script to a forked copy that takes its place.

A real server (``python -m qac.launcher serve``, preloading only ``json`` so it starts at once) and
real stage processes running a small script that reports where and how it ran.
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

from qac.launcher import SOCKET_ENV, Server

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """\
import json, os, sys, time
from pathlib import Path

from qac.launcher import hand_over

hand_over()
mode = sys.argv[1]
print(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv, "marker": os.environ.get("MARKER"),
                  "launcher": os.environ.get("QAC_LAUNCHER"), "stdin": sys.stdin.read() if mode == "read" else None,
                  "main": __name__}), flush=True)
sys.stderr.write("to stderr\\n")
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    raise RuntimeError("boom")
if mode == "wait":
    Path(sys.argv[2]).write_text(str(os.getpid()))
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted once")
        sys.exit(5)
if mode == "write":
    from qac.console import run_main
    from qac.io import atomic_path

    def main(argv=None):
        with atomic_path(Path("out") / "result", directory=True):
            Path(sys.argv[2]).write_text(str(os.getpid()))
            time.sleep(60)

    run_main(main, prog="stage.py")
"""


@pytest.fixture()
def server(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "QAC_LAUNCHER_PRELOAD": "json"}
    with Server(env) as path:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            assert time.monotonic() < deadline, "the launcher server did not answer"
            time.sleep(0.05)
        yield path, env


def _start(tmp_path: Path, env: dict, *args: str, cwd: Path | None = None, **popen) -> subprocess.Popen:
    script = tmp_path / "stage.py"
    script.write_text(SCRIPT)
    return subprocess.Popen([sys.executable, str(script), *args], cwd=cwd or tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def test_the_script_runs_in_a_forked_copy_with_its_callers_place(server, tmp_path):
    path, env = server
    place = tmp_path / "somewhere"
    place.mkdir()
    process = _start(tmp_path, {**env, SOCKET_ENV: path, "MARKER": "mine"}, "read", cwd=place,
                     stdin=subprocess.PIPE)
    out, err = process.communicate("what the stage reads", timeout=60)
    assert process.returncode == 0, err
    seen = json.loads(out.splitlines()[0])
    assert seen["pid"] != process.pid                    # a copy of the server ran it
    assert seen["cwd"] == str(place) and seen["argv"] == [str(tmp_path / "stage.py"), "read"]
    assert seen["marker"] == "mine" and seen["launcher"] is None and seen["main"] == "__main__"
    assert seen["stdin"] == "what the stage reads" and "to stderr" in err


@pytest.mark.parametrize("args, status, said", [(("exit", "7"), 7, None), (("raise",), 1, "RuntimeError: boom")])
def test_the_exit_status_and_the_traceback_come_back(server, tmp_path, args, status, said):
    path, env = server
    process = _start(tmp_path, {**env, SOCKET_ENV: path}, *args)
    out, err = process.communicate(timeout=60)
    assert process.returncode == status
    assert json.loads(out.splitlines()[0])["pid"] != process.pid
    assert said is None or said in err


@pytest.mark.parametrize("change", [{"OMP_NUM_THREADS": "3"}, {"LOCAL_RANK": "0"}, {SOCKET_ENV: "/nonexistent/socket"}])
def test_another_environment_torchrun_or_no_server_runs_the_script_in_its_own_process(server, tmp_path, change):
    path, env = server
    process = _start(tmp_path, {**env, SOCKET_ENV: path, **change}, "exit", "0")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out.splitlines()[0])["pid"] == process.pid


def _copy_started(pid_file: Path, process: subprocess.Popen) -> int:
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return int(pid_file.read_text())


def test_ctrl_c_on_the_stages_process_reaches_the_copy_once(server, tmp_path):
    path, env = server
    pid_file = tmp_path / "copy.pid"
    process = _start(tmp_path, {**env, SOCKET_ENV: path}, "wait", str(pid_file))
    copy = _copy_started(pid_file, process)
    assert copy != process.pid
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 5 and out.count("interrupted once") == 1, (out, err)


def test_sigterm_on_the_stages_process_ends_the_copy_as_run_main_ends_it(server, tmp_path):
    """Forwarded to the copy, SIGTERM is handled there as Ctrl-C is: staging removed, one paragraph, 143."""
    path, env = server
    pid_file = tmp_path / "copy.pid"
    process = _start(tmp_path, {**env, SOCKET_ENV: path, "QAC_VERBOSE": ""}, "write", str(pid_file))
    assert _copy_started(pid_file, process) != process.pid
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(errors) == 1 and errors[0].startswith("stage.py: error: terminated (SIGTERM")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_stage_process_killed_with_sigkill_takes_its_copy_with_it(server, tmp_path):
    path, env = server
    pid_file = tmp_path / "copy.pid"
    process = _start(tmp_path, {**env, SOCKET_ENV: path}, "wait", str(pid_file))
    copy = _copy_started(pid_file, process)
    process.kill()
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{copy}").exists():                # gone, and reaped by the server
        assert time.monotonic() < deadline, "the copy outlived its stage's process"
        time.sleep(0.05)


def test_the_server_quits_when_its_socket_is_gone(tmp_path):
    import shutil

    env = {**os.environ, "PYTHONPATH": str(REPO), "QAC_LAUNCHER_PRELOAD": "json"}
    server = Server(env)
    path = server.__enter__()
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    shutil.rmtree(os.path.dirname(path))              # a run that ended without telling it (its folder cleaned)
    assert server.process.wait(timeout=30) == 0
    server.__exit__(None, None, None)
    assert server.process.returncode == 0 and not os.path.exists(path)


def test_a_server_told_to_stop_while_importing_stops_at_once_and_cleanly(tmp_path):
    """A run with nothing to do stops the server it started while that is still importing its libraries."""
    (tmp_path / "slow_import.py").write_text(
        "import pathlib, time\npathlib.Path(__file__).with_name('importing').touch()\ntime.sleep(120)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]),
           "QAC_LAUNCHER_PRELOAD": "slow_import"}
    server = Server(env)
    path = server.__enter__()
    deadline = time.monotonic() + 30
    while not (tmp_path / "importing").exists():
        assert time.monotonic() < deadline, "the server never started importing"
        time.sleep(0.05)
    server.__exit__(None, None, None)                 # kills it (-9) only if it ignores SIGTERM for 10 s
    assert server.process.returncode == 0 and not os.path.exists(path)


def test_a_large_environment_is_handed_over_whole(server, tmp_path):
    path, env = server
    # more than a socket buffer holds at once, in variables under the kernel's limit for one
    big = {f"QAC_TEST_BIG_{number}": str(number) * 100_000 for number in range(6)}
    process = _start(tmp_path, {**env, SOCKET_ENV: path, "MARKER": "mine", **big}, "exit", "0")
    out, err = process.communicate(timeout=60)
    seen = json.loads(out.splitlines()[0])
    assert process.returncode == 0 and seen["pid"] != process.pid and seen["marker"] == "mine", err


def test_a_preload_list_naming_a_module_that_is_not_installed_still_serves(tmp_path):
    """QAC_LAUNCHER_PRELOAD names what this environment lacks: the server preloads the rest and serves."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "QAC_LAUNCHER_PRELOAD": "json,qac_no_such_module,csv"}
    launcher = Server(env)
    with launcher as path:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            assert launcher.process.poll() is None, "the launcher server ended"
            assert time.monotonic() < deadline, "the launcher server did not answer"
            time.sleep(0.05)
        process = _start(tmp_path, {**env, SOCKET_ENV: path}, "exit", "0")
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out.splitlines()[0])["pid"] != process.pid      # the server's copy ran it
