"""How a retriever folder says it encodes: the sentence-transformers layout, written and read.

A fine-tuned retriever is saved as a Hugging Face encoder folder (weights,
config, tokenizer) that is also a sentence-transformers model folder, so any
tool of the field (``SentenceTransformer(path)``, MTEB, BEIR, a vector
database) loads it as it is and gets our vectors:

- ``modules.json``: Transformer, then Pooling, then Normalize when the
  retriever scores by cosine;
- ``sentence_bert_config.json``: ``query_length`` and ``document_length``, the
  tokens ``encode_query`` and ``encode_document`` keep (queries are cut shorter
  than documents; sentence-transformers 6 reads both), ``max_seq_length`` (a
  document's length, what a plain ``encode`` and older versions keep), and
  ``model_args`` with ``add_pooling_layer: false`` where the encoder's class
  has a pooler that the retriever never used (it was dropped before training:
  loading it back would report "newly initialized" weights that no vector
  goes through);
- ``1_Pooling/config.json``: [CLS] or masked mean;
- ``config_sentence_transformers.json``: the similarity (dot or cosine).

What sentence-transformers has no place for goes into ``retriever.json``: the
text put between a document's title and its body. The evaluation reads all of
it back (:func:`read_encoding`) instead of the fine-tuning parameters; a folder
written before the per-side lengths keeps its query length in ``retriever.json``,
where it is still read.

No library version is written into these files, so the same weights give the
same folder whatever is installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from qac.params.vocabulary import POOLINGS   # a text's vector: its [CLS] token state, or the attention-masked mean

RETRIEVER_FILE = "retriever.json"
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class Encoding:
    """How a retriever turns queries and documents into vectors."""

    pooling: str
    normalize: bool
    query_max_len: int
    passage_max_len: int
    title_separator: str = " "

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {', '.join(POOLINGS)}")


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def encoder_arguments(encoder) -> dict:
    """What ``from_pretrained`` needs to build ``encoder`` as it was saved: ``add_pooling_layer=False``
    for a model class with a pooler (BERT, RoBERTa, ...) whose pooler was dropped, else nothing."""
    import inspect

    accepts = "add_pooling_layer" in inspect.signature(type(encoder).__init__).parameters
    return {"add_pooling_layer": False} if accepts and getattr(encoder, "pooler", None) is None else {}


def write_encoding(folder: str | Path, encoding: Encoding, dimension: int, model_args: dict | None = None) -> None:
    """Write the sentence-transformers files and ``retriever.json`` beside the encoder in ``folder``;
    ``model_args`` (:func:`encoder_arguments`) go to ``from_pretrained`` when the folder is loaded."""
    folder = Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _POOLING}]
    if encoding.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _NORMALIZE})
        (folder / "2_Normalize").mkdir(parents=True, exist_ok=True)
    _write_json(folder / "modules.json", modules)
    _write_json(folder / "sentence_bert_config.json",
                {"max_seq_length": encoding.passage_max_len, "query_length": encoding.query_max_len,
                 "document_length": encoding.passage_max_len, "do_lower_case": False,
                 **({"model_args": model_args} if model_args else {})})
    _write_json(folder / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dimension,
        "pooling_mode_cls_token": encoding.pooling == "cls",
        "pooling_mode_mean_tokens": encoding.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    })
    _write_json(folder / "config_sentence_transformers.json",
                {"prompts": {}, "default_prompt_name": None,
                 "similarity_fn_name": "cosine" if encoding.normalize else "dot"})
    _write_json(folder / RETRIEVER_FILE, {"title_separator": encoding.title_separator})


def read_encoding(folder: str | Path) -> Encoding | None:
    """The encoding a retriever folder declares; None for a folder without one (a plain encoder)."""
    folder = Path(folder)
    if not (folder / "modules.json").is_file() or not (folder / RETRIEVER_FILE).is_file():
        return None
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    lengths = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8"))
    own = json.loads((folder / RETRIEVER_FILE).read_text(encoding="utf-8"))
    modes = [mode for mode in POOLINGS if pooling.get(f"pooling_mode_{'cls_token' if mode == 'cls' else mode + '_tokens'}")]
    if len(modes) != 1:
        raise ValueError(f"{folder / '1_Pooling' / 'config.json'}: pools by none or several of "
                         f"{', '.join(POOLINGS)}; qac reads exactly one")
    query_max_len = lengths.get("query_length", own.get("query_max_len"))
    return Encoding(pooling=modes[0], normalize=any(module["type"] == _NORMALIZE for module in modules),
                    query_max_len=int(query_max_len),
                    passage_max_len=int(lengths.get("document_length", lengths["max_seq_length"])),
                    title_separator=own.get("title_separator", " "))


def loading_arguments(folder: str | Path) -> dict:
    """The ``from_pretrained`` arguments a retriever folder declares (``model_args``), so that qac loads
    it as sentence-transformers does; none for a plain encoder folder."""
    config = Path(folder) / "sentence_bert_config.json"
    if not config.is_file():
        return {}
    return dict(json.loads(config.read_text(encoding="utf-8")).get("model_args") or {})
