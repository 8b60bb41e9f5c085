"""Table 5 annotation study: sampling, sheets for people, majority vote and agreement, the automatic judge."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from qac.data.errors import DataFormatError
from qac.evaluation import annotation
from stages import load_stage

# Documents: d1 three passages; d2 one passage (no passage-passage pair possible);
# d3 two passages, only the second has queries; d4 two passages without queries; d5 two passages.
PASSAGES = [
    ("d1#0", "d1", 0, "the heart pumps blood through the body"),
    ("d1#1", "d1", 1, "arteries carry blood away from the heart"),
    ("d1#2", "d1", 2, "veins return blood to the heart"),
    ("d2#0", "d2", 0, "a single passage document about volcanoes"),
    ("d3#0", "d3", 0, "photosynthesis converts light into chemical energy"),
    ("d3#1", "d3", 1, "chlorophyll absorbs red and blue light"),
    ("d4#0", "d4", 0, "the roman empire had many provinces"),
    ("d4#1", "d4", 1, "latin was the language of the empire"),
    ("d5#0", "d5", 0, "glaciers shape valleys over millennia"),
    ("d5#1", "d5", 1, "ice ages come and go in cycles"),
]
QUERIES = {
    "d1#0": ["what does the heart pump", "heart function"],
    "d1#1": ["what do arteries carry"],
    "d1#2": ["", "where do veins go"],
    "d2#0": ["what is a volcano"],
    "d3#0": [],
    "d3#1": ["what does chlorophyll absorb"],
    "d4#0": [""],
    "d4#1": [],
    "d5#0": ["how do glaciers shape valleys"],
    "d5#1": ["what are ice ages"],
}


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.fixture()
def study_inputs(tmp_path):
    from qac.data.arrowstore import write_passages, write_queries

    passages, queries = tmp_path / "passages.arrow", tmp_path / "queries.arrow"
    write_passages(passages, [
        {"pid": pid, "doc_id": doc, "position": pos, "text": text, "n_tokens": len(text.split()),
         "contexts": {"nearby": [], "random_sampled": [], "overlap": ""}} for pid, doc, pos, text in PASSAGES])
    write_queries(queries, [{"pid": pid, "queries": qs} for pid, qs in QUERIES.items()])
    return passages, queries


@pytest.fixture()
def beir_dataset(tmp_path):
    """Three queries, six documents; each query has one relevant document (q3 two, one of grade 0)."""
    root = tmp_path / "scifact"
    (root / "qrels").mkdir(parents=True)
    docs = {"a": ("Heart", "the heart pumps blood"), "b": ("Lungs", "lungs exchange oxygen"),
            "c": ("Liver", "the liver filters toxins"), "d": ("", "kidneys make urine"),
            "e": ("Skin", "skin protects the body"), "f": ("Bones", "bones support the body")}
    write_jsonl(root / "corpus.jsonl", [{"_id": k, "title": t, "text": x} for k, (t, x) in docs.items()])
    write_jsonl(root / "queries.jsonl", [{"_id": "q1", "text": "what pumps blood"},
                                         {"_id": "q2", "text": "how is oxygen exchanged"},
                                         {"_id": "q3", "text": "what filters toxins"}])
    (root / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\ta\t1\nq2\tb\t1\nq3\tc\t2\nq3\td\t0\n", encoding="utf-8")
    return root


# ---------------------------------------------------------------- sampling

def test_sample_uses_documents_with_two_passages_and_a_query(study_inputs):
    passages, queries = study_inputs
    documents, generated = annotation.read_passages(passages), annotation.read_queries(queries)
    pairs = annotation.sample_items(documents, generated, n_documents=10, seed=1)
    # d2 has one passage, d4 no query: only d1, d3 and d5 qualify; 10 asked, 3 taken.
    assert sorted({pair.doc_id for pair in pairs}) == ["d1", "d3", "d5"]
    assert len(pairs) == 6
    text_of = {pid: text for pid, _, _, text in PASSAGES}
    for doc_id in ("d1", "d3", "d5"):
        pp, pq = [pair for pair in pairs if pair.doc_id == doc_id]
        assert (pp.kind, pq.kind) == ("passage-passage", "passage-query")
        assert pp.pid == pq.pid and pp.passage == pq.passage == text_of[pp.pid]
        assert pp.context_id != pp.pid and pp.context_id.split("#")[0] == doc_id   # another passage, same document
        assert pp.context == text_of[pp.context_id]
        assert pq.context in QUERIES[pq.pid] and pq.context.strip()              # one of its generated queries
        assert QUERIES[pq.pid][int(pq.context_id.rsplit("#q", 1)[1])] == pq.context
    assert [p for p in pairs if p.doc_id == "d3"][0].pid == "d3#1"                  # the only passage with queries


def test_sample_depends_only_on_the_seed(study_inputs):
    passages, queries = study_inputs
    documents, generated = annotation.read_passages(passages), annotation.read_queries(queries)
    first = annotation.sample_items(documents, generated, 2, seed=5)
    assert annotation.sample_items(documents, generated, 2, seed=5) == first
    assert len({pair.doc_id for pair in first}) == 2
    seeds = {tuple(p.pid for p in annotation.sample_items(documents, generated, 2, seed=s)) for s in range(10)}
    assert len(seeds) > 1


def test_a_passages_file_of_another_format_names_file_and_field(tmp_path):
    path = tmp_path / "passages.arrow"
    path.write_text('{"pid": "a#0", "doc_id": "a", "text": "x"}\n', encoding="utf-8")   # JSON lines, not Arrow
    with pytest.raises(DataFormatError, match=r"passages.arrow: not an Arrow stream file"):
        annotation.read_passages(path)


# ---------------------------------------------------------------- sheets, majority vote, agreement

def export(study_inputs, tmp_path, seed=1):
    passages, queries = study_inputs
    pairs = annotation.sample_items(annotation.read_passages(passages), annotation.read_queries(queries), 2, seed)
    annotation.export_sheet(pairs, tmp_path / "sheet.csv", tmp_path / "key.csv", seed)
    return pairs


def read_rows(path):
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def fill(sheet: Path, target: Path, labels: list[str]) -> Path:
    rows = read_rows(sheet)
    for row, label in zip(rows, labels):
        row["label"] = label
    with open(target, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return target


def test_sheet_hides_the_kind_and_the_key_restores_it(study_inputs, tmp_path):
    pairs = export(study_inputs, tmp_path)
    sheet, key = read_rows(tmp_path / "sheet.csv"), read_rows(tmp_path / "key.csv")
    assert list(sheet[0]) == ["item", "passage", "context", "label"]
    assert all(row["label"] == "" for row in sheet)
    by_ids = {(p.pid, p.context_id): p for p in pairs}
    for shown, entry in zip(sheet, key):
        assert shown["item"] == entry["item"]
        pair = by_ids[(entry["pid"], entry["context_id"])]
        assert (entry["kind"], entry["doc_id"]) == (pair.kind, pair.doc_id)
        assert (shown["passage"], shown["context"]) == (pair.passage, pair.context)
    assert [e["kind"] for e in key] != [p.kind for p in pairs] or [e["pid"] for e in key] != [p.pid for p in pairs]


def test_three_annotators_majority_vote_and_fleiss_kappa(study_inputs, tmp_path):
    export(study_inputs, tmp_path)
    sheet = tmp_path / "sheet.csv"
    # Items 1-4 in sheet order. Votes: HHH, HHL, LLL, HLL (spelled as people might).
    filled = [fill(sheet, tmp_path / "ann1.csv", ["high", "High", "low", "high"]),
              fill(sheet, tmp_path / "ann2.csv", ["h", "high", "LOW", "0"]),
              fill(sheet, tmp_path / "ann3.csv", ["1", "low", "l", "low"])]
    human = annotation.import_sheets(filled, tmp_path / "key.csv", sheet)
    items = [row["item"] for row in read_rows(sheet)]
    assert [human.labels[item] for item in items] == ["high", "high", "low", "low"]
    assert human.votes[items[1]] == ["high", "high", "low"]
    # Per item pairwise agreement: 1, 1/3, 1, 1/3 -> P-bar = 2/3. Category shares 6/12 and 6/12 -> P_e = 1/2.
    # kappa = (2/3 - 1/2) / (1 - 1/2) = 1/3.
    assert human.percent_agreement == pytest.approx(2 / 3)
    assert human.fleiss_kappa == pytest.approx(1 / 3)
    assert human.annotators == 3 and human.ties == 0


def test_fleiss_kappa_three_categories():
    # 5 items, 4 annotators, 3 categories. P_i = sum_j c_ij (c_ij - 1) / (4 * 3); shares = column sums / 20.
    counts = [[4, 0, 0], [2, 2, 0], [0, 0, 4], [1, 1, 2], [0, 4, 0]]
    per_item = [12 / 12, 4 / 12, 12 / 12, 2 / 12, 12 / 12]
    p_bar = sum(per_item) / 5
    shares = [7 / 20, 7 / 20, 6 / 20]
    p_e = sum(s * s for s in shares)
    assert annotation.percent_agreement(counts) == pytest.approx(p_bar)
    assert annotation.fleiss_kappa(counts) == pytest.approx((p_bar - p_e) / (1 - p_e))
    assert annotation.fleiss_kappa([[3, 0], [3, 0]]) != annotation.fleiss_kappa([[3, 0], [3, 0]])  # NaN: one category


def test_majority_tie_with_two_annotators():
    assert annotation.majority_label(["high", "low"]) is None
    assert annotation.majority_label(["low", "high", "low"]) == "low"


def test_bad_label_is_reported_with_file_line_and_field(study_inputs, tmp_path):
    export(study_inputs, tmp_path)
    bad = fill(tmp_path / "sheet.csv", tmp_path / "bad.csv", ["high", "maybe", "low", "low"])
    with pytest.raises(DataFormatError, match=r"bad.csv:3: field 'label': expected high or low"):
        annotation.read_filled_sheet(bad, annotation.read_key(tmp_path / "key.csv"))


def test_unlabelled_items_and_stale_sheets_are_refused(study_inputs, tmp_path):
    export(study_inputs, tmp_path)
    key = annotation.read_key(tmp_path / "key.csv")
    partial = tmp_path / "partial.csv"
    rows = read_rows(tmp_path / "sheet.csv")[:3]
    with open(partial, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["item", "passage", "context", "label"])
        writer.writeheader()
        writer.writerows([{**row, "label": "low"} for row in rows])
    with pytest.raises(DataFormatError, match="1 items not labelled"):
        annotation.read_filled_sheet(partial, key)
    stale = fill(tmp_path / "sheet.csv", tmp_path / "stale.csv", ["low"] * 4)
    text = stale.read_text(encoding="utf-8").replace(read_rows(tmp_path / "sheet.csv")[0]["passage"], "other text", 1)
    stale.write_text(text, encoding="utf-8")
    with pytest.raises(DataFormatError, match="exported from other data"):
        annotation.check_sheet_texts(stale, tmp_path / "sheet.csv")


# ---------------------------------------------------------------- automatic judge

def test_threshold_maximises_accuracy_then_f1():
    # Sorted: .2n .3n .55p .6n .8p .9p. Accuracy 5/6 at t=0.425 (one false positive) and at t=0.7 (one miss);
    # F1 6/7 vs 4/5 picks 0.425, the midpoint of 0.3 and 0.55.
    calibration = annotation.calibrate_threshold([0.9, 0.8, 0.55], [0.6, 0.3, 0.2])
    assert calibration.threshold == pytest.approx(0.425)
    assert calibration.accuracy == pytest.approx(5 / 6)
    assert calibration.f1 == pytest.approx(6 / 7)
    separable = annotation.calibrate_threshold([0.7, 0.8], [0.1, 0.2])
    assert separable.threshold == pytest.approx(0.45) and separable.accuracy == 1.0


def test_calibration_pairs_from_qrels(beir_dataset):
    positives, negatives = annotation.calibration_pairs(beir_dataset, "train", max_pairs=10, seed=0)
    # q3-d has grade 0: not relevant. Document text is title + " " + text.
    assert sorted(positives) == [("how is oxygen exchanged", "Lungs lungs exchange oxygen"),
                                 ("what filters toxins", "Liver the liver filters toxins"),
                                 ("what pumps blood", "Heart the heart pumps blood")]
    relevant = {"what pumps blood": "Heart the heart pumps blood", "how is oxygen exchanged": "Lungs lungs exchange oxygen",
                "what filters toxins": "Liver the liver filters toxins"}
    assert len(negatives) == 3
    for query, document in negatives:
        assert document != relevant[query]
    assert len(annotation.calibration_pairs(beir_dataset, "train", max_pairs=2, seed=0)[0]) == 2


def test_judge_mean_pooling_ignores_padding(tiny_bert_dir):
    import torch

    judge = annotation.EncoderCosineJudge(str(tiny_bert_dir), device="cpu")
    texts = ["short", "a much longer text with many more tokens in it"]
    batched = judge.embed(texts)
    alone = torch.cat([judge.embed([text]) for text in texts])
    assert torch.allclose(batched, alone, atol=1e-5)
    assert torch.allclose(batched.norm(dim=-1), torch.ones(2), atol=1e-5)
    scores = judge.scores([("same text", "same text"), ("short", "a much longer text with many more tokens in it")])
    assert scores[0] == pytest.approx(1.0, abs=1e-5) and -1.0 <= scores[1] <= 1.0


# ---------------------------------------------------------------- the whole study and the stage

def test_run_study_with_judge_then_with_people(study_inputs, beir_dataset, tiny_bert_dir, tmp_path):
    passages, queries = study_inputs
    out = tmp_path / "annotation"
    out.mkdir()
    summary = annotation.run_study(passages, queries, beir_dataset, out, documents=2, seed=1,
                                   judge_model=str(tiny_bert_dir), calibration_pairs_max=10)
    assert sorted(p.name for p in out.iterdir()) == ["key.csv", "labels.csv", "sheet.csv", "summary.json"]
    labels = read_rows(out / "labels.csv")
    assert summary["label_source"] == "judge" and summary["labels"].startswith("automatic judge")
    threshold = summary["judge"]["threshold"]
    for row in labels:
        assert row["label"] == ("high" if float(row["score"]) >= threshold else "low")
    pp = [row for row in labels if row["kind"] == "passage-passage"]
    assert summary["shares"]["passage-passage"]["share"] == pytest.approx(sum(r["label"] == "high" for r in pp) / 2)

    sheet = out / "sheet.csv"
    kinds = {row["item"]: row["kind"] for row in read_rows(out / "key.csv")}
    order = [row["item"] for row in read_rows(sheet)]
    # Everyone says passage-query pairs are highly correlated; two of three call passage-passage pairs low.
    votes = [["high" if kinds[i] == "passage-query" else "low" for i in order],
             ["high" if kinds[i] == "passage-query" else "low" for i in order],
             ["high"] * len(order)]
    filled = [fill(sheet, tmp_path / f"a{n}.csv", v) for n, v in enumerate(votes)]
    again = tmp_path / "again"
    again.mkdir()
    summary = annotation.run_study(passages, queries, beir_dataset, again, documents=2, seed=1,
                                   judge_model=str(tiny_bert_dir), calibration_pairs_max=10, human_sheets=filled)
    assert summary["label_source"] == "human" and summary["labels"].startswith("human: 3 annotators")
    assert summary["shares"]["passage-query"]["share"] == 1.0
    assert summary["shares"]["passage-passage"]["share"] == 0.0
    assert summary["human"]["percent_agreement"] == pytest.approx((2 * 1 + 2 * (1 / 3)) / 4)


def test_annotation_stage_logs_table5_run(study_inputs, beir_dataset, tiny_bert_dir, tmp_path, monkeypatch,
                                          mlflow_store):
    import yaml

    from qac.reporting.profile_report import load_study
    from qac.reporting.tables import TableContext, table5_annotation

    work = tmp_path / "work"
    data = work / "data" / "smoke"
    (data / "datasets").mkdir(parents=True)
    passages, queries = study_inputs
    for source in (passages, queries):
        (data / source.name).write_bytes(source.read_bytes())
    beir_dataset.rename(data / "datasets" / "scifact")
    params = {"profile": "smoke", "seed": 1, "data_dir": "data", "train_dataset": "scifact",
              "mlflow": {"experiment": None, "system_metrics": False},
              "annotation": {"documents": 2, "judge": "encoder_cosine", "judge_model": str(tiny_bert_dir),
                             "calibration_split": "train", "calibration_pairs": 10, "human_sheets": []},
              "tables": {"permutations": 500, "in_domain_columns": [{"label": "x", "measure": "RR@10"}]}}
    (work / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    monkeypatch.chdir(work)
    monkeypatch.setenv("QAC_PARAMS", str(work / "params.yaml"))
    assert load_stage("annotation").main() == 0

    out = data / "annotation"
    assert sorted(p.name for p in out.iterdir()) == ["key.csv", "labels.csv", "sheet.csv", "summary.json"]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    from qac.params import load_params

    checked = load_params(work / "params.yaml")
    table = table5_annotation(TableContext.from_params(load_study(checked), checked))
    run_id = json.loads((data / ".runs" / "annotation" / "mlflow_run.json").read_text(encoding="utf-8"))["run_id"]
    pq = table.cell("passage-query", "high correlation %")
    assert pq.run_id == run_id
    assert pq.value == pytest.approx(100 * summary["shares"]["passage-query"]["share"])
    assert table.cell("passage-passage", "pairs").value == 2
    assert table.cell("passage-query", "labels").text == summary["labels"]
    assert table.cell("Δ passage-query − passage-passage", "high correlation %").note.startswith("paired by document")


def test_annotate_cli_export_and_import(study_inputs, tmp_path, monkeypatch, capsys):
    import yaml

    from qac.cli import main

    work = tmp_path / "work"
    (work / "data" / "smoke").mkdir(parents=True)
    for source in study_inputs:
        (work / "data" / "smoke" / source.name).write_bytes(source.read_bytes())
    (work / "params.yaml").write_text(yaml.safe_dump({"profile": "smoke", "seed": 1, "data_dir": "data",
                                                      "annotation": {"documents": 2}}), encoding="utf-8")
    monkeypatch.chdir(work)
    monkeypatch.setenv("QAC_PARAMS", str(work / "params.yaml"))
    assert main(["annotate", "export", "--out", "sheets"]) == 0
    sheet = work / "sheets" / "sheet.csv"
    filled = [str(fill(sheet, work / f"f{n}.csv", labels)) for n, labels in
              enumerate([["high", "high", "low", "low"], ["high", "low", "low", "low"], ["high", "high", "high", "low"]])]
    assert main(["annotate", "import", "--key", "sheets/key.csv", "--sheet", str(sheet), *filled]) == 0
    printed = capsys.readouterr().out
    assert "human: 3 annotators" in printed
    result = json.loads((work / "sheets" / "agreement.json").read_text(encoding="utf-8"))
    # Votes per item HHH, HLH, LLH, LLL: P_i = 1, 1/3, 1/3, 1 -> P-bar 2/3; shares 1/2, 1/2 -> kappa 1/3.
    assert result["fleiss_kappa"] == pytest.approx(1 / 3)
    assert [row["label"] for row in read_rows(work / "sheets" / "human_labels.csv")] == ["high", "high", "low", "low"]


def annotate_import(capsys, *arguments: str) -> str:
    """`qac annotate import ARGUMENTS`, which must fail: its one paragraph on stderr."""
    from qac.cli import main

    assert main(["annotate", "import", *arguments]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("qac: error: "), err
    return lines[0]


@pytest.fixture()
def filled_sheets(study_inputs, tmp_path):
    """The key, the exported sheet and two annotators' filled sheets (four items)."""
    export(study_inputs, tmp_path)
    first = fill(tmp_path / "sheet.csv", tmp_path / "first.csv", ["high", "high", "low", "low"])
    second = fill(tmp_path / "sheet.csv", tmp_path / "second.csv", ["high", "low", "low", "low"])
    return tmp_path / "key.csv", tmp_path / "sheet.csv", first, second


def test_annotate_import_needs_two_sheets_and_a_folder_to_write_to(filled_sheets, tmp_path, capsys):
    key, sheet, first, second = filled_sheets
    message = annotate_import(capsys, "--key", str(key), str(first))
    assert f"{first}: need the filled sheets of at least two annotators, got 1" in message
    taken = tmp_path / "taken"
    taken.write_text("a file where the folder should go\n")
    message = annotate_import(capsys, "--key", str(key), "--out", str(taken), str(first), str(second))
    assert f"--out {taken}: is a file, not a folder" in message
    assert taken.read_text() == "a file where the folder should go\n"


@pytest.mark.parametrize("action", [["export"], ["import", "first.csv", "second.csv", "--key", "key.csv"]])
def test_annotate_refuses_an_out_folder_outside_the_working_folder(action, tmp_path, monkeypatch, capsys):
    """'..' would write beside the checkout (an absolute folder stays allowed): refused before any work."""
    from qac.cli import main

    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert main(["annotate", *action, "--out", "../outside"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("qac: error: --out '../outside': expected a relative path inside its folder")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["work"]


def test_annotate_import_names_the_line_of_a_byte_that_is_not_utf8(filled_sheets, capsys):
    key, sheet, first, second = filled_sheets
    lines = second.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"high", b"h\xe9gh", 1).replace(b"low", b"l\xf6w", 1)
    second.write_bytes(b"\n".join(lines))
    message = annotate_import(capsys, "--key", str(key), str(first), str(second))
    assert f"{second}:3: not UTF-8 text" in message


def test_annotate_import_says_a_folder_is_not_a_sheet(filled_sheets, tmp_path, capsys):
    key, sheet, first, second = filled_sheets
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    assert f"{folder}: a folder, not a file" in annotate_import(capsys, "--key", str(key), str(first), str(folder))
    assert f"{folder}: a folder, not a file" in annotate_import(capsys, "--key", str(folder), str(first), str(second))


def test_annotate_import_refuses_one_sheet_counted_twice(filled_sheets, tmp_path, capsys):
    """The same file twice, or a copy of it, would count one annotator twice and agree 100% with itself."""
    key, sheet, first, second = filled_sheets
    same = f"{first.parent}/./{first.name}"
    message = annotate_import(capsys, "--key", str(key), str(first), str(second), same)
    assert f"{same}: given twice (as {first} too)" in message
    copy = tmp_path / "copy.csv"
    copy.write_bytes(first.read_bytes())
    message = annotate_import(capsys, "--key", str(key), str(first), str(copy))
    assert f"{copy}: byte for byte the same as {first}" in message
    assert not (tmp_path / "agreement.json").exists()


def test_annotate_import_names_an_item_given_twice_in_one_sheet(filled_sheets, capsys):
    """A mistyped id on line 4 repeats line 2's: said as such, not as line 4's texts differing from the item's."""
    key, sheet, first, second = filled_sheets
    lines = second.read_text(encoding="utf-8").splitlines(keepends=True)
    repeated, mistyped = lines[1].split(",", 1)[0], lines[3].split(",", 1)[0]
    lines[3] = lines[3].replace(mistyped, repeated, 1)
    second.write_text("".join(lines), encoding="utf-8")
    message = annotate_import(capsys, "--key", str(key), "--sheet", str(sheet), str(first), str(second))
    assert f"{second}:4: field 'item': item {repeated!r} appears twice (lines 2 and 4)" in message
