"""The Punkt sentence splitter: NLTK's pretrained English model, or one trained on the corpus.

The paper splits documents into sentences with NLTK's Punkt. ``split.punkt``
names the model, and nothing falls back from one to the other, so the same
parameters give the same passages on every machine:

- ``pretrained``: NLTK's English parameters (the ``punkt_tab`` data package), as
  the release ran. When they are not installed, NLTK's own downloader fetches
  them (:func:`nltk.download`) before any splitting starts; without a network
  that is a :class:`PunktUnavailableError` naming the command that installs them.
- ``trained``: Punkt's own unsupervised trainer
  (:class:`nltk.tokenize.punkt.PunktTrainer`) learns the parameters from the
  corpus being split: abbreviations, collocations and frequent sentence
  starters. That is what Punkt was designed for (Kiss & Strunk, 2006); its
  English model was trained the same way on newspaper text. Machines that
  cannot download NLTK data run this.

Trained parameters are saved as a stage output in NLTK's ``punkt_tab`` layout
(``abbrev_types.txt``, ``collocations.tab``, ``sent_starters.txt``,
``ortho_context.tab``, lines sorted so equal parameters give equal bytes) plus
``punkt.json`` naming the model and the corpus they were trained on, and are
reused when the same corpus is split again. When the pretrained model runs the
folder holds only ``punkt.json`` saying so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer, PunktTrainer

from qac.io import atomic_path
from qac.params.vocabulary import PUNKT_SOURCES

PRETRAINED = "nltk-pretrained-english"
TRAINED = "trained-on-corpus"
PUNKT_PACKAGE = "punkt_tab"
META_FILE = "punkt.json"
_TRAIN_BATCH_DOCUMENTS = 1000


class PunktUnavailableError(RuntimeError):
    """NLTK's pretrained English Punkt is neither installed nor downloadable."""


def pretrained_english_available() -> bool:
    """Whether NLTK's pretrained English Punkt (``punkt_tab``) is installed."""
    import nltk

    try:
        nltk.data.find(f"tokenizers/{PUNKT_PACKAGE}/english/")
        return True
    except LookupError:
        return False


def download_pretrained_english() -> None:
    """Install NLTK's English Punkt with NLTK's own downloader, or raise :class:`PunktUnavailableError`.

    NLTK writes into the first writable folder of its data path (``NLTK_DATA``,
    ``~/nltk_data``, ...), where every later process finds it. The downloader's
    own progress lines are kept out of the stage's output; its failure reason is
    part of the error.
    """
    import contextlib
    import io

    import nltk

    chatter = io.StringIO()
    reason = None
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            done = nltk.download(PUNKT_PACKAGE, quiet=True, raise_on_error=True)
        if not done:
            reason = "the downloader reported a failure"
    except (OSError, ValueError) as error:
        reason = str(error)
    if reason is None and pretrained_english_available():
        return
    reason = " ".join((reason or "the package was not found after the download").split())
    raise PunktUnavailableError(
        f"split.punkt is 'pretrained' (NLTK's English Punkt, as the paper's release splits sentences), but "
        f"NLTK's {PUNKT_PACKAGE} data is not installed and NLTK's downloader could not fetch it ({reason}). "
        f"On a machine with a network run `python -m nltk.downloader {PUNKT_PACKAGE}` (or copy an nltk_data "
        f"folder holding tokenizers/{PUNKT_PACKAGE} into a folder named by NLTK_DATA), then rerun the stage; "
        f"or set split.punkt: trained to learn Punkt's parameters from the corpus instead (a documented "
        f"deviation from the release).")


def train_parameters(texts: Iterable[str], max_documents: int | None = None) -> PunktParameters:
    """Punkt parameters learned from ``texts`` (at most ``max_documents`` of them), unsupervised.

    Documents are fed in batches separated by blank lines, so memory stays
    bounded by the trainer's frequency tables rather than the corpus size.
    """
    trainer = PunktTrainer()
    batch: list[str] = []
    for count, text in enumerate(texts):
        if max_documents is not None and count >= max_documents:
            break
        batch.append(text)
        if len(batch) == _TRAIN_BATCH_DOCUMENTS:
            trainer.train("\n\n".join(batch), finalize=False)
            batch = []
    if batch:
        trainer.train("\n\n".join(batch), finalize=False)
    trainer.finalize_training()
    return trainer.get_params()


def save_parameters(params: PunktParameters, directory: str | os.PathLike, meta: dict) -> None:
    """Write trained parameters and ``punkt.json`` into ``directory``, atomically."""
    with atomic_path(directory, directory=True) as tmp:
        files = {
            "abbrev_types.txt": sorted(params.abbrev_types),
            "collocations.tab": sorted("\t".join(pair) for pair in params.collocations),
            "sent_starters.txt": sorted(params.sent_starters),
            "ortho_context.tab": sorted(f"{word}\t{flags}" for word, flags in params.ortho_context.items()),
        }
        for name, lines in files.items():
            (tmp / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        _write_meta(tmp, {"model": TRAINED, **meta})


def load_parameters(directory: str | os.PathLike) -> PunktParameters:
    """Parameters saved by :func:`save_parameters`."""
    directory = Path(directory)

    def lines(name: str) -> list[str]:
        text = (directory / name).read_text(encoding="utf-8")
        return [line for line in text.split("\n") if line]

    params = PunktParameters()
    params.abbrev_types = set(lines("abbrev_types.txt"))
    params.collocations = {tuple(line.split("\t")) for line in lines("collocations.tab")}
    params.sent_starters = set(lines("sent_starters.txt"))
    for line in lines("ortho_context.tab"):
        word, flags = line.rsplit("\t", 1)
        params.ortho_context[word] = int(flags)
    return params


def read_meta(directory: str | os.PathLike) -> dict | None:
    path = Path(directory) / META_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _write_meta(directory: Path, meta: dict) -> None:
    (directory / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def prepare_punkt(setting: str, directory: str | os.PathLike, texts: Callable[[], Iterable[str]],
                  corpus_fingerprint: str, max_train_documents: int | None = None) -> str:
    """Make ``directory`` describe the Punkt model to use and return which one it is.

    ``setting``: ``pretrained`` (NLTK's English model, downloaded by NLTK if
    missing; :class:`PunktUnavailableError` if that fails) or ``trained``. Trained
    parameters already in ``directory`` for the same ``corpus_fingerprint`` and
    ``max_train_documents`` are reused; otherwise ``texts()`` is iterated to
    train. Returns :data:`PRETRAINED` or :data:`TRAINED`.
    """
    if setting not in PUNKT_SOURCES:
        raise ValueError(f"split.punkt: {setting!r} is not one of {', '.join(PUNKT_SOURCES)}")
    directory = Path(directory)
    if setting == "pretrained":
        if not pretrained_english_available():
            download_pretrained_english()
        with atomic_path(directory, directory=True) as tmp:
            _write_meta(tmp, {"model": PRETRAINED})
        return PRETRAINED
    wanted = {"model": TRAINED, "corpus_md5": corpus_fingerprint, "max_train_documents": max_train_documents}
    meta = read_meta(directory)
    if meta is not None and all(meta.get(key) == value for key, value in wanted.items()):
        return TRAINED
    params = train_parameters(texts(), max_train_documents)
    save_parameters(params, directory, {key: value for key, value in wanted.items() if key != "model"})
    return TRAINED


def load_sentence_splitter(directory: str | os.PathLike) -> PunktSentenceTokenizer:
    """The Punkt tokenizer that :func:`prepare_punkt` left described in ``directory``."""
    meta = read_meta(directory)
    if meta is None:
        raise FileNotFoundError(f"{Path(directory) / META_FILE}: no Punkt model here (run prepare_punkt first)")
    if meta["model"] == PRETRAINED:
        from nltk.tokenize.punkt import PunktTokenizer

        return PunktTokenizer("english")
    return PunktSentenceTokenizer(load_parameters(directory))
