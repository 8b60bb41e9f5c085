"""The annotation study of Table 5: how often is a context highly correlated with its passage?

The paper sampled 200 MS MARCO documents, one random passage each, and asked
annotators whether the passage is highly or weakly correlated with (a) another
random passage of the same document and (b) a query generated from it; three
votes per pair, majority label. Here:

1. :func:`sample_items` draws ``documents`` documents with at least two
   passages, one passage per document that has generated queries, a random
   other passage of the document and one of the passage's generated queries.
2. :func:`export_sheet` writes the pairs for people: ``sheet.csv`` (pairs
   shuffled, which kind a pair is hidden; ``label`` left empty, to be filled
   with ``high`` or ``low``) and ``key.csv`` (item -> kind, document, ids).
3. :func:`import_sheets` reads any number of filled copies of the sheet,
   takes the majority label of each pair and measures agreement (mean
   pairwise agreement and Fleiss' kappa).
4. Until people have labelled the pairs, an automatic judge does:
   :class:`EncoderCosineJudge` scores a pair by the cosine similarity of the
   ``judge_model`` encoder's mean-pooled embeddings and calls it ``high``
   above a threshold. :func:`calibrate_threshold` picks the threshold that
   best separates relevant query-document pairs of the train dataset's qrels
   from random query-document pairs (highest accuracy on a balanced set), so
   "high correlation" means "as related as a judged relevant pair". Table 5
   says which labels it shows.
"""

from __future__ import annotations

import csv
import io
import os
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from qac.data.errors import DataFormatError
from qac.data.textfile import iter_json_objects, iter_rows, parse_int, required_id, required_text
from qac.io import atomic_path, write_json

RUN_NAME = "annotation/table5"
LABELS_TAG = "qac.annotation.labels"
LABELS_FILE = "labels.csv"
PASSAGE_PASSAGE = "passage-passage"
PASSAGE_QUERY = "passage-query"
PAIR_KINDS = (PASSAGE_PASSAGE, PASSAGE_QUERY)
HIGH, LOW = "high", "low"
_LABEL_SPELLINGS = {"high": HIGH, "h": HIGH, "1": HIGH, "low": LOW, "l": LOW, "0": LOW}
SHEET_FIELDS = ["item", "passage", "context", "label"]
KEY_FIELDS = ["item", "kind", "doc_id", "pid", "context_id"]
LABEL_FIELDS = ["item", "doc_id", "kind", "pid", "context_id", "score", "judge_label", "human_label", "votes",
                "label", "label_source"]


def share_metric(kind: str) -> str:
    """MLflow metric of the annotation run: share (0-1) of ``kind`` pairs labelled high."""
    return f"high_correlation/{kind}"


def count_metric(kind: str) -> str:
    """MLflow metric of the annotation run: number of labelled ``kind`` pairs."""
    return f"pairs/{kind}"


# ---------------------------------------------------------------- sampling

@dataclass(frozen=True)
class AnnotationPair:
    """One pair shown to annotators: a passage and a context (passage or generated query)."""

    doc_id: str
    kind: str
    pid: str
    context_id: str       # the context passage's pid, or ``<pid>#q<index>`` for a generated query
    passage: str
    context: str


def read_passages(path: str | os.PathLike) -> dict[str, list[dict]]:
    """``passages.arrow`` grouped by document: ``{doc_id: [{pid, position, text}, ...]}`` in file order."""
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import PASSAGES_SCHEMA, iter_records

    documents: dict[str, list[dict]] = defaultdict(list)
    for record in iter_records(path, PASSAGES_SCHEMA, columns=["pid", "doc_id", "position", "text"]):
        documents[record["doc_id"]].append({"pid": record["pid"], "position": record["position"],
                                            "text": record["text"]})
    return dict(documents)


def read_queries(path: str | os.PathLike) -> dict[str, list[str]]:
    """``queries.arrow`` as ``{pid: [query, ...]}`` (generation order)."""
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import QUERIES_SCHEMA, iter_records

    return {record["pid"]: record["queries"] for record in iter_records(path, QUERIES_SCHEMA)}


def draw_passage_pair(passages: Sequence[dict], rng: random.Random,
                      can_anchor: Callable[[dict], bool] = lambda passage: True) -> tuple[dict, dict]:
    """Table 5's passage pair of one document: a random anchor (among those ``can_anchor`` accepts) and a
    random other passage of the same document, drawn in that order from ``rng``."""
    anchor = rng.choice([p for p in passages if can_anchor(p)])
    other = rng.choice([p for p in passages if p["pid"] != anchor["pid"]])
    return anchor, other


def sample_items(documents: Mapping[str, list[dict]], queries: Mapping[str, list[str]], n_documents: int,
                 seed: int) -> list[AnnotationPair]:
    """A passage-passage and a passage-query pair for each of ``n_documents`` random documents.

    Only documents with at least two passages qualify (a passage-passage pair
    needs a second passage), and only passages with a non-empty generated
    query are drawn (the passage-query pair needs one). Documents are drawn
    from the sorted ids with ``random.Random(seed)``, so the sample depends on
    the seed and the data only. Fewer qualifying documents than asked: all of
    them are used.
    """
    rng = random.Random(seed)
    eligible = []
    for doc_id in sorted(documents):
        passages = documents[doc_id]
        with_queries = [p for p in passages if any(q.strip() for q in queries.get(p["pid"], []))]
        if len(passages) >= 2 and with_queries:
            eligible.append(doc_id)
    if not eligible:
        raise ValueError("no document has two or more passages and a generated query: nothing to annotate")
    chosen = sorted(rng.sample(eligible, min(n_documents, len(eligible))))
    pairs = []
    for doc_id in chosen:
        anchor, other = draw_passage_pair(documents[doc_id], rng,
                                          lambda p: any(q.strip() for q in queries.get(p["pid"], [])))
        candidates = [(index, q) for index, q in enumerate(queries[anchor["pid"]]) if q.strip()]
        index, query = rng.choice(candidates)
        pairs.append(AnnotationPair(doc_id, PASSAGE_PASSAGE, anchor["pid"], other["pid"], anchor["text"], other["text"]))
        pairs.append(AnnotationPair(doc_id, PASSAGE_QUERY, anchor["pid"], f"{anchor['pid']}#q{index}",
                                    anchor["text"], query))
    return pairs


# ---------------------------------------------------------------- sheets

def _csv_text(fields: Sequence[str], rows: Iterable[Mapping]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def write_csv(path: str | os.PathLike, fields: Sequence[str], rows: Iterable[Mapping]) -> None:
    """Write rows as CSV with a header, atomically."""
    _write_text(path, _csv_text(fields, rows))


def sheet_rows(pairs: Sequence[AnnotationPair], seed: int) -> tuple[list[dict], list[dict]]:
    """Shuffled sheet rows (kind hidden) and the key rows that undo the hiding."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    width = len(str(len(pairs)))
    sheet, key = [], []
    for position, index in enumerate(order, start=1):
        pair = pairs[index]
        item = f"A{position:0{width}d}"
        sheet.append({"item": item, "passage": pair.passage, "context": pair.context, "label": ""})
        key.append({"item": item, "kind": pair.kind, "doc_id": pair.doc_id, "pid": pair.pid,
                    "context_id": pair.context_id})
    return sheet, key


def export_sheet(pairs: Sequence[AnnotationPair], sheet_path: str | os.PathLike, key_path: str | os.PathLike,
                 seed: int) -> int:
    """Write the annotators' sheet and the key, atomically. Returns the number of items."""
    sheet, key = sheet_rows(pairs, seed)
    write_csv(sheet_path, SHEET_FIELDS, sheet)
    write_csv(key_path, KEY_FIELDS, key)
    return len(sheet)


def _read_csv(path: str | os.PathLike, required: Sequence[str]) -> list[tuple[int, dict]]:
    """``(line, row)`` of a CSV file with a header naming at least ``required``."""
    if not Path(path).is_file():
        raise DataFormatError(path, None, None, "file not found")
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [name for name in required if name not in (reader.fieldnames or [])]
        if missing:
            raise DataFormatError(path, 1, missing[0], f"missing column (header: {reader.fieldnames})")
        return [(reader.line_num, row) for row in reader]


def read_key(path: str | os.PathLike) -> dict[str, dict]:
    """``key.csv`` as ``{item: {kind, doc_id, pid, context_id}}``."""
    key = {}
    for line, row in _read_csv(path, KEY_FIELDS):
        if row["kind"] not in PAIR_KINDS:
            raise DataFormatError(path, line, "kind", f"expected one of {PAIR_KINDS}, found {row['kind']!r}")
        if row["item"] in key:
            raise DataFormatError(path, line, "item", f"duplicate item {row['item']!r}")
        key[row["item"]] = row
    return key


def read_filled_sheet(path: str | os.PathLike, key: Mapping[str, dict]) -> dict[str, str]:
    """One annotator's labels ``{item: high|low}``; every item of the key must be labelled once."""
    labels: dict[str, str] = {}
    for line, row in _read_csv(path, ("item", "label")):
        item = (row["item"] or "").strip()
        if item not in key:
            raise DataFormatError(path, line, "item", f"unknown item {item!r} (not in the key)")
        if item in labels:
            raise DataFormatError(path, line, "item", f"item {item!r} labelled twice")
        spelled = (row["label"] or "").strip().lower()
        if spelled not in _LABEL_SPELLINGS:
            raise DataFormatError(path, line, "label", f"expected high or low (or 1/0), found {row['label']!r}")
        labels[item] = _LABEL_SPELLINGS[spelled]
    unlabelled = [item for item in key if item not in labels]
    if unlabelled:
        raise DataFormatError(path, None, "label", f"{len(unlabelled)} items not labelled, first {unlabelled[0]!r}")
    return labels


# ---------------------------------------------------------------- agreement

def majority_label(votes: Sequence[str]) -> str | None:
    """The label most votes agree on, or None on a tie."""
    counts = Counter(votes).most_common()
    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]


def category_counts(votes_per_item: Sequence[Sequence[str]], categories: Sequence[str] = (HIGH, LOW)) -> list[list[int]]:
    """``counts[i][j]``: how many annotators put item ``i`` into category ``j``."""
    return [[sum(vote == category for vote in votes) for category in categories] for votes in votes_per_item]


def percent_agreement(counts: Sequence[Sequence[int]]) -> float:
    """Mean over items of the share of annotator pairs that agree (Fleiss' P-bar)."""
    per_item = []
    for row in counts:
        raters = sum(row)
        if raters < 2:
            raise ValueError("agreement needs at least two annotators per item")
        per_item.append(sum(c * (c - 1) for c in row) / (raters * (raters - 1)))
    return sum(per_item) / len(per_item)


def fleiss_kappa(counts: Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa: (P-bar - P_e) / (1 - P_e), the same number of annotators for every item.

    ``P_e`` is the agreement expected by chance, the sum of the squared shares
    of each category over all votes. All votes in one category: kappa is
    undefined (NaN).
    """
    raters = {sum(row) for row in counts}
    if len(raters) != 1:
        raise ValueError(f"Fleiss' kappa needs the same number of annotators per item, found {sorted(raters)}")
    total = sum(sum(row) for row in counts)
    shares = [sum(row[j] for row in counts) / total for j in range(len(counts[0]))]
    expected = sum(share * share for share in shares)
    observed = percent_agreement(counts)
    if expected == 1.0:
        return float("nan")
    return (observed - expected) / (1.0 - expected)


@dataclass
class HumanLabels:
    """Majority labels of several annotators and how much they agreed."""

    labels: dict[str, str | None]          # item -> majority label (None on a tie)
    votes: dict[str, list[str]]            # item -> each annotator's label, in sheet order
    annotators: int
    percent_agreement: float
    fleiss_kappa: float
    ties: int = 0
    sheets: list[str] = field(default_factory=list)

    def description(self) -> str:
        return (f"human: {self.annotators} annotators, majority vote (agreement {self.percent_agreement:.1%}, "
                f"Fleiss' kappa {self.fleiss_kappa:.2f}, {self.ties} ties left out)")

    def summary(self) -> dict:
        return {"annotators": self.annotators, "percent_agreement": self.percent_agreement,
                "fleiss_kappa": self.fleiss_kappa, "ties": self.ties, "sheets": self.sheets}


def check_sheet_texts(filled_path: str | os.PathLike, sheet_path: str | os.PathLike) -> None:
    """A filled sheet must show the same texts as the exported sheet, else its labels belong to other pairs."""
    exported = {row["item"]: row for _, row in _read_csv(sheet_path, SHEET_FIELDS)}
    for line, row in _read_csv(filled_path, ("item", "label")):
        expected = exported.get((row["item"] or "").strip())
        for name in ("passage", "context"):
            if expected is not None and name in row and row[name] != expected[name]:
                raise DataFormatError(filled_path, line, name, f"text differs from {sheet_path}: the sheet was "
                                      "exported from other data; export again and relabel")


def import_sheets(sheet_paths: Sequence[str | os.PathLike], key_path: str | os.PathLike,
                  exported_sheet: str | os.PathLike | None = None) -> HumanLabels:
    """Read filled sheets (one per annotator), take majority labels and measure agreement.

    With ``exported_sheet`` every filled sheet's passage and context texts are
    checked against it, so labels made for another sample are refused.
    """
    if len(sheet_paths) < 2:
        raise ValueError(f"need filled sheets of at least two annotators, got {len(sheet_paths)}")
    key = read_key(key_path)
    if exported_sheet is not None:
        for path in sheet_paths:
            check_sheet_texts(path, exported_sheet)
    sheets = [read_filled_sheet(path, key) for path in sheet_paths]
    votes = {item: [sheet[item] for sheet in sheets] for item in key}
    labels = {item: majority_label(item_votes) for item, item_votes in votes.items()}
    counts = category_counts(list(votes.values()))
    return HumanLabels(labels=labels, votes=votes, annotators=len(sheets), percent_agreement=percent_agreement(counts),
                       fleiss_kappa=fleiss_kappa(counts), ties=sum(label is None for label in labels.values()),
                       sheets=[str(path) for path in sheet_paths])


# ---------------------------------------------------------------- automatic judge

@dataclass(frozen=True)
class Calibration:
    """The judge's threshold and how well it separates relevant from random pairs (on the calibration pairs)."""

    threshold: float
    accuracy: float
    f1: float
    positives: int
    negatives: int
    source: str = ""


def calibrate_threshold(positive_scores: Sequence[float], negative_scores: Sequence[float]) -> Calibration:
    """The threshold ``t`` (score >= t means high) with the best accuracy, ties broken by F1.

    Candidates are the midpoints between consecutive distinct scores plus one
    below the lowest and one above the highest, so the choice does not depend
    on where inside a gap the threshold sits.
    """
    if not positive_scores or not negative_scores:
        raise ValueError("calibration needs both relevant and random pairs")
    scored = sorted([(s, 1) for s in positive_scores] + [(s, 0) for s in negative_scores])
    distinct = sorted({s for s, _ in scored})
    candidates = ([distinct[0] - 1.0] + [(a + b) / 2 for a, b in zip(distinct, distinct[1:])] + [distinct[-1] + 1.0])
    n_pos, n_neg = len(positive_scores), len(negative_scores)
    best = None
    for threshold in candidates:
        true_pos = sum(1 for s in positive_scores if s >= threshold)
        true_neg = sum(1 for s in negative_scores if s < threshold)
        predicted_pos = true_pos + (n_neg - true_neg)
        precision = true_pos / predicted_pos if predicted_pos else 0.0
        recall = true_pos / n_pos
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        accuracy = (true_pos + true_neg) / (n_pos + n_neg)
        if best is None or (accuracy, f1) > (best.accuracy, best.f1):
            best = Calibration(threshold=threshold, accuracy=accuracy, f1=f1, positives=n_pos, negatives=n_neg)
    return best


def calibration_pairs(dataset_dir: str | os.PathLike, split: str, max_pairs: int, seed: int,
                      rel_threshold: int = 1) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Relevant (query, document) pairs from ``qrels/<split>.tsv`` and as many random pairs.

    A random pair joins each sampled query with a document drawn uniformly
    from the documents not judged relevant to it. Document text is
    ``title + " " + text`` as everywhere else in the project.
    """
    dataset_dir = Path(dataset_dir)
    qrels_path = dataset_dir / "qrels" / f"{split}.tsv"
    relevant: dict[str, set[str]] = defaultdict(set)
    for line, (qid, doc_id, score) in iter_rows(qrels_path, ("query-id", "corpus-id", "score")):
        if line == 1 and score.strip() == "score":
            continue
        if parse_int(score, "score", qrels_path, line) >= rel_threshold:
            relevant[qid].add(doc_id)
    corpus_path, queries_path = dataset_dir / "corpus.jsonl", dataset_dir / "queries.jsonl"
    documents = {}
    for line, record in iter_json_objects(corpus_path):
        title = required_text(record, "title", corpus_path, line, default="")
        documents[required_id(record, "_id", corpus_path, line)] = \
            f"{title} {required_text(record, 'text', corpus_path, line)}".strip()
    queries = {required_id(r, "_id", queries_path, line): required_text(r, "text", queries_path, line)
               for line, r in iter_json_objects(queries_path)}
    judged = sorted((qid, doc_id) for qid, docs in relevant.items() for doc_id in docs
                    if qid in queries and doc_id in documents)
    if not judged:
        raise ValueError(f"{qrels_path}: no relevant pair whose query and document are in the dataset")
    rng = random.Random(seed)
    sample = sorted(rng.sample(judged, min(max_pairs, len(judged))))
    doc_ids = sorted(documents)
    positives, negatives = [], []
    for qid, doc_id in sample:
        positives.append((queries[qid], documents[doc_id]))
        while True:
            other = doc_ids[rng.randrange(len(doc_ids))]
            if other not in relevant[qid] or len(relevant[qid]) >= len(doc_ids):
                break
        negatives.append((queries[qid], documents[other]))
    return positives, negatives


class EncoderCosineJudge:
    """Scores a text pair by the cosine similarity of mean-pooled encoder embeddings."""

    def __init__(self, model_spec: str, max_length: int = 256, batch_size: int = 32, device: str | None = None):
        import torch

        # here, not at the top: it loads safetensors
        from qac.models.loading import load_model, load_tokenizer

        self.model_spec = model_spec
        self.tokenizer = load_tokenizer(model_spec)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = load_model(model_spec).to(self.device).eval()
        self.max_length = max_length
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]):
        """L2-normalised mean of the last hidden states over non-padding tokens."""
        import torch

        # here, not at the top: it loads numpy
        from qac.data.tokens import cut_texts

        chunks = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(cut_texts(texts[start:start + self.batch_size], self.max_length), padding=True,
                                       truncation=True, max_length=self.max_length,
                                       return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
                chunks.append(torch.nn.functional.normalize(mean.float(), dim=-1).cpu())
        return torch.cat(chunks) if chunks else torch.empty(0)

    def scores(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Cosine similarity of each ``(a, b)``."""
        if not pairs:
            return []
        first = self.embed([a for a, _ in pairs])
        second = self.embed([b for _, b in pairs])
        return (first * second).sum(dim=-1).tolist()

    def calibrate(self, positives: Sequence[tuple[str, str]], negatives: Sequence[tuple[str, str]],
                  source: str = "") -> Calibration:
        calibration = calibrate_threshold(self.scores(positives), self.scores(negatives))
        return Calibration(**{**calibration.__dict__, "source": source})


def judge_description(model_spec: str, calibration: Calibration) -> str:
    return (f"automatic judge: cosine similarity of {model_spec} mean-pooled embeddings >= "
            f"{calibration.threshold:.3f}, threshold calibrated on {calibration.source} "
            f"({calibration.positives} relevant vs {calibration.negatives} random query-document pairs, "
            f"accuracy {calibration.accuracy:.1%}, F1 {calibration.f1:.2f})")


# ---------------------------------------------------------------- labels and summary

def label_rows(key: Mapping[str, dict], scores: Mapping[str, float], threshold: float,
               human: HumanLabels | None = None) -> list[dict]:
    """One row per item: judge score and label, human votes and majority, and the label used.

    The label used is the human majority where people labelled the pairs,
    else the judge's. An item with tied human votes has no label and is left
    out of the shares.
    """
    rows = []
    for item, entry in key.items():
        judge_label = HIGH if scores[item] >= threshold else LOW
        row = {"item": item, "doc_id": entry["doc_id"], "kind": entry["kind"], "pid": entry["pid"],
               "context_id": entry["context_id"], "score": f"{scores[item]:.6f}", "judge_label": judge_label,
               "human_label": "", "votes": "", "label": judge_label, "label_source": "judge"}
        if human is not None:
            majority = human.labels[item]
            row.update(human_label=majority or "tie", votes=" ".join(human.votes[item]), label=majority or "",
                       label_source="human")
        rows.append(row)
    return rows


def label_shares(rows: Sequence[Mapping]) -> dict[str, dict[str, float]]:
    """Per pair kind: labelled pairs, pairs labelled high, and their share."""
    shares = {}
    for kind in PAIR_KINDS:
        labelled = [row for row in rows if row["kind"] == kind and row["label"] in (HIGH, LOW)]
        high = sum(row["label"] == HIGH for row in labelled)
        shares[kind] = {"pairs": len(labelled), "high": high, "share": high / len(labelled) if labelled else float("nan")}
    return shares


def labels_by_kind(text: str) -> dict[str, dict[str, float]]:
    """From ``labels.csv`` text: ``{kind: {doc_id: 1.0 high / 0.0 low}}``, for a test paired by document."""
    by_kind: dict[str, dict[str, float]] = {kind: {} for kind in PAIR_KINDS}
    for row in csv.DictReader(io.StringIO(text)):
        if row["label"] in (HIGH, LOW) and row["kind"] in by_kind:
            by_kind[row["kind"]][row["doc_id"]] = 1.0 if row["label"] == HIGH else 0.0
    return by_kind


def judge_agreement(rows: Sequence[Mapping]) -> float | None:
    """Share of items where the judge's label equals the human majority (None without human labels)."""
    compared = [row for row in rows if row["human_label"] in (HIGH, LOW)]
    if not compared:
        return None
    return sum(row["judge_label"] == row["human_label"] for row in compared) / len(compared)


# ---------------------------------------------------------------- the whole study

def run_study(passages_path: str | os.PathLike, queries_path: str | os.PathLike,
              calibration_dataset: str | os.PathLike, out_dir: str | os.PathLike, *, documents: int, seed: int,
              judge_model: str, calibration_split: str = "train", calibration_pairs_max: int = 500,
              rel_threshold: int = 1, human_sheets: Sequence[str | os.PathLike] = (),
              judge_max_length: int = 256) -> dict:
    """Sample, export, judge (and import human labels if given) into ``out_dir``; returns the summary.

    Writes ``sheet.csv``, ``key.csv``, ``labels.csv`` and ``summary.json``.
    The caller makes ``out_dir`` atomic (a temporary folder renamed on success).
    """
    out_dir = Path(out_dir)
    pairs = sample_items(read_passages(passages_path), read_queries(queries_path), documents, seed)
    export_sheet(pairs, out_dir / "sheet.csv", out_dir / "key.csv", seed)
    key = read_key(out_dir / "key.csv")
    texts = {row["item"]: (row["passage"], row["context"]) for _, row in _read_csv(out_dir / "sheet.csv", SHEET_FIELDS)}

    judge = EncoderCosineJudge(judge_model, max_length=judge_max_length)
    positives, negatives = calibration_pairs(calibration_dataset, calibration_split, calibration_pairs_max, seed,
                                             rel_threshold)
    calibration = judge.calibrate(positives, negatives,
                                  source=f"{Path(calibration_dataset).name} {calibration_split} qrels")
    items = list(key)
    scores = dict(zip(items, judge.scores([texts[item] for item in items])))
    human = import_sheets(human_sheets, out_dir / "key.csv", out_dir / "sheet.csv") if human_sheets else None
    rows = label_rows(key, scores, calibration.threshold, human)
    write_csv(out_dir / LABELS_FILE, LABEL_FIELDS, rows)
    summary = {
        "documents": len(pairs) // 2,
        "documents_asked": documents,
        "labels": human.description() if human else judge_description(judge_model, calibration),
        "label_source": "human" if human else "judge",
        "shares": label_shares(rows),
        "judge": {"model": judge_model, "pooling": "mean", "similarity": "cosine", "max_length": judge_max_length,
                  **calibration.__dict__},
        "human": human.summary() if human else None,
        "judge_human_agreement": judge_agreement(rows),
    }
    write_json(out_dir / "summary.json", summary)
    return summary
