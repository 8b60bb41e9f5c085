"""The MS MARCO data the release fine-tuned on: RocketQA's passages with titles (``para.txt`` beside the
line-aligned ``para.title.txt``), ``title [SEP] text`` for the dense encoder, and retriever 1's negatives
from the official training triples (``qidpidtriples``), sampled per query, instead of our BM25 run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from qac.data.errors import DataFormatError
from qac.data.msmarco import iter_passage_collection, iter_triple_negatives
from qac.data.prepared import TRAIN_NEGATIVES, load_prepared
from qac.data.textfile import iter_jsonl
from qac.params import ParamsError
from qac.retrieval import document_text, title_separator
from stages import load_stage

REPO = Path(__file__).resolve().parent.parent

PARA = "0\tThe sun is a star.\n1\tPython is a language.\n2\tParis is in France.\n3\tWater boils at 100 C.\n"
TITLES = "0\tSun\n1\t-\n2\tParis\n3\tWater\n"
# qid, positive, negative: rows of a query together, negatives repeated across positives as in the real file
TRIPLES = ("10\t0\t1\n10\t0\t2\n10\t0\t3\n10\t0\t9\n"      # 9 is not in the corpus
           "11\t2\t0\n11\t2\t1\n11\t3\t1\n"
           "12\t1\t0\n")                                   # 12 is not a training query


def smoke_params(**overrides) -> dict:
    """The smoke profile's full parameters (every key the schema asks for) with ``overrides``.

    ``datasets`` is replaced, not merged; other sections are merged key by key.
    """
    from qac.config import deep_merge, render_profile

    params = render_profile("smoke")
    if "datasets" in overrides:
        params["datasets"] = {}
    params = deep_merge(params, overrides)
    params["mlflow"]["system_metrics"] = False
    if "datasets" in overrides:   # the tables' columns name the smoke profile's datasets
        params["tables"]["in_domain_columns"] = []
    return params


def marco_project(root: Path, monkeypatch, *, finetune: dict | None = None, bm25: dict | None = None,
                  seed: int = 7) -> dict:
    """A working directory whose mirror holds RocketQA-style passages, titles and official triples.

    Returns the params written to ``root/params.yaml`` (QAC_PARAMS points there).
    """
    mirror = root / "mirror" / "marco"
    mirror.mkdir(parents=True)
    (mirror / "para.txt").write_text(PARA)
    (mirror / "para.title.txt").write_text(TITLES)
    (mirror / "train.query.txt").write_text("10\twhat is the sun\n11\twhere is paris\n")
    (mirror / "qrels.train.tsv").write_text("10\t0\t0\t1\n11\t0\t2\t1\n11\t0\t3\t1\n")
    with gzip.open(root / "mirror" / "qidpidtriples.train.full.2.tsv.gz", "wt") as handle:
        handle.write(TRIPLES.replace("\n", "\r\n"))   # the official file has Windows line ends
    params = smoke_params(
        profile="test", seed=seed, data_dir="data",
        datasets={"marco": {"format": "msmarco-passage", "mirror": "marco", "url": None,
                            "collection": "para.txt", "titles": "para.title.txt",
                            "triples": "qidpidtriples.train.full.2.tsv.gz", "splits": ["train"],
                            "topics": {"train": "train.query.txt"}, "qrels": {"train": "qrels.train.tsv"}}},
        prepare={"max_documents": None, "keep_judged_documents": True, "min_text_chars": 1},
        train_dataset="marco", pretrain_corpus="marco", zero_shot=[],
        finetune=finetune or {"bm25_depth": 3, "r1_negatives": "official", "official_negatives": 1},
        evaluate={"depth": 10, "metrics": ["RR@10"]},
        bm25=bm25 or {"k1": 0.9, "b": 0.4, "stopwords": None, "stemmer": None})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(root)
    monkeypatch.setenv("QAC_PARAMS", str(root / "params.yaml"))
    monkeypatch.setenv("QAC_DATA_MIRROR", str(root / "mirror"))
    return params


@pytest.fixture()
def project(tmp_path, monkeypatch, mlflow_store):
    return tmp_path, marco_project(tmp_path, monkeypatch)


def test_titles_are_read_beside_their_passages_and_must_keep_step(tmp_path):
    (tmp_path / "para.txt").write_text(PARA)
    (tmp_path / "titles.txt").write_text(TITLES)
    documents = list(iter_passage_collection(tmp_path / "para.txt", titles=tmp_path / "titles.txt"))
    assert [(d.doc_id, d.title) for d in documents] == [("0", "Sun"), ("1", "-"), ("2", "Paris"), ("3", "Water")]
    (tmp_path / "titles.txt").write_text("0\tSun\n2\tParis\n1\t-\n3\tWater\n")
    with pytest.raises(DataFormatError) as caught:
        list(iter_passage_collection(tmp_path / "para.txt", titles=tmp_path / "titles.txt"))
    assert (caught.value.line, caught.value.field) == (2, "pid")
    (tmp_path / "titles.txt").write_text("0\tSun\n1\t-\n")
    with pytest.raises(DataFormatError, match="ends before passage '2'"):
        list(iter_passage_collection(tmp_path / "para.txt", titles=tmp_path / "titles.txt"))


def test_triples_give_each_query_its_distinct_negatives_and_must_be_grouped(tmp_path):
    path = tmp_path / "triples.tsv"
    path.write_text(TRIPLES)
    assert list(iter_triple_negatives(path)) == [("10", ["1", "2", "3", "9"]), ("11", ["0", "1"]), ("12", ["0"])]
    path.write_text("10\t0\t1\n11\t2\t0\n10\t0\t2\n")
    with pytest.raises(DataFormatError) as caught:
        list(iter_triple_negatives(path))
    assert (caught.value.line, caught.value.field) == (3, "qid")


def test_title_sep_text_is_what_a_bert_tokenizer_reads_as_its_separator():
    from qac.models.loading import load_tokenizer

    tokenizer = load_tokenizer("minilm")
    separator = title_separator("sep", tokenizer)
    assert document_text("Sun", "The sun is a star.", separator) == "Sun[SEP]The sun is a star."
    assert document_text("", "No title.", separator) == "No title."
    assert document_text("Sun", "The sun is a star.", title_separator("space", tokenizer)) == "Sun The sun is a star."
    ids = tokenizer("Sun[SEP]The sun", add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.sep_token_id) == 1 and ids[0] != tokenizer.sep_token_id
    with pytest.raises(ValueError, match="finetune.title_join"):
        title_separator("colon", tokenizer)


def test_prepare_keeps_titles_and_official_negatives_and_bm25_stage_samples_them(project):
    root, params = project
    assert load_stage("prepare").main(["--dataset", "marco"]) == 0
    folder = root / "data" / "test" / "datasets" / "marco"
    dataset = load_prepared(folder)
    assert dataset.corpus["0"].title == "Sun" and dataset.corpus["1"].title == "-"
    assert list(iter_jsonl(folder / TRAIN_NEGATIVES)) == [
        {"qid": "10", "negatives": ["1", "2", "3"]},          # the positive and the unknown 9 left out
        {"qid": "11", "negatives": ["0", "1"]}]               # positives 2 and 3 never negatives
    record = json.loads((folder / "dataset.json").read_text())
    assert record["train_negatives"] == {"queries": 2, "negatives": 5, "queries_not_in_train": 1,
                                         "negatives_not_in_corpus": 1}

    load_stage("bm25").main([])
    official = list(iter_jsonl(root / "data" / "test" / "bm25" / "negatives.jsonl"))
    assert [(r["qid"], r["positives"], len(r["negatives"])) for r in official] == [("10", ["0"], 1),
                                                                                 ("11", ["2", "3"], 1)]
    assert official[0]["negatives"][0] in {"1", "2", "3"} and official[1]["negatives"][0] in {"0", "1"}
    load_stage("bm25").main([])   # the same draw again
    assert list(iter_jsonl(root / "data" / "test" / "bm25" / "negatives.jsonl")) == official
    draws = set()
    for seed in range(12):        # the draw depends on the seed: not always the first negative
        params["seed"] = seed
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        load_stage("bm25").main([])
        draws.add(next(iter_jsonl(root / "data" / "test" / "bm25" / "negatives.jsonl"))["negatives"][0])
    assert draws == {"1", "2", "3"}

    params["finetune"]["r1_negatives"] = "bm25"   # the other value: our BM25 run, positives removed
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    load_stage("bm25").main([])
    bm25 = list(iter_jsonl(root / "data" / "test" / "bm25" / "negatives.jsonl"))
    assert [r["qid"] for r in bm25] == ["10", "11"] and "0" not in bm25[0]["negatives"]
    assert all(len(r["negatives"]) <= 3 for r in bm25)


def test_official_negatives_without_declared_triples_stop_the_bm25_stage(project):
    root, params = project
    del params["datasets"]["marco"]["triples"]
    params["finetune"]["r1_negatives"] = "bm25"       # validation refuses 'official' without triples...
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert load_stage("prepare").main(["--dataset", "marco"]) == 0
    with pytest.raises(ParamsError, match="datasets.marco.triples"):
        params["finetune"]["r1_negatives"] = "official"
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        load_stage("bm25").main([])
    from qac.stages.bm25 import official_negatives   # the stage's own check, behind the schema's

    folder = root / "data" / "test" / "datasets" / "marco"
    with pytest.raises(SystemExit, match="datasets.marco.triples"):
        list(official_negatives(folder, load_prepared(folder), 2, 7))
