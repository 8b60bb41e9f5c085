"""Atomic outputs: a failure leaves neither the target nor a temporary file behind."""

import json

import pytest

from qac.data.textfile import iter_jsonl
from qac.io import atomic_path, path_md5, write_jsonl


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("stage crashed")
    assert list(tmp_path.iterdir()) == []


def test_failed_directory_write_keeps_previous_version(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target, directory=True) as tmp:
            (tmp / "weights").write_text("new, half written")
            raise RuntimeError("crash")
    assert (target / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_directory_replaced_on_success(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale").write_text("old")
    with atomic_path(target, directory=True) as tmp:
        (tmp / "weights").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["weights"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.parametrize("standing, directory", [("file", True), ("folder", False), ("file", False),
                                                 ("folder", True), ("dangling link", True)])
@pytest.mark.parametrize("leftover", [None, "file", "folder"])
def test_whatever_stands_at_the_output_is_replaced_and_nothing_is_left_beside_it(tmp_path, standing, directory,
                                                                                 leftover):
    """A stray file where a folder output belongs (or a folder where a file belongs, or a leftover of an earlier
    replacement of any kind) is replaced, run after run, and no hidden entry stays beside the output."""
    target, old = tmp_path / "eval", tmp_path / ".eval.old"
    for _ in range(2):
        if standing == "file":
            target.write_text("junk")
        elif standing == "folder":
            target.mkdir()
            (target / "stale").write_text("old")
        else:
            target.symlink_to(tmp_path / "nowhere")
        if leftover == "file":
            old.write_text("left by an earlier run")
        elif leftover == "folder":
            old.mkdir()
        with atomic_path(target, directory=directory) as tmp:
            if directory:
                (tmp / "result").write_text("new")
            else:
                tmp.write_text("new")
        assert (target / "result" if directory else target).read_text() == "new"
        assert [p.name for p in tmp_path.iterdir()] == ["eval"]
        _clear(target)


def _clear(path):
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def test_jsonl_round_trip_and_bad_line(tmp_path):
    path = tmp_path / "a.jsonl"
    assert write_jsonl(path, [{"a": 1}, {"b": "é"}]) == 2
    assert list(iter_jsonl(path)) == [{"a": 1}, {"b": "é"}]
    path.write_text(json.dumps({"a": 1}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"a\.jsonl:2"):
        list(iter_jsonl(path))


def test_directory_hash_depends_on_names_and_contents(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "x").write_text("1")
    first = path_md5(a)
    (a / "x").write_text("2")
    assert path_md5(a) != first
    (a / "x").write_text("1")
    assert path_md5(a) == first


def test_outputs_get_ordinary_permissions(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    os.umask(umask)
    write_jsonl(tmp_path / "f.jsonl", [{"a": 1}])
    with atomic_path(tmp_path / "d", directory=True) as tmp:
        (tmp / "x").write_text("1")
    assert stat.S_IMODE((tmp_path / "f.jsonl").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o777 & ~umask


def _killed_while_writing(target, directory: bool):
    """A process that opens an atomic write of ``target`` and is killed with SIGKILL inside it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import sys, time\nfrom qac.io import atomic_path\n"
              f"with atomic_path({str(target)!r}, directory={directory}) as tmp:\n"
              "    print(tmp, flush=True)\n    time.sleep(60)\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    staging = process.stdout.readline().strip()
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    time.sleep(0.05)
    return staging


@pytest.mark.parametrize("directory", [False, True])
def test_staging_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path, directory):
    from pathlib import Path

    target = tmp_path / "out"
    staging = Path(_killed_while_writing(target, directory))
    assert staging.exists() and staging.name.startswith(".out.") and staging.name.endswith(".tmp")
    with atomic_path(target, directory=directory) as tmp:
        (tmp / "x").write_text("new") if directory else tmp.write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_only_orphaned_staging_is_removed(tmp_path):
    import os

    from qac.io import remove_orphaned_staging

    live = tmp_path / f".out.{os.getppid()}.abcdefgh.tmp"       # the test runner's parent is alive
    legacy = tmp_path / ".out.abcdefgh.tmp"                      # written before writers recorded their id
    old = tmp_path / ".out.old"
    other = tmp_path / ".other.1.abcdefgh.tmp"                   # another output's staging
    for path in (live, legacy, other):
        path.write_text("x")
    old.mkdir()
    assert sorted(p.name for p in remove_orphaned_staging(tmp_path / "out")) == [legacy.name]
    assert live.exists() and old.exists() and other.exists()     # a live writer may still need .old
    live.unlink()
    assert remove_orphaned_staging(tmp_path / "out") == [old]
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name]


def test_dvc_ignores_staging_folders():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    dvc = str(Path(sys.executable).parent / "dvc")
    for name in ("data/smoke/datasets/.scifact.4242.abcdefgh.tmp", "data/smoke/pretrain/.none.old"):
        result = subprocess.run([dvc, "check-ignore", name], cwd=repo, capture_output=True, text=True)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
    result = subprocess.run([dvc, "check-ignore", "data/smoke/passages.arrow"], cwd=repo, capture_output=True)
    assert result.returncode == 1


@pytest.mark.parametrize("directory", [False, True])
def test_an_interruption_while_the_staging_is_created_leaves_nothing(tmp_path, monkeypatch, directory):
    """Ctrl-C (or SIGTERM) landing in the instant the staging entry is made still has it removed."""
    import os
    import signal
    import tempfile

    create = tempfile.mkdtemp if directory else tempfile.mkstemp

    def create_then_interrupt(*args, **kwargs):
        made = create(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)     # delivered before the caller has the name in hand
        return made

    monkeypatch.setattr(tempfile, "mkdtemp" if directory else "mkstemp", create_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(tmp_path / "out", directory=directory):
            pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("directory", [False, True])
def test_an_interruption_while_the_staging_is_created_leaves_nothing_with_another_thread_alive(
        tmp_path, monkeypatch, directory):
    """As above while another thread runs (torch's, a data loader's): the kernel may hand the signal to that
    thread, which a signal mask of the main thread alone would not hold back."""
    import os
    import signal
    import tempfile
    import threading
    import time

    create = tempfile.mkdtemp if directory else tempfile.mkstemp
    release = threading.Event()
    worker = threading.Thread(target=release.wait, args=(30,))        # not a daemon: alive throughout
    worker.start()

    def create_then_interrupt(*args, **kwargs):
        made = create(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)     # to the process: any thread that does not block it may take it
        time.sleep(0.2)                         # and its handler runs before the caller has the name in hand
        return made

    monkeypatch.setattr(tempfile, "mkdtemp" if directory else "mkstemp", create_then_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            with atomic_path(tmp_path / "out", directory=directory):
                pass
    finally:
        release.set()
        worker.join()
    assert list(tmp_path.iterdir()) == []
