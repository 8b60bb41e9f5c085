"""The ``evaluate`` stage: runs, per-query values and metrics of r1, r2 and the untuned encoder.

The tiny study is fine-tuned once, then evaluated; the metrics logged into the
fine-tuning runs are checked against pytrec_eval on the TREC run files the stage
wrote, with the graded zero-shot set judged at its own threshold (2).
"""

from __future__ import annotations

import json

import pytest

from test_finetune_stage import load_stage, shared_mlflow_store, study_dir  # noqa: F401  (fixture)

RETRIEVERS = ("r1", "r2", "untuned")
DATASETS = ("tinyset", "othertiny")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, tiny_bert_dir, shared_mlflow_store):  # noqa: F811
    root = tmp_path_factory.mktemp("evaluated") / "study"
    with study_dir(root, tiny_bert_dir) as params:
        load_stage("finetune").main(["--variant", "none"])
        from qac.stages import evaluate as retrievers

        original = retrievers.evaluate_retriever_on

        def recording(model, tokenizer, dataset, *, out_dir, **options):
            ENCODED.append((out_dir.parent.name, dataset.name))      # (retriever, dataset) encoded here
            return original(model, tokenizer, dataset, out_dir=out_dir, **options)

        retrievers.evaluate_retriever_on = recording
        try:
            load_stage("evaluate").main(["--variant", "none"])
        finally:
            retrievers.evaluate_retriever_on = original
    return root, params


ENCODED: list[tuple[str, str]] = []


def _run_id(root, retriever):
    folder = "finetune/none" if retriever != "untuned" else "eval/none"
    return json.loads((root / "data" / "smoke" / ".runs" / folder / retriever / "mlflow_run.json").read_text())["run_id"]


def test_every_retriever_is_evaluated_on_every_non_training_split(evaluated):
    root, _ = evaluated
    out = root / "data" / "smoke" / "eval" / "none"
    for retriever in RETRIEVERS:
        for dataset in DATASETS:
            files = sorted(p.name for p in (out / retriever / dataset).iterdir())
            assert files == ["test.per_query.json", "test.trec"], (retriever, dataset)
    summary = json.loads((root / "data" / "smoke" / "metrics" / "eval" / "none.json").read_text())
    assert set(summary) == set(RETRIEVERS)
    for retriever in RETRIEVERS:
        assert set(summary[retriever]) == set(DATASETS)
        for dataset in DATASETS:
            assert set(summary[retriever][dataset]) == {"test"}  # never the train split
            values = summary[retriever][dataset]["test"]
            assert set(values) == {"RR@10", "R@10", "nDCG@10", "AP"}
            assert all(0.0 <= value <= 1.0 for value in values.values())


def test_run_files_rank_the_whole_depth_for_every_test_query(evaluated):
    from qac.evaluation.trec_io import read_run

    root, params = evaluated
    run = read_run(root / "data" / "smoke" / "eval" / "none" / "r2" / "tinyset" / "test.trec")
    assert sorted(run) == [f"test-{i}" for i in range(4)]
    assert {len(docs) for docs in run.values()} == {params["evaluate"]["depth"]}


def test_logged_metrics_agree_with_pytrec_eval_at_each_sets_threshold(evaluated, shared_mlflow_store):  # noqa: F811
    import mlflow
    import pytrec_eval

    from qac.data.prepared import load_prepared
    from qac.evaluation.trec_io import read_run

    root, _ = evaluated
    client = mlflow.MlflowClient(shared_mlflow_store)
    for retriever in RETRIEVERS:
        logged = client.get_run(_run_id(root, retriever))
        metrics = logged.data.metrics
        assert logged.data.tags["qac.eval.depth"] == "10"
        for dataset_name, threshold in (("tinyset", 1), ("othertiny", 2)):
            dataset = load_prepared(root / "data" / "smoke" / "datasets" / dataset_name)
            assert dataset.rel_threshold("test") == threshold
            run = read_run(root / "data" / "smoke" / "eval" / "none" / retriever / dataset_name / "test.trec")
            reference = pytrec_eval.RelevanceEvaluator(dataset.qrels["test"], {"recip_rank", "map", "ndcg_cut.10"},
                                                       relevance_level=threshold).evaluate(run)
            # every judged document is within the depth, so RR@10 is trec_eval's recip_rank
            for key, measure in (("recip_rank", "RR_at_10"), ("map", "AP"), ("ndcg_cut_10", "nDCG_at_10")):
                expected = sum(values[key] for values in reference.values()) / len(dataset.qrels["test"])
                assert metrics[f"{dataset_name}/test/{measure}"] == pytest.approx(expected, abs=1e-6)


def test_per_query_values_are_logged_as_artifacts(evaluated, shared_mlflow_store):  # noqa: F811
    import mlflow

    root, _ = evaluated
    run_id = _run_id(root, "r1")
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="per_query/othertiny/test.json",
                                                tracking_uri=shared_mlflow_store)
    logged = json.loads(open(local).read())
    written = json.loads((root / "data/smoke/eval/none/r1/othertiny/test.per_query.json").read_text())
    assert logged == written
    assert sorted(logged["AP"]) == [f"oq{i}" for i in range(4)]


def test_the_untuned_encoder_has_its_own_run_under_the_pretraining_run(evaluated, shared_mlflow_store):  # noqa: F811
    import mlflow

    root, _ = evaluated
    pretrain_run = json.loads((root / "data/smoke/.runs/pretrain/none/mlflow_run.json").read_text())["run_id"]
    run = mlflow.MlflowClient(shared_mlflow_store).get_run(_run_id(root, "untuned"))
    assert run.info.run_name == "untuned · none"
    assert (run.data.params["method"], run.data.params["retriever"]) == ("none", "untuned")
    assert run.data.tags["mlflow.parentRunId"] == pretrain_run
    assert run.data.tags["qac.retriever"] == "untuned" and run.data.tags["qac.variant"] == "none"


def test_evaluating_before_fine_tuning_fails_without_output(tmp_path, tiny_bert_dir, shared_mlflow_store):  # noqa: F811
    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir):
        with pytest.raises(SystemExit, match="run the finetune@none stage"):
            load_stage("evaluate").main(["--variant", "none"])
    assert not (root / "data" / "smoke" / "eval").exists()


def test_retriever_one_in_domain_is_scored_from_the_runs_searched_with_the_mining_vectors(evaluated, monkeypatch):
    """The fine-tuning stage encoded the corpus once for mining and searched the test queries with it; the
    evaluation scores that run (no second encoding), and it equals what encoding afresh at the mining's
    batch size gives, score for score."""
    from qac.data.prepared import load_prepared
    from qac.evaluation.trec_io import read_run
    from qac.models.loading import load_tokenizer
    from qac.retrieval import title_separator
    from qac.models.biencoder import BiEncoder
    from qac.params import load_params
    from qac.train.finetune import FinetuneSettings

    root, _ = evaluated
    params = load_params(root / "params.yaml")
    data = root / "data" / "smoke"
    assert sorted(ENCODED) == sorted({(r, d) for r in RETRIEVERS for d in DATASETS} - {("r1", "tinyset")})
    shared = read_run(data / "finetune" / "none" / "r1_runs" / "test.trec")
    assert read_run(data / "eval" / "none" / "r1" / "tinyset" / "test.trec") == shared

    from qac.stages.evaluate import evaluate_retriever_on
    from qac.models.encoding import Encoding

    settings = FinetuneSettings.from_params(params.finetune, params.seed)
    folder = data / "finetune" / "none" / "r1"
    tokenizer = load_tokenizer(str(folder))
    dataset = load_prepared(data / "datasets" / "tinyset")
    results = evaluate_retriever_on(
        BiEncoder.from_pretrained(folder, pooling=settings.pooling), tokenizer, dataset,
        settings=params.evaluate.model_copy(update={"batch_size": params.finetune.encode_batch_size}),
        encoding=Encoding(pooling=settings.pooling, normalize=False, query_max_len=settings.query_max_len,
                          passage_max_len=settings.corpus_length), device="cpu",
        out_dir=root / "fresh" / "r1" / "tinyset",
        separator=title_separator(params.finetune.title_join, tokenizer))
    assert read_run(root / "fresh" / "r1" / "tinyset" / "test.trec") == shared
    logged = json.loads((data / "metrics" / "eval" / "none.json").read_text())["r1"]["tinyset"]["test"]
    assert logged == results["test"].aggregate


def test_runs_made_with_another_encoding_are_not_reused(evaluated):
    from qac.train.indomain_runs import RUNS_FOLDER, read_indomain_runs, run_encoding

    root, params = evaluated
    folder = root / "data" / "smoke" / "finetune" / "none" / RUNS_FOLDER
    settings = params["finetune"]
    made = dict(query_max_len=settings["query_max_len"],
                passage_max_len=settings.get("corpus_max_len") or settings["passage_max_len"],
                pooling=settings.get("pooling", "cls"), separator=" ", depth=params["evaluate"]["depth"])
    assert read_indomain_runs(folder, run_encoding(**made), ["test"]) is not None
    for key, other in (("depth", 5), ("passage_max_len", 7), ("pooling", "mean"), ("separator", " [SEP] ")):
        assert read_indomain_runs(folder, run_encoding(**{**made, key: other}), ["test"]) is None, key
    assert read_indomain_runs(folder, run_encoding(**made), ["test", "dev"]) is None    # a split it lacks
    assert read_indomain_runs(root / "nowhere", run_encoding(**made), ["test"]) is None


def test_a_fine_tuned_retriever_loads_in_sentence_transformers_with_the_vectors_evaluation_uses(evaluated):
    """The fine-tuning stage's retriever folder is a sentence-transformers model: handed to the field's
    tools as it is, it encodes documents as the evaluation encodes them (its pooling and length)."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from qac.data.prepared import load_prepared
    from qac.models.biencoder import BiEncoder
    from qac.models.encoding import read_encoding
    from qac.models.loading import load_tokenizer
    from qac.retrieval import document_text
    from qac.retrieval.encode import encode_texts

    root, params = evaluated
    data = root / "data" / "smoke"
    folder = data / "finetune" / "none" / "r1"
    encoding = read_encoding(folder)
    assert (encoding.pooling, encoding.normalize, encoding.query_max_len) == \
        (params["finetune"]["pooling"], False, params["finetune"]["query_max_len"])
    assert encoding.passage_max_len == (params["finetune"].get("corpus_max_len")
                                        or params["finetune"]["passage_max_len"])
    dataset = load_prepared(data / "datasets" / "tinyset")
    texts = [document_text(doc.title, doc.text, encoding.title_separator) for doc in dataset.corpus.values()]
    ours = encode_texts(BiEncoder.from_pretrained(folder).encoder, load_tokenizer(str(folder)), texts,
                        max_length=encoding.passage_max_len, pooling=encoding.pooling, normalize=encoding.normalize)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)
    # float32 rounding of vectors of this magnitude, batched differently
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-5 * float(np.abs(ours).max()))


def test_sentence_transformers_gives_the_stages_run_and_rr_at_10_through_encode_query_and_encode_document(evaluated):
    """Retriever 2 handed to sentence-transformers as its folder is: its query and document routes keep the
    folder's two lengths, so searching its vectors scores every split as the evaluate stage scored it."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from qac.data.prepared import load_prepared
    from qac.evaluation.split_evaluation import evaluate_split, evaluation_splits
    from qac.models.encoding import read_encoding
    from qac.retrieval import document_text
    from qac.retrieval.search import dense_search

    root, params = evaluated
    data = root / "data" / "smoke"
    folder = data / "finetune" / "none" / "r2"
    encoding = read_encoding(folder)
    assert encoding.query_max_len < encoding.passage_max_len      # otherwise one length would pass for both
    dataset = load_prepared(data / "datasets" / "tinyset")
    model = SentenceTransformer(str(folder), device="cpu")
    doc_ids = list(dataset.corpus)
    documents = model.encode_document([document_text(dataset.corpus[d].title, dataset.corpus[d].text,
                                                     encoding.title_separator) for d in doc_ids],
                                      convert_to_numpy=True)
    for split in evaluation_splits(dataset):
        queries = dataset.split_queries(split)
        vectors = model.encode_query(list(queries.values()), convert_to_numpy=True)
        run = dense_search(list(queries), vectors, doc_ids, documents, k=params["evaluate"]["depth"])
        theirs = evaluate_split(dataset, split, run, ["RR@10"]).per_query["RR@10"]
        ours = json.loads((data / "eval" / "none" / "r2" / "tinyset" / f"{split}.per_query.json").read_text())
        assert sorted(theirs) == sorted(ours["RR@10"])
        np.testing.assert_allclose([theirs[q] for q in sorted(theirs)],
                                   [ours["RR@10"][q] for q in sorted(theirs)], atol=1e-6)
