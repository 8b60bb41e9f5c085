"""The deviation ledger (qac/deviations.yaml): its keys exist, its document is current, each switch runs both ways.

Every switch is run with each of its values on the smoke profile's settings:
the stage it names is executed for real on a tiny corpus (pre-training steps
of the variant that reads the key; retriever 1, mining and retriever 2 for a
fine-tuning key). A stage without a runner here fails the test, so a new
switch cannot enter the ledger untested.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mlflow_stores import empty_store
from qac import deviations
from qac.config import render_profile
from qac.params import PROFILE_NAMES, validate_params
from qac.params.changes import assign
from stages import load_stage

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def profiles():
    return {name: render_profile(name, REPO / "profiles") for name in PROFILE_NAMES}


# ------------------------------------------------------------------ the ledger as data

def test_every_key_the_ledger_names_is_a_params_key_of_every_profile(profiles):
    assert deviations.switches(), "the ledger has no switch"
    for name, params in profiles.items():
        assert deviations.missing_keys(params) == [], name


def test_a_switch_that_is_not_a_params_key_is_reported(profiles):
    params = copy.deepcopy(profiles["smoke"])
    del params["finetune"]["weight_decay"]
    assert "finetune-weight-decay: finetune.weight_decay" in deviations.missing_keys(params)


def test_the_paper_profile_runs_the_recipe_each_switch_names(profiles):
    for entry_id, entry in deviations.recipe_of(profiles["paper"]).items():
        ledger_entry = next(e for e in deviations.load_ledger() if e.id == entry_id)
        assert ledger_entry.recipe in (entry["recipe"] or "").split("/"), (entry_id, entry)


def test_docs_deviations_md_is_generated_from_the_ledger(profiles):
    expected = deviations.render_markdown(profiles)
    assert deviations.DOC.read_text(encoding="utf-8") == expected, "run `qac deviations render`"
    for entry in deviations.load_ledger():
        assert f'<a id="{entry.id}"></a>' in expected
    result = subprocess.run([sys.executable, "-m", "qac.cli", "deviations", "check"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_ledger_holds_the_known_gaps():
    ids = {entry.id for entry in deviations.load_ledger()}
    assert {"cocondenser-loss-weights", "cotmae-decoder", "cotmae-decoder-mask-ratio", "finetune-weight-decay",
            "corpus-token-length", "mining-query-set", "negatives-across-gpus", "zero-shot-cost",
            "retriever1-queries", "bm25-parameters", "bm25-title", "bm25-analyzer", "pretrain-query-length",
            "querygen-precision", "passage-context-kind"} <= ids
    # Every MASTER choice: the NPR mask a switch, the others documented.
    assert {"master-npr-mask", "master-mkp-weights", "master-cmp-ratio", "master-encoder-passes",
            "master-npr-text", "master-generated-texts", "master-max-len"} <= ids
    text = deviations.LEDGER.read_text(encoding="utf-8")
    assert "tevatron issue 81" in text and "RetroMAE" in text


@pytest.mark.parametrize("broken, message", [
    ("entries:\n  - {id: a, title: t, stage: none, paper: p, release: r, ours: o}\n"
     "  - {id: a, title: t, stage: none, paper: p, release: r, ours: o}\n", "id 'a' appears twice"),
    ("entries:\n  - {id: a, title: t, stage: finetune, paper: p, release: r, ours: o, switch: finetune.lr,"
     " values: {paper: 1}, recipe: paper}\n", "must give exactly paper and release"),
    ("entries:\n  - {id: a, title: t, stage: finetune, paper: p, release: r, ours: o, switch: finetune.lr,"
     " values: {paper: 1, release: 2}}\n", "'recipe'"),
    ("entries:\n  - {id: a, title: t, stage: nowhere, paper: p, release: r, ours: o}\n", "stage 'nowhere'"),
    ("entries:\n  - {id: a, title: t, stage: none, paper: p, release: r, ours: o, swtich: x}\n", "unknown field"),
    ("entries:\n  - {id: a, title: t, stage: finetune, paper: p, release: r, ours: o, switch: 42,"
     " values: {paper: 1, release: 2}, recipe: paper}\n", "field 'switch' must be a dotted params key, found 42"),
    ("entries:\n  - {id: a, title: t, stage: none, paper: p, release: r, ours: o, keys: finetune.lr}\n",
     "field 'keys' must be a list of non-empty strings"),
])
def test_a_malformed_ledger_names_the_entry_and_the_field(broken, message):
    with pytest.raises(ValueError, match=message) as error:
        deviations.parse_ledger(broken, Path("ledger.yaml"))
    assert "ledger.yaml: entries[" in str(error.value)


@pytest.mark.parametrize("broken, message", [
    ("entries:\n  - {id: a, switch: [unclosed\n", "ledger.yaml:3: not valid YAML"),
    ("- a list\n", "ledger.yaml: needs a list under 'entries'"),
])
def test_a_ledger_that_is_not_yaml_or_not_a_mapping_is_named_with_its_line(broken, message):
    with pytest.raises(ValueError) as error:
        deviations.parse_ledger(broken, Path("ledger.yaml"))
    assert str(error.value).startswith(message)


def test_recipe_of_follows_a_variants_own_setting(profiles):
    params = profiles["paper"]
    assert deviations.recipe_of(params)["cotmae-decoder"]["recipe"] == "release"
    assert deviations.recipe_of(params, {"cotmae_decoder": "paper"})["cotmae-decoder"]["recipe"] == "paper"
    assert deviations.recipe_summary(params).startswith("release recipe")
    assert deviations.recipe_summary(profiles["default"]).startswith("mixed recipe")


# ------------------------------------------------------------------ each switch, each value, on the smoke profile

def _run_pretrain(params, entry, tmp_path):
    from qac.train.pretrain import PretrainSettings, pretrain
    from test_pretrain_corpus import write_corpus, write_master_inputs

    assert entry.variant, f"{entry.id}: a pretrain switch names the variant that reads it"
    settings = PretrainSettings.from_params(params, entry.variant)
    key = entry.switch.rsplit(".", 1)[1]
    assert getattr(settings, key) == deviations.lookup(params, entry.switch)
    settings = dataclasses.replace(settings, steps=2, batch_size=4, checkpoint_every=2, log_every=1, dtype="fp32")
    data = tmp_path / "data"
    if not (data / "passages.arrow").exists():
        write_corpus(data, documents=4, spans=3, queries=4)
    extra = write_master_inputs(data) if settings.method == "master" else None
    logged = []
    summary = pretrain(settings, passages=data / "passages.arrow", queries=data / "queries.arrow",
                       work_dir=tmp_path / "work", out_dir=tmp_path / "out",
                       log=lambda step, values: logged.append(values), extra_inputs=extra)
    assert summary["steps"] == 2 and (tmp_path / "out" / "encoder").exists()
    assert logged and all(math.isfinite(values["loss"]) for values in logged)
    if entry.id == "single-span-documents":    # write_corpus holds a single-span document
        from qac.data.context_pairs import load_pair_corpus

        corpus = load_pair_corpus(data / "passages.arrow", None, "passage",
                                  single_span=settings.single_span_documents)
        assert corpus.self_paired == (settings.single_span_documents == "self")
    return logged


def _run_finetune(params, entry, tmp_path, model_dir):
    """Retriever 1, mining with it, retriever 2: what the finetune stage runs, on 24 tiny documents."""
    import random

    from qac.train.finetune import FinetuneSettings, fine_tune_retriever
    from qac.train.groups import TrainingQuery, retriever1_queries, retriever2_negatives
    from qac.models.loading import load_tokenizer
    from qac.retrieval import document_text, title_separator
    from qac.train.mining import mine_with_retriever

    section = params["finetune"]
    settings = dataclasses.replace(FinetuneSettings.from_params(section, params["seed"]), batch_size=4, epochs=1,
                                   dtype="fp32")
    rng = random.Random(0)
    words = "cell protein gene virus immune tumour brain heart lung blood bone muscle drug dose trial".split()
    # Titled documents joined as finetune.title_join says (title [SEP] text in the release), as the stage does.
    separator = title_separator(section["title_join"], load_tokenizer(str(model_dir)))
    passage_text = {f"d{i}": document_text(f"{words[i % len(words)]} study",
                                           " ".join(rng.choice(words) for _ in range(rng.randint(20, 90))), separator)
                    for i in range(24)}
    assert all(("[SEP]" in text) == (section["title_join"] == "sep") for text in passage_text.values())
    ids = list(passage_text)
    bm25 = {f"q{i}": [ids[(i + k) % 24] for k in range(1, 5)] for i in range(8)}
    # Half the judged queries have no retriever-1 negatives (as MS MARCO's queries missing from the triples).
    queries = [TrainingQuery(f"q{i}", " ".join(passage_text[ids[i]].split()[:4]), (ids[i],),
                             tuple(bm25[f"q{i}"]) if i < 4 else ()) for i in range(8)]
    r1_queries = retriever1_queries(queries, section["r1_queries"])
    assert len(r1_queries) == (4 if section["r1_queries"] == "triples" else 8)
    r1_settings = settings.for_retriever("r1")
    assert r1_settings.passage_max_len == (section.get("corpus_max_len") or section["passage_max_len"])
    r1, tokenizer, losses = fine_tune_retriever(model_dir, r1_queries, ids, passage_text, r1_settings)
    records = mine_with_retriever(r1, tokenizer, queries, passage_text, depth=10,
                                  query_max_len=settings.query_max_len, passage_max_len=settings.corpus_length,
                                  batch_size=8)
    mined = {record["qid"]: record["negatives"] for record in records}
    negatives = retriever2_negatives(mined, bm25, section["r2_use_bm25_negatives"])
    for qid, pool in negatives.items():
        assert set(bm25[qid]) <= set(pool) or not section["r2_use_bm25_negatives"]
        assert pool[:len(mined[qid])] == list(mined[qid])
    r2_queries = [dataclasses.replace(query, negatives=tuple(negatives[query.qid])) for query in queries]
    _, _, r2_losses = fine_tune_retriever(model_dir, r2_queries, ids, passage_text, settings.for_retriever("r2"))
    assert losses and r2_losses and all(math.isfinite(loss) for loss in losses + r2_losses)
    return losses + r2_losses


def _run_bm25(params, entry, tmp_path, model_dir):
    """The prepare and bm25 stages on RocketQA-style passages with official triples: retriever 1's negatives."""
    from qac.data.textfile import iter_jsonl
    from test_release_data import marco_project

    monkeypatch = pytest.MonkeyPatch()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(tmp_path / "mlflow.db"))
        marco_project(tmp_path, monkeypatch, finetune=params.finetune.to_dict(), bm25=params.bm25.to_dict(),
                      seed=params.seed)
        for stage, argv in (("prepare", ["--dataset", "marco"]), ("bm25", [])):
            load_stage(stage).main(argv)
    finally:
        monkeypatch.undo()
    records = list(iter_jsonl(tmp_path / "data" / "test" / "bm25" / "negatives.jsonl"))
    assert [record["qid"] for record in records] == ["10", "11"]
    assert not any(set(record["negatives"]) & set(record["positives"]) for record in records)
    if params["finetune"]["r1_negatives"] == "official":   # drawn from the triples' negatives of each query
        assert all(record["negatives"] for record in records)
        assert set(records[0]["negatives"]) <= {"1", "2", "3"} and set(records[1]["negatives"]) <= {"0", "1"}
        assert all(len(record["negatives"]) <= params["finetune"]["official_negatives"] for record in records)
    return records


def _run_split(params, entry, tmp_path, model_dir):
    """The split stage's function on the smoke profile's first 40 SciFact documents, then a pre-training batch."""
    import itertools
    import json

    from conftest import SHARED_DATA
    from qac.data.arrowstore import PASSAGES_SCHEMA, iter_records
    from qac.data.context_pairs import PairCollator, PairSampler, load_pair_corpus
    from qac.data.splitting import SplitSettings, split_corpus_file
    from qac.models.loading import load_tokenizer
    from qac.train.pretrain import PretrainSettings

    source = SHARED_DATA / "scifact" / "corpus.jsonl"
    if not source.exists():
        pytest.skip(f"data mirror {SHARED_DATA} not present")
    corpus = tmp_path / "corpus.jsonl"
    with open(source, encoding="utf-8") as lines:
        corpus.write_text("".join(itertools.islice(lines, params["split"]["max_documents"])), encoding="utf-8")
    settings = SplitSettings.from_params(params)
    stats, _ = split_corpus_file(corpus, tmp_path / "passages.arrow", tmp_path / "punkt",
                                 tokenizer_spec=params["split"]["tokenizer"], settings=settings, punkt="trained",
                                 progress=False)
    max_len = params["split"]["max_len"]
    lengths = [record["n_tokens"] for record in iter_records(tmp_path / "passages.arrow", PASSAGES_SCHEMA)]
    assert stats.passages == len(lengths) > stats.documents
    if params["split"]["spans"] == "bounded":
        assert max(lengths) <= max_len
    else:           # spans close after the sentence that crosses the limit
        assert max(lengths) > max_len
    variant = PretrainSettings.from_params(params, "cocondenser-passage")
    assert variant.spans == params["split"]["spans"]
    pairs = load_pair_corpus(tmp_path / "passages.arrow", None, "passage")
    collator = PairCollator(load_tokenizer(params["split"]["tokenizer"]), variant.max_len, variant.query_max_len,
                            0.3, 0.3, variant.seed, crop=variant.spans == "overflow")
    batch = collator(PairSampler(pairs, "passage", variant.seed).batch(0, 32), 0)
    assert batch["anchor"]["input_ids"].shape[1] <= variant.max_len
    return json.dumps(stats.as_metrics())


def _run_beir(params, entry, tmp_path, model_dir):
    """Table 2's retriever: with ``beir`` the footnote's recipe trains on hard negatives read from the real file
    format (the whole stage runs in tests/test_beir_retriever.py); otherwise it trains nothing."""
    from qac.data.hard_negatives import read_hard_negatives
    from qac.train.finetune import fine_tune_retriever
    from qac.train.groups import TrainingQuery
    from qac.train.zero_shot import recipe_settings, trained_variants
    from test_beir_retriever import SCORED, write_file

    value = deviations.lookup(params, entry.switch)
    if value != "beir":
        assert trained_variants(params) == []
        return []
    assert trained_variants(params)
    section = params["beir_retriever"]
    selected = read_hard_negatives(write_file(tmp_path / "hn.jsonl.gz", SCORED),
                                   per_system=section["negatives_per_system"],
                                   ce_score_margin=section["ce_score_margin"], systems=section["systems"])
    texts = {"0": "the sun is a star", "1": "python is a language", "2": "paris is in france", "3": "water boils"}
    queries = [TrainingQuery("10", "what is the sun", ("0",), tuple(selected.negatives["10"])),
               TrainingQuery("11", "where is paris", ("2", "3"), tuple(selected.negatives["11"]))]
    settings = dataclasses.replace(recipe_settings(params), batch_size=2, epochs=1,
                                   query_max_len=16, passage_max_len=16, dtype="fp32")
    model, _, losses = fine_tune_retriever(model_dir, queries, list(texts), texts, settings)
    assert model.normalize and model.pooling == section["pooling"]
    assert losses and all(math.isfinite(loss) for loss in losses)
    return losses


RUNNERS = {"pretrain": _run_pretrain, "finetune": _run_finetune, "bm25": _run_bm25, "split": _run_split,
           "beir": _run_beir}
CASES = [(entry.id, recipe) for entry in deviations.switches() for recipe in deviations.RECIPES]


@pytest.mark.parametrize("entry_id, recipe", CASES)
def test_each_switch_value_runs_on_the_smoke_profile(entry_id, recipe, profiles, tmp_path, tiny_bert_dir):
    entry = next(e for e in deviations.load_ledger() if e.id == entry_id)
    assert entry.stage in RUNNERS, f"{entry.id}: no runner for stage {entry.stage!r} in tests/test_deviations.py"
    raw = copy.deepcopy(profiles["smoke"])
    assign(raw, entry.switch, entry.values[recipe])
    # Each key checked; not the rules across keys, which weigh a switch against the smoke profile's data
    # (retriever 1's official triples), where each runner brings data of its own.
    params = validate_params(raw, complete=False)
    if entry.stage == "pretrain":
        _run_pretrain(params, entry, tmp_path)
    else:
        RUNNERS[entry.stage](params, entry, tmp_path, tiny_bert_dir)


def test_the_tables_stage_reruns_when_a_switch_changes():
    """The tables print each cell's recipe, so every switch (or a section holding it) is a tables param."""
    import yaml

    stage = yaml.safe_load((REPO / "profiles" / "pipeline.yaml").read_text())["stages"]["tables"]
    keys = [key for entry in stage["params"] for file_keys in entry.values() for key in file_keys]
    for entry in deviations.switches():
        assert any(entry.switch == key or entry.switch.startswith(key + ".") for key in keys), entry.switch
