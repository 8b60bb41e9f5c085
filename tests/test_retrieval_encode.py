"""Dense encoding: length sorting must not change results, pooling, sharding across ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qac.retrieval.encode import encode_distributed, encode_texts, shard_bounds

TEXTS = ["a short one", "a much longer text about retrieval with many more words than the others in here",
         "medium length text about cats", "x", "another sentence of moderate size for the encoder"]


@pytest.fixture(scope="module")
def tiny():
    from qac.models.loading import load_model, load_tokenizer

    return load_model("tiny:minilm", seed=0).eval(), load_tokenizer("minilm")


def reference_embedding(model, tokenizer, text, pooling):
    """One text at a time, no padding at all: the ground truth."""
    batch = tokenizer([text], return_tensors="pt", truncation=True, max_length=32)
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state[0]
    return (hidden[0] if pooling == "cls" else hidden.mean(dim=0)).numpy()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_batched_length_sorted_encoding_equals_one_by_one(tiny, pooling):
    model, tokenizer = tiny
    embeddings = encode_texts(model, tokenizer, TEXTS, max_length=32, batch_size=2, pooling=pooling)
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(TEXTS), model.config.hidden_size)
    for row, text in zip(embeddings, TEXTS):
        np.testing.assert_allclose(row, reference_embedding(model, tokenizer, text, pooling), atol=1e-5)


def test_sorting_does_not_change_embeddings_or_order(tiny):
    model, tokenizer = tiny
    sorted_ = encode_texts(model, tokenizer, TEXTS, max_length=32, batch_size=2)
    unsorted = encode_texts(model, tokenizer, TEXTS, max_length=32, batch_size=2, sort_by_length=False)
    np.testing.assert_allclose(sorted_, unsorted, atol=1e-5)


def test_cls_and_mean_pooling_differ(tiny):
    model, tokenizer = tiny
    cls = encode_texts(model, tokenizer, TEXTS, max_length=32, pooling="cls")
    mean = encode_texts(model, tokenizer, TEXTS, max_length=32, pooling="mean")
    assert not np.allclose(cls, mean)


def test_empty_input_and_bad_pooling(tiny):
    model, tokenizer = tiny
    assert encode_texts(model, tokenizer, [], max_length=8).shape == (0, model.config.hidden_size)
    with pytest.raises(ValueError, match="pooling"):
        encode_texts(model, tokenizer, TEXTS, max_length=8, pooling="max")


def test_shards_cover_every_item_once():
    for n, world in [(10, 3), (2, 4), (0, 2), (7, 1)]:
        bounds = [shard_bounds(n, rank, world) for rank in range(world)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert max(e - s for s, e in bounds) - min(e - s for s, e in bounds) <= 1


def _encode_on_rank(rank, world_size, init_file, out_file):
    import torch.distributed as dist

    from qac.distributed import DistContext
    from qac.models.loading import load_model, load_tokenizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    ctx = DistContext(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"))
    result = encode_distributed(load_model("tiny:minilm", seed=0), load_tokenizer("minilm"), TEXTS, ctx,
                                max_length=32, batch_size=2)
    if rank == 0:
        np.save(out_file, result)
    else:
        assert result is None
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_gather_the_same_embeddings_in_order(tiny, tmp_path):
    model, tokenizer = tiny
    out_file = tmp_path / "gathered.npy"
    torch.multiprocessing.spawn(_encode_on_rank, args=(2, str(tmp_path / "init"), str(out_file)), nprocs=2)
    expected = encode_texts(model, tokenizer, TEXTS, max_length=32, batch_size=2)
    np.testing.assert_allclose(np.load(out_file), expected, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_autocast_on_gpu_stays_close_to_fp32(tiny):
    model, tokenizer = tiny
    reference = encode_texts(model, tokenizer, TEXTS, max_length=32, dtype="fp32")
    gpu_model = model.to("cuda")
    try:
        mixed = encode_texts(gpu_model, tokenizer, TEXTS, max_length=32, dtype="auto")
    finally:
        model.to("cpu")
    assert mixed.dtype == np.float32
    cosine = (mixed * reference).sum(1) / np.linalg.norm(mixed, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.99


def test_explicit_bf16_runs_on_cpu_and_auto_stays_fp32_there(tiny):
    from qac.distributed import autocast_dtype

    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is None and autocast_dtype("fp64", cpu) is None
    assert autocast_dtype("bf16", cpu) is torch.bfloat16 and autocast_dtype("fp16", cpu) is torch.float16
    with pytest.raises(ValueError, match="got 'half'"):
        autocast_dtype("half", cpu)
    model, tokenizer = tiny
    reference = encode_texts(model, tokenizer, TEXTS, max_length=32, dtype="fp32")
    mixed = encode_texts(model, tokenizer, TEXTS, max_length=32, dtype="bf16")
    assert not np.array_equal(mixed, reference)          # bf16 really ran: its 8-bit mantissa shows
    cosine = (mixed * reference).sum(1) / np.linalg.norm(mixed, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.99


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_loader_workers_and_batch_size_do_not_change_embeddings(tiny, pooling):
    """Two worker processes and any batch size give the in-process, one-batch result (order restored)."""
    model, tokenizer = tiny
    texts = TEXTS * 3
    reference = encode_texts(model, tokenizer, texts, max_length=32, batch_size=len(texts), pooling=pooling)
    in_process = encode_texts(model, tokenizer, texts, max_length=32, batch_size=4, pooling=pooling)
    workers = encode_texts(model, tokenizer, texts, max_length=32, batch_size=4, pooling=pooling,
                           loader_workers=2, prefetch_batches=2)
    # The batches are fixed before the loader starts: workers change nothing, bit for bit.
    np.testing.assert_array_equal(workers, in_process)
    # Another batch size pads differently; float32 rounding of values of this scale.
    tolerance = 1e-5 * float(np.abs(reference).max())
    for batch_size in (1, 3, 7):
        other = encode_texts(model, tokenizer, texts, max_length=32, batch_size=batch_size, pooling=pooling,
                             loader_workers=2)
        np.testing.assert_allclose(other, reference, rtol=0, atol=tolerance)
    for row, text in zip(workers, texts):
        np.testing.assert_allclose(row, reference_embedding(model, tokenizer, text, pooling), rtol=0, atol=tolerance)


def test_stored_ids_through_workers_equal_tokenised_texts(tiny):
    model, tokenizer = tiny
    stored = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    from_texts = encode_texts(model, tokenizer, TEXTS, max_length=32, batch_size=2)
    from_ids = encode_texts(model, tokenizer, TEXTS, max_length=32, batch_size=2, token_ids=stored, loader_workers=2)
    np.testing.assert_array_equal(from_ids, from_texts)


def test_bad_loader_settings(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="loader_workers"):
        encode_texts(model, tokenizer, TEXTS, max_length=8, loader_workers=-1)
    with pytest.raises(ValueError, match="prefetch_batches"):
        encode_texts(model, tokenizer, TEXTS, max_length=8, prefetch_batches=0)
