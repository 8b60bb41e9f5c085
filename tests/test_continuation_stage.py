"""The generate_continuations stage (MASTER's GOR texts): a causal LM loaded from a saved folder,
its quality figures, and byte-identical output across shards, torchrun and a kill -9."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mlflow_stores import empty_store
from qac.data.arrowstore import PASSAGES_TOKENS_SCHEMA, QUERIES_TOKENS_SCHEMA, iter_records, open_mapped, write_passages
from qac.data.tokens import TextEncoder, TokenizerStamp
from qac.models.loading import load_tokenizer
from qac.querygen.continuation import (ContinuationGenerator, continuation_quality,
                                       distinct_n, load_causal_lm, tiny_causal_lm)
from qac.querygen.generate import GenerationStats
from stages import arrow_records, kill_after_chunks, passage_records, run_stage_main, run_torchrun
from base_settings import continuation_settings


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    """A tiny GPT-2 (2 layers, width 64, MiniLM's vocabulary) built from a config and saved as a local folder."""
    path = tmp_path_factory.mktemp("tiny-gpt2")
    model, tokenizer = tiny_causal_lm("minilm", seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_project(root: Path, gpt2_dir: Path, n_passages: int = 14, tokenizer: str | None = None,
                 **continuation) -> Path:
    from qac.config import render_profile

    params = render_profile("smoke")
    params["data_dir"] = str(root / "data")
    params["continuation"].update(dict(model=str(gpt2_dir), max_new_tokens=8, max_source_len=40, batch_size=4,
                                       chunk_size=3), **continuation)
    data = root / "data" / "smoke"
    data.mkdir(parents=True)
    write_passages(data / "passages.arrow", passage_records(n_passages),
                   tokenizer=load_tokenizer(tokenizer) if tokenizer else None, tokenizer_name=tokenizer)
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    return root / "params.yaml"


def run_stage(params_path: Path, monkeypatch, *args: str) -> Path:
    run_stage_main("generate_continuations", params_path, monkeypatch, *args)
    return params_path.parent / "data" / "smoke" / "continuations.arrow"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, gpt2_dir) -> bytes:
    root = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", empty_store(root / "mlflow.db"))
        return run_stage(make_project(root, gpt2_dir), patch).read_bytes()


def test_distinct_n_and_shares_by_hand():
    texts = ["a b a b", "a b c", "", "a b c"]
    # unigrams of the non-empty texts: a b a b a b c a b c -> 3 distinct of 10
    assert distinct_n([t for t in texts if t], 1) == pytest.approx(3 / 10)
    # bigrams: ab ba ab | ab bc | ab bc -> {ab, ba, bc} of 7
    assert distinct_n([t for t in texts if t], 2) == pytest.approx(3 / 7)
    quality = continuation_quality(texts, GenerationStats(tokens=20))
    assert quality["empty_share"] == 0.25 and quality["duplicate_share"] == 0.25
    assert quality["mean_words"] == pytest.approx(10 / 4) and quality["mean_tokens"] == 5.0


def test_saved_folder_loads_through_the_hub_code_and_generates_per_passage(gpt2_dir):
    model, tokenizer = load_causal_lm(str(gpt2_dir))
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.n_layer == 2
    settings = continuation_settings(model=str(gpt2_dir), max_new_tokens=6, max_source_len=12, seed=42)
    generator = ContinuationGenerator(model, tokenizer, settings)
    passages = [(r["pid"], r["text"]) for r in passage_records(5)]
    together, stats = generator.generate(passages, batch_size=5)
    assert len(together) == 5 and all(len(texts) == 1 for texts in together)
    assert stats.passages == 5 and stats.tokens <= 5 * 6
    # the same batch decodes alike (each passage samples from its own stream)
    assert generator.generate(passages, batch_size=5)[0] == together
    # the LM reads the passage's end: only the last max_source_len tokens
    long_text = "word " * 100 + "end"
    assert len(generator.encode([long_text])[0]) == 12


def test_stage_writes_continuations_and_quality_metrics(tmp_path, gpt2_dir, monkeypatch, mlflow_store):
    output = run_stage(make_project(tmp_path, gpt2_dir), monkeypatch)
    records = arrow_records(output.read_bytes())
    assert [r["pid"] for r in records] == [r["pid"] for r in passage_records(14)]
    assert all(len(r["queries"]) == 1 for r in records)
    assert not (output.parent / ".continuations.work").exists()
    metrics = json.loads((output.parent / "metrics" / "continuations.json").read_text())
    assert metrics["passages"] == 14
    texts = [r["queries"][0] for r in records]
    assert metrics["distinct_1"] == pytest.approx(distinct_n([t for t in texts if t], 1))
    assert set(metrics) >= {"mean_words", "mean_tokens", "distinct_2", "empty_share", "duplicate_share"}
    assert "passages_per_second" not in metrics


def test_continuations_carry_token_ids_stamped_with_the_passages_tokenizer(tmp_path, gpt2_dir, monkeypatch,
                                                                          mlflow_store):
    """The GOR decoder reads the continuation's ids, made by the tokenizer of the passages' ids."""
    output = run_stage(make_project(tmp_path, gpt2_dir, tokenizer="minilm"), monkeypatch)
    passages = output.parent / "passages.arrow"
    stamp = TokenizerStamp.from_schema(open_mapped(output, QUERIES_TOKENS_SCHEMA).table.schema)
    assert stamp == TokenizerStamp.from_schema(open_mapped(passages, PASSAGES_TOKENS_SCHEMA).table.schema)
    assert stamp.name == "minilm"
    records = list(iter_records(output, QUERIES_TOKENS_SCHEMA))
    encode = TextEncoder(load_tokenizer("minilm"))
    assert any(record["queries"][0].strip() for record in records)
    for record in records:
        assert record["query_ids"] == encode(record["queries"])


def test_shards_and_merge_give_identical_bytes(tmp_path, gpt2_dir, monkeypatch, mlflow_store, reference):
    params = make_project(tmp_path, gpt2_dir)
    run_stage(params, monkeypatch, "--shard", "1/2")
    output = params.parent / "data" / "smoke" / "continuations.arrow"
    with pytest.raises(RuntimeError, match="chunks not generated yet"):
        run_stage(params, monkeypatch, "--merge-only")
    assert not output.exists()
    run_stage(params, monkeypatch, "--shard", "0/2")
    assert run_stage(params, monkeypatch, "--merge-only").read_bytes() == reference


def test_bad_setting_is_refused_before_work(tmp_path, gpt2_dir, monkeypatch):
    params = make_project(tmp_path, gpt2_dir, top_p=1.5)
    with pytest.raises(ValueError, match="continuation.top_p"):
        run_stage(params, monkeypatch)
    assert not (tmp_path / "data" / "smoke" / ".continuations.work").exists()


@pytest.mark.slow
def test_torchrun_two_processes_match_a_single_process(tmp_path, gpt2_dir, reference, mlflow_store):
    params = make_project(tmp_path, gpt2_dir)
    run_torchrun("generate_continuations", params, mlflow_store)
    assert (tmp_path / "data" / "smoke" / "continuations.arrow").read_bytes() == reference


@pytest.mark.slow
def test_kill_nine_then_rerun_is_byte_identical(tmp_path, gpt2_dir, monkeypatch, mlflow_store):
    settings = dict(max_new_tokens=48, chunk_size=2, batch_size=2)
    params = make_project(tmp_path / "killed", gpt2_dir, n_passages=24, **settings)
    data = params.parent / "data" / "smoke"
    committed = kill_after_chunks("generate_continuations", params, mlflow_store, data / ".continuations.work")
    assert 2 <= committed < 12, "the run must be killed between chunks"
    assert not (data / "continuations.arrow").exists()
    resumed = run_stage(params, monkeypatch).read_bytes()
    whole = run_stage(make_project(tmp_path / "whole", gpt2_dir, n_passages=24, **settings), monkeypatch)
    assert resumed == whole.read_bytes()
