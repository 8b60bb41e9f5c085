"""Profiles: complete, consistent with the paper where they claim to be, and a DVC graph for each."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from qac.config import (HandEditedParams, deep_merge, params_hand_edited, render_profile, render_profile_files,
                        rendered_params_text, rendered_pipeline_text, write_params)
from qac.params import PROFILE_NAMES, load_params
from qac.errors import UserError
from qac.params.errors import ParamsError

REPO = Path(__file__).resolve().parent.parent
BIN = Path(__import__("sys").executable).parent



def _keys(mapping, prefix=""):
    out = set()
    for key, value in mapping.items():
        out.add(prefix + key)
        if isinstance(value, dict) and key not in ("datasets", "variants", "generators", "space", "kind_prefixes",
                                                   "stages", "encoders"):
            out |= _keys(value, prefix + key + ".")
    return out


def test_deep_merge_replaces_leaves_and_merges_mappings():
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": 3}, "d": [2]}) == {"a": {"b": 3, "c": 2}, "d": [2]}


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_profile_overrides_only_known_keys(name):
    base = yaml.safe_load((REPO / "profiles" / "base.yaml").read_text())
    override = yaml.safe_load((REPO / "profiles" / f"{name}.yaml").read_text()) or {}
    unknown = _keys(override) - _keys(base)
    assert not unknown, f"profiles/{name}.yaml sets keys that base.yaml does not define: {sorted(unknown)}"


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_profile_is_complete(name):
    params = render_profile(name)
    assert params["profile"] == name
    assert params["train_dataset"] in params["datasets"]
    assert params["pretrain_corpus"] in params["datasets"]
    for dataset in params["zero_shot"]:
        assert dataset in params["datasets"], f"zero-shot dataset {dataset} is not declared"
    for name_, dataset in params["datasets"].items():
        assert dataset["format"] in ("beir", "msmarco-docs", "msmarco-passage", "trec", "hf"), name_
        assert dataset.get("mirror") or dataset.get("url"), f"{name_}: neither mirror nor url"
    variants = params["pretrain"]["variants"]
    assert variants, "no pre-training variants"
    for variant in variants.values():
        assert variant["method"] in ("none", "cocondenser", "cotmae", "master")
        if variant["method"] != "none":
            assert variant["context_type"] in ("passage", "query", "mixed")
            assert 1 <= variant["query_count"] <= params["querygen"]["queries_per_passage"]


def test_paper_profile_uses_the_papers_settings():
    params = render_profile("paper")
    assert params["pretrain_corpus"] == "msmarco-docs"
    assert params["split"]["max_len"] == 144 and params["split"]["short_span_prob"] == 0.15
    assert params["split"]["tokenizer"].partition("@")[0] == "bert-base-uncased"
    assert params["query_generator"]["model"] == "doc2query/all-with_prefix-t5-base-v1"
    assert params["querygen"]["prefix"] == "text2query: "
    assert (params["querygen"]["top_p"], params["querygen"]["top_k"], params["querygen"]["max_new_tokens"]) == (0.95, 25, 64)
    assert params["querygen"]["queries_per_passage"] == 20
    variants = params["pretrain"]["variants"]
    cocondenser = variants["cocondenser-query-q20"]
    assert (cocondenser["init"], cocondenser["steps"], cocondenser["batch_size"], cocondenser["lr"]) == ("Luyu/condenser", 120000, 2048, 1e-4)
    cotmae = variants["cotmae-query-q20"]
    assert (cotmae["init"].partition("@")[0], cotmae["steps"], cotmae["batch_size"], cotmae["lr"]) == \
        ("bert-base-uncased", 50000, 16384, 4e-4)
    assert {v["query_count"] for v in variants.values() if v.get("context_type") == "query"} == {1, 5, 10, 20}
    assert params["pretrain"]["common"]["max_len"] == 144 and params["pretrain"]["common"]["skip_from"] == 6
    finetune = params["finetune"]
    assert (finetune["lr"], finetune["batch_size"], finetune["train_n_passages"], finetune["epochs"]) == (2e-5, 64, 16, 3)
    assert (finetune["passage_max_len"], finetune["query_max_len"], finetune["mine_depth"]) == (144, 32, 200)
    assert len(params["zero_shot"]) == 14
    assert set(params["datasets"]["msmarco-passage"]["splits"]) >= {"train", "dev", "dl19", "dl20"}


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_committed_profile_files_are_current(name):
    """profiles/NAME/params.yaml is the render of base + overrides, and dvc.yaml the template with its code deps."""
    folder = REPO / "profiles" / name
    assert (folder / "params.yaml").read_text() == rendered_params_text(render_profile(name)), (
        f"profiles/{name}/params.yaml is stale or edited: run `qac profile render {name}`")
    assert not params_hand_edited(folder / "params.yaml")
    assert (folder / "dvc.yaml").read_text() == rendered_pipeline_text(), (
        f"profiles/{name}/dvc.yaml is stale (code moved, or the template changed): run `qac profile render {name}`")


def _profiles_copy(tmp_path):
    import shutil

    target = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", target)
    return target


def test_render_leaves_a_current_profile_alone(tmp_path):
    profiles = _profiles_copy(tmp_path)
    before = (profiles / "smoke" / "params.yaml").stat().st_mtime_ns
    assert render_profile_files("smoke", profiles_dir=profiles) == []
    assert (profiles / "smoke" / "params.yaml").stat().st_mtime_ns == before


def test_render_follows_a_change_of_the_profile_file(tmp_path):
    profiles = _profiles_copy(tmp_path)
    overrides = yaml.safe_load((profiles / "smoke.yaml").read_text())
    overrides["seed"] = 7
    (profiles / "smoke.yaml").write_text(yaml.safe_dump(overrides))
    assert render_profile_files("smoke", profiles_dir=profiles) == [profiles / "smoke" / "params.yaml"]
    assert load_params(profiles / "smoke" / "params.yaml")["seed"] == 7


_MAX_LEN = re.compile(r"^(\s+)max_len: (\d+)$", re.M)


@pytest.mark.parametrize("edit, named", [
    (lambda text: _MAX_LEN.sub(r"\1max_len: sixty", text, count=1), "parameter split.max_len: expected an integer"),
    (lambda text: _MAX_LEN.sub(r"\1max_lenn: \2", text, count=1), "parameter split.max_lenn: unknown key"),
    (lambda text: text + "\nprepare_more:\n  - 120\n", "parameter prepare_more: unknown key"),
    (lambda text: _MAX_LEN.sub("\\1\tmax_len: \\2", text, count=1), "not valid YAML at line"),
    (lambda text: _MAX_LEN.sub(r"\g<0>\n\1max_len: \2", text, count=1), "'max_len' is written twice"),
    (lambda text: "- a\n- b\n", "expected a mapping of parameters, found a list"),
    (lambda text: text.replace("max_len", "max\udcfflen", 1), "not UTF-8 text at line"),
], ids=["wrong type", "unknown key", "unknown section", "tab", "key twice", "a list", "a byte not UTF-8"])
def test_a_broken_profile_file_renders_nothing_and_names_its_line(tmp_path, edit, named):
    """A profile source that breaks the schema or YAML is named at its own file and line; params.yaml stays."""
    profiles = _profiles_copy(tmp_path)
    rendered = (profiles / "smoke" / "params.yaml").read_bytes()
    text = edit((profiles / "smoke.yaml").read_text())
    (profiles / "smoke.yaml").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ParamsError) as caught:
        render_profile_files("smoke", profiles_dir=profiles)
    message = str(caught.value)
    assert message.startswith(f"{profiles / 'smoke.yaml'}") and named in message
    if "parameter " in named:
        line = int(message.split(":")[1])
        assert named.split()[1].rstrip(":").rpartition(".")[2] in text.splitlines()[line - 1]
    assert (profiles / "smoke" / "params.yaml").read_bytes() == rendered


def test_a_problem_written_in_the_base_is_named_there(tmp_path):
    profiles = _profiles_copy(tmp_path)
    base = (profiles / "base.yaml").read_text()
    (profiles / "base.yaml").write_text(re.sub(r"^seed: \d+", "seed: -1", base, count=1, flags=re.M))
    with pytest.raises(ParamsError) as caught:
        render_profile("smoke", profiles)
    line = int(str(caught.value).split(":")[1])
    assert str(caught.value).startswith(f"{profiles / 'base.yaml'}:{line}: parameter seed: must be >= 0")
    assert (profiles / "base.yaml").read_text().splitlines()[line - 1].startswith("seed: -1")


def test_render_carries_a_new_description_of_the_profile(tmp_path):
    """Only the profile's leading comment changed: the values are the same, the header is not."""
    profiles = _profiles_copy(tmp_path)
    text = (profiles / "smoke.yaml").read_text()
    (profiles / "smoke.yaml").write_text("# smoke: a new description.\n" + text)
    assert render_profile_files("smoke", profiles_dir=profiles) == [profiles / "smoke" / "params.yaml"]
    assert "# smoke: a new description." in (profiles / "smoke" / "params.yaml").read_text()
    assert not params_hand_edited(profiles / "smoke" / "params.yaml")


def test_render_never_silently_discards_a_hand_edit(tmp_path):
    profiles = _profiles_copy(tmp_path)
    params_file = profiles / "smoke" / "params.yaml"
    # (43 is the seed copies' seed: the variants they copy would run it twice, which the schema refuses)
    params_file.write_text(params_file.read_text().replace("seed: 42", "seed: 44"))
    assert params_hand_edited(params_file)
    overrides = yaml.safe_load((profiles / "smoke.yaml").read_text())
    overrides["split"]["workers"] = 2          # the profile changed too: a render is due
    (profiles / "smoke.yaml").write_text(yaml.safe_dump(overrides))
    with pytest.raises(HandEditedParams, match="edited by hand"):
        render_profile_files("smoke", profiles_dir=profiles)
    assert load_params(params_file)["seed"] == 44
    render_profile_files("smoke", force=True, profiles_dir=profiles)
    assert load_params(params_file)["seed"] == 42 and load_params(params_file)["split"]["workers"] == 2


def test_a_comment_written_into_the_rendered_file_is_a_hand_edit_too(tmp_path):
    """A note beside a value changes no parameter, but it is the user's text: a render keeps it unless forced."""
    profiles = _profiles_copy(tmp_path)
    params_file = profiles / "smoke" / "params.yaml"
    noted = params_file.read_text().replace("seed: 42", "seed: 42  # the seed of the run in my notebook", 1)
    params_file.write_text(noted)
    assert params_hand_edited(params_file)
    overrides = yaml.safe_load((profiles / "smoke.yaml").read_text())
    overrides["split"]["workers"] = 2
    (profiles / "smoke.yaml").write_text(yaml.safe_dump(overrides))
    with pytest.raises(HandEditedParams, match="edited by hand"):
        render_profile_files("smoke", profiles_dir=profiles)
    assert params_file.read_text() == noted


def test_a_file_of_an_earlier_render_is_rendered_over_unless_its_values_were_edited(tmp_path):
    """Earlier renders recorded a digest of the values alone: such a file is still recognised as a render."""
    import hashlib

    from qac.config import _params_body

    profiles = _profiles_copy(tmp_path)
    params_file = profiles / "smoke" / "params.yaml"
    text = params_file.read_text()
    values = hashlib.sha256(_params_body(load_params(params_file).to_dict(), colons_in_flow=True).encode()).hexdigest()[:16]
    earlier = re.sub(r"# render-sha256: \w+", f"# render-digest: {values}", text)
    params_file.write_text(earlier)
    assert not params_hand_edited(params_file)
    assert render_profile_files("smoke", profiles_dir=profiles) == [params_file]
    assert params_file.read_text() == text
    params_file.write_text(earlier.replace("seed: 42", "seed: 44"))
    assert params_hand_edited(params_file)


def test_a_collection_holding_a_colon_is_written_in_block_style():
    """`dvc exp run -S` rewrites params with ruamel.yaml, which writes ``'24:00:00'`` and ``'tiny:minilm'``
    unquoted; libyaml cannot read such a value inside ``{...}`` or ``[...]``, so those collections go one
    value a line. Collections of other scalars stay on one line."""
    from qac.config import _params_body

    body = _params_body({"cluster": {"time": "24:00:00", "nodes": 1}, "model": {"init": "tiny:minilm"},
                         "urls": ["https://example.org/a.zip"], "split": {"max_len": 64, "tokenizer": "minilm"},
                         "splits": ["train", "test"]})
    assert body == ("cluster:\n  time: '24:00:00'\n  nodes: 1\nmodel:\n  init: tiny:minilm\n"
                    "urls:\n- https://example.org/a.zip\nsplit: {max_len: 64, tokenizer: minilm}\n"
                    "splits: [train, test]\n")


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_libyaml_reads_a_profile_as_dvc_exp_run_rewrites_it(name):
    """DVC reads params with ruamel.yaml's libyaml parser (a dependency): after `dvc exp run -S` rewrites the
    file (DVC's own round trip), that parser reads the values the pure-Python one reads."""
    pytest.importorskip("_ruamel_yaml", reason="ruamel.yaml's libyaml parser is not installed")
    import io

    from dvc.utils.serialize._yaml import _dump, parse_yaml_for_update
    from ruamel.yaml import YAML

    path = REPO / "profiles" / name / "params.yaml"
    data = parse_yaml_for_update(path.read_text(encoding="utf-8"), str(path))
    data["seed"] = 7                                            # what `-S seed=7` changes before writing
    rewritten = io.StringIO()
    _dump(data, rewritten)
    text = rewritten.getvalue()
    assert re.search(r"^ *[\w.-]+: [^'\s{\[][^\s]*:\S", text, re.M), "no unquoted value with a colon to read"
    assert YAML(typ="safe").load(text) == YAML(typ="safe", pure=True).load(text)


def test_params_file_is_found_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("QAC_PARAMS", raising=False)
    monkeypatch.delenv("QAC_PROFILE", raising=False)
    assert load_params()["profile"] == "default"
    monkeypatch.setenv("QAC_PROFILE", "smoke")
    assert load_params()["profile"] == "smoke"
    other = tmp_path / "params.yaml"
    write_params(render_profile("paper"), other)
    monkeypatch.setenv("QAC_PARAMS", str(other))
    assert load_params(running=False)["profile"] == "paper"
    monkeypatch.delenv("QAC_PARAMS")
    for name in ("", "../smoke"):                 # set to nothing or to a path: named, never the default profile
        monkeypatch.setenv("QAC_PROFILE", name)
        with pytest.raises(UserError, match=f"QAC_PROFILE: the profile name {name!r} is not"):
            load_params()


def test_paper_plan_lists_every_stage_without_the_data(tmp_path, copy_repository):
    """`qac profile plan paper` (make paper-dry) shows the whole study where none of its data exists."""
    work = tmp_path / "repo"
    copy_repository(work)
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    result = subprocess.run([str(BIN / "qac"), "profile", "plan", "paper"], cwd=work, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    stages = [line.split()[1] for line in result.stdout.splitlines()[1:]]
    params = render_profile("paper")
    expected = {"split_passages", "query_generator", "generate_queries", "bm25", "annotation", "tables"}
    for variant in params["pretrain"]["variants"]:
        expected |= {f"pretrain@{variant}", f"finetune@{variant}", f"evaluate@{variant}"}
    assert set(stages) >= expected
    assert stages.index("tables") == len(stages) - 1
    for variant in params["pretrain"]["variants"]:
        assert stages.index(f"pretrain@{variant}") < stages.index(f"finetune@{variant}") < stages.index(f"evaluate@{variant}")


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_dvc_graph_builds_for_every_profile(name, tmp_path, copy_repository):
    """DVC resolves every stage of the profile and wires them in the study's order.

    `dvc dag` builds the whole graph (templating, deps, outs, params) without
    running anything or needing the data, which the paper profile cannot have here.
    """
    work = tmp_path / "repo"
    copy_repository(work)
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    result = subprocess.run([str(BIN / "dvc"), "dag", "--dot", f"profiles/{name}/dvc.yaml"], cwd=work,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # Nodes are addressed as profiles/<name>/dvc.yaml:<stage> when run from the root.
    edges = {(a.rsplit(":", 1)[-1], b.rsplit(":", 1)[-1])
             for a, b in re.findall(r'"([^"]+)" -> "([^"]+)"', result.stdout)}
    params = render_profile(name)
    train, corpus = params["train_dataset"], params["pretrain_corpus"]
    expected = {(f"prepare@{corpus}", "split_passages"), ("split_passages", "generate_queries"),
                ("query_generator", "generate_queries"), (f"prepare@{train}", "bm25"), ("bm25", "tables")}
    for variant in params["pretrain"]["variants"]:
        expected |= {("split_passages", f"pretrain@{variant}"), ("generate_queries", f"pretrain@{variant}"),
                     (f"pretrain@{variant}", f"finetune@{variant}"), ("bm25", f"finetune@{variant}"),
                     (f"finetune@{variant}", f"evaluate@{variant}"), (f"evaluate@{variant}", "tables")}
    for dataset in params["zero_shot"]:
        expected.add((f"prepare@{dataset}", f"evaluate@{next(iter(params['pretrain']['variants']))}"))
    assert expected <= edges, sorted(expected - edges)
