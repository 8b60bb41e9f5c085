"""CQADupStack: a BEIR zip of sub-forums (``cqadupstack/<forum>/corpus.jsonl`` ...) downloaded, prepared
forum by forum, searched by BM25 within each forum's own corpus, and averaged into one figure, as BEIR
reports it (the mean of the forums' means, not of all queries pooled)."""

from __future__ import annotations

import io
import json
import math
import zipfile

import pytest
import yaml

from qac.data.errors import DataFormatError
from qac.data.prepared import load_prepared, load_prepared_parts
from qac.data.sources import DatasetSpec
from qac.params.sections import DatasetEntry
from qac.io import file_md5

from stages import load_stage
from test_prepare import serve
from test_release_data import smoke_params

# Two forums of different sizes, so the mean of forum means differs from the pooled mean.
FORUMS = {
    "android": {
        "corpus": {"a1": ("Wifi drops", "wifi keeps dropping on my phone"), "a2": ("", "battery drains fast"),
                   "a3": ("Root", "how to root a tablet")},
        "queries": {"qa1": "wifi dropping", "qa2": "battery drain", "qa3": "root tablet"},
        "qrels": [("qa1", "a1", 1), ("qa2", "a2", 1), ("qa3", "a3", 1)],
    },
    "gis": {
        "corpus": {"g1": ("", "reproject a shapefile"), "g2": ("", "shapefile layer projection in qgis"),
                   "g3": ("", "raster tiles")},
        "queries": {"qg1": "shapefile projection"},
        "qrels": [("qg1", "g1", 1)],
    },
}


def forum_files(forum: dict) -> dict[str, str]:
    corpus = "".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, (t, x) in forum["corpus"].items())
    queries = "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in forum["queries"].items())
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in forum["qrels"])
    return {"corpus.jsonl": corpus, "queries.jsonl": queries, "qrels/test.tsv": qrels}


@pytest.fixture()
def site(tmp_path):
    """cqadupstack.zip as BEIR publishes it: one top folder, a folder per forum, no top-level corpus."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, forum in FORUMS.items():
            for member, content in forum_files(forum).items():
                bundle.writestr(f"cqadupstack/{name}/{member}", content)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "cqadupstack.zip").write_bytes(buffer.getvalue())
    return tmp_path / "site"


def test_subsets_must_name_folders_of_a_beir_dataset():
    entry = {"format": "beir", "splits": ["test"], "subsets": ["android", "gis"]}
    spec = DatasetSpec.from_params("cqadupstack", DatasetEntry.model_validate(entry))
    assert spec.corpus_files()[:2] == [("android/corpus.jsonl",), ("android/queries.jsonl",)]
    for bad in ("android", ["android", "android"], ["../etc"]):
        assert "datasets.cqadupstack.subsets" in checked_entry_problems({**entry, "subsets": bad}), bad
    assert "datasets.cqadupstack.subsets" in checked_entry_problems({**entry, "format": "msmarco-passage"})


def checked_entry_problems(entry: dict) -> str:
    """What checking the smoke profile with ``entry`` as ``datasets.cqadupstack`` says (the rules across keys
    included)."""
    from qac.params import ParamsError, load_params, profile_params_path, with_values

    with pytest.raises(ParamsError) as caught:
        with_values(load_params(profile_params_path("smoke")), {"datasets.cqadupstack": entry})
    return str(caught.value)


def test_two_forums_are_prepared_apart_and_averaged_into_one_figure(site, tmp_path, monkeypatch, mlflow_store):
    work = tmp_path / "work"
    work.mkdir()
    with serve(site) as base:
        params = smoke_params(
            profile="test", seed=1, data_dir="data",
            datasets={"cqadupstack": {"format": "beir", "url": f"{base}/cqadupstack.zip",
                                      "md5": file_md5(site / "cqadupstack.zip"), "splits": ["test"],
                                      "rel_threshold": 1, "subsets": ["android", "gis"]},
                      "scratch": {"format": "beir", "mirror": "scratch", "splits": ["train"]}},
            prepare={"max_documents": None, "keep_judged_documents": True, "min_text_chars": 1},
            train_dataset="scratch", pretrain_corpus="scratch", zero_shot=["cqadupstack"],
            finetune={"bm25_depth": 3}, evaluate={"depth": 10, "metrics": ["nDCG@10", "RR@10"]},
            bm25={"k1": 0.9, "b": 0.4, "stopwords": None, "stemmer": None})
        (work / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
        monkeypatch.chdir(work)
        monkeypatch.setenv("QAC_PARAMS", str(work / "params.yaml"))
        monkeypatch.setenv("QAC_DATA_MIRROR", str(tmp_path / "no-mirror"))
        assert load_stage("prepare").main(["--dataset", "cqadupstack"]) == 0

    out = work / "data" / "test" / "datasets" / "cqadupstack"
    record = json.loads((out / "dataset.json").read_text())
    assert record["subsets"] == ["android", "gis"]
    assert record["counts"]["documents"] == 6 and record["counts"]["queries_per_split"] == {"test": 4}
    parts = load_prepared_parts(out)
    assert [(subset, dataset.name, sorted(dataset.corpus)) for subset, dataset in parts] == [
        ("android", "cqadupstack/android", ["a1", "a2", "a3"]), ("gis", "cqadupstack/gis", ["g1", "g2", "g3"])]
    with pytest.raises(DataFormatError, match="load_prepared_parts"):
        load_prepared(out)

    # BM25 as the zero-shot baseline: each forum is searched in its own corpus only.
    scratch = work / "data" / "test" / "datasets" / "scratch"
    (scratch / "qrels").mkdir(parents=True)
    (scratch / "corpus.jsonl").write_text(json.dumps({"_id": "s1", "title": "", "text": "alpha"}) + "\n")
    (scratch / "queries.jsonl").write_text(json.dumps({"_id": "t1", "text": "alpha"}) + "\n")
    (scratch / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nt1\ts1\t1\n")
    (scratch / "dataset.json").write_text(json.dumps({"name": "scratch", "splits": ["train"]}))
    load_stage("bm25").main([])

    runs = work / "data" / "test" / "bm25" / "runs" / "cqadupstack"
    android = json.loads((runs / "android" / "test.per_query.json").read_text())["nDCG@10"]
    gis = json.loads((runs / "gis" / "test.per_query.json").read_text())["nDCG@10"]
    assert set(android) == {"qa1", "qa2", "qa3"} and set(gis) == {"qg1"}
    assert all(doc.startswith("a") for doc in
               (line.split()[2] for line in (runs / "android" / "test.trec").read_text().splitlines()))
    # gis: "shapefile projection" -> g2 holds both words, so the judged g1 comes second: nDCG < 1
    assert gis["qg1"] == pytest.approx(1 / math.log2(3))
    combined = json.loads((runs / "test.per_query.json").read_text())["nDCG@10"]
    assert combined == {**{f"android/{q}": v for q, v in android.items()}, **{f"gis/{q}": v for q, v in gis.items()}}
    forum_average = (sum(android.values()) / 3 + gis["qg1"]) / 2
    pooled = (sum(android.values()) + gis["qg1"]) / 4
    assert forum_average != pytest.approx(pooled)
    metrics = json.loads((work / "data" / "test" / "bm25" / "metrics.json").read_text())
    assert metrics["cqadupstack"]["test"]["nDCG@10"] == pytest.approx(forum_average)

    from qac.reporting.lineage import Source

    source = Source("bm25", work / "data" / "test", work / "data" / "test" / "bm25" / "runs")
    assert source.metric("cqadupstack", "test", "nDCG@10") == pytest.approx(forum_average)
