"""Where a dataset declared in ``params.yaml`` comes from, and reading it whatever its format.

A dataset is declared under ``datasets.<name>``::

    scifact: {format: beir, mirror: scifact, url: https://.../scifact.zip,
              splits: [train, test], rel_threshold: 1}

and is looked for, in order:

1. in the local data mirror (:func:`qac.config.data_mirror`, ``QAC_DATA_MIRROR``),
   folder ``mirror``;
2. in the download cache (``data/downloads/<name>``), from an earlier download;
3. at ``url``: a BEIR ``.zip``, an MS MARCO ``.tar.gz`` or ``.tsv.gz``, downloaded
   into the cache, checked against the pinned ``md5`` or ``sha256`` of the
   entry (the checksum its publisher gives), and unpacked there. A download
   whose checksum differs is discarded with an error; a ``url`` without a
   pinned checksum is downloaded with a loud :class:`UnverifiedDownloadWarning`.
   The cache remembers the checksum it was verified against, so pinning a new
   one downloads again. With ``convert`` (``cranfield``, ``cisi``:
   :mod:`qac.data.glasgow`) the download is a collection in its native format,
   converted to the BEIR layout in the cache.

:func:`locate_dataset` answers where the data is without downloading anything
(it checks that the URL answers), so a stage can fail with a clear
:class:`DatasetUnavailableError` before any work; :func:`fetch_dataset` also
downloads. :func:`read_dataset` reads the located files by ``format``:

- ``beir``: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``; with
  ``subsets`` (CQADupStack's 12 sub-forums) the same files in each
  ``<subset>/`` folder, read as separate collections (:func:`read_dataset_parts`)
  whose scores are averaged into one figure, as BEIR reports them;
- ``msmarco-docs``: ``msmarco-docs.tsv[.gz]`` (docid, url, title, body);
- ``msmarco-passage`` and ``trec``: a ``collection`` TSV (pid, text; default
  ``collection.tsv``), with ``titles`` a TSV of pid and title in the same order
  (RocketQA's ``para.txt`` and ``para.title.txt``, the corpus the release
  fine-tunes on), with ``topics`` and ``qrels`` per split (TREC formats;
  defaults ``queries.<split>.tsv`` and ``qrels.<split>.tsv``, as in MS MARCO's
  ``collectionandqueries.tar.gz``);
- ``hf``: the Hugging Face dataset ``hub`` (e.g. ``BeIR/scifact``), used when the
  mirror has no BEIR copy of it; locating it loads its small queries table, so an
  unreachable hub fails before any work.

Paths in ``topics``/``qrels`` are relative to the dataset's folder or, failing
that, to the mirror root (the paper profile takes TREC DL files from the
mirror's ``trec-msmarco/`` folder).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qac.data.beir import read_beir
from qac.data.dataset import Corpus, Dataset, Qrels, Queries
from qac.data.errors import DataFormatError, DatasetUnavailableError
from qac.data.msmarco import stream_tsv_corpus
from qac.data.trec import read_topics, read_trec_qrels
from qac.io import atomic_path
from qac.redaction import basic_authorization, redact_text, redact_url, split_credentials
from qac.config import data_mirror
from qac.data.glasgow import CONVERTERS
from qac.data.hub import check_hub_dataset, read_hub_dataset

if TYPE_CHECKING:
    from qac.params.sections import DatasetEntry, Params, PrepareSection

MSMARCO_DOCUMENT_FILES = ("msmarco-docs.tsv", "msmarco-docs.tsv.gz")
URL_TIMEOUT_S = 30
CHECKSUMS = {"sha256": 64, "md5": 32}      # algorithm: hex digits; the first one declared is used
DOWNLOAD_RECORD = ".download.json"         # in a download's cache folder: the URL and checksum verified


class UnverifiedDownloadWarning(UserWarning):
    """A dataset is downloaded from a URL that has no pinned checksum."""


def subset_settings(params: Params, name: str) -> PrepareSection:
    """The ``prepare`` settings that apply to dataset ``name``: the profile-wide section with the dataset's
    own ``max_documents`` and ``keep_judged_documents`` over it where its entry sets them (``max_documents:
    null`` there keeps every document of a profile that cuts the others). A name the profile does not declare
    gets the profile-wide settings."""
    declared = params.datasets.get(name)
    overrides = {key: declared[key] for key in ("max_documents", "keep_judged_documents")
                 if declared is not None and key in declared}
    return params.prepare.model_copy(update=overrides)


@dataclass(frozen=True)
class DatasetSpec:
    """One ``datasets.<name>`` entry of ``params.yaml``, as the readers and downloaders use it."""

    name: str
    format: str
    mirror: str | None
    url: str | None
    splits: tuple[str, ...]
    rel_threshold: dict[str, int]     # per split
    ignore_identical_ids: bool
    collection: str
    topics: dict[str, str]
    qrels: dict[str, str]
    hub: str | None
    hub_qrels: str | None
    md5: str | None
    sha256: str | None
    convert: str | None        # a converter of qac.data.glasgow for a download in its native format
    triples: str | None        # msmarco-passage: training triples (qid, pos, neg): retriever-1 negatives
    triples_url: str | None    # where the triples file is downloaded from when neither folder has it
    triples_md5: str | None
    titles: str | None         # msmarco-passage: pid<TAB>title file beside the collection (RocketQA's)
    subsets: tuple[str, ...]   # beir: sub-collections in <subset>/ folders, evaluated apart and averaged

    @classmethod
    def from_params(cls, name: str, entry: DatasetEntry) -> "DatasetSpec":
        """The spec of a checked entry (the schema and its rules checked every key and how they combine)."""
        threshold = entry.rel_threshold
        if isinstance(threshold, dict):
            # A split the per-split thresholds leave out counts as the key's own default would have it.
            unnamed = type(entry).model_fields["rel_threshold"].default
            thresholds = {split: threshold.get(split, unnamed) for split in entry.splits}
        else:
            thresholds = {split: threshold for split in entry.splits}
        return cls(
            name=name, format=entry.format, mirror=entry.mirror, url=entry.url, splits=tuple(entry.splits),
            rel_threshold=thresholds, ignore_identical_ids=entry.ignore_identical_ids,
            collection=entry.collection or "collection.tsv", topics=dict(entry.topics), qrels=dict(entry.qrels),
            hub=entry.hub, hub_qrels=entry.hub_qrels, convert=entry.convert, subsets=tuple(entry.subsets),
            titles=entry.titles, triples=entry.triples, triples_url=entry.triples_url,
            triples_md5=entry.triples_md5.lower() if entry.triples_md5 else None,
            md5=entry.md5.lower() if entry.md5 else None, sha256=entry.sha256.lower() if entry.sha256 else None,
        )

    @property
    def checksum(self) -> tuple[str, str] | None:
        """``(algorithm, hex digest)`` the download must match, or None when none is pinned."""
        for algorithm in CHECKSUMS:
            if getattr(self, algorithm):
                return algorithm, getattr(self, algorithm)
        return None

    def corpus_files(self) -> list[tuple[str, ...]]:
        """The files (relative to the dataset folder) that must exist; each entry lists alternatives."""
        if self.format in ("beir", "hf"):
            files = [("corpus.jsonl",), ("queries.jsonl",)] + [(f"qrels/{split}.tsv",) for split in self.splits]
            if self.subsets:
                return [(f"{subset}/{name}",) for subset in self.subsets for (name,) in files]
            return files
        if self.format == "msmarco-docs":
            return [MSMARCO_DOCUMENT_FILES]
        files = [(self.collection, f"{self.collection}.gz")]
        if self.titles:
            files.append((self.titles, f"{self.titles}.gz"))
        return files

    def split_files(self, split: str) -> tuple[str, str]:
        """Topics and qrels of ``split`` for the TREC-style formats."""
        return (self.topics.get(split, f"queries.{split}.tsv"), self.qrels.get(split, f"qrels.{split}.tsv"))


@dataclass(frozen=True)
class Source:
    """Where a dataset was found: ``origin`` is ``mirror``, ``download`` or ``hub``.

    ``directory`` holds the files (None for the hub); ``location`` names the
    source without machine-specific paths (mirror folder, URL, hub name), for
    the records a stage writes.
    """

    origin: str
    directory: Path | None
    location: str


def download_dir(params: Params) -> Path:
    """The download cache, shared by all profiles: ``<data_dir>/downloads``."""
    return Path(params.data_dir) / "downloads"


def _entry_problem(path: Path, wanted: str) -> str | None:
    """What stands at ``path`` instead of a ``wanted`` ("file" or "folder"); None when nothing does."""
    if not os.path.lexists(path):
        return None
    if path.is_symlink() and not path.exists():
        return f"{path.name} is a symbolic link that leads nowhere (or in a loop)"
    if wanted == "folder":
        return f"{path.name} is a file, not a folder"
    if path.is_dir():
        return f"{path.name} is a folder, not a file"
    return f"{path.name} is not a regular file (a device, a pipe or a socket)"


def _unusable(directory: Path, alternatives: list[tuple[str, ...]]) -> list[str]:
    """Why each required file of ``directory`` cannot be read: missing, or something else stands there."""
    reasons = []
    for names in alternatives:
        if any((directory / name).is_file() for name in names):
            continue
        found = [problem for name in names if (problem := _entry_problem(directory / name, "file"))]
        reasons.append("; ".join(found) if found else f"missing {' or '.join(names)}")
    return reasons


def _open_url(url: str, method: str = "GET"):
    """``urlopen`` of ``url``, whose ``user:password@`` (if any) is sent as HTTP Basic authorization.

    Python's HTTP client takes ``user:password@host`` for a host and a port ("nonnumeric port"), so the
    address is dialled without them. The header is not sent on to where a redirect points: another
    host never sees the credentials.
    """
    bare, user, password = split_credentials(url)
    request = urllib.request.Request(bare, method=method)
    authorization = basic_authorization(user, password)
    if authorization:
        request.add_unredirected_header("Authorization", authorization)
    return urllib.request.urlopen(request, timeout=URL_TIMEOUT_S)


def _check_url(url: str) -> None:
    """Raise ``OSError`` (or ``http.client.HTTPException``) unless ``url`` answers (HEAD, or GET where HEAD
    is refused)."""
    try:
        with _open_url(url, method="HEAD"):
            return
    except urllib.error.HTTPError as error:
        if error.code not in (403, 405, 501):
            raise
    with _open_url(url):
        return


def _failure(error: BaseException, url: str) -> str:
    """``error`` in words without the credentials of ``url`` (an HTTP status, a refused connection)."""
    return redact_text(str(error) or type(error).__name__, url)


def locate_dataset(spec: DatasetSpec, mirror: str | os.PathLike | None = None,
                   downloads: str | os.PathLike = "data/downloads") -> Source:
    """Where ``spec``'s data is, or would be downloaded from; downloads nothing.

    Raises :class:`DatasetUnavailableError` naming the mirror path tried and the
    URL (with the reason it failed) when the data cannot be had.
    """
    mirror_root = Path(mirror) if mirror is not None else data_mirror()
    tried = []
    if spec.mirror:
        folder = mirror_root / spec.mirror
        if folder.is_dir():
            unusable = _unusable(folder, spec.corpus_files())
            if not unusable:
                return Source("mirror", folder, f"mirror:{spec.mirror}")
            tried.append(f"{folder} ({'; '.join(unusable)})")
        else:
            tried.append(f"{folder} ({_entry_problem(folder, 'folder') or 'not found'})")
    else:
        tried.append(f"{mirror_root} (no mirror folder is declared for it)")
    cached = Path(downloads) / spec.name
    if spec.format != "hf" and _cache_is_current(cached, spec) and not _unusable(cached, spec.corpus_files()):
        return Source("download", cached, redact_url(spec.url) if spec.url else f"cache:{spec.name}")
    if spec.format == "hf":
        try:
            check_hub_dataset(spec.hub)
        except DatasetUnavailableError as error:
            raise DatasetUnavailableError(unavailable_message(spec, tried, cached, str(error))) from None
        return Source("hub", None, f"hf:{spec.hub}")
    if not spec.url:
        raise DatasetUnavailableError(unavailable_message(spec, tried, cached, None))
    try:
        _check_url(spec.url)
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise DatasetUnavailableError(unavailable_message(spec, tried, cached,
                                                          f"failed: {_failure(error, spec.url)}")) from None
    return Source("download", cached, redact_url(spec.url))


def unavailable_message(spec: DatasetSpec, tried: list[str], cached: Path, url_problem: str | None) -> str:
    """One paragraph: the mirror path tried, ``QAC_DATA_MIRROR``, the URL and what went wrong with it."""
    if spec.format == "hf":
        remote = f"the Hugging Face dataset {spec.hub} could not be loaded ({url_problem})"
    elif spec.url:
        remote = f"the download from {redact_url(spec.url)} {url_problem}"
    else:
        remote = "no public URL is declared for it (params: datasets.<name>.url)"
    return (f"dataset {spec.name!r} is not available: the data mirror has no copy at {'; '.join(tried)}, "
            f"nothing was downloaded before into {cached}, and {remote}. Set QAC_DATA_MIRROR to the folder "
            f"that holds the mirror (default: ../shared/data beside the checkout), or make the URL reachable, "
            f"or put the files in {cached} by hand; docs/data.md says where every dataset comes from.")


def fetch_dataset(spec: DatasetSpec, mirror: str | os.PathLike | None = None,
                  downloads: str | os.PathLike = "data/downloads") -> Source:
    """:func:`locate_dataset`, then download and unpack into the cache if that is where it must come from."""
    source = locate_dataset(spec, mirror, downloads)
    if source.origin == "download" and not _cache_is_current(source.directory, spec):
        if spec.checksum is None:
            warnings.warn(f"dataset {spec.name!r}: {redact_url(spec.url)} has no pinned checksum (md5 or sha256 in its "
                          "datasets entry), so the download cannot be verified; pin the checksum its "
                          "publisher gives", UnverifiedDownloadWarning, stacklevel=2)
        try:
            if spec.convert:
                _download_and_convert(spec, source.directory)
            else:
                download_and_unpack(spec.url, source.directory, checksum=spec.checksum)
        except (OSError, ValueError, http.client.HTTPException, zipfile.BadZipFile, tarfile.TarError) as error:
            raise DatasetUnavailableError(
                f"dataset {spec.name!r}: the download from {redact_url(spec.url)} into {source.directory} failed: "
                f"{_failure(error, spec.url)} "
                f"(or set QAC_DATA_MIRROR to a data mirror that holds it)") from None
        unusable = _unusable(source.directory, spec.corpus_files())
        if unusable:
            raise DatasetUnavailableError(
                f"dataset {spec.name!r}: the archive from {redact_url(spec.url)} is not a dataset: {'; '.join(unusable)} "
                f"(unpacked in {source.directory})")
    return source


def _cache_is_current(directory: Path, spec: DatasetSpec) -> bool:
    """Whether a download cache folder holds what ``spec`` pins (any complete one if nothing is pinned)."""
    if not directory.is_dir():
        return False
    if spec.checksum is None:
        return True
    record = directory / DOWNLOAD_RECORD
    try:
        verified = json.loads(record.read_text(encoding="utf-8")).get("checksum")
    except (OSError, ValueError):
        return False
    return verified == list(spec.checksum)


def _download_and_convert(spec: DatasetSpec, target: Path) -> None:
    """Download the native files into ``target/source`` and write the BEIR layout beside them, atomically."""
    with atomic_path(target, directory=True) as tmp:
        download_and_unpack(spec.url, tmp / "source", checksum=spec.checksum)
        CONVERTERS[spec.convert](tmp / "source", tmp)
        # The cache is current when its top folder records the verified checksum.
        shutil.copy(tmp / "source" / DOWNLOAD_RECORD, tmp / DOWNLOAD_RECORD)


def download_and_unpack(url: str, target: str | os.PathLike, checksum: tuple[str, str] | None = None) -> None:
    """Download ``url`` and unpack it into the directory ``target``, atomically.

    With ``checksum`` (``(algorithm, hex digest)``) the downloaded bytes are
    checked before anything is unpacked; a mismatch raises ``ValueError`` and
    leaves nothing behind. ``.zip`` and ``.tar.gz``/``.tgz`` archives are
    unpacked (a single top-level folder, as in BEIR's zips, is stripped); any
    other file, ``.tsv.gz`` included, is stored as is under its own name
    (readers decompress ``.gz``).
    """
    from tqdm import tqdm

    target = Path(target)
    file_name = Path(urllib.request.urlparse(url).path).name or "download"
    with atomic_path(target, directory=True) as tmp:
        archive = tmp / file_name
        digest = hashlib.new(checksum[0]) if checksum else None
        with _open_url(url) as response, open(archive, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {file_name}") as progress:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    out.write(chunk)
                    if digest is not None:
                        digest.update(chunk)
                    progress.update(len(chunk))
        if checksum and digest.hexdigest() != checksum[1]:
            raise ValueError(f"{redact_url(url)}: {checksum[0]} of the download is {digest.hexdigest()}, but "
                             f"{checksum[1]} is pinned; the file is corrupt or was changed at the source "
                             "(the download was discarded)")
        if file_name.endswith(".zip"):
            unpacked = tmp / ".unpacked"
            with zipfile.ZipFile(archive) as bundle:
                _refuse_escaping_members(redact_url(url), [(member, None) for member in bundle.namelist()])
                bundle.extractall(unpacked)
            archive.unlink()
            _move_contents(unpacked, tmp)
        elif file_name.endswith((".tar.gz", ".tgz", ".tar")):
            unpacked = tmp / ".unpacked"
            with tarfile.open(archive) as bundle:
                _extract_tar(bundle, unpacked, redact_url(url))
            archive.unlink()
            _move_contents(unpacked, tmp)
        (tmp / DOWNLOAD_RECORD).write_text(
            json.dumps({"url": redact_url(url), "checksum": list(checksum) if checksum else None}) + "\n", encoding="utf-8")


def _refuse_escaping_members(url: str, members: list[tuple[str, str | None]]) -> None:
    """Refuse an archive one of whose ``(path, link target)`` members points outside it (an absolute path,
    or one that climbs with ``..``), before anything is unpacked."""
    for name, link in members:
        if any(path is not None and (Path(path).is_absolute() or ".." in Path(path).parts) for path in (name, link)):
            raise ValueError(f"{url}: archive member {name!r} points outside the archive")


def _extract_tar(bundle: tarfile.TarFile, destination: Path, url: str) -> None:
    """Unpack ``bundle`` into ``destination`` when no member, or link target, points outside it and none is a
    device or a pipe. The same rules hold on every Python: tarfile's own ``data`` filter, which also drops
    unsafe permission bits, arrived in 3.10.12 and 3.11.4 (and Debian 12's 3.11.2 lacks it)."""
    members = bundle.getmembers()
    _refuse_escaping_members(url, [(member.name, member.linkname if member.issym() or member.islnk() else None)
                                   for member in members])
    special = next((member.name for member in members if member.isdev()), None)
    if special is not None:
        raise ValueError(f"{url}: archive member {special!r} is a device or a pipe, not a file")
    if hasattr(tarfile, "data_filter"):
        bundle.extractall(destination, members, filter="data")
    else:
        bundle.extractall(destination, members)


def download_file(url: str, md5: str | None, cache: Path, name: str, owner: str, md5_key: str,
                  warning: type[Warning], what: str = "") -> Path:
    """``cache / name`` after unpacking ``url`` into ``cache`` (:func:`download_and_unpack`).

    The bytes are checked against ``md5`` when it is pinned; when not, ``warning`` says so, naming the
    parameter ``md5_key`` that would pin it. A failed download, or one without ``name``, is a
    :class:`DatasetUnavailableError` that begins with ``owner`` (``what`` says what was downloaded).
    """
    checksum = ("md5", md5) if md5 else None
    if checksum is None:
        warnings.warn(f"{owner}: {redact_url(url)} has no pinned checksum ({md5_key})", warning, stacklevel=3)
    try:
        download_and_unpack(url, cache, checksum=checksum)
    except (OSError, ValueError, http.client.HTTPException, zipfile.BadZipFile, tarfile.TarError) as error:
        raise DatasetUnavailableError(f"{owner}: the download {what}from {redact_url(url)} into {cache} failed: "
                                      f"{_failure(error, url)}") from None
    if not (cache / name).is_file():
        raise DatasetUnavailableError(f"{owner}: {redact_url(url)} did not give {name} in {cache}")
    return cache / name


def _move_contents(unpacked: Path, destination: Path) -> None:
    """Move an unpacked archive's files into ``destination``, skipping a lone top-level folder."""
    entries = [entry for entry in unpacked.iterdir() if entry.name != "__MACOSX"]
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
    for entry in root.iterdir():
        if entry.name != "__MACOSX":
            shutil.move(str(entry), destination / entry.name)
    shutil.rmtree(unpacked)


def _find_split_file(relative: str, directory: Path, mirror_root: Path, spec: DatasetSpec, what: str) -> Path:
    for base in (directory, mirror_root):
        for candidate in (base / relative, base / f"{relative}.gz"):
            if candidate.is_file():
                return candidate
    raise DatasetUnavailableError(
        f"dataset {spec.name!r}: {what} file {relative!r} found neither in {directory} nor in {mirror_root}")


def split_file_paths(spec: DatasetSpec, source: Source,
                     mirror: str | os.PathLike | None = None) -> dict[str, tuple[Path, Path]]:
    """Topics and qrels files per split for the TREC-style formats (checked to exist)."""
    mirror_root = Path(mirror) if mirror is not None else data_mirror()
    if spec.format in ("beir", "hf") or source.directory is None:
        return {}
    paths = {}
    for split in spec.splits:
        topics, qrels = spec.split_files(split)
        paths[split] = (_find_split_file(topics, source.directory, mirror_root, spec, f"{split} topics"),
                        _find_split_file(qrels, source.directory, mirror_root, spec, f"{split} qrels"))
    return paths


def read_dataset_parts(spec: DatasetSpec, source: Source, *, mirror: str | os.PathLike | None = None,
                       min_text_chars: int = 1) -> list[tuple[str | None, Dataset]]:
    """``[(subset, Dataset)]``: each sub-collection of a dataset with ``subsets``, else ``[(None, dataset)]``.

    A sub-collection is a dataset of its own (its own corpus, queries and
    judgements; BEIR retrieves each CQADupStack forum within its own corpus),
    named ``<name>/<subset>``.
    """
    if not spec.subsets:
        return [(None, read_dataset(spec, source, mirror=mirror, min_text_chars=min_text_chars))]
    parts = []
    for subset in spec.subsets:
        skipped: Counter = Counter()
        directory = source.directory / subset
        dataset = read_beir(directory, spec.splits, name=f"{spec.name}/{subset}", min_text_chars=min_text_chars,
                            skipped=skipped)
        dataset.meta = _dataset_meta(spec, f"{source.location}#{subset}", skipped,
                                     {split: str(directory / "qrels" / f"{split}.tsv") for split in spec.splits})
        parts.append((subset, dataset))
    return parts


def read_dataset(spec: DatasetSpec, source: Source, *, mirror: str | os.PathLike | None = None,
                 min_text_chars: int = 1) -> Dataset:
    """Read a located dataset; ``meta`` gets the source, thresholds and skipped-row counts."""
    if spec.subsets:
        raise ValueError(f"dataset {spec.name!r} has subsets {list(spec.subsets)}: read it with read_dataset_parts")
    skipped: Counter = Counter()
    if source.origin == "hub":
        dataset = read_hub_dataset(spec.hub, spec.splits, qrels_name=spec.hub_qrels,
                                   min_text_chars=min_text_chars, skipped=skipped)
    elif spec.format in ("beir", "hf"):
        dataset = read_beir(source.directory, spec.splits, name=spec.name,
                            min_text_chars=min_text_chars, skipped=skipped)
    else:
        split_paths = split_file_paths(spec, source, mirror)
        corpus = _read_tsv_corpus(spec, source.directory, min_text_chars, skipped)
        queries: Queries = {}
        qrels: dict[str, Qrels] = {}
        for split, (topics_path, qrels_path) in split_paths.items():
            for qid, text in read_topics(topics_path).items():
                if queries.setdefault(qid, text) != text:
                    raise DataFormatError(topics_path, None, "text",
                                          f"query {qid!r} has a different text in another split's topics")
            qrels[split] = read_trec_qrels(qrels_path, skipped=skipped)
        dataset = Dataset(name=spec.name, corpus=corpus, queries=queries, qrels=qrels)
    dataset.name = spec.name
    dataset.meta = _dataset_meta(spec, source.location, skipped, _qrels_files(spec, source, mirror))
    return dataset


def _dataset_meta(spec: DatasetSpec, location: str, skipped: Counter, qrels_files: dict[str, str]) -> dict:
    return {
        "qrels_files": qrels_files,
        "format": spec.format,
        "source": location,
        "rel_threshold": dict(spec.rel_threshold),
        "ignore_identical_ids": spec.ignore_identical_ids,
        "skipped": dict(skipped),
    }


def _qrels_files(spec: DatasetSpec, source: Source, mirror) -> dict[str, str]:
    """Where each split's judgements were read from, for errors about a split (not written to dataset.json)."""
    if source.origin == "hub":
        return {split: f"hf://{spec.hub_qrels or spec.hub + '-qrels'}/{split}" for split in spec.splits}
    if spec.format in ("beir", "hf"):
        return {split: str(source.directory / "qrels" / f"{split}.tsv") for split in spec.splits}
    return {split: str(qrels) for split, (_, qrels) in split_file_paths(spec, source, mirror).items()}


def _read_tsv_corpus(spec: DatasetSpec, directory: Path, min_text_chars: int, skipped: Counter) -> Corpus:
    """The TSV collection, streamed from its file (MS MARCO documents do not fit in memory)."""
    found = [next(directory / name for name in names if (directory / name).is_file())
             for names in spec.corpus_files()]
    return stream_tsv_corpus(found[0], spec.format == "msmarco-docs", min_text_chars=min_text_chars, skipped=skipped,
                             titles=found[1] if spec.titles else None)


def triples_path(spec: DatasetSpec, source: Source, *, mirror: str | os.PathLike | None = None,
                 downloads: str | os.PathLike = "data/downloads") -> Path:
    """The training-triples file of ``spec``: in its folder, the mirror root, or downloaded (checksum verified).

    Downloads go to ``<downloads>/<name>-triples/`` (a ``.tsv.gz`` is kept as is;
    readers decompress it). Raises :class:`DatasetUnavailableError` when the file
    can be had from none of them.
    """
    mirror_root = Path(mirror) if mirror is not None else data_mirror()
    name = Path(spec.triples).name
    cache = Path(downloads) / f"{spec.name}-triples"
    candidates = [base / spec.triples for base in (source.directory, mirror_root) if base is not None]
    candidates.append(cache / name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if not spec.triples_url:
        raise DatasetUnavailableError(
            f"dataset {spec.name!r}: training triples {spec.triples!r} found in none of "
            f"{', '.join(str(c.parent) for c in candidates)}, and no triples_url is declared to download them from")
    return download_file(spec.triples_url, spec.triples_md5, cache, name, f"dataset {spec.name!r}", "triples_md5",
                         UnverifiedDownloadWarning, what="of its training triples ")
