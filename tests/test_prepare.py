"""Dataset resolution (mirror, then download), subsetting, and the prepare stage."""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import json
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
import yaml

from qac.data.dataset import Dataset, Document
from qac.data.errors import DataFormatError, DatasetUnavailableError
from qac.data.prepared import load_prepared, prepare_dataset, select_documents, write_prepared
from qac.data.sources import (DOWNLOAD_RECORD, DatasetSpec, UnverifiedDownloadWarning, fetch_dataset,
                              locate_dataset, read_dataset)
from qac.io import file_md5
from qac.params import ParamsError, load_params, profile_params_path, validate_params
from qac.params.sections import DatasetEntry
import stages

UNREACHABLE = "http://127.0.0.1:9/x.zip"  # the discard port: nothing listens there

CORPUS = [{"_id": f"d{i}", "title": f"Title {i}", "text": f"Text of document {i}."} for i in range(1, 7)]
QUERIES = [{"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"}, {"_id": "q3", "text": "never judged"}]
QRELS = {"test": ["q1\td2\t1", "q1\td5\t2", "q2\td6\t1", "q2\tmissing\t1"], "train": ["q2\td1\t1"]}


def beir_files() -> dict[str, str]:
    header = "query-id\tcorpus-id\tscore\n"
    files = {"corpus.jsonl": "".join(json.dumps(r) + "\n" for r in CORPUS),
             "queries.jsonl": "".join(json.dumps(r) + "\n" for r in QUERIES)}
    files.update({f"qrels/{split}.tsv": header + "".join(row + "\n" for row in rows) for split, rows in QRELS.items()})
    return files


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content, encoding="utf-8")
    return root


def spec(**entry) -> DatasetSpec:
    values = {"format": "beir", "mirror": "tiny", "url": None, "splits": ["test", "train"], "rel_threshold": 1}
    values.update(entry)
    return DatasetSpec.from_params("tiny", DatasetEntry.model_validate(values))


def entry_problems(**entry) -> str:
    """What the params check says of a ``datasets.tiny`` entry with ``entry`` over ``spec``'s."""
    values = {"format": "beir", "mirror": "tiny", "url": None, "splits": ["test", "train"], "rel_threshold": 1}
    with pytest.raises(ParamsError) as caught:
        validate_params({"profile": "smoke", "datasets": {"tiny": {**values, **entry}}}, complete=False)
    return str(caught.value)


@contextlib.contextmanager
def serve(directory: Path):
    """An HTTP server on loopback serving ``directory``; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- where the data comes from ----------------------------------------------

def test_the_mirror_comes_first(tmp_path):
    write_tree(tmp_path / "mirror" / "tiny", beir_files())
    source = locate_dataset(spec(url=UNREACHABLE), tmp_path / "mirror", tmp_path / "downloads")
    assert (source.origin, source.directory, source.location) == ("mirror", tmp_path / "mirror" / "tiny", "mirror:tiny")


def test_not_in_the_mirror_and_an_unreachable_url_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetUnavailableError) as caught:
        locate_dataset(spec(url=UNREACHABLE), tmp_path / "mirror", tmp_path / "downloads")
    message = str(caught.value)
    assert str(tmp_path / "mirror" / "tiny") in message and UNREACHABLE in message
    assert not (tmp_path / "downloads").exists()


def test_a_hub_dataset_without_a_reachable_hub_fails_when_located(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    hub_spec = spec(format="hf", hub="BeIR/scifact", mirror="scifact-hub")
    with pytest.raises(DatasetUnavailableError) as caught:
        locate_dataset(hub_spec, tmp_path / "mirror", tmp_path / "downloads")
    assert str(tmp_path / "mirror" / "scifact-hub") in str(caught.value) and "BeIR/scifact" in str(caught.value)
    # With a BEIR copy in the mirror, the hub is not needed.
    write_tree(tmp_path / "mirror" / "scifact-hub", beir_files())
    assert locate_dataset(hub_spec, tmp_path / "mirror", tmp_path / "downloads").origin == "mirror"


def test_an_incomplete_mirror_folder_says_what_is_missing(tmp_path):
    files = beir_files()
    del files["qrels/train.tsv"]
    write_tree(tmp_path / "mirror" / "tiny", files)
    with pytest.raises(DatasetUnavailableError, match=r"missing qrels/train.tsv.*no public URL"):
        locate_dataset(spec(), tmp_path / "mirror", tmp_path / "downloads")


def test_download_of_a_beir_zip_from_a_local_server(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, content in beir_files().items():
            bundle.writestr(f"tiny/{name}", content)  # BEIR zips hold one top-level folder
    (site / "tiny.zip").write_bytes(buffer.getvalue())
    downloads = tmp_path / "downloads"
    with serve(site) as base:
        source = fetch_dataset(spec(url=f"{base}/tiny.zip", md5=file_md5(site / "tiny.zip")), tmp_path / "no-mirror",
                               downloads)
        assert (source.origin, source.directory, source.location) == ("download", downloads / "tiny", f"{base}/tiny.zip")
        assert sorted(p.relative_to(source.directory).as_posix() for p in source.directory.rglob("*.*")
                      if p.name != DOWNLOAD_RECORD) == sorted(beir_files())
        dataset = read_dataset(spec(url=f"{base}/tiny.zip"), source, mirror=tmp_path / "no-mirror")
    assert list(dataset.corpus) == [r["_id"] for r in CORPUS]
    # The cached copy is used once the server is gone.
    again = fetch_dataset(spec(url=UNREACHABLE), tmp_path / "no-mirror", downloads)
    assert again.directory == downloads / "tiny"
    assert [p.name for p in downloads.iterdir()] == ["tiny"]


def _beir_zip(site: Path, name: str = "tiny.zip") -> str:
    """A BEIR-style zip served from ``site``; returns its MD5."""
    import hashlib

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for member, content in beir_files().items():
            bundle.writestr(f"tiny/{member}", content)
    site.mkdir(parents=True, exist_ok=True)
    (site / name).write_bytes(buffer.getvalue())
    return hashlib.md5(buffer.getvalue()).hexdigest()


def test_a_download_is_verified_against_its_pinned_checksum(tmp_path):
    md5 = _beir_zip(tmp_path / "site")
    downloads = tmp_path / "downloads"
    with serve(tmp_path / "site") as base:
        with pytest.raises(DatasetUnavailableError) as caught:
            fetch_dataset(spec(url=f"{base}/tiny.zip", md5="0" * 32), tmp_path / "no-mirror", downloads)
        assert f"md5 of the download is {md5}, but {'0' * 32} is pinned" in str(caught.value)
        assert list(downloads.iterdir()) == []                 # nothing unpacked, no staging left
        source = fetch_dataset(spec(url=f"{base}/tiny.zip", md5=md5.upper()), tmp_path / "no-mirror", downloads)
        assert (source.directory / "corpus.jsonl").is_file()
        # Pinning another checksum makes the cached copy stale: it is downloaded (and checked) again.
        with pytest.raises(DatasetUnavailableError, match="is pinned"):
            fetch_dataset(spec(url=f"{base}/tiny.zip", md5="1" * 32), tmp_path / "no-mirror", downloads)
    assert (source.directory / "corpus.jsonl").is_file()        # the verified copy is kept


def test_a_download_without_a_pinned_checksum_warns(tmp_path):
    _beir_zip(tmp_path / "site")
    with serve(tmp_path / "site") as base:
        with pytest.warns(UnverifiedDownloadWarning, match="'tiny'.*no pinned checksum"):
            fetch_dataset(spec(url=f"{base}/tiny.zip"), tmp_path / "no-mirror", tmp_path / "downloads")


def test_a_malformed_checksum_is_rejected():
    assert "datasets.tiny.md5" in entry_problems(md5="5f7d1de6")
    assert "datasets.tiny.sha256" in entry_problems(sha256="z" * 64)


# Downloads whose publisher gives no checksum (and no index we know pins one): they warn as
# unverified (UnverifiedDownloadWarning) instead. Glasgow's CISI archive is the only one.
UNPUBLISHED_CHECKSUMS = {"http://ir.dcs.gla.ac.uk/resources/test_collections/cisi/cisi.tar.gz",
                         "https://rocketqa.bj.bcebos.com/corpus/marco.tar.gz"}   # RocketQA's MS MARCO with titles


@pytest.mark.parametrize("profile", ["smoke", "default", "paper"])
def test_every_public_download_of_a_profile_has_a_pinned_checksum(profile):
    for name, entry in load_params(profile_params_path(profile), running=False).datasets.items():
        declared = DatasetSpec.from_params(name, entry)
        if declared.url and declared.url not in UNPUBLISHED_CHECKSUMS:
            assert declared.checksum is not None, f"{profile}: datasets.{name} has a url but no md5/sha256"


def test_download_of_an_msmarco_style_tar_gz_with_topics_from_the_mirror(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    members = {"collection.tsv": "0\tPassage zero.\n1\tPassage one.\n2\tPassage two.\n",
               "queries.train.tsv": "10\ttrain query\n", "qrels.train.tsv": "10\t0\t1\t1\n"}
    with tarfile.open(site / "collectionandqueries.tar.gz", "w:gz") as bundle:
        for name, content in members.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data))
    mirror = write_tree(tmp_path / "mirror", {"trec/topics.dl.txt": "20\tdl query\n",
                                              "trec/qrels.dl.txt": "20 Q0 2 3\n20 Q0 0 0\n"})
    entry = dict(format="msmarco-passage", mirror="msmarco-passage", splits=["train", "dl"],
                 topics={"dl": "trec/topics.dl.txt"}, qrels={"dl": "trec/qrels.dl.txt"}, rel_threshold={"dl": 2})
    with serve(site) as base:
        passage_spec = DatasetSpec.from_params("msmarco-passage", DatasetEntry.model_validate({
            **entry, "url": f"{base}/collectionandqueries.tar.gz",
            "md5": file_md5(site / "collectionandqueries.tar.gz")}))
        source = fetch_dataset(passage_spec, mirror, tmp_path / "downloads")
    dataset = read_dataset(passage_spec, source, mirror=mirror)
    assert dataset.corpus["2"] == Document("2", "", "Passage two.")
    assert dataset.queries == {"10": "train query", "20": "dl query"}
    assert dataset.qrels == {"train": {"10": {"1": 1}}, "dl": {"20": {"2": 3, "0": 0}}}
    assert dataset.meta["rel_threshold"] == {"train": 1, "dl": 2}


def test_dataset_spec_errors():
    assert "datasets.tiny.format" in entry_problems(format="csv")
    assert "datasets.tiny.splitz" in entry_problems(splitz=["test"])
    assert spec(rel_threshold={"test": 2}).rel_threshold == {"test": 2, "train": 1}


def test_paper_profile_msmarco_passage_resolves_topics_in_the_mirror(shared_data):
    entry = load_params(profile_params_path("paper"), running=False).datasets["msmarco-passage"]
    passage_spec = DatasetSpec.from_params("msmarco-passage", entry)
    assert passage_spec.rel_threshold == {"train": 1, "dev": 1, "dl19": 2, "dl20": 2}
    topics, qrels = passage_spec.split_files("dl19")
    assert (shared_data / topics).is_file() and (shared_data / qrels).is_file()


# --- subsets -----------------------------------------------------------------

def tiny_dataset() -> Dataset:
    corpus = {r["_id"]: Document(r["_id"], r["title"], r["text"]) for r in CORPUS}
    qrels = {"test": {"q1": {"d2": 1, "d5": 2}, "q2": {"d6": 1, "missing": 1}}, "train": {"q2": {"d1": 1}}}
    return Dataset("tiny", corpus, {q["_id"]: q["text"] for q in QUERIES}, qrels, meta={"skipped": {}})


def test_select_documents():
    dataset = tiny_dataset()
    assert select_documents(dataset, None, True) == ["d1", "d2", "d3", "d4", "d5", "d6"]
    assert select_documents(dataset, 3, False) == ["d1", "d2", "d3"]
    # judged: d1, d2, d5, d6 (and 'missing', not in the corpus: dropped first)
    dataset.qrels["test"]["q2"].pop("missing")
    assert select_documents(dataset, 5, True) == ["d1", "d2", "d3", "d5", "d6"]
    assert select_documents(dataset, 2, True) == ["d1", "d2", "d5", "d6"]


def test_prepare_subset_counts_what_it_drops():
    dataset = prepare_dataset(tiny_dataset(), max_documents=3, keep_judged_documents=False)
    assert list(dataset.corpus) == ["d1", "d2", "d3"]
    assert dataset.qrels == {"test": {"q1": {"d2": 1}}, "train": {"q2": {"d1": 1}}}
    assert dataset.queries == {"q1": "first", "q2": "second"}
    assert dataset.meta["skipped"] == {
        "documents_outside_subset": 3,
        "qrels_unknown_document": 1,       # q2 -> missing
        "qrels_dropped_document": 2,       # q1 -> d5, q2 -> d6
        "queries_without_qrels.test": 1,   # q2 in test
        "queries_unjudged": 1,             # q3
    }


# --- the stage ----------------------------------------------------------------

def load_stage():
    return stages.load_stage("prepare")


@pytest.fixture()
def project(tmp_path, monkeypatch, mlflow_store):
    """A working directory with params.yaml declaring ``tiny`` and a mirror holding it."""
    mirror = tmp_path / "mirror"
    write_tree(mirror / "tiny", beir_files())
    params = {"profile": "smoke", "seed": 1, "data_dir": "data", "mlflow": {"system_metrics": False},
              "datasets": {"tiny": {"format": "beir", "mirror": "tiny", "url": None, "splits": ["test", "train"],
                                    "rel_threshold": {"test": 2, "train": 1}, "ignore_identical_ids": True},
                           "elsewhere": {"format": "beir", "mirror": "absent", "url": UNREACHABLE, "splits": ["test"]}},
              "prepare": {"max_documents": 4, "keep_judged_documents": True, "min_text_chars": 1}}
    work = tmp_path / "work"
    work.mkdir()
    (work / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    monkeypatch.chdir(work)
    monkeypatch.setenv("QAC_PARAMS", str(work / "params.yaml"))
    monkeypatch.setenv("QAC_DATA_MIRROR", str(mirror))
    return work


def test_prepare_stage_writes_a_normalised_dataset(project, mlflow_store):
    assert load_stage().main(["--dataset", "tiny"]) == 0
    out = project / "data" / "smoke" / "datasets" / "tiny"
    record = json.loads((out / "dataset.json").read_text())
    assert record == {
        "name": "tiny", "format": "beir", "source": "mirror:tiny", "splits": ["test", "train"],
        "rel_threshold": {"test": 2, "train": 1}, "ignore_identical_ids": True,
        "counts": {"documents": 4, "queries": 2, "qrels": {"test": 3, "train": 1},
                   "queries_per_split": {"test": 2, "train": 1}},
        "skipped": {"documents_outside_subset": 2, "qrels_unknown_document": 1, "queries_unjudged": 1},
        "subset": {"max_documents": 4, "keep_judged_documents": True},
    }
    dataset = load_prepared(out)
    assert list(dataset.corpus) == ["d1", "d2", "d5", "d6"]   # judged documents kept, file order
    assert dataset.qrels["test"] == {"q1": {"d2": 1, "d5": 2}, "q2": {"d6": 1}}
    assert dataset.rel_threshold("test") == 2 and dataset.ignore_identical_ids
    first = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert load_stage().main(["--dataset", "tiny"]) == 0      # deterministic: same bytes again
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == first

    import mlflow

    run = mlflow.search_runs(experiment_names=["qac-smoke"], filter_string="tags.`qac.kind` = 'prepare'",
                             output_format="list")[0]
    assert run.info.run_name == "tiny · prepare" and run.data.tags["qac.stage"] == "prepare@tiny"
    assert run.data.metrics["documents"] == 4 and run.data.metrics["skipped/qrels_unknown_document"] == 1


def test_a_failing_prepare_leaves_nothing_behind(project, tmp_path):
    corpus = tmp_path / "mirror" / "tiny" / "corpus.jsonl"
    corpus.write_text(corpus.read_text() + '{"_id": "d7", "title": "no text field"}\n')
    with pytest.raises(DataFormatError) as caught:
        load_stage().main(["--dataset", "tiny"])
    assert (caught.value.line, caught.value.field) == (7, "text")
    datasets = project / "data" / "smoke" / "datasets"
    assert not (datasets / "tiny").exists()
    assert not datasets.exists() or list(datasets.iterdir()) == []  # no temporary folder either


def test_an_unavailable_dataset_fails_before_any_work(project, tmp_path, monkeypatch):
    store = tmp_path / "no-store-yet" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    with pytest.raises(SystemExit, match=UNREACHABLE):   # the message alone, no traceback
        load_stage().main(["--dataset", "elsewhere"])
    assert not (project / "data").exists()
    assert not store.exists()  # no run was even opened


def test_load_prepared_of_a_folder_that_is_not_one(tmp_path):
    with pytest.raises(DataFormatError, match="run the prepare stage"):
        load_prepared(tmp_path)


def test_write_prepared_replaces_an_existing_folder_atomically(tmp_path):
    out = tmp_path / "datasets" / "tiny"
    write_prepared(prepare_dataset(tiny_dataset()), out)
    write_prepared(prepare_dataset(tiny_dataset(), max_documents=2, keep_judged_documents=False), out)
    assert list(load_prepared(out).corpus) == ["d1", "d2"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]
    assert load_prepared(out).meta["counts"]["qrels"] == {"test": 1, "train": 1}


def test_msmarco_documents_are_prepared_from_their_file_without_loading_texts(tmp_path):
    from qac.data.streamed import StreamedCorpus

    rows = ["D1\thttp://a\tTitle one\tBody one.", "D2\thttp://b\t \t ", "D3\thttp://c\tTitle three\tBody three.",
            "D4\thttp://d\tTitle four\tBody four."]
    write_tree(tmp_path / "mirror" / "docs", {"msmarco-docs.tsv": "\n".join(rows) + "\n",
                                              "queries.dev.tsv": "q1\tfirst\n", "qrels.dev.tsv": "q1 0 D3 1\n"})
    docs = DatasetSpec.from_params("docs", DatasetEntry(format="msmarco-docs", mirror="docs", splits=["dev"]))
    source = fetch_dataset(docs, tmp_path / "mirror", tmp_path / "downloads")
    dataset = read_dataset(docs, source, mirror=tmp_path / "mirror")
    assert isinstance(dataset.corpus, StreamedCorpus) and list(dataset.corpus) == ["D1", "D3", "D4"]
    prepare_dataset(dataset, max_documents=2, keep_judged_documents=True)
    write_prepared(dataset, tmp_path / "out")
    prepared = load_prepared(tmp_path / "out")
    assert prepared.corpus == {"D1": Document("D1", "Title one", "Body one."),
                               "D3": Document("D3", "Title three", "Body three.")}
    assert prepared.meta["skipped"] == {"corpus_empty_text": 1, "documents_outside_subset": 1}
    assert prepared.meta["counts"]["documents"] == 2 and prepared.qrels == {"dev": {"q1": {"D3": 1}}}
