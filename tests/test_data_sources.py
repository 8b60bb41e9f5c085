"""Public sources of the default profile's datasets: converters from the native formats, and the
error a user sees when neither the mirror nor the URL has the data.

The inputs are small files in the collections' real formats, written here:
Cranfield's and CISI's SMART-style ``.I/.T/.A/.B/.W/.X`` records and their
relevance files, the MS MARCO collection TSV, DL19 topics (gzip) and TREC qrels.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from qac.config import render_profile, write_params
from qac.data.errors import DataFormatError, DatasetUnavailableError
from qac.data.sources import DatasetSpec, fetch_dataset, locate_dataset, read_dataset
from qac.params.sections import DatasetEntry
from test_prepare import UNREACHABLE, entry_problems, serve

REPO = Path(__file__).resolve().parent.parent

# Three Cranfield records; the second has no text (two such records exist in the real file).
CRAN_ALL = """.I 1
.T
experimental investigation of the aerodynamics of a
wing in a slipstream .
.A
brenckman,m.
.B
j. ae. scs. 25, 1958, 324.
.W
experimental investigation of the aerodynamics of a
wing in a slipstream .
.I 2
.T
simple shear flow past a flat plate .
.A
ting-yili
.B
department of aeronautical engineering, rensselaer polytechnic
institute
.W
.I 3
.T
the boundary layer in simple shear flow past a flat plate .
.A
m. b. glauert
.B
department of mathematics, university of manchester
.W
the boundary-layer equations are presented for steady
incompressible flow with no pressure gradient .
"""
# .I numbers skip (001, 002, 004) as in the real cran.qry; cranqrel numbers queries by position.
CRAN_QRY = """.I 001
.W
what similarity laws must be obeyed when constructing aeroelastic models
of heated high speed aircraft .
.I 002
.W
what are the structural and aeroelastic problems associated with flight
of high speed aircraft .
.I 004
.W
what problems of heat conduction in composite slabs have been solved so
far .
"""
CRANQREL = "1 1 2\n1 3 4\n2 2 1\n2 1 -1\n3 3 3\n"

CISI_ALL = """.I 1
.T
18 Editions of the Dewey Decimal Classifications
.A
Comaromi, J.P.
.W
    The present study is a history of the DEWEY Decimal
Classification.
.X
1\t5\t1
92\t1\t1
.I 2
.T
Use Made of Technical Libraries
.A
Slater, M.
.W
This report is an analysis of 6300 acts of use
in 104 technical libraries.
.X
2\t2\t2
"""
CISI_QRY = """.I 1
.W
What problems and concerns are there in making up descriptive titles?
.I 2
.T
A test title
.W
How can actually pertinent data be retrieved?
"""
CISI_REL = "     1     1 0       0.000000\n     1     2 0       0.000000\n     2     2 0       0.000000\n" \
           "     2     2 0       0.000000\n"


def _write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_text(content, encoding="utf-8")
    return folder


def _beir(folder: Path) -> tuple[list[dict], list[dict], list[list[str]]]:
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    queries = [json.loads(line) for line in (folder / "queries.jsonl").read_text().splitlines()]
    qrels = [line.split("\t") for line in (folder / "qrels" / "test.tsv").read_text().splitlines()]
    return corpus, queries, qrels


# --- the converters ------------------------------------------------------------

def test_cranfield_numbers_queries_by_position_and_turns_cleverdon_codes_into_gains(tmp_path):
    from qac.data.glasgow import convert_cranfield

    source = _write(tmp_path / "cran", {"cran.all.1400": CRAN_ALL, "cran.qry": CRAN_QRY, "cranqrel": CRANQREL})
    counts = convert_cranfield(source, tmp_path / "out")
    corpus, queries, qrels = _beir(tmp_path / "out")
    assert counts == {"documents": 3, "queries": 3, "qrels": 4, "dropped_no_interest": 1}
    assert corpus[0] == {"_id": "1", "title": "experimental investigation of the aerodynamics of a wing in a "
                                              "slipstream .",
                         "text": "experimental investigation of the aerodynamics of a wing in a slipstream ."}
    assert corpus[1]["text"] == ""                     # kept here; prepare skips and counts empty texts
    assert [q["_id"] for q in queries] == ["1", "2", "3"]   # not 1, 2, 4
    assert queries[2]["text"] == "what problems of heat conduction in composite slabs have been solved so far ."
    # gain = 5 - code; the row coded -1 is gone
    assert qrels == [["query-id", "corpus-id", "score"], ["1", "1", "3"], ["1", "3", "1"], ["2", "2", "4"],
                     ["3", "3", "2"]]


def test_cisi_keeps_its_ids_and_reads_every_rel_row_as_relevant_once(tmp_path):
    from qac.data.glasgow import convert_cisi

    source = _write(tmp_path / "cisi", {"CISI.ALL": CISI_ALL, "CISI.QRY": CISI_QRY, "CISI.REL": CISI_REL})
    counts = convert_cisi(source, tmp_path / "out")
    corpus, queries, qrels = _beir(tmp_path / "out")
    assert counts == {"documents": 2, "queries": 2, "qrels": 3}
    assert corpus[0]["text"] == "The present study is a history of the DEWEY Decimal Classification."
    assert "1\t5\t1" not in json.dumps(corpus)        # the .X cross-references are no text
    assert queries[1] == {"_id": "2", "text": "How can actually pertinent data be retrieved?"}
    assert qrels[1:] == [["1", "1", "1"], ["1", "2", "1"], ["2", "2", "1"]]


def test_a_malformed_relevance_line_names_file_line_and_field(tmp_path):
    from qac.data.glasgow import convert_cranfield

    source = _write(tmp_path / "cran", {"cran.all.1400": CRAN_ALL, "cran.qry": CRAN_QRY,
                                        "cranqrel": "1 1 2\n1 3 four\n"})
    with pytest.raises(DataFormatError) as caught:
        convert_cranfield(source, tmp_path / "out")
    assert (Path(caught.value.path).name, caught.value.line, caught.value.field) == ("cranqrel", 2, "relevance")
    assert not (tmp_path / "out" / "qrels").exists()


def _write_tar(path: Path, files: dict[str, str], others: tuple[tarfile.TarInfo, ...] = ()) -> None:
    """A gzipped tar at ``path`` of the regular ``files`` (name -> text), then the members ``others`` (links,
    devices), which carry no data."""
    with tarfile.open(path, "w:gz") as bundle:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content.encode())
            bundle.addfile(info, io.BytesIO(content.encode()))
        for info in others:
            bundle.addfile(info)


def test_a_converted_download_is_read_as_beir(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _write_tar(site / "cran.tar.gz", {"cran.all.1400": CRAN_ALL, "cran.qry": CRAN_QRY, "cranqrel": CRANQREL})
    entry = {"format": "beir", "mirror": "cranfield", "splits": ["test"], "convert": "cranfield"}
    with serve(site) as base:
        spec = DatasetSpec.from_params("cranfield",
                                       DatasetEntry.model_validate({**entry, "url": f"{base}/cran.tar.gz"}))
        source = fetch_dataset(spec, tmp_path / "no-mirror", tmp_path / "downloads")
    dataset = read_dataset(spec, source, mirror=tmp_path / "no-mirror")
    assert source.directory == tmp_path / "downloads" / "cranfield"
    assert sorted(dataset.corpus) == ["1", "2", "3"]
    assert (dataset.corpus["2"].title, dataset.corpus["2"].text) == ("simple shear flow past a flat plate .", "")
    assert dataset.qrels["test"]["1"] == {"1": 3, "3": 1}
    assert "datasets.tiny.convert" in entry_problems(convert="cisi-v2")


def test_a_download_that_is_no_dataset_says_what_it_lacks(tmp_path):
    """An archive without the BEIR files (a wrong URL serving some other bundle) is named with what is missing
    and where it was unpacked; a folder standing where corpus.jsonl should be is said to be one."""
    site = tmp_path / "site"
    site.mkdir()
    _write_tar(site / "other.tar.gz", dict.fromkeys(("notes.txt", "corpus.jsonl/part-0"), "{}"))
    entry = {"format": "beir", "mirror": "tiny", "splits": ["test"]}
    with serve(site) as base:
        spec = DatasetSpec.from_params("tiny", DatasetEntry.model_validate({**entry, "url": f"{base}/other.tar.gz"}))
        with pytest.raises(DatasetUnavailableError) as caught:
            fetch_dataset(spec, tmp_path / "no-mirror", tmp_path / "downloads")
    message = str(caught.value)
    assert message.startswith(f"dataset 'tiny': the archive from {base}/other.tar.gz is not a dataset: ")
    assert "corpus.jsonl is a folder, not a file" in message and "missing queries.jsonl" in message


def _hostile_member(kind: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo({"climbs": "../escaped.txt", "absolute": "/tmp/escaped.txt"}.get(kind, "corpus.jsonl"))
    if kind == "symlink out":
        info.type, info.linkname = tarfile.SYMTYPE, "../../escaped.txt"
    elif kind == "hard link out":
        info.type, info.linkname = tarfile.LNKTYPE, "/etc/hostname"
    elif kind == "device":
        info.type = tarfile.CHRTYPE
    return info


@pytest.mark.parametrize("tar_filter", ["tarfile's data filter", "none (Python before 3.10.12 / 3.11.4)"])
@pytest.mark.parametrize("kind", ["climbs", "absolute", "symlink out", "hard link out", "device"])
def test_an_archive_member_pointing_outside_is_refused_before_anything_is_unpacked(tmp_path, monkeypatch, kind,
                                                                                   tar_filter):
    """The same refusal whether or not this Python's tarfile has the ``data`` filter: one paragraph naming the
    member, nothing written outside the download folder, and no download folder left half-written."""
    if tar_filter.startswith("none"):
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    site = tmp_path / "site"
    site.mkdir()
    hostile = _hostile_member(kind)
    files = dict.fromkeys(("queries.jsonl", "qrels/test.tsv"), "{}")
    if hostile.isreg():
        files[hostile.name] = "{}"
    _write_tar(site / "bundle.tar.gz", files, () if hostile.isreg() else (hostile,))
    entry = {"format": "beir", "mirror": "tiny", "splits": ["test"]}
    downloads = tmp_path / "work" / "downloads"
    with serve(site) as base:
        spec = DatasetSpec.from_params("tiny", DatasetEntry.model_validate({**entry, "url": f"{base}/bundle.tar.gz"}))
        with pytest.raises(DatasetUnavailableError) as caught:
            fetch_dataset(spec, tmp_path / "no-mirror", downloads)
    message = str(caught.value)
    assert message.startswith(f"dataset 'tiny': the download from {base}/bundle.tar.gz into ") and "\n" not in message
    assert repr(hostile.name) in message
    assert ("a device or a pipe" if kind == "device" else "points outside the archive") in message
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "work" / "escaped.txt").exists()
    assert not downloads.exists() or not any(downloads.rglob("*.jsonl"))


def test_the_dl19_subset_keeps_every_relevant_passage_then_judged_then_others(tmp_path):
    from qac.cli.dl19_subset_command import main

    (tmp_path / "collection.tsv").write_text("".join(f"{pid}\tpassage number {pid}\n" for pid in range(10)))
    with gzip.open(tmp_path / "topics.tsv.gz", "wt") as topics:
        topics.write("100\twhat is seven\n200\twhat is three\n300\tnever judged\n")
    (tmp_path / "qrels.txt").write_text("100 Q0 7 3\n100 Q0 5 0\n200 Q0 3 2\n200 Q0 8 0\n200 Q0 9 1\n")
    assert main(["--collection", str(tmp_path / "collection.tsv"), "--topics", str(tmp_path / "topics.tsv.gz"),
                 "--qrels", str(tmp_path / "qrels.txt"), "--out", str(tmp_path / "out"), "--others", "3"]) == 0
    corpus, queries, qrels = _beir(tmp_path / "out")
    # relevant 7, 3, 9; then the judged non-relevant 5, 8; then the collection's first passage, 0
    assert [d["_id"] for d in corpus] == ["0", "3", "5", "7", "8", "9"]
    assert corpus[3] == {"_id": "7", "title": "", "text": "passage number 7"}
    assert queries == [{"_id": "100", "text": "what is seven"}, {"_id": "200", "text": "what is three"}]
    assert qrels[1:] == [["100", "7", "3"], ["100", "5", "0"], ["200", "3", "2"], ["200", "8", "0"],
                         ["200", "9", "1"]]


@pytest.mark.parametrize("others, out, expected", [
    ("-5", "out", "--others -5: expected a count of passages >= 0"),
    ("3", "taken", "--out {tmp}/taken: is a file, not a folder"),
    ("3", "taken/sub", "--out {tmp}/taken/sub: {tmp}/taken is a file, so no folder can be made under it"),
])
def test_the_dl19_subset_refuses_a_bad_option_before_reading_the_collection(others, out, expected, tmp_path,
                                                                             capsys):
    """A negative count would drop the judged non-relevant passages unsaid; a file where the folder goes
    would stop the build after the collection was read."""
    from qac.cli.dl19_subset_command import main
    from qac.console import call_main

    (tmp_path / "taken").write_text("a file\n")
    arguments = ["--collection", str(tmp_path / "absent.tsv"), "--topics", str(tmp_path / "absent.tsv"),
                 "--qrels", str(tmp_path / "absent.txt"), "--out", str(tmp_path / out), "--others", others]
    assert call_main(main, arguments, prog="dl19") == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("dl19: error: " + expected.format(tmp=tmp_path)), lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["taken"]


def _dl19_inputs(folder: Path, collection: str, qrels: str) -> list[str]:
    (folder / "collection.tsv").write_text(collection)
    with gzip.open(folder / "topics.tsv.gz", "wt") as topics:
        topics.write("100\twhat is seven\n200\twhat is three\n")
    (folder / "qrels.txt").write_text(qrels)
    return ["--collection", str(folder / "collection.tsv"), "--topics", str(folder / "topics.tsv.gz"),
            "--qrels", str(folder / "qrels.txt"), "--out", str(folder / "out")]


def test_the_dl19_subset_refuses_a_passage_id_written_twice(tmp_path):
    from qac.data.dl19_subset import build_dl19_subset

    _dl19_inputs(tmp_path, "7\tseven\n3\tthree\n7\tseven again\n", "100 Q0 7 3\n200 Q0 3 2\n")
    with pytest.raises(DataFormatError) as caught:
        build_dl19_subset(tmp_path / "collection.tsv", tmp_path / "topics.tsv.gz", tmp_path / "qrels.txt",
                          tmp_path / "out", 1)
    assert str(caught.value).startswith(f"{tmp_path / 'collection.tsv'}:3: field 'pid': duplicate id '7'"), \
        str(caught.value)
    assert not (tmp_path / "out").exists()


def test_the_dl19_subset_replaces_its_folder_whole(tmp_path):
    from qac.cli.dl19_subset_command import main

    arguments = _dl19_inputs(tmp_path, "".join(f"{pid}\tpassage {pid}\n" for pid in range(10)),
                             "100 Q0 7 3\n200 Q0 3 2\n")
    (tmp_path / "out" / "qrels").mkdir(parents=True)
    (tmp_path / "out" / "stale.jsonl").write_text("from an earlier build\n")
    (tmp_path / "out" / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n")
    assert main([*arguments, "--others", "1"]) == 0
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")) == \
        ["corpus.jsonl", "qrels", "qrels/test.tsv", "queries.jsonl"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]       # no staging entry left


def test_the_dl19_subset_fills_its_count_where_judged_passages_are_missing_from_the_collection(tmp_path, capsys):
    """Passage 50, judged non-relevant, is not in this collection: the collection's next passages take its
    place; a collection too small for the count asked is said in a note."""
    from qac.cli.dl19_subset_command import main

    arguments = _dl19_inputs(tmp_path, "".join(f"{pid}\tpassage {pid}\n" for pid in range(10)),
                             "100 Q0 7 3\n100 Q0 50 0\n200 Q0 3 2\n200 Q0 8 0\n")
    assert main([*arguments, "--others", "3"]) == 0
    corpus, _, qrels = _beir(tmp_path / "out")
    # relevant 7 and 3, judged 8, then the collection's first passages for the missing 50: 0 and 1
    assert [d["_id"] for d in corpus] == ["0", "1", "3", "7", "8"]
    assert qrels[1:] == [["100", "7", "3"], ["200", "3", "2"], ["200", "8", "0"]]
    assert capsys.readouterr().err == ""

    assert main([*arguments, "--others", "100"]) == 0
    assert len(_beir(tmp_path / "out")[0]) == 10
    assert capsys.readouterr().err == ("note: 8 passages beyond the relevant ones, not the 100 asked (--others): "
                                       "the collection has no more\n")


@pytest.mark.parametrize("make, reason", [
    (lambda mirror: (mirror / "tiny").write_text("a file\n"), "tiny is a file, not a folder"),
    (lambda mirror: (mirror / "tiny" / "corpus.jsonl").mkdir(), "corpus.jsonl is a folder, not a file"),
    (lambda mirror: (mirror / "tiny" / "corpus.jsonl").symlink_to(mirror / "nowhere.jsonl"),
     "corpus.jsonl is a symbolic link that leads nowhere"),
])
def test_what_stands_in_a_mirror_instead_of_a_dataset_file_is_said(tmp_path, make, reason):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    if "tiny is a file" not in reason:          # the dataset's folder, complete but for corpus.jsonl
        _write(mirror / "tiny", {"queries.jsonl": '{"_id": "q1", "text": "q"}\n'})
        (mirror / "tiny" / "qrels").mkdir()
        (mirror / "tiny" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    make(mirror)
    spec = DatasetSpec.from_params("tiny", DatasetEntry(format="beir", mirror="tiny", splits=["test"]))
    with pytest.raises(DatasetUnavailableError) as caught:
        locate_dataset(spec, mirror, tmp_path / "downloads")
    message = str(caught.value)
    assert f"{mirror / 'tiny'} ({reason}" in message and "\n" not in message, message


@pytest.mark.parametrize("value, expected", [
    ("", "QAC_DATA_MIRROR is set but empty: unset it to use the default mirror"),
    ("{file}", "QAC_DATA_MIRROR={file}: not a folder"),
])
def test_a_data_mirror_variable_that_names_no_folder_is_refused(tmp_path, monkeypatch, value, expected):
    from qac.config import data_mirror
    from qac.errors import UserError

    file = tmp_path / "mirror.txt"
    file.write_text("not a mirror\n")
    monkeypatch.setenv("QAC_DATA_MIRROR", value.format(file=file))
    with pytest.raises(UserError) as caught:
        data_mirror()
    assert str(caught.value).startswith(expected.format(file=file)), str(caught.value)
    monkeypatch.setenv("QAC_DATA_MIRROR", str(tmp_path))
    assert data_mirror() == tmp_path


# --- when the data cannot be had ----------------------------------------------

def test_the_unavailable_error_is_one_paragraph_naming_mirror_variable_and_url(tmp_path):
    spec = DatasetSpec.from_params("cranfield", DatasetEntry(format="beir", mirror="cranfield", url=UNREACHABLE,
                                                             splits=["test"]))
    with pytest.raises(DatasetUnavailableError) as caught:
        locate_dataset(spec, tmp_path / "mirror", tmp_path / "downloads")
    message = str(caught.value)
    assert "\n" not in message
    assert str(tmp_path / "mirror" / "cranfield") in message
    assert "QAC_DATA_MIRROR" in message and UNREACHABLE in message
    without_url = DatasetSpec.from_params("dl19", DatasetEntry(format="beir", mirror="dl19", splits=["test"]))
    with pytest.raises(DatasetUnavailableError, match=r"no public URL.*QAC_DATA_MIRROR.*docs/data.md"):
        locate_dataset(without_url, tmp_path / "mirror", tmp_path / "downloads")


def test_the_prepare_stage_prints_the_paragraph_without_a_traceback(tmp_path):
    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["datasets"]["elsewhere"] = {"format": "beir", "mirror": "elsewhere", "url": UNREACHABLE,
                                       "splits": ["test"]}
    write_params(params, tmp_path / "params.yaml")
    env = {**os.environ, "QAC_PARAMS": str(tmp_path / "params.yaml"), "QAC_DATA_MIRROR": str(tmp_path / "mirror"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "pipelines" / "prepare.py"), "--dataset", "elsewhere"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2     # a user error
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(tmp_path / "mirror" / "elsewhere") in lines[0] and "QAC_DATA_MIRROR" in lines[0]
    assert UNREACHABLE in lines[0]


def test_every_default_profile_dataset_has_a_public_source_or_a_documented_build():
    docs = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
    for name, entry in render_profile("default")["datasets"].items():
        if entry.get("url"):
            assert entry["url"].startswith(("https://", "http://")), name
        else:
            assert f"`{name}`" in docs and "qac.cli.dl19_subset_command" in docs, name
    assert render_profile("default")["datasets"]["cranfield"]["convert"] == "cranfield"
