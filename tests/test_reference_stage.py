"""The ``reference`` stage: a released retriever, loaded by its hub name, evaluated as it was published.

No hub at test time: a tiny BERT built from a configuration is saved in a
folder named as the hub name (``Luyu/co-condenser-marco-retriever``), which
``from_pretrained`` loads as it would the downloaded model. The stage's runs are
checked against rankings computed here from the same weights with [CLS] pooling,
the published lengths and its own title join (``title [SEP] text``, where the
profile fine-tunes on ``title text``), and its MLflow run and record are checked.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from test_finetune_stage import load_stage, shared_mlflow_store, study_dir  # noqa: F401  (fixture)

HUB_NAME = "Luyu/co-condenser-marco-retriever"
# title [SEP] text as the released checkpoint was trained; the smoke params' finetune.title_join is space
ENCODING = {"pooling": "cls", "normalize": False, "query_max_len": 8, "passage_max_len": 16, "title_join": "sep"}


def _with_reference(root, published: float = 0.5) -> dict:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["reference_retrievers"] = [HUB_NAME]
    params["encoders"] = {HUB_NAME: {**ENCODING, "published": [
        {"dataset": "tinyset", "split": "test", "measure": "RR@10", "value": published, "source": "a paper"}]}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return params


@pytest.fixture(scope="module")
def referenced(tmp_path_factory, tiny_bert_dir, shared_mlflow_store):  # noqa: F811
    root = tmp_path_factory.mktemp("reference") / "study"
    with study_dir(root, tiny_bert_dir):
        shutil.copytree(tiny_bert_dir, root / HUB_NAME)     # stands in for the hub's download
        params = _with_reference(root)
        load_stage("reference").main([])
    return root, params


def _expected_scores(root, dataset) -> dict[str, dict[str, float]]:
    """Each test query's score of every document, computed here: [CLS] vectors at the published lengths, inner
    product, a document's title and text joined by [SEP]."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    model, tokenizer = AutoModel.from_pretrained(root / HUB_NAME).eval(), AutoTokenizer.from_pretrained(root / HUB_NAME)

    def cls(texts, length):
        batch = tokenizer(texts, max_length=length, truncation=True, padding=True, return_tensors="pt")
        with torch.no_grad():
            return model(**batch).last_hidden_state[:, 0]

    doc_ids = sorted(dataset.corpus)
    docs = cls([f"{dataset.corpus[d].title}{tokenizer.sep_token}{dataset.corpus[d].text}" if dataset.corpus[d].title
                else dataset.corpus[d].text for d in doc_ids],
               ENCODING["passage_max_len"])
    qids = sorted(dataset.qrels["test"])
    scores = cls([dataset.queries[q] for q in qids], ENCODING["query_max_len"]) @ docs.T
    return {qid: dict(zip(doc_ids, scores[i].tolist())) for i, qid in enumerate(qids)}


def _top_of_run(path) -> dict[str, str]:
    best = {}
    for line in path.read_text().splitlines():
        qid, _, doc, rank, *_ = line.split()
        if rank == "1":
            best[qid] = doc
    return best


def test_the_released_retriever_is_evaluated_as_published(referenced):
    import mlflow

    from test_finetune_stage import tiny_datasets

    root, _ = referenced
    data = root / "data" / "smoke"
    out = data / "reference" / "Luyu--co-condenser-marco-retriever" / "tinyset"
    assert sorted(p.name for p in out.iterdir()) == ["test.per_query.json", "test.trec"]     # never train
    assert json.loads((data / "reference" / "references.json").read_text()) == {"reference_retrievers": [HUB_NAME]}
    # The weights named by the hub name, [CLS] pooling and the published lengths: the same first documents.
    in_domain, _ = tiny_datasets()
    # Float32 vectors encoded in other batches differ in their last bits, so a near-tie may fall either way: the
    # run's first document must score the best to float32 rounding of the scores' scale.
    expected, top = _expected_scores(root, in_domain), _top_of_run(out / "test.trec")
    assert set(top) == set(expected)
    for qid, scores in expected.items():
        scale = max(abs(score) for score in scores.values())
        assert scores[top[qid]] >= max(scores.values()) - 64 * 1.2e-7 * scale, (qid, top[qid], scores)
    per_query = json.loads((out / "test.per_query.json").read_text())
    assert set(per_query["RR@10"]) == set(in_domain.qrels["test"])
    record = json.loads((data / ".runs" / "reference" / "Luyu--co-condenser-marco-retriever" /
                         "mlflow_run.json").read_text())
    run = mlflow.MlflowClient().get_run(record["run_id"])
    assert run.data.tags["qac.reference"] == HUB_NAME and run.data.params["pooling"] == "cls"
    assert run.data.params["query_max_len"] == "8" and run.data.params["passage_max_len"] == "16"
    assert run.data.params["title_join"] == "sep" and yaml.safe_load((root / "params.yaml").read_text())[
        "finetune"]["title_join"] == "space"
    from qac.tracking import metric_key

    assert run.data.metrics[metric_key("tinyset", "test", "RR@10")] == pytest.approx(
        sum(per_query["RR@10"].values()) / len(per_query["RR@10"]))


def test_table1_shows_the_reference_row_beside_its_published_figure(referenced):
    from qac.params import load_params, with_values
    from qac.reporting.check import record
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    root, _ = referenced
    # The tiny study's corpus is whole.
    params = with_values(load_params(root / "params.yaml"), {"prepare.max_documents": None})
    table1 = build_tables(load_study(params, root / "data" / "smoke"), params)[0]
    row = f"published checkpoint {HUB_NAME}"
    cell = table1.cell(row, table1.columns[0])
    per_query = json.loads((root / "data" / "smoke" / "reference" / "Luyu--co-condenser-marco-retriever" / "tinyset" /
                            "test.per_query.json").read_text())["RR@10"]
    assert cell.value == pytest.approx(100 * sum(per_query.values()) / len(per_query))
    assert (cell.paper, cell.cited) == (50.0, None)       # a whole corpus: compared
    assert table1.paper_rows[row] == "published: a paper"
    # A reproduction check records the published figure as the expected value of that cell.
    expected = [c for c in record([table1], "smoke", from_paper=True)["cells"] if c["row"] == row]
    assert [(c["value"], c["rounding"]) for c in expected] == [(50.0, 0.05)]
    # A profile that cuts the corpus (fewer distractors: retrieval is easier) only cites the figure.
    params = with_values(params, {"prepare.max_documents": 120})
    cell = build_tables(load_study(params, root / "data" / "smoke"), params)[0].cell(row, table1.columns[0])
    assert (cell.paper, cell.cited) == (None, 50.0)


def test_a_reference_retriever_without_its_encoding_is_refused_before_a_model_loads(tmp_path, tiny_bert_dir,
                                                                                    shared_mlflow_store):  # noqa: F811
    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir):
        params = _with_reference(root)
        params["encoders"] = {}
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        with pytest.raises(SystemExit, match=rf"reference_retrievers names '{HUB_NAME}', but encoders.{HUB_NAME} "
                                             "is missing"):
            load_stage("reference").main([])
    assert not (root / "data" / "smoke" / "reference").exists()
