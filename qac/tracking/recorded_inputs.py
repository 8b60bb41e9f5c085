"""A stage's inputs checked against the hashes DVC recorded for them, before the stage reads them.

``dvc checkout`` restores a cache object as it is: a cached file whose bytes flipped on disk comes back
without a word, and the next stage would read it as its input. The lock is the record: every output of
every stage of a profile is listed in ``profiles/<profile>/dvc.lock`` with the hash DVC computed when the
stage wrote it (a file's MD5, or a folder's ``.dir`` hash over its files' MD5s). Before a stage reads
its inputs, each one the lock records as some stage's output (or that holds such outputs, or lies inside
one) is hashed as DVC hashes it (dvc_data's functions) and compared; a mismatch stops the stage in one
paragraph naming the path, both hashes and the fix.

Under ``dvc repro`` the stage's own lock entry (``DVC_STAGE``, set by DVC for every command) adds the
data it depended on at its last run; run by hand, the inputs the stage names are checked. An input the
lock does not record (a test's folder, a first run) is not hashed. A file's MD5 is kept with its size,
modification time and inode (``.dvc/tmp/qac-input-md5.json``), as DVC's own state keeps it, so a rerun
on files unchanged since hashes nothing; a restored copy is a new file and is hashed again.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from qac.errors import UserError
from qac.io import atomic_path

STAT_CACHE = Path(".dvc") / "tmp" / "qac-input-md5.json"


@dataclass(frozen=True)
class Recorded:
    """One output as the lock records it: where it is, its DVC hash, and the stage that wrote it."""

    path: Path          # absolute
    md5: str            # a file's MD5, or a folder's hash with ".dir"
    stage: str
    lock: Path


class DamagedInput(UserError):
    """An input whose bytes are not those the lock records for it."""

    def __init__(self, recorded: Recorded, found: str, shown: str, differing: list[tuple[str, str | None]]):
        self.recorded, self.found, self.differing = recorded, found, differing
        pipeline = recorded.lock.with_name("dvc.yaml")
        target = f"{_shown(pipeline)}:{recorded.stage}"
        copies = [cache_object(recorded.md5)] + [cache_object(md5) for _, md5 in differing[:3] if md5]
        if recorded.md5.endswith(".dir") and not differing:
            copies.append("the copies of the files that differ")
        cache_copy = ", ".join(copies)
        names = [name for name, _ in differing]
        files = (f" (files that differ: {', '.join(names[:3])}{' and more' if len(names) > 3 else ''})"
                 if names else "")
        super().__init__(
            f"{shown}: damaged: DVC's hash of it is {found}, but {_shown(recorded.lock)} records {recorded.md5} "
            f"for it, as stage {recorded.stage} wrote it{files}. It was not read. DVC restores a damaged cache "
            f"copy without a word: restore it with `dvc checkout --force {shown}`; if that brings back the "
            f"same bytes, the cached copy is damaged: delete it from the DVC cache ({cache_copy}) and rebuild "
            f"it with `dvc repro -s -f {target}`, which reruns {recorded.stage}. If it was changed outside DVC "
            f"on purpose, `dvc commit {target}` records it")

    def __reduce__(self):
        return type(self), (self.recorded, self.found, str(self).partition(":")[0], self.differing)


def cache_object(md5: str) -> str:
    """Where DVC 3 keeps the object of hash ``md5`` in a repository's cache."""
    return f".dvc/cache/files/md5/{md5[:2]}/{md5[2:]}"


def _shown(path: Path) -> str:
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _yaml_stages(path: Path) -> dict:
    """The ``stages`` of a DVC file (empty when it is missing or does not parse: then nothing is checked), read
    once per version of the file (a process opening several runs parses the lock once)."""
    try:
        stat = path.stat()
    except OSError:
        return {}
    return _parsed_stages(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _parsed_stages(path: str, mtime_ns: int, size: int) -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)     # a lock of thousands of lines: 0.1 s, not 0.6
    try:
        stages = (yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return {}
    return stages if isinstance(stages, dict) else {}


def _stage_dirs(pipeline: Path) -> dict[str, Path]:
    """Stage name (a foreach stage's base name) -> the folder its paths are relative to (its ``wdir``)."""
    stages = _yaml_stages(pipeline)
    dirs = {}
    for name, body in stages.items():
        body = (body.get("do", body) if isinstance(body, dict) else None) or {}
        dirs[name] = pipeline.parent / str(body.get("wdir", "."))
    return dirs


def read_lock(lock: Path) -> dict:
    """The lock's stages."""
    return _yaml_stages(lock)


def recorded_outputs(lock: Path, stages: Mapping | None = None) -> list[Recorded]:
    """Every output of every stage in ``lock`` that carries an MD5."""
    stages = read_lock(lock) if stages is None else stages
    dirs = _stage_dirs(lock.with_name("dvc.yaml"))
    found = []
    for name, entry in stages.items():
        base = dirs.get(name.partition("@")[0], lock.parent)
        for out in (entry or {}).get("outs") or []:
            # DVC 3's plain MD5 ("hash: md5"); an entry of DVC 2 hashed text files with CRLF read as LF
            if isinstance(out, dict) and out.get("md5") and out.get("path") and out.get("hash") == "md5":
                found.append(Recorded(Path(os.path.abspath(base / out["path"])), str(out["md5"]), name, lock))
    return found


class Md5Cache:
    """File MD5s by (size, modification time, inode), read from and written to ``path`` (None: kept in memory)."""

    def __init__(self, path: Path | None):
        self.path, self.changed = path, False
        try:
            self.known = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
        except (OSError, ValueError):
            self.known = {}

    def md5(self, file: Path) -> str:
        from dvc_data.hashfile.hash import file_md5

        stat = file.stat()
        key, stamp = str(file), [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        known = self.known.get(key)
        if isinstance(known, list) and known[:3] == stamp:
            return known[3]
        md5 = file_md5(str(file))
        self.known[key], self.changed = [*stamp, md5], True
        return md5

    def save(self) -> None:
        if self.path is None or not self.changed or not self.path.parent.is_dir():
            return

        try:
            with atomic_path(self.path) as tmp:
                Path(tmp).write_text(json.dumps(self.known), encoding="utf-8")
        except OSError:
            pass        # a cache only: the next stage hashes again


def dvc_hash(path: Path, cache: Md5Cache) -> tuple[str, dict[str, str]]:
    """DVC's hash of ``path`` (a file's MD5, a folder's ``.dir`` hash) and, for a folder, each file's MD5."""
    if path.is_file():
        return cache.md5(path), {}
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.meta import Meta
    from dvc_data.hashfile.tree import Tree

    tree, files = Tree(), {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path)
        files[relative.as_posix()] = cache.md5(file)
        tree.add(relative.parts, Meta(), HashInfo("md5", files[relative.as_posix()]))
    tree.digest()
    return tree.hash_info.value, files


def _differing(recorded: Recorded, files: Mapping[str, str], repo: Path) -> list[tuple[str, str | None]]:
    """``(file, recorded MD5)`` of each file of a folder whose MD5 differs from the one its ``.dir`` object in the
    DVC cache lists, when that object is there (a file the listing lacks has None)."""
    listing = repo / cache_object(recorded.md5)
    try:
        entries = {entry["relpath"]: entry["md5"] for entry in json.loads(listing.read_text(encoding="utf-8"))}
    except (OSError, ValueError, KeyError, TypeError):
        return []
    names = sorted(set(entries) | set(files))
    return [(name, entries.get(name)) for name in names if entries.get(name) != files.get(name)]


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def verify_recorded(paths: Iterable[str | os.PathLike], lock: Path, repo: Path | None = None) -> int:
    """Check every output ``lock`` records that is, holds or lies inside one of ``paths``; the number checked.

    Raises :class:`DamagedInput` for the first whose hash is not the recorded one. ``repo``: the DVC
    repository (the MD5 cache and the DVC cache live there); default the lock's pipeline's first stage folder.
    """
    wanted = [Path(os.path.abspath(p)) for p in paths if p is not None]
    if not wanted or not lock.is_file():
        return 0
    outputs = [out for out in recorded_outputs(lock) if any(_overlaps(out.path, p) for p in wanted)
               and out.path.exists()]
    if not outputs:
        return 0
    repo = repo or _repo_of(lock)
    cache = Md5Cache(repo / STAT_CACHE if repo is not None else None)
    try:
        for out in outputs:
            found, files = dvc_hash(out.path, cache)
            if found != out.md5:
                differing = _differing(out, files, repo) if repo is not None and files else []
                raise DamagedInput(out, found, _shown(out.path), differing)
    finally:
        cache.save()
    return len(outputs)


def _repo_of(lock: Path) -> Path | None:
    for folder in [lock.parent, *lock.parent.parents]:
        if (folder / ".dvc").is_dir():
            return folder
    return None


def dvc_stage() -> tuple[Path, str] | None:
    """``(lock, stage name)`` of the stage DVC is running this process for (``DVC_STAGE``), else None."""
    addressing, root = os.environ.get("DVC_STAGE"), os.environ.get("DVC_ROOT")
    if not addressing or ":" not in addressing:
        return None
    pipeline, _, name = addressing.rpartition(":")
    return Path(root or ".") / Path(pipeline).with_name("dvc.lock"), name


def verify_stage_inputs(lock: Path, inputs: Iterable[str | os.PathLike | None] = ()) -> int:
    """Check the inputs a stage names and, when DVC runs this stage of ``lock``, the data its lock entry
    depended on, against the outputs ``lock`` records (:func:`verify_recorded`); the number checked."""
    paths = [Path(path) for path in inputs if path is not None]
    running = dvc_stage()
    if running is not None and Path(os.path.abspath(running[0])) == Path(os.path.abspath(lock)):
        lock_dir = _stage_dirs(lock.with_name("dvc.yaml")).get(running[1].partition("@")[0], lock.parent)
        entry = read_lock(lock).get(running[1]) or {}
        paths += [lock_dir / dep["path"] for dep in entry.get("deps") or []
                  if isinstance(dep, dict) and dep.get("path")]
    return verify_recorded(paths, lock)
