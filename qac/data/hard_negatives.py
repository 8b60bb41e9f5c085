"""sentence-transformers' MS MARCO hard negatives (``msmarco-hard-negatives.jsonl.gz``).

The paper's zero-shot (BEIR) retriever is trained on this file (its footnote 2;
the release points to BEIR's ``train_msmarco_v3.py``). One JSON object per line,
one line per MS MARCO training query::

    {"qid": 867436, "pos": [5238393], "neg": {"bm25": [...], "msmarco-distilbert-base-v3": [...], ...}}

``pos`` lists the query's relevant passage ids; ``neg`` maps each mining system
(BM25 and a dozen dense retrievers, 50 passages each) to its passage ids in rank
order. The file version ``train_msmarco_v3.py`` reads carries a cross-encoder
score with every id (``{"pid": 5238393, "ce-score": 8.2}``); the version the
dataset card describes has bare ids and ships the scores in a separate pickle.
Both are read here.

Selection, as ``train_msmarco_v3.py`` does it: every system in file order (or
those named), at most ``per_system`` new passages from each, in rank order,
skipping any whose cross-encoder score is above the query's lowest positive
score minus ``ce_score_margin`` (likely false negatives); a passage kept for
one system is not counted again for another. Queries left with no negative are
dropped. ``ce_score_margin: null`` keeps every negative (the only choice for the
unscored file); a margin with a file that has no scores is an error, never a
silent skip of the filter.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from qac.data.errors import DatasetUnavailableError
from qac.config import data_mirror
from qac.data.sources import download_file

if TYPE_CHECKING:
    from qac.params.sections import HardNegativesSource


class HardNegativesError(ValueError):
    """A line of the hard-negatives file that does not have the expected fields."""


@dataclass
class HardNegatives:
    """``qid -> negative passage ids`` (selection order) and what the selection left out."""

    negatives: dict[str, list[str]] = field(default_factory=dict)
    lines: int = 0
    outside: int = 0          # queries not kept (``keep``: outside the training split)
    without_negatives: int = 0  # queries left with no negative after the filter
    filtered: int = 0         # negatives skipped by the cross-encoder margin

    def stats(self) -> dict[str, float]:
        kept = len(self.negatives)
        return {"lines": self.lines, "queries": kept, "outside_train": self.outside,
                "without_negatives": self.without_negatives, "ce_filtered": self.filtered,
                "negatives_per_query": sum(map(len, self.negatives.values())) / kept if kept else 0.0}


def _entry(item: Any, where: str, field_name: str) -> tuple[str, float | None]:
    """``(pid, ce-score or None)`` of one list item: a bare id or ``{"pid", "ce-score"}``."""
    if isinstance(item, bool):
        raise HardNegativesError(f"{where}: field {field_name!r}: {item!r} is not a passage id")
    if isinstance(item, (int, str)):
        return str(item), None
    if isinstance(item, Mapping) and "pid" in item:
        score = item.get("ce-score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
            raise HardNegativesError(f"{where}: field {field_name!r}: ce-score {score!r} is not a number")
        return str(item["pid"]), None if score is None else float(score)
    raise HardNegativesError(f"{where}: field {field_name!r}: {item!r} is neither a passage id nor "
                             "{\"pid\": ..., \"ce-score\": ...}")


def _open_text(path: Path):
    raw = open(path, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8")
    raw.seek(0)
    return io.TextIOWrapper(raw, encoding="utf-8")


def read_hard_negatives(path: str | os.PathLike, *, per_system: int = 5, ce_score_margin: float | None = 3.0,
                        systems: Iterable[str] | None = None, keep: Iterable[str] | None = None) -> HardNegatives:
    """Select each query's hard negatives from ``path`` (gzip or plain JSON lines), as described above.

    ``keep`` (qids) limits the result to those queries, e.g. the train split's. A malformed line
    raises :class:`HardNegativesError` naming the file, the line and the field.
    """
    if per_system < 1:
        raise ValueError(f"per_system must be >= 1, got {per_system}")
    path = Path(path)
    wanted = list(systems) if systems is not None else None
    kept = set(map(str, keep)) if keep is not None else None
    result = HardNegatives()
    with _open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise HardNegativesError(f"{where}: not a JSON object ({error.msg})") from None
            if not isinstance(record, dict):
                raise HardNegativesError(f"{where}: not a JSON object")
            for name, kind in (("qid", (int, str)), ("pos", list), ("neg", dict)):
                if name not in record:
                    raise HardNegativesError(f"{where}: missing field {name!r}")
                if not isinstance(record[name], kind) or isinstance(record[name], bool):
                    raise HardNegativesError(f"{where}: field {name!r} has the wrong type "
                                             f"({type(record[name]).__name__})")
            result.lines += 1
            qid = str(record["qid"])
            if kept is not None and qid not in kept:
                result.outside += 1
                continue
            if qid in result.negatives:
                raise HardNegativesError(f"{where}: field 'qid': query {qid!r} appears twice")
            positives = [_entry(item, where, "pos") for item in record["pos"]]
            threshold = None
            if ce_score_margin is not None:
                scores = [score for _, score in positives]
                if not positives or any(score is None for score in scores):
                    raise HardNegativesError(
                        f"{where}: field 'pos': no ce-score, so the cross-encoder margin "
                        f"(beir_retriever.ce_score_margin: {ce_score_margin}) cannot be applied; use the scored file "
                        "train_msmarco_v3.py reads, or set beir_retriever.ce_score_margin: null to keep every negative")
                threshold = min(scores) - ce_score_margin
            positive_ids = {pid for pid, _ in positives}
            chosen: list[str] = []
            seen: set[str] = set()
            names = wanted if wanted is not None else list(record["neg"])
            for system in names:
                ranked = record["neg"].get(system, [])
                if not isinstance(ranked, list):
                    raise HardNegativesError(f"{where}: field 'neg.{system}' must be a list")
                added = 0
                for item in ranked:
                    pid, score = _entry(item, where, f"neg.{system}")
                    if threshold is not None:
                        if score is None:
                            raise HardNegativesError(f"{where}: field 'neg.{system}': {pid} has no ce-score "
                                                     "(set beir_retriever.ce_score_margin: null for unscored files)")
                        if score > threshold:
                            result.filtered += 1
                            continue
                    if pid in seen or pid in positive_ids:
                        continue
                    seen.add(pid)
                    chosen.append(pid)
                    added += 1
                    if added >= per_system:
                        break
            if chosen:
                result.negatives[qid] = chosen
            else:
                result.without_negatives += 1
    return result


class UnverifiedHardNegativesWarning(UserWarning):
    """The hard-negatives file was downloaded without a pinned checksum."""


def locate_hard_negatives(source: HardNegativesSource, *, mirror: str | os.PathLike | None = None,
                          downloads: str | os.PathLike = "data/downloads", download: bool = True) -> Path:
    """The hard-negatives file of ``beir_retriever.hard_negatives`` (``{mirror, url, md5}``).

    Looked for in the data mirror (``mirror``: a path under the mirror root), then in the
    download cache ``<downloads>/msmarco-hard-negatives/``, then downloaded from ``url``
    (checked against ``md5`` when one is pinned). Raises :class:`DatasetUnavailableError`
    naming every place tried.
    """
    mirror_root = Path(mirror) if mirror is not None else data_mirror()
    relative, url = source.mirror, source.url
    name = Path(relative).name if relative else Path(str(url or "msmarco-hard-negatives.jsonl.gz")).name
    cache = Path(downloads) / "msmarco-hard-negatives"
    candidates = ([mirror_root / relative] if relative and mirror_root is not None else []) + [cache / name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if not url or not download:
        raise DatasetUnavailableError(
            f"beir_retriever.hard_negatives: {name} found in none of {', '.join(str(c.parent) for c in candidates)}"
            + ("" if url else ", and no url is declared to download it from"))
    return download_file(url, source.md5, cache, name, "beir_retriever.hard_negatives", "md5",
                         UnverifiedHardNegativesWarning)
