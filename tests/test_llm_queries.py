"""Queries from a prompted causal LM and the filters that choose among them: prompts and examples recorded,
deterministic for a seed, byte-identical after a kill -9, the filters' kept shares on hand-checked cases."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from mlflow_stores import empty_store
from qac.data.arrowstore import write_passages
from qac.llm_queries.filtering import (Bm25Passages, FilterSettings, QueryRecord, apply_filters, best_share_mask,
                                       copied_share, round_trip_mask)
from qac.llm_queries.prompts import Example, PromptBook, check_templates, draw_examples
from stages import PYTHON, REPO, arrow_records, passage_records, run_stage_main, subprocess_env

BOOK = PromptBook(query_types=("question", "claim"),
                  templates={"question": "{examples}Passage: {passage}\nQuestion:",
                             "claim": "Passage: {passage}\nClaim:"},
                  example_template="Passage: {passage}\nQuery: {query}\n\n",
                  examples=(Example("d1", "Cats are small animals that purr when content.", "do cats purr"),),
                  passage_tokens=12, example_tokens=4)


def settings(**overrides):
    from qac.llm_queries.causal_lm import CausalSettings

    values = dict(model="tiny:minilm", revision=None, gguf_file=None, chat=False, prompts=BOOK, queries_per_passage=4,
                  top_p=0.95, top_k=25, temperature=1.0, repeat_penalty=0.0, min_new_tokens=1, max_new_tokens=6,
                  drop_duplicates=True, drop_empty=True, seed=7)
    return CausalSettings(**{**values, **overrides})


@pytest.fixture(scope="module")
def tiny_gpt2():
    from qac.llm_queries.causal_lm import load_causal_generator

    return load_causal_generator("tiny:minilm", seed=0)


PASSAGES = [(record["pid"], record["text"]) for record in passage_records(7)]


# -- prompts ---------------------------------------------------------------------------------------------
def test_examples_are_drawn_by_seed_whatever_the_order_of_the_pairs():
    pairs = [(f"d{i}", f"passage {i}", f"query {i}") for i in range(20)] + [("d0", "passage 0 again", "query 0")]
    drawn = draw_examples(pairs, 3, seed=1)
    assert drawn == draw_examples(list(reversed(pairs)), 3, seed=1)
    assert len({e.query for e in drawn}) == 3                  # one example per query
    assert [e.query for e in draw_examples(pairs, 3, seed=2)] != [e.query for e in drawn]
    assert draw_examples(pairs, 0, seed=1) == []
    with pytest.raises(ValueError, match="give 20"):
        draw_examples(pairs, 21, seed=1)


def test_prompts_cut_passages_to_their_token_budgets(tiny_gpt2):
    _, tokenizer = tiny_gpt2
    long = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    prompts = BOOK.prompts(long, tokenizer)
    # the example's passage keeps 4 tokens, the prompted passage 12; the claim template is zero-shot
    assert prompts["question"] == ("Passage: Cats are small animals\nQuery: do cats purr\n\n"
                                   "Passage: one two three four five six seven eight nine ten eleven twelve\nQuestion:")
    assert prompts["claim"] == "Passage: one two three four five six seven eight nine ten eleven twelve\nClaim:"
    assert [BOOK.type_of(j) for j in range(5)] == ["question", "claim", "question", "claim", "question"]


def test_template_problems_name_their_key():
    problems = check_templates(["question", "title"], {"question": "{examples} {text}"}, "{passage}")
    assert problems == ["templates.question: has no {passage} field",
                        "templates.question: unknown field(s) ['text'] (only {examples} and {passage})",
                        "templates: no template for query type 'title'",
                        "example_template: needs exactly the fields {passage} and {query}, has ['passage']"]


# -- the generator ---------------------------------------------------------------------------------------
def test_generation_is_a_function_of_the_seed_and_both_decoding_loops_agree(tiny_gpt2):
    from qac.llm_queries.causal_lm import CausalQueryGenerator

    model, tokenizer = tiny_gpt2
    first, stats = CausalQueryGenerator(model, tokenizer, settings()).generate(PASSAGES, 3)
    again, _ = CausalQueryGenerator(model, tokenizer, settings()).generate(PASSAGES, 3)
    static, _ = CausalQueryGenerator(model, tokenizer, settings(), decode="static", sync_every=3).generate(PASSAGES, 3)
    other, _ = CausalQueryGenerator(model, tokenizer, settings(seed=8)).generate(PASSAGES, 3)
    assert first == again == static and first != other
    assert stats.passages == len(PASSAGES) and stats.candidates == 4 * len(PASSAGES)
    assert stats.queries == sum(map(len, first)) > 0


def test_a_candidate_continues_its_own_prompt_alone(tiny_gpt2):
    """Candidate j reads the prompt of its type: decoded with that prompt alone (no sharing, no batch), its
    first token is the one the batch chose."""
    import torch

    from qac.llm_queries.causal_lm import CausalQueryGenerator
    from qac.querygen.sampling import choose_tokens, passage_uniforms

    model, tokenizer = tiny_gpt2
    generator = CausalQueryGenerator(model, tokenizer, settings(drop_duplicates=False, drop_empty=False))
    pid, text = PASSAGES[2]
    raw, _ = generator.generate_batch([pid], [generator.prompt_ids(text)])
    uniforms = passage_uniforms(7, pid, 4, 6)
    for j, kind in enumerate(["question", "claim", "question", "claim"]):
        ids = tokenizer(BOOK.prompts(text, tokenizer)[kind], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[:, -1].float()
        token = choose_tokens(logits, uniforms[j:j + 1, 0], 25, 0.95)
        assert raw[0][j].split()[0] == tokenizer.decode(token).split()[0]


def test_a_query_ends_at_a_line_break(tiny_gpt2):
    from qac.llm_queries.causal_lm import stop_token_ids

    _, tokenizer = tiny_gpt2
    assert stop_token_ids(tokenizer, 102) == [102]        # the MiniLM vocabulary holds no line break

    class Lines:
        def get_vocab(self):
            return {"a": 0, "Ċ": 1, "bĊ": 2, "c": 3}

        def convert_tokens_to_string(self, tokens):
            return "".join(tokens).replace("Ċ", "\n")

    assert stop_token_ids(Lines(), 3) == [1, 2, 3]


# -- the stage ------------------------------------------------------------------------------------------
def make_project(root: Path, n_passages: int = 10, **generation) -> Path:
    from qac.config import render_profile

    params = render_profile("smoke")
    params["data_dir"] = str(root / "data")
    params["llm_queries"]["generators"] = {"tiny": {"model": "tiny:minilm", "revision": None}}
    params["llm_queries"]["generation"].update(dict(shots=0, queries_per_passage=3, max_new_tokens=6, batch_size=3,
                                                    chunk_size=3, passage_tokens=24), **generation)
    data = root / "data" / "smoke"
    data.mkdir(parents=True)
    from qac.models.loading import load_tokenizer

    # With token ids, as split_passages writes them: the queries get theirs from the same tokenizer.
    write_passages(data / "passages.arrow", passage_records(n_passages), tokenizer=load_tokenizer("minilm"),
                   tokenizer_name="minilm")
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    return root / "params.yaml"


def run_generation(params_path: Path, monkeypatch, *args: str) -> Path:
    run_stage_main("generate_llm_queries", params_path, monkeypatch, "--generator", "tiny", *args)
    return params_path.parent / "data" / "smoke" / "llm_queries" / "tiny" / "queries.arrow"


def test_the_stage_records_prompts_and_resumes_byte_identical_after_a_kill(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(tmp_path / "mlflow.db"))
    reference = run_generation(make_project(tmp_path / "reference"), monkeypatch)
    records = arrow_records(reference.read_bytes())
    assert [r["pid"] for r in records] == [p["pid"] for p in passage_records(10)]
    prompts = json.loads((reference.parent / "prompts.json").read_text())
    assert prompts["model"] == "tiny:minilm" and prompts["prompts"]["query_types"] == ["question", "claim", "keywords"]
    assert "{passage}" in prompts["prompts"]["templates"]["claim"] and prompts["prompts"]["examples"] == []

    params = make_project(tmp_path / "killed")
    work = params.parent / "data" / "smoke" / "llm_queries" / "tiny" / ".queries.work"
    process = subprocess.Popen([str(PYTHON), str(REPO / "pipelines" / "generate_llm_queries.py"), "--generator", "tiny"],
                               cwd=params.parent, env=subprocess_env(params, empty_store(tmp_path / "killed.db")),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None and len(list(work.glob("*/chunks/*.json"))) < 2:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    committed = len(list(work.glob("*/chunks/*.json")))
    assert 1 <= committed < 4, "the kill came before the run ended"
    assert run_generation(params, monkeypatch).read_bytes() == reference.read_bytes()


def test_the_batch_size_is_part_of_the_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(tmp_path / "mlflow.db"))
    params = make_project(tmp_path)
    run_generation(params, monkeypatch, "--shard", "0/2")
    manifests = list((params.parent / "data/smoke/llm_queries/tiny/.queries.work").glob("*/manifest.json"))
    assert json.loads(manifests[0].read_text())["compute"]["batch_size"] == 3


# -- filters ------------------------------------------------------------------------------------------
def test_copied_share_is_the_longest_run_copied_over_the_query_length():
    passage = "The coral reefs bleach when the water warms by two degrees."
    assert copied_share("coral reefs bleach when the water warms", passage) == 1.0
    assert copied_share("why do coral reefs bleach", passage) == 3 / 5      # "coral reefs bleach"
    assert copied_share("ocean heat", passage) == 0.0
    assert copied_share("", passage) == 0.0


def test_round_trip_keeps_a_query_whose_passage_is_in_its_top_k():
    records = [QueryRecord(0, "a"), QueryRecord(1, "b"), QueryRecord(2, "c")]
    assert round_trip_mask([[0, 2], [0, 2], []], records) == [True, False, False]


def test_relevance_keeps_the_best_scored_share_with_earlier_queries_winning_ties():
    scores = [0.2, 0.9, 0.5, 0.5, 0.1]
    assert best_share_mask(scores, 0.4) == [False, True, True, False, False]     # ceil(2.0) = 2 best
    assert best_share_mask(scores, 0.5) == [False, True, True, True, False]      # ceil(2.5) = 3
    assert best_share_mask(scores, 1.0) == [True] * 5 and best_share_mask(scores, 0.0) == [False] * 5
    with pytest.raises(ValueError, match="keep_share"):
        best_share_mask(scores, 1.5)


def test_filters_run_in_order_and_report_each_kept_share():
    passages = ["coral reefs bleach in warm water", "tax policy shapes household savings",
                "neural spikes encode timing information"]
    queries = [["coral reefs bleach in warm water", "why do reefs bleach", "tax savings"],
               ["household tax policy", "spike timing"],
               ["how do neurons encode timing", "coral"]]
    filters = FilterSettings(max_copied_share=0.8, round_trip=True, round_trip_retriever="bm25",
                             round_trip_depth=1, relevance=True, relevance_scorer="bm25", keep_share=0.5)
    index = Bm25Passages(passages)
    kept, figures = apply_filters(queries, passages, filters, lambda kind: index)
    # copies: the first query is the passage itself (6 of 6 words); 6 of 7 pass.
    # round trip at depth 1: "tax savings" (passage 1), "spike timing" (passage 2) and "coral" (passage 0) miss;
    # 3 of 6 pass. Relevance keeps ceil(0.5 * 3) = 2 of the 3 by BM25 against their own passage.
    assert figures["queries_before"] == 7 and figures["kept_share/copies"] == 6 / 7
    assert figures["kept_share/round_trip"] == 3 / 6 and figures["kept_share/relevance"] == 2 / 3
    assert figures["queries_after"] == 2 and figures["kept_share"] == 2 / 7
    survivors = {"why do reefs bleach", "household tax policy", "how do neurons encode timing"}
    assert all(set(texts) <= survivors for texts in kept) and sum(map(len, kept)) == 2
    assert figures["passages_without_query"] == 3 - sum(1 for texts in kept if texts)


def test_the_llm_variant_runs_from_generation_through_filtering_to_pre_training(tmp_path, monkeypatch):
    """The switch on, end to end with a tiny GPT-2: queries, the filter's kept shares, and a pre-training
    variant on those queries that every reader of pretrain.variants sees."""
    from qac.params import load_params

    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(tmp_path / "mlflow.db"))
    params_path = make_project(tmp_path)
    params = yaml.safe_load(params_path.read_text())
    params["llm_queries"]["filter"].update(judge_passages=0, round_trip_depth=3)
    params["llm_queries"]["variants"] = {"cocondenser-llm": {"method": "cocondenser", "context_type": "query",
                                                             "query_count": 3, "generator": "tiny", "filtered": False}}
    params_path.write_text(yaml.safe_dump(params), encoding="utf-8")
    raw = run_generation(params_path, monkeypatch)
    run_stage_main("filter_llm_queries", params_path, monkeypatch, "--generator", "tiny")
    figures = json.loads((raw.parent / "metrics" / "filter.json").read_text())
    before = sum(len(r["queries"]) for r in arrow_records(raw.read_bytes()))
    after = sum(len(r["queries"]) for r in arrow_records((raw.parent / "filtered.arrow").read_bytes()))
    assert figures["queries_before"] == before and figures["queries_after"] == after
    assert figures["kept_share"] == pytest.approx(after / before)
    assert {"kept_share/copies", "kept_share/round_trip"} <= set(figures)

    assert "cocondenser-llm" in load_params(params_path).pretrain.variants      # a variant for every reader
    run_stage_main_none("pretrain_llm", params_path, monkeypatch, "--variant", "cocondenser-llm")
    encoder = params_path.parent / "data" / "smoke" / "pretrain" / "cocondenser-llm" / "encoder"
    assert (encoder / "config.json").is_file()


def run_stage_main_none(name: str, params_path: Path, monkeypatch, *args: str) -> None:
    """Run a stage whose ``main`` returns nothing (pretrain's shape)."""
    from stages import load_stage

    monkeypatch.setenv("QAC_PARAMS", str(params_path))
    load_stage(name).main(list(args))


# -- the round trip through the start encoder ------------------------------------------------------------------
class UnitVectors:
    """An encoder stand-in: each text's embedding is given by hand (as the start encoder's, unit length)."""

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors = vectors

    def embed(self, texts):
        import torch

        vectors = torch.tensor([self.vectors[t] for t in texts], dtype=torch.float32)
        return torch.nn.functional.normalize(vectors, dim=-1)


def test_the_encoder_round_trip_ranks_by_cosine_and_breaks_ties_by_passage_index():
    from qac.llm_queries.filtering import EncoderPassages

    passages = ["p0", "p1", "p2"]
    encoder = UnitVectors({"p0": [1, 0, 0], "p1": [1, 0, 0], "p2": [0, 1, 0],     # p0 and p1 point the same way
                           "q-p0": [1, 0.1, 0], "q-p1": [1, 0.1, 0], "q-p2": [0.6, 0.8, 0], "q-none": [0, 0, 1]})
    index = EncoderPassages(passages, encoder)
    # cosines of q-p2: p0 and p1 0.6, p2 0.8; of q-none: 0 with every passage, so the index order decides
    assert index.ranked(["q-p0", "q-p1", "q-p2", "q-none"], 2) == [[0, 1], [0, 1], [2, 0], [0, 1]]
    records = [QueryRecord(0, "q-p0"), QueryRecord(1, "q-p1"), QueryRecord(2, "q-p2"), QueryRecord(2, "q-none")]
    # depth 1: q-p1's passage ties with p0 and loses on the index; q-none ranks p0 first
    assert round_trip_mask(index.ranked([r.text for r in records], 1), records) == [True, False, True, False]
    assert index.scores(records) == pytest.approx([1 / 1.01 ** 0.5, 1 / 1.01 ** 0.5, 0.8, 0.0])


def test_the_start_encoder_keeps_a_paraphrase_that_bm25_drops():
    """The round trip with the start encoder (MiniLM, as filter_llm_queries builds it): a query sharing no
    word with its passage finds it by meaning; BM25 finds nothing for it and drops it."""
    from qac.evaluation.annotation import EncoderCosineJudge
    from qac.llm_queries.filtering import EncoderPassages

    passages = ["Coral reefs lose their colour when sea temperatures climb for weeks.",
                "Higher income taxes reduce how much households put aside each month.",
                "Neurons signal information through the precise timing of their spikes."]
    queries = [["marine heatwaves whiten corals"], ["fiscal policy and family savings"], ["spike timing codes"]]
    filters = FilterSettings(max_copied_share=1.0, round_trip=True, round_trip_retriever="encoder",
                             round_trip_depth=1, relevance=False, relevance_scorer="encoder", keep_share=1.0)
    encoder = EncoderPassages(passages, EncoderCosineJudge("minilm", max_length=64))
    kept, figures = apply_filters(queries, passages, filters, lambda kind: {"encoder": encoder}[kind])
    assert kept == queries and figures["kept_share/round_trip"] == 1.0
    bm25 = Bm25Passages(passages)
    lexical_filters = FilterSettings(**{**filters.__dict__, "round_trip_retriever": "bm25"})
    _, lexical = apply_filters(queries, passages, lexical_filters, lambda kind: {"bm25": bm25}[kind])
    # BM25 (no stemmer) matches words: the first two queries share none with any passage ("corals" is not
    # "coral"); "spike timing codes" shares "timing" with its own passage only
    assert lexical["queries_after"] == 1 and lexical["kept_share/round_trip"] == 1 / 3


def test_rouge_against_claims_scores_each_query_against_its_documents_best_real_query(monkeypatch, tmp_path):
    """By hand: passage d1#0 has real queries 'a b c' and 'x y'; d2#0 has none (not counted)."""
    import qac.querygen.generator_pairs as generator_pairs
    from dvc_study import study_params
    from qac.querygen.generator_pairs import Pair
    from qac.querygen.quality import rouge_l_scores
    from qac.stages.filter_llm_queries import rouge_against_claims

    pairs = [Pair("passage one", "a b c", "query", "set", "d1"), Pair("passage one", "x y", "query", "set", "d1"),
             Pair("passage one", "title", "title", "set", "d1")]
    monkeypatch.setattr(generator_pairs, "build_pairs", lambda *args: pairs)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "smoke" / "datasets" / "scifact").mkdir(parents=True)
    params = study_params()                   # train_dataset: scifact
    before = [["a b c", "x y z"], ["q r"]]
    after = [["x y z"], []]
    figures = rouge_against_claims(params, ["d1#0", "d2#0"], before, after)
    xyz = max(rouge_l_scores(["x y z", "x y z"], ["a b c", "x y"]))
    assert xyz == pytest.approx(0.8)          # 2 of 3 words against 2 of 2: F = 2 * (2/3 * 1) / (2/3 + 1)
    assert figures["rougeL/passages"] == 1
    assert figures["rougeL/before"] == pytest.approx((1.0 + xyz) / 2) and figures["rougeL/queries/before"] == 2
    assert figures["rougeL/after"] == pytest.approx(xyz) and figures["rougeL/queries/after"] == 1
    assert rouge_against_claims(params, ["d3#0"], [["a"]], [["a"]]) == {}
