"""Pinned hub models: a profile that sets pinned_models refuses to run an unpinned one, and `qac profile pin`
writes the hub's commits into the profile's own file (asked of a hub API served on loopback)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from qac.config import render_profile
from qac.errors import UserError
from qac.model_specs import is_commit, split_revision
from qac.params import ParamsError, load_params, validate_params
from qac.params.model_sources import pin_problems
from qac.params.pinning import hub_commit, pin_profile, pinned_text, unpinned_models

REPO = Path(__file__).resolve().parents[1]


def _commit_of(name: str) -> str:
    return hashlib.sha1(f"hub:{name}".encode()).hexdigest()


class _HubApi(http.server.BaseHTTPRequestHandler):
    """GET /api/models/<name>: the model's id and commit, as the hub's API answers; 404 for an unknown name."""

    missing: set[str] = set()
    asked: list[str] = []

    def do_GET(self):  # noqa: N802 (the handler's name)
        name = self.path.split("?")[0].removeprefix("/api/models/")
        type(self).asked.append(name)
        if name in self.missing:
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "Repository not found"}')
            return
        body = json.dumps({"id": name, "sha": _commit_of(name), "private": False}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub.constants

    # The suite runs offline (HF_HUB_OFFLINE=1): this hub is on loopback, the only one these tests reach.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubApi)
    _HubApi.missing, _HubApi.asked = set(), []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def profiles(tmp_path):
    """A copy of the profiles' source files, to pin without touching the checkout's."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    for path in (REPO / "profiles").glob("*.yaml"):
        shutil.copy(path, folder / path.name)
    return folder


def _pin(profiles: Path, endpoint: str):
    return pin_profile(profiles / "paper.yaml", validate_params(render_profile("paper", profiles)),
                       resolve=functools.partial(hub_commit, endpoint=endpoint))


def test_the_paper_profile_requires_pins_and_names_what_is_unpinned():
    params = validate_params(render_profile("paper"))       # read: plans and costs need no pins
    assert params.pinned_models
    unpinned = unpinned_models(params)
    assert "Luyu/condenser" in unpinned and "bert-base-uncased" not in unpinned   # pinned in profiles/paper.yaml
    problems = pin_problems(params)
    assert len(problems) == len(unpinned)                    # one paragraph per model, every key named in it
    text = " ".join(problem.message for problem in problems)
    for keys in unpinned.values():
        assert all(key in text or any(p.key == key for p in problems) for key in keys)
    assert "qac profile pin paper" in text
    with pytest.raises(ParamsError) as refused:              # a stage or `qac repro` stops here
        load_params(REPO / "profiles" / "paper" / "params.yaml")
    assert "Luyu/condenser" in str(refused.value)
    assert load_params(REPO / "profiles" / "paper" / "params.yaml", running=False).pinned_models


def test_profiles_without_the_switch_run_unpinned_models():
    params = validate_params(render_profile("default"))
    assert not params.pinned_models and pin_problems(params) == []


def test_qac_profile_validate_refuses_the_unpinned_paper_profile():
    done = subprocess.run([sys.executable, "-m", "qac.cli", "profile", "validate", "paper"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "without a revision" in done.stderr and "Traceback" not in done.stderr
    assert "pretrain.variants.cocondenser-passage.init" in done.stderr


def test_pin_writes_the_hubs_commits_where_the_profile_names_them(profiles, hub):
    before = (profiles / "paper.yaml").read_text()
    wanted = unpinned_models(validate_params(render_profile("paper", profiles)))
    pins = _pin(profiles, hub)
    assert {pin.name for pin in pins} == set(wanted)
    assert all(pin.commit == _commit_of(pin.name) and pin.places >= 1 for pin in pins)
    params = validate_params(render_profile("paper", profiles))
    assert pin_problems(params) == []
    assert params.encoder(params.reference_retrievers[0]) is not None     # encoders still name it as published
    after = (profiles / "paper.yaml").read_text()
    assert after != before
    # Only values changed: comments, quoted sources and encoders' keys read as they did.
    changed = [(old, new) for old, new in zip(before.splitlines(), after.splitlines()) if old != new]
    assert len(before.splitlines()) == len(after.splitlines())
    for old, new in changed:
        old_code, new_code = old.partition(" #")[0], new.partition(" #")[0]
        assert old.partition(" #")[2] == new.partition(" #")[2]
        assert any(f"{pin.name}@{pin.commit}" in new_code for pin in pins), new
    assert yaml.safe_load(after)["encoders"].keys() == yaml.safe_load(before)["encoders"].keys()
    # A second pin finds nothing left and asks the hub nothing.
    asked = len(_HubApi.asked)
    assert _pin(profiles, hub) == []
    assert len(_HubApi.asked) == asked
    assert (profiles / "paper.yaml").read_text() == after


def test_a_model_the_hub_does_not_have_leaves_the_file_as_it_was(profiles, hub):
    before = (profiles / "paper.yaml").read_bytes()
    _HubApi.missing = {"caskcsg/cotmae_base_msmarco_retriever"}
    with pytest.raises(UserError, match="caskcsg/cotmae_base_msmarco_retriever: no such model"):
        _pin(profiles, hub)
    assert (profiles / "paper.yaml").read_bytes() == before
    assert not [path for path in profiles.iterdir() if path.name.startswith(".")]     # no temp file left


def test_an_unreachable_hub_is_one_clear_error(profiles, hub):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    before = (profiles / "paper.yaml").read_bytes()
    with pytest.raises(UserError, match="the hub cannot be reached"):
        _pin(profiles, f"http://127.0.0.1:{port}")
    assert (profiles / "paper.yaml").read_bytes() == before


def test_an_inherited_model_must_be_written_in_the_profiles_own_file(profiles, hub):
    text = (profiles / "paper.yaml").read_text()
    start = text.index("continuation:\n")
    end = text.index("\n\n", start) + 2
    (profiles / "paper.yaml").write_text(text[:start] + text[end:])     # gpt2 now comes from base.yaml
    with pytest.raises(UserError, match=r"continuation\.model \(gpt2\)"):
        _pin(profiles, hub)
    assert _HubApi.asked == []                                          # refused before asking


def test_pin_leaves_comments_mapping_keys_quoted_text_and_pinned_values_alone():
    name, commit = "org/model", "a" * 40
    text = ("# trained from org/model, see its card\n"
            "init: org/model   # org/model as published\n"
            "other: org/model-large\n"
            "list: [org/model, org/model@" + "b" * 40 + "]\n"
            "encoders:\n  org/model: {pooling: cls}\n  'org/model': {pooling: cls}\n"
            "source: \"published with org/model\"\n"
            "items:\n  - org/model\n")
    pinned, counts = pinned_text(text, {name: commit})
    lines = pinned.splitlines()
    assert lines[0] == "# trained from org/model, see its card"
    assert lines[1] == f"init: org/model@{commit}   # org/model as published"
    assert lines[2] == "other: org/model-large"
    assert lines[3] == f"list: [org/model@{commit}, org/model@{'b' * 40}]"
    assert lines[5:7] == ["  org/model: {pooling: cls}", "  'org/model': {pooling: cls}"]
    assert lines[7] == "source: \"published with org/model\""
    assert lines[9] == f"  - org/model@{commit}"
    assert counts[name] == 3


def test_a_pinned_reference_retriever_keeps_its_encoder_row_and_folder():
    from qac.reference import reference_slug
    from qac.reporting.tables import reference_row

    params = validate_params(render_profile("paper-mini"))
    spec = params.reference_retrievers[0]
    name, revision = split_revision(spec)
    assert is_commit(revision)
    assert params.encoder(spec) is params.encoder(name) is not None
    assert reference_slug(spec) == name.replace("/", "--")
    assert reference_row(spec) == f"published checkpoint {name}"


def test_pin_dry_run_writes_nothing(profiles, hub, tmp_path):
    before = (profiles / "paper.yaml").read_bytes()
    env = {"HF_ENDPOINT": hub, "HF_HUB_OFFLINE": "0", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "qac.cli", "profile", "pin", "paper", "--dry-run"],
                          cwd=profiles.parent, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Luyu/condenser@{_commit_of('Luyu/condenser')}" in done.stdout
    assert "nothing written" in done.stdout
    assert (profiles / "paper.yaml").read_bytes() == before
