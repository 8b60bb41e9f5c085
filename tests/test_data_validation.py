"""Bad input gives a DataFormatError naming the file, the line and the field."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from qac.data.beir import read_corpus_jsonl, read_qrels_tsv, read_queries_jsonl
from qac.data.dataset import Dataset, Document, drop_unknown_judgements
from qac.data.errors import DataFormatError
from qac.data.prepared import prepare_dataset
from qac.data.msmarco import read_msmarco_documents, read_passage_collection
from qac.data.trec import read_topics, read_trec_qrels


def write(tmp_path, name, content: str | bytes):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def raises_at(reader, path, line, field, message):
    with pytest.raises(DataFormatError) as caught:
        reader(path)
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), line, field)
    assert str(error).startswith(f"{path}:{line}: " if line else f"{path}: ")
    if field:
        assert f"field '{field}'" in str(error)
    assert message in str(error)
    return error


GOOD_DOC = json.dumps({"_id": "d1", "title": "t", "text": "x"})


@pytest.mark.parametrize("line, field, message", [
    ('{"_id": "d2", "text": "unterminated', None, "malformed JSON"),
    ('["a", "list"]', None, "expected a JSON object"),
    ('{"title": "no id", "text": "x"}', "_id", "missing"),
    ('{"_id": "d2", "title": "no text"}', "text", "missing"),
    ('{"_id": "", "text": "x"}', "_id", "empty id"),
    ('{"_id": ["d2"], "text": "x"}', "_id", "expected a string id"),
    ('{"_id": "d2", "text": 7}', "text", "expected text"),
    ('{"_id": "d1", "text": "again"}', "_id", "duplicate id 'd1' (first on line 1)"),
    # null is a value written, not a field left out: said as such
    ('{"_id": "d2", "title": "t", "text": null}', "text", "null, expected text"),
    ('{"_id": null, "text": "x"}', "_id", "null, expected a string id"),
])
def test_corpus_jsonl_errors(tmp_path, line, field, message):
    path = write(tmp_path, "corpus.jsonl", f"{GOOD_DOC}\n\n{line}\n")
    raises_at(read_corpus_jsonl, path, 3, field, message)


def test_undecodable_bytes_name_the_line(tmp_path):
    path = write(tmp_path, "corpus.jsonl", GOOD_DOC.encode() + b"\n" + b'{"_id": "d2", "text": "caf\xe9"}\n')
    raises_at(read_corpus_jsonl, path, 2, None, "not valid UTF-8 (byte 0xe9 at column 27)")
    tsv = write(tmp_path, "collection.tsv", b"1\tok\n2\tbad \xff byte\n")
    raises_at(read_passage_collection, tsv, 2, None, "not valid UTF-8")


def test_empty_documents_are_skipped_and_counted(tmp_path):
    path = write(tmp_path, "corpus.jsonl", "\n".join([
        GOOD_DOC, json.dumps({"_id": "e1", "title": "", "text": ""}), json.dumps({"_id": "e2", "text": " \t "}),
        json.dumps({"_id": "short", "text": "ab"})]) + "\n")
    skipped = Counter()
    assert list(read_corpus_jsonl(path, skipped=skipped)) == ["d1", "short"]
    assert skipped == Counter({"corpus_empty_text": 2})
    # full texts: "t x" (3 characters) and "ab" (2)
    assert list(read_corpus_jsonl(path, min_text_chars=3)) == ["d1"]
    # nothing left is an error, not an empty corpus that fails stages later
    raises_at(lambda p: read_corpus_jsonl(p, min_text_chars=4), path, None, None,
              "no documents: all 4 were skipped as unusable")


def test_an_empty_query_is_an_error(tmp_path):
    path = write(tmp_path, "queries.jsonl", '{"_id": "q1", "text": "fine"}\n{"_id": "q2", "text": "  "}\n')
    raises_at(read_queries_jsonl, path, 2, "text", "empty query")
    topics = write(tmp_path, "topics.tsv", "1\tfine\n2\t \n")
    raises_at(read_topics, topics, 2, "text", "empty query")


def test_duplicate_query_ids(tmp_path):
    path = write(tmp_path, "queries.jsonl", '{"_id": "q1", "text": "a"}\n{"_id": "q1", "text": "b"}\n')
    raises_at(read_queries_jsonl, path, 2, "_id", "duplicate id 'q1' (first on line 1)")
    topics = write(tmp_path, "topics.tsv", "7\ta\n7\tb\n")
    raises_at(read_topics, topics, 2, "qid", "duplicate id '7'")


@pytest.mark.parametrize("rows, line, field, message", [
    (["q1\td1\t1"], 1, None, "expected the header 'query-id corpus-id score'"),
    (["query-id\tcorpus-id\tscore", "q1\td1"], 2, None, "expected 3 tab-separated fields (query-id, corpus-id, score), found 2"),
    (["query-id\tcorpus-id\tscore", "q1\td1\thigh"], 2, "score", "expected an integer, found 'high'"),
    (["query-id\tcorpus-id\tscore", "q1\td1\t1", "q1\td1\t2"], 3, "score", "judged 1 on line 2 and 2 here"),
    (["query-id\tcorpus-id\tscore", "\td1\t1"], 2, "query-id", "empty id"),
])
def test_beir_qrels_errors(tmp_path, rows, line, field, message):
    path = write(tmp_path, "test.tsv", "\n".join(rows) + "\n")
    raises_at(read_qrels_tsv, path, line, field, message)


def test_trec_qrels_errors(tmp_path):
    raises_at(read_trec_qrels, write(tmp_path, "a.txt", "1 Q0 d1 1\n1 Q0 d2\n"), 2, None,
              "expected 4 whitespace-separated fields (qid, iter, docid, rel), found 3")
    raises_at(read_trec_qrels, write(tmp_path, "b.txt", "1 Q0 d1 x\n"), 1, "rel", "expected an integer")


def test_msmarco_document_errors(tmp_path):
    raises_at(read_msmarco_documents, write(tmp_path, "docs.tsv", "D1\turl\ttitle\tbody\nD2\turl\tbody only\n"),
              2, None, "expected 4 tab-separated fields (docid, url, title, body), found 3")
    raises_at(read_msmarco_documents, write(tmp_path, "dup.tsv", "D1\tu\tt\tb\nD1\tu\tt\tb\n"),
              2, "docid", "duplicate id 'D1'")
    raises_at(read_passage_collection, write(tmp_path, "c.tsv", "\ttext\n"), 1, "pid", "empty id")


def test_a_missing_file_is_named(tmp_path):
    raises_at(read_corpus_jsonl, tmp_path / "nowhere.jsonl", None, None, "file not found")


def test_judgements_of_unknown_ids_are_dropped_and_counted():
    dataset = Dataset(
        "x", {"d1": Document("d1", "", "a"), "d2": Document("d2", "", "b")}, {"q1": "one", "q2": "two"},
        {"test": {"q1": {"d1": 1, "gone": 1}, "q2": {"gone": 1, "also-gone": 2}, "q9": {"d1": 1, "d2": 0}}})
    skipped = Counter({"corpus_empty_text": 4})
    counts = drop_unknown_judgements(dataset, skipped)
    assert counts == Counter({"qrels_unknown_document": 3, "qrels_unknown_query": 2})
    assert dataset.qrels == {"test": {"q1": {"d1": 1}}}  # q2 has nothing left, q9 is unknown
    assert skipped == Counter({"corpus_empty_text": 4, "qrels_unknown_document": 3, "qrels_unknown_query": 2})


def test_errors_survive_pickling():
    import pickle

    error = pickle.loads(pickle.dumps(DataFormatError("f.jsonl", 3, "_id", "missing")))
    assert (error.path, error.line, error.field, str(error)) == ("f.jsonl", 3, "_id", "f.jsonl:3: field '_id': missing")


def test_malformed_json_with_a_control_character_reads_as_one_sentence(tmp_path):
    """json says "Invalid control character at" for its own "line L column C": the column is said once."""
    path = write(tmp_path, "corpus.jsonl", GOOD_DOC + '\n{"_id": "d2", "text": "a\tb"}\n')
    error = raises_at(read_corpus_jsonl, path, 2, None, "malformed JSON (Invalid control character at column ")
    assert "at at" not in str(error)


def _judged(qrels: dict, rel_threshold: int = 1) -> Dataset:
    corpus = {doc_id: Document(doc_id, "", f"text of {doc_id}") for doc_id in ("d1", "d2", "d3", "d4")}
    queries = {qid: f"query {qid}" for qid in ("q1", "q2", "q3", "q4")}
    return Dataset("tiny", corpus, queries, {"test": qrels},
                   meta={"rel_threshold": {"test": rel_threshold}, "qrels_files": {"test": "qrels/test.tsv"}})


def test_qrels_that_mostly_name_unknown_ids_are_refused():
    """Three of four judged queries lose every judgement to ids the corpus and queries file lack: the files
    do not belong together, and evaluating the one left would look like a result."""
    dataset = _judged({"q1": {"d1": 1}, "q2": {"x2": 1}, "q3": {"x3": 1}, "q9": {"d2": 1}})
    with pytest.raises(DataFormatError) as caught:
        prepare_dataset(dataset)
    message = str(caught.value)
    assert message.startswith("qrels/test.tsv: 3 of the 4 queries judged in split 'test' name a query or only "
                              "documents that the queries and corpus files do not have (for example q2, q3, q9)"), \
        message


def test_a_judged_document_missing_from_the_corpus_is_dropped_as_in_cranfield():
    dataset = prepare_dataset(_judged({"q1": {"d1": 1, "gone": 1}, "q2": {"d2": 2}, "q3": {"d3": 1}}))
    assert dataset.qrels["test"] == {"q1": {"d1": 1}, "q2": {"d2": 2}, "q3": {"d3": 1}}
    assert dataset.meta["skipped"]["qrels_unknown_document"] == 1


def test_a_split_that_judges_nothing_relevant_is_refused():
    """Grades all below the split's threshold (a threshold of 2 on 0/1 grades): every binary measure would be 0."""
    dataset = _judged({"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 1}}, rel_threshold=2)
    with pytest.raises(DataFormatError, match=r"^qrels/test.tsv: split 'test' judges no document relevant: no grade "
                                              r"reaches its relevance threshold 2"):
        prepare_dataset(dataset)
    assert prepare_dataset(_judged({"q1": {"d1": 2, "d2": 0}, "q2": {"d3": 1}}, rel_threshold=2)).qrels["test"]
