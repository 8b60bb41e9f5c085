"""The ``finetune`` stage on a tiny study: r1 and r2 saved, mined negatives written, runs nested in MLflow.

``make_study`` builds what the upstream stages would have left: prepared
datasets (an in-domain one with train and test splits, a zero-shot one), BM25
negatives for the training queries, a pre-trained encoder (the tiny BERT) and
its pre-training run. The evaluation and leakage tests reuse it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

from mlflow_stores import empty_store
from qac.config import render_profile, write_params
from qac.data.dataset import Dataset, Document
from qac.data.prepared import write_prepared
from qac.io import write_jsonl
from stages import load_stage, run_torchrun
from base_settings import finetune_settings

REPO = Path(__file__).resolve().parent.parent
TOPICS = ["apple orchard harvest", "river bridge engineering", "violin concerto tuning", "glacier ice melt",
          "solar panel voltage", "chess opening theory", "coffee bean roasting", "volcano lava flow",
          "honey bee colony", "desert cactus bloom", "satellite orbit decay", "bread yeast dough",
          "whale song migration", "copper wire conductivity", "tea leaf oxidation", "marathon runner training"]
HELDOUT_TOPICS = ["zeppelin airship hangar", "quasar redshift survey", "origami crane folding",
                  "lighthouse keeper lamp"]
HELDOUT_MARK = "heldoutmarker"   # a word only test queries contain


def tiny_datasets() -> tuple[Dataset, Dataset]:
    corpus = {}
    for index, topic in enumerate(TOPICS + HELDOUT_TOPICS):
        corpus[f"d{index}"] = Document(f"d{index}", topic.split()[0].title(), f"A passage on {topic}.")
        corpus[f"x{index}"] = Document(f"x{index}", "", f"Another note mentioning {topic.split()[1]} briefly.")
    queries = {f"q{i}": f"what about {topic}" for i, topic in enumerate(TOPICS)}
    queries.update({f"test-{i}": f"{HELDOUT_MARK} {topic}" for i, topic in enumerate(HELDOUT_TOPICS)})
    train = {f"q{i}": {f"d{i}": 1} for i in range(len(TOPICS))}
    test = {f"test-{i}": {f"d{len(TOPICS) + i}": 1, f"x{len(TOPICS) + i}": 2} for i in range(len(HELDOUT_TOPICS))}
    in_domain = Dataset("tinyset", corpus, queries, {"train": train, "test": test},
                        meta={"rel_threshold": {"train": 1, "test": 1}})
    other_corpus = {f"o{i}": Document(f"o{i}", "", f"Report {i} on {topic}.") for i, topic in enumerate(TOPICS[:8])}
    other = Dataset("othertiny", other_corpus, {f"oq{i}": topic for i, topic in enumerate(TOPICS[:4])},
                    {"test": {f"oq{i}": {f"o{i}": 2, f"o{i + 4}": 1} for i in range(4)}},
                    meta={"rel_threshold": {"test": 2}})
    return in_domain, other


def make_study(root: Path, tiny_bert_dir: Path, variants=("none",)) -> dict:
    """A working directory with params.yaml and every input of the finetune and evaluate stages."""
    params = render_profile("smoke")
    params["data_dir"] = str(root / "data")
    params["datasets"] = {"tinyset": {"format": "beir", "splits": ["train", "test"]},
                          "othertiny": {"format": "beir", "splits": ["test"]}}
    params["train_dataset"], params["zero_shot"] = "tinyset", ["othertiny"]
    params["pretrain_corpus"] = "tinyset"
    params["mlflow"]["system_metrics"] = False
    params["pretrain"]["variants"] = {name: {"method": "none"} for name in variants}
    params["finetune"].update(query_max_len=12, passage_max_len=24, train_n_passages=3, batch_size=8, epochs=1,
                              lr=1e-4, mine_depth=6, max_train_queries=None, log_every=1, encode_batch_size=8)
    params["evaluate"].update(depth=10, batch_size=8, metrics=["RR@10", "R@10", "nDCG@10", "AP"])
    # The other sections name what this study has (the schema checks every reference).
    params["tables"]["in_domain_columns"] = [{"label": "RR@10", "dataset": None, "split": "test", "measure": "RR@10",
                                              "paper": "mrr@10"}]
    params["hpo"]["variant"] = variants[0]
    write_params(params, root / "params.yaml")

    data = root / "data" / "smoke"
    in_domain, other = tiny_datasets()
    write_prepared(in_domain, data / "datasets" / "tinyset")
    write_prepared(other, data / "datasets" / "othertiny")
    ids = sorted(in_domain.corpus)
    write_jsonl(data / "bm25" / "negatives.jsonl", (
        {"qid": qid, "positives": sorted(judged), "negatives": [d for d in ids if d not in judged][:5]}
        for qid, judged in in_domain.qrels["train"].items()))

    from qac.params import load_params
    from qac.tracking import stage_run, write_run_record

    checked = load_params(root / "params.yaml")
    for name in variants:
        folder = data / "pretrain" / name
        shutil.copytree(tiny_bert_dir, folder / "encoder")
        with stage_run(checked, f"pretrain@{name}", f"pretrain/none/{name}", kind="pretrain",
                       tags={"qac.variant": name, "qac.method": "none"}) as run:
            pass
        write_run_record(data, folder, run.info.run_id, variant=name, method="none")
    return params


@pytest.fixture(scope="module")
def shared_mlflow_store(tmp_path_factory):
    """As the ``mlflow_store`` fixture, but one SQLite store for the module's tests."""
    with pytest.MonkeyPatch.context() as patch:
        uri = empty_store(tmp_path_factory.mktemp("mlflow") / "mlflow.db")
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri


@contextlib.contextmanager
def study_dir(root: Path, tiny_bert_dir: Path):
    """Work inside a fresh tiny study at ``root`` (cwd and QAC_PARAMS point there)."""
    root.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("QAC_PARAMS", str(root / "params.yaml"))
        yield make_study(root, tiny_bert_dir)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_bert_dir, shared_mlflow_store):
    """One finetune@none run on the tiny study, with the start of every fine-tuning recorded."""
    from qac.train import finetune

    root = tmp_path_factory.mktemp("finetuned") / "study"
    starts = []
    original = finetune.BiEncoder.from_pretrained

    def recording(path, **kwargs):
        starts.append(Path(path))
        return original(path, **kwargs)

    with study_dir(root, tiny_bert_dir) as params, pytest.MonkeyPatch.context() as patch:
        patch.setattr(finetune.BiEncoder, "from_pretrained", staticmethod(recording))
        load_stage("finetune").main(["--variant", "none"])
    return root, params, starts


def test_finetune_stage_writes_two_retrievers_and_mined_negatives(finetuned):
    from transformers import AutoModel

    root, params, _ = finetuned
    out = root / "data" / "smoke" / "finetune" / "none"
    assert sorted(p.name for p in out.iterdir()) == ["mined_negatives.jsonl", "r1", "r1_runs", "r2"]
    assert sorted(p.name for p in (out / "r1_runs").iterdir()) == ["encoding.json", "test.trec"]   # never train
    for name in ("r1", "r2"):
        AutoModel.from_pretrained(out / name)
        assert (out / name / "tokenizer.json").exists() or (out / name / "vocab.txt").exists()

    train_positive = {f"q{i}": f"d{i}" for i in range(16)}
    mined = [json.loads(line) for line in (out / "mined_negatives.jsonl").read_text().splitlines()]
    assert sorted(record["qid"] for record in mined) == sorted(train_positive)
    for record in mined:
        assert record["positives"] == [train_positive[record["qid"]]]
        assert train_positive[record["qid"]] not in record["negatives"]  # positives are never negatives
        # the top 6 (mine_depth) minus the positive if it was retrieved there
        assert len(record["negatives"]) in (5, 6)


def test_finetune_runs_nest_under_the_pretraining_run(finetuned, shared_mlflow_store):
    import mlflow

    root, _, _ = finetuned
    out = root / "data" / "smoke" / "finetune" / "none"
    records = root / "data" / "smoke" / ".runs"
    pretrain_run = json.loads((records / "pretrain/none/mlflow_run.json").read_text())["run_id"]
    client = mlflow.MlflowClient(shared_mlflow_store)
    assert not list(out.glob("**/mlflow_run.json"))    # bookkeeping stays out of the DVC output
    for name in ("r1", "r2"):
        run = client.get_run(json.loads((records / "finetune/none" / name / "mlflow_run.json").read_text())["run_id"])
        assert run.info.run_name == f"{name} · none" and run.data.tags["qac.stage"] == "finetune@none"
        assert (run.data.params["method"], run.data.params["context_type"],
                run.data.params["retriever"]) == ("none", "none", name)
        assert "query_count" not in run.data.params     # nothing pre-trained: no C to speak of
        assert run.data.tags["mlflow.parentRunId"] == pretrain_run
        assert run.data.tags["qac.kind"] == "finetune" and run.data.tags["qac.retriever"] == name
        assert run.data.tags["qac.variant"] == "none"
        # The seed it trained with, as a parameter and a tag (a seed copy of a variant carries its own).
        assert run.data.tags["qac.seed"] == run.data.params["seed"] == str(finetuned[1]["seed"])
        assert run.data.params["train_n_passages"] == "3"
        losses = client.get_metric_history(run.info.run_id, "loss")
        assert [m.step for m in losses] == [1, 2]  # 16 training queries, batch 8, 1 epoch
        assert len(client.get_metric_history(run.info.run_id, "lr")) == 2


def test_retriever_two_restarts_from_the_pretrained_encoder(finetuned):
    root, _, starts = finetuned
    encoder = root / "data" / "smoke" / "pretrain" / "none" / "encoder"
    assert starts == [encoder, encoder]


def test_retriever_one_on_the_triples_queries_and_mining_over_every_judged_query(tmp_path, tiny_bert_dir,
                                                                                 shared_mlflow_store):
    """finetune.r1_queries: triples, as the release: retriever 1 trains only on the queries its negatives file
    lists (half of them here), the mining and retriever 2 cover all 16 judged queries (tevatron issue 81)."""
    import mlflow

    from qac.config import write_params

    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir) as params:
        params["finetune"]["r1_queries"] = "triples"
        write_params(params, root / "params.yaml")
        negatives = root / "data" / "smoke" / "bm25" / "negatives.jsonl"
        kept = [line for line in negatives.read_text().splitlines() if json.loads(line)["qid"] in
                {f"q{i}" for i in range(8)}]
        negatives.write_text("\n".join(kept) + "\n")
        load_stage("finetune").main(["--variant", "none"])
    out = root / "data" / "smoke" / "finetune" / "none"
    mined = [json.loads(line)["qid"] for line in (out / "mined_negatives.jsonl").read_text().splitlines()]
    assert sorted(mined) == sorted(f"q{i}" for i in range(16))
    records = root / "data" / "smoke" / ".runs" / "finetune" / "none"
    client = mlflow.MlflowClient(shared_mlflow_store)
    trained = {}
    for name in ("r1", "r2"):
        run = client.get_run(json.loads((records / name / "mlflow_run.json").read_text())["run_id"])
        trained[name] = (run.data.metrics["train_queries/queries"], run.data.metrics["train_queries/corpus_negatives"],
                         len(client.get_metric_history(run.info.run_id, "loss")))
    assert trained == {"r1": (8, 0, 1), "r2": (16, 0, 2)}


@pytest.mark.parametrize("lost", ["record", "store"])
def test_an_unknown_pretraining_run_is_a_link_left_out(tmp_path, tiny_bert_dir, shared_mlflow_store, monkeypatch,
                                                        capsys, lost):
    """No record (DVC restored or pulled the encoder) or a store without the run (a new mlflow.db):
    fine-tuning runs and nests under the study run instead of failing on ``Run with id=... not found``."""
    import mlflow

    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir):
        if lost == "record":
            (root / "data/smoke/.runs/pretrain/none/mlflow_run.json").unlink()
        else:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'new.db'}")
        load_stage("finetune").main(["--variant", "none"])
        record = json.loads((root / "data/smoke/.runs/finetune/none/r1/mlflow_run.json").read_text())
    assert (root / "data" / "smoke" / "finetune" / "none" / "r1" / "config.json").is_file()
    assert "not linked" in capsys.readouterr().err
    run = mlflow.MlflowClient().get_run(record["run_id"])
    parent = mlflow.MlflowClient().get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["qac.role"] == "study"


def test_a_failure_during_training_leaves_no_partial_output(tmp_path, tiny_bert_dir, shared_mlflow_store,
                                                            monkeypatch):
    from qac.train import finetune

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(finetune, "train_biencoder", broken)
    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir):
        with pytest.raises(RuntimeError, match="out of memory"):
            load_stage("finetune").main(["--variant", "none"])
    finetune_dir = root / "data" / "smoke" / "finetune"
    assert not finetune_dir.exists() or not any(finetune_dir.iterdir())


def test_queries_that_do_not_fill_whole_batches_stop_the_stage_before_a_model_loads(tmp_path, tiny_bert_dir,
                                                                                    shared_mlflow_store, monkeypatch):
    """A batch of 7 over the study's training queries used to drop the remainder silently."""
    from qac.config import write_params
    from qac.train import finetune
    from qac.train.finetune import IncompleteBatchError

    loaded = []
    monkeypatch.setattr(finetune.BiEncoder, "from_pretrained", staticmethod(lambda *a, **k: loaded.append(a)))
    root = tmp_path / "study"
    n = len(TOPICS)
    with study_dir(root, tiny_bert_dir) as params:
        params["finetune"].update(batch_size=7, incomplete_batch="error")
        write_params(params, root / "params.yaml")
        with pytest.raises(IncompleteBatchError) as caught:
            load_stage("finetune").main(["--variant", "none"])
    message = str(caught.value)
    assert message.startswith(f"finetune@none r1: {n} training queries do not fill whole batches of 7 "
                              f"(finetune.batch_size): {n // 7} batches would leave {n % 7} queries out")
    assert "finetune.incomplete_batch: drop" in message
    assert loaded == []
    finetune_dir = root / "data" / "smoke" / "finetune"
    assert not finetune_dir.exists() or not any(finetune_dir.iterdir())


def test_whole_batches_leave_out_what_drop_allows_and_nothing_else():
    from qac.train.finetune import IncompleteBatchError, check_whole_batches

    assert check_whole_batches(21, finetune_settings(batch_size=7, incomplete_batch="error", seed=42)) == 0
    assert check_whole_batches(19, finetune_settings(batch_size=7, incomplete_batch="drop", seed=42)) == 5
    with pytest.raises(IncompleteBatchError, match="19 training queries do not fill whole batches of 7"):
        check_whole_batches(19, finetune_settings(batch_size=7, incomplete_batch="error", seed=42))
    with pytest.raises(IncompleteBatchError, match="6 training queries are fewer than one batch of 7"):
        check_whole_batches(6, finetune_settings(batch_size=7, incomplete_batch="drop", seed=42))


@pytest.mark.slow
def test_the_stage_under_torchrun_gathers_every_share_of_the_corpus_and_the_queries(finetuned, tmp_path,
                                                                                     tiny_bert_dir,
                                                                                     shared_mlflow_store):
    """Two processes each encode half of the corpus and of the queries; the main process searches the
    gathered vectors. Mining and retriever 1's evaluation runs cover what one process covers: every
    training query mined, every test query ranked to the full depth over the whole corpus."""
    from qac.evaluation.trec_io import read_run
    from qac.data.textfile import iter_jsonl

    one_root, params, _ = finetuned
    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir):
        run_torchrun("finetune", root / "params.yaml", shared_mlflow_store, 2, "--variant", "none")
    one, two = (r / "data" / "smoke" / "finetune" / "none" for r in (one_root, root))
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    mined = {record["qid"]: record for record in iter_jsonl(two / "mined_negatives.jsonl")}
    assert set(mined) == {record["qid"] for record in iter_jsonl(one / "mined_negatives.jsonl")}
    assert (two / "r1_runs" / "encoding.json").read_text() == (one / "r1_runs" / "encoding.json").read_text()
    run, reference = read_run(two / "r1_runs" / "test.trec"), read_run(one / "r1_runs" / "test.trec")
    assert set(run) == set(reference)
    depth = params["evaluate"]["depth"]
    assert all(len(docs) == depth for docs in run.values())
    # Both halves of the corpus (each process encoded one) reach the rankings.
    corpus = sorted(tiny_datasets()[0].corpus)
    ranked = {doc for docs in run.values() for doc in docs}
    assert ranked & set(corpus[:len(corpus) // 2]) and ranked & set(corpus[len(corpus) // 2:])


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_stage_killed_after_retriever_one_resumes_without_training_it_again(finetuned, tmp_path, tiny_bert_dir,
                                                                            shared_mlflow_store, monkeypatch, capsys):
    """Killed while mining: no output, retriever 1 kept in the work folder; the rerun takes it as it is
    (its logged steps replayed into the new run, which links the one that trained it), and writes what an
    uninterrupted run writes, byte for byte; the work folder then goes."""
    import mlflow

    from qac.train import finetune, mining

    root = tmp_path / "study"
    trained = []
    original = finetune.train_biencoder

    def counting(*args, **kwargs):
        trained.append(kwargs.get("checkpoint").directory.parent.name)
        return original(*args, **kwargs)

    monkeypatch.setattr(finetune, "train_biencoder", counting)
    with study_dir(root, tiny_bert_dir):
        with monkeypatch.context() as patch:
            def killed(*args, **kwargs):
                raise KeyboardInterrupt

            patch.setattr(mining, "mine_with_retriever", killed)
            with pytest.raises(KeyboardInterrupt):
                load_stage("finetune").main(["--variant", "none"])
        data = root / "data" / "smoke"
        assert not (data / "finetune" / "none").exists()
        assert (data / ".work" / "finetune" / "none" / "r1" / "result" / "model").is_dir()
        capsys.readouterr()
        load_stage("finetune").main(["--variant", "none"])
    assert trained == ["r1", "r2"]                  # retriever 1 once, in the killed run
    assert "r1 taken as an earlier run finished it" in capsys.readouterr().err
    expected = finetuned[0] / "data" / "smoke" / "finetune" / "none"
    assert _files(data / "finetune" / "none") == _files(expected)
    assert not (data / ".work" / "finetune" / "none").exists()

    client = mlflow.MlflowClient(shared_mlflow_store)
    run = client.get_run(json.loads((data / ".runs/finetune/none/r1/mlflow_run.json").read_text())["run_id"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
    earlier = run.data.tags["qac.resumes_run"]
    assert earlier != run.info.run_id and client.get_run(earlier).data.tags["qac.continued_by"] == run.info.run_id


@pytest.mark.parametrize("left", ["another run's work", "an unreadable fingerprint", "a file"])
def test_work_of_other_settings_is_discarded_not_resumed(finetuned, tmp_path, tiny_bert_dir, shared_mlflow_store,
                                                        monkeypatch, capsys, left):
    """A work folder left by a run of other settings (or that cannot be trusted) is cleared, and said so;
    the run trains both retrievers."""
    from qac.config import write_params
    from qac.train import finetune

    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir) as params:
        stale = root / "data" / "smoke" / ".work" / "finetune" / "none"
        if left == "a file":
            stale.parent.mkdir(parents=True)
            stale.write_text("not a folder\n")
        else:
            (stale / "r1" / "result" / "model").mkdir(parents=True)
            (stale / "fingerprint").write_bytes(b"another run's\n" if left == "another run's work" else b"\xff\xfe\x00")
        trained = []
        original = finetune.train_biencoder
        monkeypatch.setattr(finetune, "train_biencoder",
                            lambda *a, **k: trained.append(1) or original(*a, **k))
        write_params(params, root / "params.yaml")
        load_stage("finetune").main(["--variant", "none"])
    assert len(trained) == 2 and "discarding the work of an earlier run" in capsys.readouterr().err
    expected = finetuned[0] / "data" / "smoke" / "finetune" / "none"
    assert _files(root / "data" / "smoke" / "finetune" / "none") == _files(expected)


@pytest.mark.parametrize("damage", ["truncated weights", "mined negatives cut mid-line"])
def test_a_damaged_finished_phase_runs_again(finetuned, tmp_path, tiny_bert_dir, shared_mlflow_store, monkeypatch,
                                             capsys, damage):
    """A finished phase whose files cannot be used (a disk fault, a copy cut short) is discarded with the
    reason and run again; the output is still what an uninterrupted run writes."""
    from qac.train import finetune, groups, mining

    root = tmp_path / "study"
    trained = []
    original = finetune.train_biencoder
    monkeypatch.setattr(finetune, "train_biencoder",
                        lambda *a, **k: trained.append(k["checkpoint"].directory.parent.name) or original(*a, **k))
    work = root / "data" / "smoke" / ".work" / "finetune" / "none"
    with study_dir(root, tiny_bert_dir):
        with monkeypatch.context() as patch:
            if damage == "truncated weights":
                patch.setattr(mining, "mine_with_retriever", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
            else:           # killed before retriever 2: retriever 1 and the mining are finished
                patch.setattr(groups, "retriever2_negatives", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
            with pytest.raises(KeyboardInterrupt):
                load_stage("finetune").main(["--variant", "none"])
        if damage == "truncated weights":
            weights = next((work / "r1" / "result" / "model").glob("*.safetensors"))
            weights.write_bytes(weights.read_bytes()[:1000])
            phase = "r1"
        else:
            mined = work / "mined" / "result" / "mined_negatives.jsonl"
            mined.write_text(mined.read_text()[:-20])
            phase = "mined"
        capsys.readouterr()
        load_stage("finetune").main(["--variant", "none"])
    err = capsys.readouterr().err
    assert f"discarding {work / phase / 'result'}" in err and f"{phase} runs again" in err
    assert trained == (["r1", "r1", "r2"] if phase == "r1" else ["r1", "r2"])
    expected = finetuned[0] / "data" / "smoke" / "finetune" / "none"
    assert _files(root / "data" / "smoke" / "finetune" / "none") == _files(expected)
