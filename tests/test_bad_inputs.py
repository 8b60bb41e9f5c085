"""Bad input files, through `prepare`'s readers and `qac eval`: a clear error naming the file, or the right result.

Every reader decodes through qac.data.textfile, so a byte order mark, a broken
``.gz``, an id a TREC file cannot hold or an empty file behave the same
everywhere. The first part reproduces what an independent stress test found;
the second holds inputs of other kinds, to check that the promise is general.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from qac.cli import main as qac_main
from qac.data.beir import read_corpus_jsonl, read_qrels_tsv, read_queries_jsonl
from qac.data.errors import DataFormatError
from qac.data.msmarco import read_msmarco_documents, read_passage_collection
from qac.data.prepared import prepare_dataset
from qac.data.sources import DatasetSpec, Source, read_dataset
from qac.params.sections import DatasetEntry
from qac.data.trec import read_topics, read_trec_qrels
from qac.evaluation.trec_io import read_qrels, read_run, write_run

BOM = "\ufeff".encode("utf-8")
HEADER = "query-id\tcorpus-id\tscore\n"
# Perfect ranking: every judged document first, in grade order.
RUN = "q1 Q0 d1 1 3.0 x\nq1 Q0 d2 2 2.0 x\nq1 Q0 d3 3 1.0 x\nq2 Q0 d4 1 1.0 x\n"
TREC_QRELS = "q1 0 d1 2\nq1 0 d2 1\nq2 0 d4 1\n"


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def fails_naming(reader, path: Path, message: str, line: int | None = None) -> DataFormatError:
    with pytest.raises(DataFormatError) as caught:
        reader(path)
    assert caught.value.path == str(path)
    assert caught.value.line == line
    assert message in str(caught.value)
    return caught.value


def qac_eval(capsys, qrels: Path, run: Path, *extra: str) -> tuple[int, dict | None, str]:
    code = qac_main(["eval", "--qrels", str(qrels), "--run", str(run), "--metrics", "nDCG@10", *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


# --- reproductions --------------------------------------------------------------

@pytest.mark.parametrize("reader, name, content, what", [
    (read_corpus_jsonl, "corpus.jsonl", "", "no documents"),
    (read_queries_jsonl, "queries.jsonl", "\n\n", "no queries"),
    (read_qrels_tsv, "qrels/test.tsv", "", "no judgements"),
    (read_qrels_tsv, "qrels/test.tsv", HEADER, "no judgements"),
    (read_topics, "queries.dev.tsv", "", "no topics"),
    (read_trec_qrels, "qrels.dev.tsv", "", "no judgements"),
    (read_passage_collection, "collection.tsv", "", "no passages"),
    (read_msmarco_documents, "msmarco-docs.tsv", "", "no documents"),
    (read_run, "run.trec", "", "no results"),
])
def test_an_empty_file_is_an_error_naming_it(tmp_path, reader, name, content, what):
    fails_naming(reader, write(tmp_path / name, content), what)


def test_a_split_left_with_no_query_is_an_error_naming_its_qrels(tmp_path):
    folder = tmp_path / "tiny"
    write(folder / "corpus.jsonl", json.dumps({"_id": "d1", "text": "a document"}) + "\n")
    write(folder / "queries.jsonl", json.dumps({"_id": "q1", "text": "a query"}) + "\n")
    write(folder / "qrels" / "test.tsv", HEADER + "q1\td1\t1\n")
    write(folder / "qrels" / "dev.tsv", HEADER + "q9\td1\t1\n")        # a query the queries file lacks
    spec = DatasetSpec.from_params("tiny", DatasetEntry(format="beir", splits=["test", "dev"]))
    dataset = read_dataset(spec, Source("mirror", folder, "mirror:tiny"))
    with pytest.raises(DataFormatError) as caught:
        prepare_dataset(dataset)
    assert caught.value.path == str(folder / "qrels" / "dev.tsv")
    # Every judged query of the split names an id the queries file lacks: said with the split and an example.
    assert "1 of the 1 queries judged in split 'dev'" in str(caught.value) and "(for example q9)" in str(caught.value)


def test_eval_scores_files_with_a_byte_order_mark_correctly(tmp_path, capsys):
    plain_qrels, plain_run = write(tmp_path / "qrels.txt", TREC_QRELS), write(tmp_path / "run.trec", RUN)
    code, plain, _ = qac_eval(capsys, plain_qrels, plain_run)
    assert code == 0 and plain == {"nDCG@10": pytest.approx(1.0)}
    bom_qrels = write(tmp_path / "bom-qrels.txt", BOM + TREC_QRELS.encode())
    bom_run = write(tmp_path / "bom-run.trec", BOM + RUN.encode())
    assert qac_eval(capsys, plain_qrels, bom_run)[1] == plain
    assert qac_eval(capsys, bom_qrels, plain_run)[1] == plain
    assert qac_eval(capsys, bom_qrels, bom_run)[1] == plain


def test_beir_qrels_with_a_byte_order_mark_are_read_as_beir(tmp_path, capsys):
    beir = write(tmp_path / "test.tsv", BOM + (HEADER + "q1\td1\t2\nq1\td2\t1\nq2\td4\t1\n").encode())
    assert read_qrels(beir) == {"q1": {"d1": 2, "d2": 1}, "q2": {"d4": 1}}
    code, result, _ = qac_eval(capsys, beir, write(tmp_path / "run.trec", RUN))
    assert code == 0 and result == {"nDCG@10": pytest.approx(1.0)}


@pytest.mark.parametrize("which", ["run", "qrels"])
def test_eval_names_the_file_and_line_of_an_undecodable_byte(tmp_path, capsys, which):
    files = {"qrels": write(tmp_path / "qrels.txt", TREC_QRELS), "run": write(tmp_path / "run.trec", RUN)}
    write(files[which], files[which].read_bytes() + b"q2 0 caf\xe9 1\n" if which == "qrels"
          else files[which].read_bytes() + b"q2 Q0 caf\xe9 2 0.5 x\n")
    code, _, err = qac_eval(capsys, files["qrels"], files["run"])
    line = len(files[which].read_bytes().splitlines())
    assert code == 2
    assert f"{files[which]}:{line}: not valid UTF-8 (byte 0xe9" in err


@pytest.mark.parametrize("eval_reader", [read_run, read_qrels])
def test_eval_rejects_empty_and_header_only_files(tmp_path, capsys, eval_reader):
    fails_naming(eval_reader, write(tmp_path / "empty", b""), "the file is empty")
    if eval_reader is read_qrels:
        fails_naming(eval_reader, write(tmp_path / "header.tsv", HEADER), "no judgements")
    code, _, err = qac_eval(capsys, tmp_path / "empty", write(tmp_path / "run.trec", RUN))
    assert code == 2 and str(tmp_path / "empty") in err


def test_an_id_with_a_space_is_rejected_with_file_line_and_field(tmp_path):
    corpus = write(tmp_path / "corpus.jsonl",
                   json.dumps({"_id": "d1", "text": "x"}) + "\n" + json.dumps({"_id": "d 2", "text": "y"}) + "\n")
    error = fails_naming(read_corpus_jsonl, corpus, "id 'd 2' contains whitespace", line=2)
    assert error.field == "_id"
    queries = write(tmp_path / "queries.jsonl", json.dumps({"_id": "q\t1", "text": "y"}) + "\n")
    assert fails_naming(read_queries_jsonl, queries, "contains whitespace", line=1).field == "_id"
    qrels = write(tmp_path / "qrels.tsv", HEADER + "q1\td 1\t1\n")
    assert fails_naming(read_qrels_tsv, qrels, "contains whitespace", line=2).field == "corpus-id"
    topics = write(tmp_path / "topics.tsv", "q 1\ta topic\n")
    assert fails_naming(read_topics, topics, "contains whitespace", line=1).field == "qid"


def test_a_run_is_not_written_with_an_id_trec_files_cannot_hold(tmp_path):
    with pytest.raises(DataFormatError, match="docid.*'d 1' contains whitespace"):
        write_run(tmp_path / "run.trec", {"q1": {"d 1": 1.0}})
    assert list(tmp_path.iterdir()) == []


def test_broken_gzip_inputs_name_the_file_and_line(tmp_path):
    rows = "".join(f"{i}\tpassage number {i}\n" for i in range(2000)).encode()
    whole = gzip.compress(rows)
    truncated = write(tmp_path / "collection.tsv.gz", whole[: len(whole) // 2])
    error = fails_naming(read_passage_collection, truncated, "truncated or corrupt gzip data after line",
                         line=_line_of(truncated))
    assert error.line > 1
    not_gzip = write(tmp_path / "queries.dev.tsv.gz", "1\tplain text named .gz\n")
    fails_naming(read_topics, not_gzip, "not a gzip file", line=1)


def _line_of(path: Path) -> int:
    """The line at which reading ``path`` stops: one after the last complete line before the damage."""
    lines = 0
    try:
        with gzip.open(path, "rb") as handle:
            for _ in handle:
                lines += 1
    except (EOFError, gzip.BadGzipFile):
        pass
    return lines + 1


def test_a_lone_surrogate_in_json_text_is_an_error_naming_the_line(tmp_path):
    path = write(tmp_path / "queries.jsonl",
                 '{"_id": "q1", "text": "emoji \\ud83d\\ude00 is a valid pair"}\n'
                 '{"_id": "q2", "text": "half \\ud83d of one"}\n')
    fails_naming(read_queries_jsonl, path, "lone surrogate \\ud83d", line=2)


# --- other bad inputs, not in the stress test ----------------------------------

def test_a_utf16_file_is_named_as_such(tmp_path):
    path = write(tmp_path / "queries.jsonl", json.dumps({"_id": "q1", "text": "x"}).encode("utf-16"))
    fails_naming(read_queries_jsonl, path, "the file is UTF-16", line=1)


def test_a_gzip_file_without_the_gz_suffix_is_named_as_such(tmp_path):
    path = write(tmp_path / "collection.tsv", gzip.compress(b"1\tsome passage\n"))
    fails_naming(read_passage_collection, path, "the file is gzip-compressed", line=1)


def test_a_byte_order_mark_in_the_middle_of_a_concatenated_file(tmp_path):
    first, second = "q1 0 d1 1\n".encode(), BOM + "q2 0 d2 1\n".encode()
    path = write(tmp_path / "qrels.txt", first + second)
    error = fails_naming(read_trec_qrels, path, "invisible character ZERO WIDTH NO-BREAK SPACE", line=2)
    assert error.field == "qid"


def test_a_no_break_space_inside_an_id(tmp_path):
    path = write(tmp_path / "corpus.jsonl", json.dumps({"_id": "d\u00a01", "text": "x"}) + "\n")
    fails_naming(read_corpus_jsonl, path, "contains the whitespace NO-BREAK SPACE (U+00A0)", line=1)


def test_a_control_character_inside_an_id(tmp_path):
    path = write(tmp_path / "collection.tsv", "p\x071\tbell in the id\n")
    fails_naming(read_passage_collection, path, "invisible character", line=1)


def test_a_json_null_id_and_a_float_id(tmp_path):
    fails_naming(read_corpus_jsonl, write(tmp_path / "a.jsonl", '{"_id": null, "text": "x"}\n'),
                 "null, expected a string id", line=1)
    fails_naming(read_corpus_jsonl, write(tmp_path / "b.jsonl", '{"_id": 1.5, "text": "x"}\n'),
                 "expected a string id, found float", line=1)


def test_a_run_with_a_nan_or_missing_score(tmp_path):
    fails_naming(read_run, write(tmp_path / "a.trec", "q1 Q0 d1 1 nan x\n"), "is NaN", line=1)
    fails_naming(read_run, write(tmp_path / "b.trec", "q1 Q0 d1 1 x\n"), "expected 6 whitespace-separated", line=1)


def test_crlf_line_endings_and_trailing_blank_lines_are_read_as_usual(tmp_path, capsys):
    qrels = write(tmp_path / "qrels.txt", TREC_QRELS.replace("\n", "\r\n") + "\r\n\r\n")
    run = write(tmp_path / "run.trec", RUN.replace("\n", "\r\n"))
    code, result, _ = qac_eval(capsys, qrels, run)
    assert code == 0 and result == {"nDCG@10": pytest.approx(1.0)}


def test_an_empty_gzip_file_is_an_empty_file(tmp_path):
    fails_naming(read_passage_collection, write(tmp_path / "collection.tsv.gz", gzip.compress(b"")),
                 "no passages: the file is empty")


def test_a_tsv_corpus_whose_rows_are_all_blank_text(tmp_path):
    path = write(tmp_path / "collection.tsv", "1\t \n2\t\n")
    fails_naming(read_passage_collection, path, "no passages: all 2 were skipped as unusable")


def test_a_beir_qrels_header_in_another_order(tmp_path):
    path = write(tmp_path / "test.tsv", "corpus-id\tquery-id\tscore\nd1\tq1\t1\n")
    fails_naming(read_qrels_tsv, path, "expected the header", line=1)


# --- numbers, comments, separators and paths as trec_eval reads them ------------------------------

@pytest.mark.parametrize("grade", ["1_0", "\u0661", "\uff11", "1.0", "one"])
def test_a_grade_trec_eval_would_not_read_as_written_is_refused(tmp_path, grade):
    """Python's int() reads '1_0' as 10 and Arabic-Indic or full-width digits as numbers; trec_eval's atol reads
    '1_0' as 1 and the others as 0. Neither is what the file says: the line is refused, naming the field."""
    path = write(tmp_path / "qrels.txt", f"q1 0 d1 1\nq1 0 d2 {grade}\n")
    error = fails_naming(read_trec_qrels, path, f"expected an integer, found {grade!r}", line=2)
    assert error.field == "rel"
    beir = write(tmp_path / "qrels" / "test.tsv", f"{HEADER}q1\td1\t{grade}\n")
    assert fails_naming(read_qrels_tsv, beir, "expected an integer", line=2).field == "score"


@pytest.mark.parametrize("score", ["1_0", "\u0661.5", "3,5"])
def test_a_score_python_float_would_take_but_trec_eval_not_is_refused(tmp_path, score):
    path = write(tmp_path / "run.trec", f"q1 Q0 d1 1 {score} x\n")
    assert fails_naming(read_run, path, f"must be a number, got {score!r}", line=1).field == "score"


def test_a_float_rank_is_read_since_ranks_are_ignored(tmp_path, capsys):
    path = write(tmp_path / "run.trec", "q1 Q0 d1 1.0 3.0 x\nq1 Q0 d2 2.0 2.0 x\nq1 Q0 d3 3e0 1.0 x\n")
    assert read_run(path) == {"q1": {"d1": 3.0, "d2": 2.0, "d3": 1.0}}
    # A word in the rank column still means a shifted column.
    shifted = write(tmp_path / "shifted.trec", "q1 Q0 d1 first 3.0 x\n")
    assert fails_naming(read_run, shifted, "must be a number, got 'first'", line=1).field == "rank"


def test_comment_lines_and_extra_run_fields_are_read_as_trec_eval_reads_them(tmp_path, capsys):
    qrels = write(tmp_path / "qrels.txt", "# judged by two assessors\n" + TREC_QRELS + "#q9 0 d9 1\n")
    run = write(tmp_path / "run.trec", "# produced by bm25\n  # indented comment\n"
                + "".join(line + " extra trailing fields\n" for line in RUN.splitlines()))
    assert read_qrels(qrels) == {"q1": {"d1": 2, "d2": 1}, "q2": {"d4": 1}}
    assert read_run(run) == read_run(write(tmp_path / "plain.trec", RUN))
    code, result, _ = qac_eval(capsys, qrels, run)
    assert code == 0 and result["nDCG@10"] == pytest.approx(1.0)


def test_an_extra_qrels_field_is_refused_saying_trec_eval_refuses_it_too(tmp_path):
    path = write(tmp_path / "qrels.txt", "q1 0 d1 1 extra\n")
    fails_naming(read_trec_qrels, path, "found 5 (trec_eval refuses extra fields here too)", line=1)


def test_a_folder_given_as_a_file_is_named_as_a_folder(tmp_path, capsys):
    folder = tmp_path / "qrels"
    folder.mkdir()
    for reader in (read_qrels, read_run, read_trec_qrels, read_qrels_tsv):
        fails_naming(reader, folder, "is a folder, not a file")
    fails_naming(read_run, tmp_path / "absent.trec", "file not found")
    code, _, err = qac_eval(capsys, folder, write(tmp_path / "run.trec", RUN))
    assert code == 2 and "is a folder, not a file" in err and "Traceback" not in err


def test_space_separated_beir_qrels_are_recognised(tmp_path, capsys):
    spaced = write(tmp_path / "qrels" / "test.tsv", "query-id corpus-id score\nq1 d1 2\nq1  d2 1\nq2 d4 1\n")
    expected = {"q1": {"d1": 2, "d2": 1}, "q2": {"d4": 1}}
    assert read_qrels_tsv(spaced) == expected and read_qrels(spaced) == expected
    code, result, _ = qac_eval(capsys, spaced, write(tmp_path / "run.trec", RUN))
    assert code == 0 and result["nDCG@10"] == pytest.approx(1.0)
    # A tab-separated header with a space-separated row is named for what it is.
    mixed = write(tmp_path / "mixed" / "test.tsv", HEADER + "q1 d1 1\n")
    fails_naming(read_qrels_tsv, mixed, "the line is separated by spaces: this file must be tab-separated", line=2)


def test_a_no_break_space_inside_a_run_or_qrels_id_is_named(tmp_path):
    """str.split() splits on a no-break space, which gave '7 fields, expected 6'; trec_eval keeps it in the id."""
    run = write(tmp_path / "run.trec", "q1 Q0 d1 1 3.0 x\nq1 Q0 d\u00a02 2 2.0 x\n")
    error = fails_naming(read_run, run, "contains the whitespace NO-BREAK SPACE (U+00A0)", line=2)
    assert error.field == "docid"
    qrels = write(tmp_path / "qrels.txt", "q\u00a01 0 d1 1\n")
    assert fails_naming(read_trec_qrels, qrels, "NO-BREAK SPACE", line=1).field == "qid"
