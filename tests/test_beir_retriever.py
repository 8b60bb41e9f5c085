"""Table 2's zero-shot retriever: sentence-transformers' hard negatives, the footnote's recipe, its stage."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from qac.data.errors import DatasetUnavailableError
from qac.data.hard_negatives import HardNegativesError, locate_hard_negatives, read_hard_negatives
from qac.params import validate_params, with_values
from qac.train.zero_shot import recipe_settings, trained_variants

REPO = Path(__file__).resolve().parent.parent

# The file as train_msmarco_v3.py reads it: ids with cross-encoder scores; systems in file order.
SCORED = [
    {"qid": 10, "pos": [{"pid": 0, "ce-score": 9.0}],
     "neg": {"bm25": [{"pid": 1, "ce-score": 2.0}, {"pid": 2, "ce-score": 8.5}, {"pid": 3, "ce-score": 1.0}],
             "msmarco-distilbert-base-v3": [{"pid": 1, "ce-score": 2.0}, {"pid": 3, "ce-score": 1.0}]}},
    {"qid": 11, "pos": [{"pid": 2, "ce-score": 7.0}, {"pid": 3, "ce-score": 8.0}],
     "neg": {"bm25": [{"pid": 0, "ce-score": -1.0}, {"pid": 1, "ce-score": 6.5}]}},
    {"qid": 12, "pos": [{"pid": 1, "ce-score": 5.0}], "neg": {"bm25": [{"pid": 0, "ce-score": 0.0}]}},
]
# The file as its dataset card describes it: bare ids.
UNSCORED = [{"qid": 10, "pos": [0], "neg": {"bm25": [1, 2, 3], "msmarco-MiniLM-L-6-v3": [3, 1]}}]


def write_file(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


def test_selection_follows_train_msmarco_v3(tmp_path):
    path = write_file(tmp_path / "hn.jsonl.gz", SCORED)
    selected = read_hard_negatives(path, per_system=5, ce_score_margin=3.0)
    # q10: 2 scores above 9 - 3 (a likely false negative); 1 and 3 not counted twice across systems.
    # q11: threshold 7 - 3 = 4 drops 1 (6.5).
    assert selected.negatives == {"10": ["1", "3"], "11": ["0"], "12": ["0"]}
    assert selected.filtered == 2 and selected.lines == 3
    one = read_hard_negatives(path, per_system=1, ce_score_margin=3.0, keep=["10", "11"])
    assert one.negatives == {"10": ["1", "3"], "11": ["0"]} and one.outside == 1
    only = read_hard_negatives(path, per_system=5, ce_score_margin=None, systems=["msmarco-distilbert-base-v3"])
    assert only.negatives["10"] == ["1", "3"] and only.without_negatives == 2
    unfiltered = read_hard_negatives(path, per_system=5, ce_score_margin=None)
    assert unfiltered.negatives["10"] == ["1", "2", "3"]


def test_the_unscored_file_needs_no_margin_and_says_so_when_given_one(tmp_path):
    path = write_file(tmp_path / "hn.jsonl.gz", UNSCORED)
    assert read_hard_negatives(path, per_system=2, ce_score_margin=None).negatives == {"10": ["1", "2", "3"]}
    with pytest.raises(HardNegativesError, match=r"hn.jsonl.gz:1: field 'pos'.*ce_score_margin: null"):
        read_hard_negatives(path, ce_score_margin=3.0)


@pytest.mark.parametrize("line, message", [
    ({"qid": 1, "neg": {}}, "missing field 'pos'"),
    ({"qid": 1, "pos": [1], "neg": []}, "field 'neg' has the wrong type"),
    ({"qid": 1, "pos": [1], "neg": {"bm25": [[2]]}}, "field 'neg.bm25'"),
])
def test_a_malformed_line_names_file_line_and_field(tmp_path, line, message):
    path = write_file(tmp_path / "bad.jsonl.gz", [UNSCORED[0], line])
    with pytest.raises(HardNegativesError, match=rf"bad.jsonl.gz:2: {message}"):
        read_hard_negatives(path, ce_score_margin=None)


def test_the_file_is_looked_for_in_the_mirror_then_the_cache(tmp_path):
    from qac.params.sections import HardNegativesSource

    source = HardNegativesSource(mirror="hn/msmarco-hard-negatives.jsonl.gz", url=None, md5=None)
    with pytest.raises(DatasetUnavailableError, match="no url is declared"):
        locate_hard_negatives(source, mirror=tmp_path / "mirror", downloads=tmp_path / "downloads")
    cached = write_file(tmp_path / "downloads" / "msmarco-hard-negatives" / "msmarco-hard-negatives.jsonl.gz", UNSCORED)
    assert locate_hard_negatives(source, mirror=tmp_path / "mirror", downloads=tmp_path / "downloads") == cached
    mirrored = write_file(tmp_path / "mirror" / "hn" / "msmarco-hard-negatives.jsonl.gz", UNSCORED)
    assert locate_hard_negatives(source, mirror=tmp_path / "mirror", downloads=tmp_path / "downloads") == mirrored


def test_cosine_mnrl_is_infonce_over_unit_vectors_at_temperature_one_over_scale(tiny_bert_dir):
    from qac.config import render_profile
    from qac.models.loading import load_tokenizer
    from qac.models.biencoder import BiEncoder

    params = validate_params(render_profile("paper"))
    settings = recipe_settings(params)
    assert (settings.pooling, settings.similarity, settings.temperature) == ("mean", "cosine", 1 / 20)
    assert (settings.batch_size, settings.passage_max_len, settings.train_n_passages) == (75, 350, 2)
    model = BiEncoder.from_pretrained(tiny_bert_dir, pooling="mean", temperature=settings.temperature,
                                      normalize=True).double()
    tokenizer = load_tokenizer(str(tiny_bert_dir))
    queries = dict(tokenizer(["sun star", "paris france"], padding=True, return_tensors="pt"))
    passages = dict(tokenizer(["the sun is a star", "water boils", "paris is in france", "python"],
                              padding=True, return_tensors="pt"))
    with torch.no_grad():
        loss = model(queries, passages).item()
        q, p = model.encode(queries), model.encode(passages)
    # sentence-transformers' MNRL: cross-entropy of 20 * cos(query, every passage), target the query's positive.
    cosines = torch.nn.functional.cosine_similarity(q[:, None, :], p[None, :, :], dim=-1) * 20
    expected = torch.nn.functional.cross_entropy(cosines, torch.tensor([0, 2])).item()
    # The loss takes its cross-entropy in float32 (infonce_loss): logits up to 20 carry ~20 * 2**-24 each.
    assert math.isclose(loss, expected, abs_tol=20 * 2 ** -24 * 8)
    dot = recipe_settings(with_values(params, {"beir_retriever.loss": "dot_infonce", "beir_retriever.scale": 1.0,
                                               "beir_retriever.pooling": "cls"}))
    assert (dot.similarity, dot.temperature, dot.pooling) == ("dot", 1.0, "cls")


def test_only_the_beir_value_trains_and_only_table_2s_variants(tmp_path):
    from qac.config import render_profile

    paper = validate_params(render_profile("paper"))
    assert paper.tables.zero_shot_retriever == "beir"
    assert trained_variants(paper) == [v for v in paper.pretrain.variants if v in paper.evaluate.zero_shot_variants]
    for name in ("smoke", "default"):
        params = validate_params(render_profile(name))
        assert params.tables.zero_shot_retriever == "r1" and trained_variants(params) == []


def beir_project(tmp_path, monkeypatch, tiny_bert_dir, retriever: str) -> tuple[dict, str]:
    """A working directory with a tiny MS MARCO-style train set, its hard negatives, a BEIR test set and a
    pre-trained encoder of one variant (with its MLflow run)."""
    import mlflow

    from qac.tracking import write_run_record
    from test_release_data import marco_project

    params = marco_project(tmp_path, monkeypatch)
    tiny = tmp_path / "mirror" / "tiny"
    (tiny / "qrels").mkdir(parents=True)
    (tiny / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"t{i}", "title": title, "text": text}) + "\n"
                                               for i, (title, text) in enumerate([
                                                   ("Sun", "The sun is a star."), ("Moon", "The moon orbits."),
                                                   ("Rome", "Rome is in Italy."), ("Ice", "Ice is frozen water.")])))
    (tiny / "queries.jsonl").write_text(json.dumps({"_id": "a", "text": "what is the sun"}) + "\n"
                                        + json.dumps({"_id": "b", "text": "where is rome"}) + "\n")
    (tiny / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\na\tt0\t1\nb\tt2\t1\n")
    write_file(tmp_path / "mirror" / "hn" / "msmarco-hard-negatives.jsonl.gz", SCORED)
    variant = next(iter(params["pretrain"]["variants"]))
    params["datasets"]["tiny"] = {"format": "beir", "mirror": "tiny", "url": None, "splits": ["test"],
                                  "rel_threshold": 1}
    params["zero_shot"] = ["tiny"]
    params["evaluate"].update({"metrics": ["RR@10", "nDCG@10"], "zero_shot_variants": [variant]})
    params["tables"]["zero_shot_retriever"] = retriever
    params["beir_retriever"].update({"hard_negatives": {"mirror": "hn/msmarco-hard-negatives.jsonl.gz", "url": None,
                                                        "md5": None},
                                     "batch_size": 2, "epochs": 2, "query_max_len": 16, "passage_max_len": 32,
                                     "log_every": 1, "dtype": "fp32"})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    encoder = tmp_path / "data" / "test" / "pretrain" / variant / "encoder"
    shutil.copytree(tiny_bert_dir, encoder)
    with mlflow.start_run() as run:
        pass
    write_run_record(Path("data/test"), Path("data/test/pretrain") / variant, run.info.run_id)   # cwd: tmp_path
    return params, variant


@pytest.mark.parametrize("retriever", ["beir", "r1"])
def test_the_stage_trains_and_scores_the_zero_shot_retriever_only_for_beir(retriever, tmp_path, monkeypatch,
                                                                          tiny_bert_dir, mlflow_store):
    from qac.params import load_params
    from qac.reporting.lineage import load_study, read_json
    from qac.tracking import read_run_record
    from test_release_data import load_stage

    params, variant = beir_project(tmp_path, monkeypatch, tiny_bert_dir, retriever)
    prepare = load_stage("prepare")
    for name in ("marco", "tiny"):
        prepare.main(["--dataset", name])
    load_stage("beir_retriever").main([])
    out = tmp_path / "data" / "test" / "beir"
    metrics = read_json(tmp_path / "data" / "test" / "metrics" / "beir.json")
    if retriever == "r1":
        assert metrics == {} and sorted(p.name for p in out.iterdir()) == ["variants.json"]
        return
    assert read_json(out / "variants.json") == [variant]
    assert (out / variant / "encoder" / "config.json").is_file()
    assert metrics[variant]["train"]["queries"] == 2      # q12 is not a training query
    assert metrics[variant]["train"]["steps"] == 2        # 2 queries, batch 2, 2 epochs
    assert 0.0 <= metrics[variant]["tiny"]["test"]["nDCG@10"] <= 1.0
    study = load_study(load_params(tmp_path / "params.yaml"), tmp_path / "data" / "test")
    source = study.finetuned(variant, "beir")
    record = read_run_record(Path("data/test"), Path("data/test/beir") / variant / "encoder")
    assert source is not None and record is not None and source.run_id == record["run_id"]
    assert math.isclose(source.metric("tiny", "test", "nDCG@10"), metrics[variant]["tiny"]["test"]["nDCG@10"],
                        rel_tol=1e-9)


def test_a_killed_stage_keeps_its_trained_retriever_and_writes_what_an_uninterrupted_run_writes(
        tmp_path, monkeypatch, tiny_bert_dir, mlflow_store, capsys):
    """Killed while evaluating: the trained retriever stays in the work folder; the rerun trains nothing,
    evaluates, and writes the uninterrupted run's files byte for byte; the work folder then goes."""
    from qac.stages import evaluate as retrievers
    from qac.train import finetune
    from test_release_data import load_stage

    trained = []
    original = finetune.train_biencoder
    monkeypatch.setattr(finetune, "train_biencoder", lambda *a, **k: trained.append(1) or original(*a, **k))

    def project(root):
        root.mkdir()
        beir_project(root, monkeypatch, tiny_bert_dir, "beir")
        prepare = load_stage("prepare")
        for name in ("marco", "tiny"):
            prepare.main(["--dataset", name])
        return root / "data" / "test"

    data = project(tmp_path / "uninterrupted")
    load_stage("beir_retriever").main([])
    expected = {p.relative_to(data / "beir").as_posix(): p.read_bytes()
                for p in sorted((data / "beir").rglob("*")) if p.is_file()}
    assert len(trained) == 1

    data = project(tmp_path / "killed")
    with monkeypatch.context() as patch:
        patch.setattr(retrievers, "evaluate_retriever_on", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            load_stage("beir_retriever").main([])
    assert not (data / "beir").exists() and len(trained) == 2
    capsys.readouterr()
    load_stage("beir_retriever").main([])
    assert len(trained) == 2
    assert "beir_retriever: encoder taken as an earlier run finished it" in capsys.readouterr().err
    assert {p.relative_to(data / "beir").as_posix(): p.read_bytes()
            for p in sorted((data / "beir").rglob("*")) if p.is_file()} == expected
    assert not (data / ".work" / "beir_retriever").exists()
