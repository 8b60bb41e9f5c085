"""A small synthetic stand-in for everything the paper profile downloads, in the real formats.

``python tests/paper_mini_mirror.py OUT`` writes, deterministically (the same bytes on every run):

- ``OUT/mirror/``: a data mirror (``QAC_DATA_MIRROR``) with the folders the paper profile's datasets name:
  ``msmarco-docs/msmarco-docs.tsv.gz`` (docid, url, title, body, with the file's quirks: empty titles, a
  row with an empty body, runs of spaces, non-ASCII text, a long run-on sentence, a one-sentence document),
  ``msmarco-passage-rocketqa/`` (RocketQA's ``para.txt`` and line-aligned ``para.title.txt`` with ``-`` for
  a missing title, ``train.query.txt``, ``qrels.train.tsv``, the official ``qidpidtriples.train.full.2.tsv.gz``
  covering only part of the training queries), ``trec-msmarco/`` (the dev subset, TREC DL 2019 with ``Q0``
  qrels and DL 2020 with ``0``, graded 0-3, topics without judgements, a topic with a leading space), the
  fourteen BEIR sets (CQADupStack as its twelve forum folders; ArguAna and Quora with queries whose ids are
  document ids) and sentence-transformers' scored ``msmarco-hard-negatives.jsonl.gz``;
- ``OUT/hub/``: a Hugging Face hub cache (``HF_HUB_CACHE``) holding, under the hub names the paper profile
  loads, tiny random models built from configurations: BERT (``bert-base-uncased``, ``Luyu/condenser``, the
  two reference retrievers), doc2query's T5, GPT-2 and the LLM-query generator (a Qwen2 with a chat
  template), all with the MiniLM (= bert-base-uncased) vocabulary;
- ``OUT/nltk_data/``: an English ``punkt_tab`` package (``NLTK_DATA``) in NLTK's file layout.

Nothing here says anything about retrieval quality; the texts are drawn from a small word list so that
every tokenizer reads them and queries share words with their passages.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import sys
from pathlib import Path

SEED = 20230521
WORDS = ("water heat energy river city music film school light plant animal ocean market price bank train "
         "road bridge garden forest island mountain village doctor hospital medicine disease cell protein "
         "computer network signal phone battery engine car fuel oil gas coal power storm rain snow wind "
         "history war king queen church museum language word book paper story poem song dance art color "
         "food bread fruit apple sugar salt coffee tea milk cheese meat fish bird horse dog cat tree flower "
         "stone gold iron steel glass wood cotton wool law court tax money trade job team game sport ball").split()
FORUMS = ("android", "english", "gaming", "gis", "mathematica", "physics", "programmers", "stats", "tex", "unix",
          "webmasters", "wordpress")
BEIR_SETS = ("trec-covid", "nfcorpus", "nq", "hotpotqa", "fiqa", "arguana", "webis-touche2020", "quora",
             "dbpedia-entity", "scidocs", "fever", "climate-fever", "scifact")
GRADED = {"trec-covid": 2, "nfcorpus": 2, "webis-touche2020": 2, "dbpedia-entity": 2}   # top grade of graded sets
SELF_QUERIES = ("arguana", "quora")    # some query ids are document ids: evaluated with ignore_identical_ids


def sentence(rng: random.Random, topic: list[str], length: int | None = None) -> str:
    words = [rng.choice(topic) if rng.random() < 0.5 else rng.choice(WORDS)
             for _ in range(length or rng.randint(6, 14))]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, topic: list[str], sentences: int) -> str:
    return " ".join(sentence(rng, topic) for _ in range(sentences))


def query_of(rng: random.Random, text: str) -> str:
    words = [w.strip(".").lower() for w in text.split()]
    return " ".join(rng.sample(words, min(len(words), rng.randint(3, 6))))


def write_lines(path: Path, lines, compress: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if compress:
        # mtime 0 and no file name in the header: the same bytes on every run
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)


def msmarco_documents(root: Path, rng: random.Random, count: int = 36) -> None:
    rows = []
    for index in range(count):
        topic = rng.sample(WORDS, 6)
        docid = f"D{1000 + index * 37}"
        title = "" if index % 7 == 3 else " ".join(topic[:3]).title()
        body = paragraph(rng, topic, rng.randint(5, 12))
        if index == 2:
            body += " " + sentence(rng, topic, length=90)           # one sentence longer than a span
        if index == 5:
            body = sentence(rng, topic)                              # a document that is one span
        if index == 8:
            body = body.replace(" ", "  ", 3) + " Café naïve résumé."    # runs of spaces, non-ASCII
        if index == 10:
            body = ""                          # no title and no body: skipped and counted (corpus_empty_text)
        rows.append(f"{docid}\thttp://example.org/{index}\t{title}\t{body}")
    write_lines(root / "msmarco-docs" / "msmarco-docs.tsv.gz", rows, compress=True)


def msmarco_passages(root: Path, rng: random.Random, passages: int = 160) -> None:
    """RocketQA's MS MARCO folder and the official triples; the TREC files at the mirror's ``trec-msmarco/``."""
    folder = root / "msmarco-passage-rocketqa"
    texts, titles = [], []
    for pid in range(passages):
        topic = rng.sample(WORDS, 5)
        texts.append(paragraph(rng, topic, rng.randint(2, 4)))
        titles.append("-" if pid % 5 == 0 else " ".join(topic[:2]).title())
    write_lines(folder / "para.txt", (f"{pid}\t{text}" for pid, text in enumerate(texts)))
    write_lines(folder / "para.title.txt", (f"{pid}\t{title}" for pid, title in enumerate(titles)))
    pids = list(range(passages))
    rng.shuffle(pids)
    train, dev, dl19, dl20 = pids[:60], pids[60:76], pids[76:86], pids[86:96]
    train_queries = {100000 + i: pid for i, pid in enumerate(train)}
    write_lines(folder / "train.query.txt", (f"{qid}\t{query_of(rng, texts[pid])}" for qid, pid in train_queries.items()))
    write_lines(folder / "qrels.train.tsv", (f"{qid}\t0\t{pid}\t1" for qid, pid in train_queries.items()))
    triples = []
    for index, (qid, pid) in enumerate(train_queries.items()):
        if index % 6 == 5:
            continue               # the triples leave some training queries out (retriever 1 trains on the rest)
        negatives = rng.sample([other for other in range(passages) if other != pid], 12)
        triples += [f"{qid}\t{pid}\t{negative}" for negative in negatives for _ in range(1 + (negative % 2))]
    write_lines(folder / "qidpidtriples.train.full.2.tsv.gz", triples, compress=True)

    trec = root / "trec-msmarco"
    dev_queries = {200000 + i: pid for i, pid in enumerate(dev)}
    write_lines(trec / "topics.msmarco-passage.dev-subset.txt",
                (f"{qid}\t{' ' if i == 1 else ''}{query_of(rng, texts[pid])}"
                 for i, (qid, pid) in enumerate(dev_queries.items())))
    write_lines(trec / "qrels.msmarco-passage.dev-subset.txt", (f"{qid} 0 {pid} 1" for qid, pid in dev_queries.items()))
    for name, relevant, start, topics_file, qrels_file, iteration in (
            ("dl19", dl19, 300000, "topics.dl19-passage.txt", "qrels.dl19-passage.txt", "Q0"),
            ("dl20", dl20, 400000, "topics.dl20.txt", "qrels.dl20-passage.txt", "0")):
        judged = {start + i: pid for i, pid in enumerate(relevant)}
        unjudged = [start + 500 + i for i in range(3)]           # topics the assessors never judged
        write_lines(trec / topics_file, [f"{qid}\t{query_of(rng, texts[pid])}" for qid, pid in judged.items()]
                    + [f"{qid}\t{' '.join(rng.sample(WORDS, 4))}" for qid in unjudged])
        qrels = []
        for qid, pid in judged.items():
            qrels.append(f"{qid} {iteration} {pid} 3")
            qrels += [f"{qid} {iteration} {other} {rng.choice((0, 1, 2))}" for other in rng.sample(pids, 6)
                      if other != pid]
        write_lines(trec / qrels_file, qrels)
    hard_negatives(root, rng, train_queries, passages)


def hard_negatives(root: Path, rng: random.Random, train_queries: dict[int, int], passages: int) -> None:
    """sentence-transformers' file as ``train_msmarco_v3.py`` reads it: scored ids per mining system."""
    lines = []
    for qid, pid in train_queries.items():
        negatives = {system: [{"pid": other, "ce-score": round(rng.uniform(-9.0, 9.0), 3)}
                              for other in rng.sample(range(passages), 8)]
                     for system in ("bm25", "msmarco-distilbert-base-tas-b", "msmarco-MiniLM-L-6-v3")}
        lines.append(json.dumps({"qid": qid, "pos": [{"pid": pid, "ce-score": round(rng.uniform(6.0, 10.0), 3)}],
                                 "neg": negatives}))
    write_lines(root / "msmarco-hard-negatives" / "msmarco-hard-negatives.jsonl.gz", lines, compress=True)


def beir_set(folder: Path, rng: random.Random, name: str, documents: int = 20, queries: int = 5) -> None:
    corpus, rows, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for index in range(documents):
        topic = rng.sample(WORDS, 5)
        corpus.append({"_id": f"{name[:3]}{index}", "title": "" if index % 4 == 0 else " ".join(topic[:2]),
                       "text": paragraph(rng, topic, rng.randint(1, 3)), "metadata": {}})
    top = GRADED.get(name, 1)
    for index in range(queries):
        relevant = [2 * index, 2 * index + 1 + rng.randrange(documents - 2 * index - 1)]
        qid = corpus[relevant[0]]["_id"] if name in SELF_QUERIES and index % 2 == 0 else f"q{index}"
        rows.append({"_id": qid, "text": query_of(rng, corpus[relevant[1]]["text"]), "metadata": {}})
        qrels.append(f"{qid}\t{corpus[relevant[1]]['_id']}\t{top}")
        if top > 1:
            qrels.append(f"{qid}\t{corpus[relevant[0]]['_id']}\t{rng.choice((0, 1))}")
    write_lines(folder / "corpus.jsonl", (json.dumps(row) for row in corpus))
    write_lines(folder / "queries.jsonl", (json.dumps(row) for row in rows))
    write_lines(folder / "qrels" / "test.tsv", qrels)


def beir_sets(root: Path, rng: random.Random) -> None:
    for name in BEIR_SETS:
        beir_set(root / name, rng, name)
    for forum in FORUMS:
        beir_set(root / "cqadupstack" / forum, rng, forum, documents=12, queries=3)


def punkt_tab(root: Path) -> None:
    """NLTK's ``punkt_tab/english`` layout: the four parameter files Punkt reads."""
    folder = root / "tokenizers" / "punkt_tab" / "english"
    write_lines(folder / "abbrev_types.txt", ["dr", "mr", "mrs", "u.s", "e.g", "i.e", "etc", "vs"])
    write_lines(folder / "collocations.tab", ["##number##\tjanuary"])
    write_lines(folder / "sent_starters.txt", ["the", "it", "in", "this"])
    write_lines(folder / "ortho_context.tab", [f"{word}\t{34}" for word in WORDS[:20]])


# Tiny architectures, seeded: each stands in for the hub model of the same name. The BERT has more layers than
# the paper's skip_from (6) and head, so coCondenser's head reads the layer the paper's does.
TINY_BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=7, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=512)


CHAT_MODELS = {"Qwen/Qwen2.5-3B-Instruct"}
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def _snapshot(hub: Path, name: str, revision: str) -> Path:
    """The folder of ``name`` at ``revision`` in a hub cache, with ``refs/main`` pointing at it."""
    repo = hub / ("models--" + name.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return repo / "snapshots" / revision


def _revision(name: str, pins: dict[str, str]) -> str:
    return pins.get(name) or hashlib.sha1(f"{SEED}:{name}".encode()).hexdigest()


def tiny_models(hub: Path, pins: dict[str, str]) -> None:
    import torch
    from transformers import (BertConfig, BertForMaskedLM, BertModel, GPT2Config, GPT2LMHeadModel, Qwen2Config,
                              Qwen2ForCausalLM, T5Config, T5ForConditionalGeneration)

    from qac.models.loading import load_tokenizer

    tokenizer = load_tokenizer("minilm")
    builds = {
        "bert-base-uncased": lambda: BertForMaskedLM(BertConfig(**TINY_BERT)),
        "Luyu/condenser": lambda: BertForMaskedLM(BertConfig(**TINY_BERT)),
        "Luyu/co-condenser-marco-retriever": lambda: BertModel(BertConfig(**TINY_BERT), add_pooling_layer=False),
        "caskcsg/cotmae_base_msmarco_retriever": lambda: BertModel(BertConfig(**TINY_BERT), add_pooling_layer=False),
        "doc2query/all-with_prefix-t5-base-v1": lambda: T5ForConditionalGeneration(T5Config(
            vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
            pad_token_id=0, eos_token_id=102, decoder_start_token_id=0)),
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=30522, n_positions=512, n_embd=32, n_layer=2, n_head=2,
                                                   bos_token_id=101, eos_token_id=102, pad_token_id=0)),
        # the LLM-query extension's generator (llm_queries.generators), prompted through its chat template
        "Qwen/Qwen2.5-3B-Instruct": lambda: Qwen2ForCausalLM(Qwen2Config(
            vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=2048, bos_token_id=101, eos_token_id=102, pad_token_id=0)),
    }
    for index, (name, build) in enumerate(builds.items()):
        folder = _snapshot(hub, name, _revision(name, pins))
        torch.manual_seed(SEED + index)
        build().save_pretrained(folder)
        tokenizer.chat_template = CHAT_TEMPLATE if name in CHAT_MODELS else None
        tokenizer.save_pretrained(folder)


def hub_pins(profile_params: dict) -> dict[str, str]:
    """``name -> revision`` of every pinned hub spec in a rendered profile: ``name@revision``, or a mapping with
    ``model`` and a commit ``revision`` (an llm_queries generator)."""
    pins = {}

    def commit(text) -> bool:
        return isinstance(text, str) and len(text) == 40 and all(c in "0123456789abcdef" for c in text)

    def visit(value):
        if isinstance(value, dict):
            if isinstance(value.get("model"), str) and commit(value.get("revision")):
                pins[value["model"]] = value["revision"]
            for key, item in value.items():
                visit(key)
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)
        elif isinstance(value, str) and "@" in value and " " not in value and not value.startswith(("http", "/")):
            name, _, revision = value.rpartition("@")
            if commit(revision):
                pins[name] = revision

    visit(profile_params)
    return pins


def build(out: Path, pins: dict[str, str] | None = None) -> Path:
    """Write the mirror, the hub cache and the NLTK data under ``out``; return ``out``."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    rng = random.Random(SEED)
    mirror = out / "mirror"
    msmarco_documents(mirror, rng)
    msmarco_passages(mirror, rng)
    beir_sets(mirror, rng)
    punkt_tab(out / "nltk_data")
    tiny_models(out / "hub", pins or {})
    return out


def environment(out: Path) -> dict[str, str]:
    """The variables that point the paper profile's stages at ``out`` instead of the network."""
    out = Path(out)
    return {"QAC_DATA_MIRROR": str(out / "mirror"), "HF_HUB_CACHE": str(out / "hub"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "NLTK_DATA": str(out / "nltk_data")}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/paper_mini_mirror.py OUT")
    from qac.config import render_profile

    print(build(Path(sys.argv[1]), hub_pins(render_profile("paper-mini"))))
