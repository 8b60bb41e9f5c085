"""Damaged inputs are found where they are read, never read as good ones.

Two kinds of damage: bytes flipped inside an Arrow stage file (any byte: the file must either read as it
was written, read with other values that only a hash can tell, or stop in one paragraph naming the file;
never a decoding error, another exception or a crash), and a DVC cache object whose bytes flipped, which
``dvc checkout`` restores without a word: a real DVC repository, a real damaged object, and the stage
that would read it stopped before it does, naming the path, both hashes and the fix.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from qac.data.arrowstore import PASSAGES_SCHEMA, open_mapped, write_passages
from qac.data.errors import DataFormatError
from qac.tracking.recorded_inputs import DamagedInput, verify_recorded, verify_stage_inputs

REPO = Path(__file__).resolve().parent.parent
DVC = REPO / ".venv" / "bin" / "dvc"


def passages(n: int) -> list[dict]:
    words = "protein membrane receptor glacier violin river solar chess coffee volcano".split()
    return [{"pid": f"d{i}#0", "doc_id": f"d{i}", "position": 0, "n_tokens": 5,
             "text": " ".join(words[(i + j) % len(words)] for j in range(5 + i % 7)),
             "contexts": {"nearby": [f"d{i}#1"], "random_sampled": [], "overlap": "naïve café"}} for i in range(n)]


# Each flipped byte read in a process of its own: a crash there must not take the test runner with it.
READ_FLIPPED = """
import json, sys
from qac.data.arrowstore import PASSAGES_SCHEMA, RowGather, iter_records, open_mapped, scan_tables
from qac.data.errors import DataFormatError
good = [dict(row) for row in iter_records(sys.argv[1], PASSAGES_SCHEMA)]
outcomes = []
for path in sys.argv[2:]:
    try:
        mapped = open_mapped(path, PASSAGES_SCHEMA)
        rows = RowGather(mapped.table).rows(list(range(mapped.table.num_rows)))
        rows = list(iter_records(path, PASSAGES_SCHEMA))
        sum(table.num_rows for table in scan_tables(path, PASSAGES_SCHEMA, 7))
        outcomes.append("same" if rows == good else "other values")
    except DataFormatError as error:
        outcomes.append("refused" if path in str(error) and "damaged" in str(error) and "\\n" not in str(error)
                        else "refused badly: " + str(error))
    except BaseException as error:
        outcomes.append(f"{type(error).__name__}: {error}")
print(json.dumps(outcomes))
"""


def test_a_byte_flipped_anywhere_in_an_arrow_file_reads_as_written_or_stops_naming_the_file(tmp_path):
    folder = tmp_path / "data" / "smoke"
    folder.mkdir(parents=True)
    good = folder / "passages.arrow"
    write_passages(good, passages(60))
    data = good.read_bytes()
    rng = random.Random(7)
    flipped = []
    for offset in sorted(rng.sample(range(len(data)), 150)):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << rng.randrange(8)
        flipped.append(folder / f"flipped-{offset}.arrow")
        flipped[-1].write_bytes(bytes(damaged))
    result = subprocess.run([sys.executable, "-c", READ_FLIPPED, str(good), *map(str, flipped)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    outcomes = json.loads(result.stdout)
    assert len(outcomes) == 150
    unexpected = [(path.name, outcome) for path, outcome in zip(flipped, outcomes)
                  if outcome not in ("same", "other values", "refused")]
    assert not unexpected
    assert outcomes.count("refused") >= 5        # offsets, headers and text bytes that are no longer UTF-8


def test_a_flipped_byte_in_a_text_names_the_file_the_column_the_rows_and_the_restore(tmp_path):
    folder = tmp_path / "data" / "smoke"
    folder.mkdir(parents=True)
    path = folder / "passages.arrow"
    write_passages(path, passages(30))
    data = bytearray(path.read_bytes())
    data[data.index("é".encode())] ^= 0x40     # a UTF-8 lead byte turned into a continuation byte
    path.write_bytes(bytes(data))
    with pytest.raises(DataFormatError) as caught:
        open_mapped(path, PASSAGES_SCHEMA)
    message = str(caught.value)
    assert message.startswith(f"{path}: field 'contexts': the file is damaged: its bytes at rows 1-30")
    assert f"`dvc checkout --force {path}`" in message
    assert "`dvc repro -s -f profiles/smoke/dvc.yaml:split_passages`" in message


# --- a damaged DVC cache object --------------------------------------------------------------------------

PIPELINE = """
stages:
  make:
    wdir: ../..
    cmd: {python} -c "import pathlib; p = pathlib.Path('data/demo'); (p / 'folder').mkdir(parents=True, exist_ok=True); (p / 'out.txt').write_text('the recorded text\\\\n' * 50); (p / 'folder' / 'a.txt').write_text('alpha ' * 40); (p / 'folder' / 'b.txt').write_text('beta ' * 40)"
    outs:
      - data/demo/out.txt
      - data/demo/folder
  use:
    wdir: ../..
    cmd: {python} use.py
    deps:
      - data/demo/out.txt
      - data/demo/folder
    outs:
      - data/demo/used.txt
"""

# The consuming stage: checks its inputs as a qac stage does, then reads them.
USE = """
from pathlib import Path
from qac.console import run_main
from qac.tracking.recorded_inputs import verify_stage_inputs

def main(argv):
    verify_stage_inputs(Path("profiles/demo/dvc.lock"))
    Path("data/demo/used.txt").write_text(Path("data/demo/out.txt").read_text())

run_main(main, [], "use")
"""


def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DVC), *args], cwd=repo, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture()
def dvc_repo(tmp_path) -> Path:
    """A DVC repository whose stage ``make`` wrote a file and a folder, and ``use`` read them."""
    repo = tmp_path / "repo"
    (repo / "profiles" / "demo").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    assert dvc(repo, "init", "-q").returncode == 0
    (repo / "profiles" / "demo" / "dvc.yaml").write_text(PIPELINE.format(python=sys.executable))
    (repo / "use.py").write_text(USE)
    made = dvc(repo, "repro", "profiles/demo/dvc.yaml")
    assert made.returncode == 0, made.stdout + made.stderr
    return repo


def damage_cache_object(repo: Path, md5: str) -> Path:
    """Flip a byte of the DVC cache object of ``md5`` (DVC keeps it read-only)."""
    cached = repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
    cached.chmod(0o644)
    data = bytearray(cached.read_bytes())
    data[5] ^= 0x01
    cached.write_bytes(bytes(data))
    return cached


def lock_md5(repo: Path, stage: str, path: str) -> str:
    import yaml

    lock = yaml.safe_load((repo / "profiles" / "demo" / "dvc.lock").read_text())
    return next(out["md5"] for out in lock["stages"][stage]["outs"] if out["path"] == path)


def test_dvc_restores_a_damaged_cache_object_silently_and_the_reading_stage_refuses_it(dvc_repo):
    recorded = lock_md5(dvc_repo, "make", "data/demo/out.txt")
    damage_cache_object(dvc_repo, recorded)
    out = dvc_repo / "data" / "demo" / "out.txt"
    out.unlink()
    restored = dvc(dvc_repo, "checkout", "profiles/demo/dvc.yaml")
    assert restored.returncode == 0 and out.read_text() != "the recorded text\n" * 50   # DVC's behaviour

    used = dvc(dvc_repo, "repro", "-s", "-f", "profiles/demo/dvc.yaml:use")
    assert used.returncode != 0
    assert "Traceback" not in used.stderr
    message = next(line for line in used.stderr.splitlines() if "damaged" in line)
    assert message.startswith("use: error: data/demo/out.txt: damaged: DVC's hash of it is ")
    assert f"profiles/demo/dvc.lock records {recorded} for it, as stage make wrote it" in message
    assert "`dvc checkout --force data/demo/out.txt`" in message
    assert f".dvc/cache/files/md5/{recorded[:2]}/{recorded[2:]}" in message
    assert "`dvc repro -s -f profiles/demo/dvc.yaml:make`" in message
    assert not (dvc_repo / "data" / "demo" / "used.txt").exists()      # DVC removed it; nothing wrote it again


def test_a_damaged_file_inside_a_recorded_folder_is_named(dvc_repo, monkeypatch):
    monkeypatch.chdir(dvc_repo)
    listing = json.loads((dvc_repo / ".dvc" / "cache" / "files" / "md5" /
                          lock_md5(dvc_repo, "make", "data/demo/folder")[:2] /
                          lock_md5(dvc_repo, "make", "data/demo/folder")[2:]).read_text())
    b_md5 = next(entry["md5"] for entry in listing if entry["relpath"] == "b.txt")
    damage_cache_object(dvc_repo, b_md5)
    folder = dvc_repo / "data" / "demo" / "folder"
    (folder / "b.txt").unlink()
    assert dvc(dvc_repo, "checkout", "profiles/demo/dvc.yaml").returncode == 0
    lock = dvc_repo / "profiles" / "demo" / "dvc.lock"
    # The stage as DVC runs it: its lock entry's data, though it names no input itself.
    monkeypatch.setenv("DVC_STAGE", "profiles/demo/dvc.yaml:use")
    monkeypatch.setenv("DVC_ROOT", str(dvc_repo))
    with pytest.raises(DamagedInput) as caught:
        verify_stage_inputs(lock)
    assert str(caught.value).startswith("data/demo/folder: damaged: DVC's hash of it is ")
    assert "(files that differ: b.txt)" in str(caught.value)
    assert f".dvc/cache/files/md5/{b_md5[:2]}/{b_md5[2:]}" in str(caught.value)
    # A file inside the folder, named alone, checks the folder it belongs to.
    monkeypatch.delenv("DVC_STAGE")
    with pytest.raises(DamagedInput):
        verify_recorded([folder / "a.txt"], lock)
    assert lock_md5(dvc_repo, "make", "data/demo/folder").endswith(".dir")


def test_good_inputs_pass_and_are_hashed_once(dvc_repo, monkeypatch):
    import qac.tracking.recorded_inputs as recorded

    lock = dvc_repo / "profiles" / "demo" / "dvc.lock"
    inputs = [dvc_repo / "data" / "demo" / "out.txt", dvc_repo / "data" / "demo"]
    assert verify_recorded(inputs, lock) == 3       # out.txt, folder and used.txt: every recorded output there
    hashed = []
    original = recorded.Md5Cache.md5

    def counting(self, file):
        known = str(file) in self.known
        hashed.append(known)
        return original(self, file)
    monkeypatch.setattr(recorded.Md5Cache, "md5", counting)
    assert verify_recorded(inputs, lock) == 3
    assert hashed and all(hashed)                  # every file's MD5 came from the cache of the first pass
    # Inputs the lock does not record, or no lock at all: nothing is hashed, nothing refused.
    assert verify_recorded([dvc_repo / "use.py"], lock) == 0
    assert verify_recorded(inputs, dvc_repo / "profiles" / "none" / "dvc.lock") == 0


def test_a_stage_checks_its_inputs_against_its_profiles_lock_before_its_run_opens(monkeypatch, tmp_path):
    import qac.tracking.recorded_inputs as recorded
    from qac.params import load_params
    from qac.tracking.lifecycle import tracked_stage, verify_inputs

    params = load_params(REPO / "profiles" / "smoke" / "params.yaml")
    checked = []

    def refuse(lock, inputs):
        checked.append((lock, list(inputs)))
        raise DamagedInput(recorded.Recorded(tmp_path / "p.arrow", "0" * 32, "split_passages", lock), "1" * 32,
                           "p.arrow", [])
    monkeypatch.setattr(recorded, "verify_stage_inputs", refuse)
    monkeypatch.setattr("qac.tracking.store.usable_store", lambda: pytest.fail("the store was reached first"))
    with pytest.raises(DamagedInput):
        with tracked_stage(params, "pretrain@x", "x", kind="pretrain", inputs={"passages": tmp_path / "p.arrow"}):
            pytest.fail("the stage's work ran")
    assert [(lock.resolve(), inputs) for lock, inputs in checked] == [
        (REPO / "profiles" / "smoke" / "dvc.lock", [tmp_path / "p.arrow"])]
    monkeypatch.setenv("RANK", "1")       # another rank of a torchrun job leaves the hashing to rank 0
    assert verify_inputs(params, [tmp_path / "p.arrow"]) == 0 and len(checked) == 1
