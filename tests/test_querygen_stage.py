"""The generate_queries stage: schema, MLflow, and byte-identical output across shards, batch
sizes, torchrun and a kill -9 in the middle of a run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from mlflow_stores import empty_store
from qac.data.arrowstore import write_passages
from stages import (REPO, arrow_records, kill_after_chunks, passage_records, run_stage_main, run_torchrun,
                    subprocess_env)  # noqa: F401  (subprocess_env: test_multinode's)

STAGE = REPO / "pipelines" / "generate_queries.py"   # test_multinode runs it on two nodes


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory) -> Path:
    """A saved tiny T5 (1 layer, width 32) with the MiniLM tokenizer: pad 0 starts, [SEP] 102 ends."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from qac.models.loading import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-t5")
    config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
                      num_heads=4, pad_token_id=0, eos_token_id=102, decoder_start_token_id=0)
    torch.manual_seed(0)
    T5ForConditionalGeneration(config).save_pretrained(path)
    load_tokenizer("minilm").save_pretrained(path)
    return path


def make_project(root: Path, t5_dir: Path, n_passages: int = 14, **querygen) -> Path:
    """A params file whose profile directory holds passages.arrow and the generator."""
    from qac.config import render_profile

    params = render_profile("smoke")
    params["data_dir"] = str(root / "data")
    params["querygen"].update(dict(queries_per_passage=3, max_new_tokens=8, max_source_len=40, batch_size=4,
                                   chunk_size=3), **querygen)
    # Pre-training variants can draw on at most the 3 queries generated per passage (the schema checks it).
    params["pretrain"]["variants"] = {"none": {"method": "none"},
                                      "cocondenser-query-q3": {"method": "cocondenser", "context_type": "query",
                                                               "query_count": 3}}
    params["hpo"].update(variant="cocondenser-query-q3")
    params["hpo"]["space"]["pretrain.query_count"] = {"type": "int", "low": 1, "high": 3}
    data = root / "data" / "smoke"
    data.mkdir(parents=True)
    write_passages(data / "passages.arrow", passage_records(n_passages))
    shutil.copytree(t5_dir, data / "generator")
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    return root / "params.yaml"


def run_stage(params_path: Path, monkeypatch, *args: str) -> Path:
    run_stage_main("generate_queries", params_path, monkeypatch, *args)
    return params_path.parent / "data" / "smoke" / "queries.arrow"


def set_querygen(params_path: Path, **values) -> None:
    params = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    params["querygen"].update(values)
    params_path.write_text(yaml.safe_dump(params), encoding="utf-8")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, t5_dir) -> bytes:
    """queries.arrow of one uninterrupted single-process run of the default test project."""
    root = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", empty_store(root / "mlflow.db"))
        return run_stage(make_project(root, t5_dir), patch).read_bytes()


def test_stage_writes_queries_metrics_and_mlflow_run(tmp_path, t5_dir, monkeypatch, mlflow_store):
    import mlflow

    params = make_project(tmp_path, t5_dir)
    output = run_stage(params, monkeypatch)
    pids = [record["pid"] for record in passage_records(14)]
    records = arrow_records(output.read_bytes())
    assert [r["pid"] for r in records] == pids
    assert all(set(r) == {"pid", "queries"} and 1 <= len(r["queries"]) <= 3 for r in records)
    assert not (output.parent / ".queries.work").exists()   # the work directory is cleaned up

    metrics = json.loads((output.parent / "metrics" / "queries.json").read_text())
    assert metrics["passages"] == len(pids) and metrics["candidates"] == 3 * len(pids)
    assert metrics["queries"] == sum(len(r["queries"]) for r in records)
    assert "mlflow_run_id" not in metrics                # bookkeeping: in the run record, not in a metrics file
    mlflow.set_tracking_uri(mlflow_store)
    record = json.loads((output.parent / ".runs" / "queries.arrow" / "mlflow_run.json").read_text())
    run = mlflow.get_run(record["run_id"])
    assert run.info.run_name == "generate_queries" and run.data.tags["qac.kind"] == "querygen"
    # The run covers generation: it lasts at least as long as generating took.
    timing = json.loads((output.parent / "metrics" / "timing" / "queries.json").read_text())
    assert "passages_per_second" not in metrics         # wall-clock figures live apart from results
    generation_ms = 1000 * metrics["passages"] / timing["passages_per_second"]
    assert run.info.end_time - run.info.start_time >= generation_ms
    for key in ("unique_ratio", "mean_query_words", "empty_candidates", "dropped_duplicates", "passages_per_second"):
        assert key in run.data.metrics
    assert run.data.params["top_p"] == "0.95" and run.data.params["queries_per_passage"] == "3"


def test_batch_size_and_shards_give_identical_bytes(tmp_path, t5_dir, monkeypatch, mlflow_store, reference):
    params = make_project(tmp_path / "batch", t5_dir, batch_size=1)
    assert run_stage(params, monkeypatch).read_bytes() == reference

    params = make_project(tmp_path / "shards", t5_dir)
    run_stage(params, monkeypatch, "--shard", "1/2")
    output = params.parent / "data" / "smoke" / "queries.arrow"
    assert not output.exists()
    with pytest.raises(RuntimeError, match="chunks not generated yet"):
        run_stage(params, monkeypatch, "--merge-only")
    assert not output.exists()
    run_stage(params, monkeypatch, "--shard", "0/2")
    assert run_stage(params, monkeypatch, "--merge-only").read_bytes() == reference


def test_max_passages_gives_a_prefix_of_the_full_output(tmp_path, t5_dir, monkeypatch, mlflow_store, reference):
    params = make_project(tmp_path, t5_dir, max_passages=5)
    assert arrow_records(run_stage(params, monkeypatch).read_bytes()) == arrow_records(reference)[:5]


def test_changed_settings_do_not_reuse_stale_chunks(tmp_path, t5_dir, monkeypatch, mlflow_store):
    params = make_project(tmp_path / "changed", t5_dir, top_k=1)
    run_stage(params, monkeypatch, "--shard", "0/2")     # commits chunks 0, 2, 4 with top_k = 1
    set_querygen(params, top_k=25)
    changed = run_stage(params, monkeypatch).read_bytes()
    fresh = run_stage(make_project(tmp_path / "fresh", t5_dir, top_k=25), monkeypatch).read_bytes()
    assert changed == fresh


def test_damaged_chunk_markers_and_manifest_are_written_again(tmp_path, t5_dir, monkeypatch, mlflow_store,
                                                             reference):
    """A marker or manifest that cannot be read (a disk fault, a copy cut short) is not trusted: the chunk is
    generated again, and the output is the uninterrupted run's, byte for byte."""
    params = make_project(tmp_path, t5_dir)
    run_stage(params, monkeypatch, "--shard", "0/2")          # commits chunks 0, 2 and 4
    work = params.parent / "data" / "smoke" / ".queries.work"
    markers = sorted(work.glob("*/chunks/*.json"))
    assert len(markers) == 3
    markers[0].write_bytes(b"\xff{ damaged")
    markers[1].write_text("[1, 2]")                            # JSON, but not a marker
    (markers[0].parent.parent / "manifest.json").write_text('{"fingerprint": ')
    assert run_stage(params, monkeypatch).read_bytes() == reference


@pytest.mark.slow
def test_torchrun_two_processes_match_a_single_process(tmp_path, t5_dir, reference, mlflow_store):
    params = make_project(tmp_path, t5_dir)
    run_torchrun("generate_queries", params, mlflow_store)
    assert (tmp_path / "data" / "smoke" / "queries.arrow").read_bytes() == reference


@pytest.mark.slow
def test_kill_nine_then_rerun_is_byte_identical(tmp_path, t5_dir, monkeypatch, mlflow_store):
    # Long enough that the run is still going when two chunks are committed.
    settings = dict(max_new_tokens=16, chunk_size=2, batch_size=2)
    params = make_project(tmp_path / "killed", t5_dir, n_passages=24, **settings)
    data = params.parent / "data" / "smoke"
    committed = kill_after_chunks("generate_queries", params, mlflow_store, data / ".queries.work")
    assert 2 <= committed < 12, "the run must be killed between chunks"
    assert not (data / "queries.arrow").exists()

    resumed = run_stage(params, monkeypatch).read_bytes()
    uninterrupted = run_stage(make_project(tmp_path / "whole", t5_dir, n_passages=24, **settings), monkeypatch)
    assert resumed == uninterrupted.read_bytes()


def test_a_passages_file_without_texts_names_file_and_field(tmp_path, t5_dir, monkeypatch, mlflow_store):
    import pyarrow as pa

    params = make_project(tmp_path, t5_dir)
    passages = params.parent / "data" / "smoke" / "passages.arrow"
    table = pa.Table.from_pylist([{"pid": "d0#0", "doc_id": "d0"}])
    with pa.OSFile(str(passages), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ValueError, match=r"passages.arrow: field 'position': column missing"):
        run_stage(params, monkeypatch)
    assert not (passages.parent / "queries.arrow").exists()
