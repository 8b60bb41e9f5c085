"""Atomic file output and the JSONL helpers every stage uses.

A stage that fails must leave nothing half-written behind, so every output is
first written to a temporary sibling and renamed into place only on success.
A process killed with SIGKILL cannot clean up, so the staging sibling
(``.<name>.<pid>.<random>.tmp``) carries its writer's process id. A stage
calls :func:`remove_orphaned_staging` on its outputs when it starts, and the
first :func:`atomic_path` of a process in a folder removes the staging there
whose writer is gone (once per folder, so writing thousands of files into one
folder costs one listing). DVC ignores them meanwhile (``.dvcignore``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from qac.errors import UserError

_UMASK = os.umask(0)
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
os.umask(_UMASK)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # alive, another user's
        return True
    return True


def remove_orphaned_staging(path: str | os.PathLike) -> list[Path]:
    """Delete the staging siblings of ``path`` that a killed writer left behind; returns them.

    A sibling is orphaned when the process named in it no longer runs (on this
    machine: outputs are written by one process, rank 0), or when it has no
    process id (written before ids were recorded). ``.<name>.old``, the previous
    version kept for an instant while a directory is replaced, is orphaned
    too when no writer of ``path`` is alive.
    """
    target = Path(path)
    if not target.parent.is_dir():
        return []
    prefix = f".{target.name}."
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(?:(\d+)\.)?[^.]+\.tmp$")
    removed, live_writer = [], False
    with os.scandir(target.parent) as entries:
        candidates = [Path(entry.path) for entry in entries if entry.name.startswith(prefix)]
    for entry in candidates:
        match = pattern.match(entry.name)
        if not match:
            continue
        pid = int(match.group(1)) if match.group(1) else None
        if pid is not None and (pid == os.getpid() or _process_alive(pid)):
            live_writer = True
            continue
        _remove(entry)
        removed.append(entry)
    old = target.with_name(f".{target.name}.old")
    if not live_writer and (old.exists() or old.is_symlink()):
        _remove(old)
        removed.append(old)
    return removed


# .<name>.<pid>.<random>.tmp, as atomic_path names its staging (tempfile's random part has no dot).
_STAGING = re.compile(r"^\..+\.(\d+)\.[a-z0-9_]+\.tmp$")
_SWEPT: set[Path] = set()


def _sweep_once(directory: Path) -> None:
    """Remove staging of dead writers in ``directory``, the first time this process writes there."""
    key = directory.resolve()
    if key in _SWEPT:
        return
    _SWEPT.add(key)
    with os.scandir(directory) as entries:
        orphans = [Path(entry.path) for entry in entries
                   if entry.name.startswith(".") and entry.name.endswith(".tmp")]
    for entry in orphans:
        match = _STAGING.match(entry.name)
        if match and int(match.group(1)) != os.getpid() and not _process_alive(int(match.group(1))):
            _remove(entry)


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


DATA_FOLDER = "data"   # data/<profile>/ under the working directory: where every stage writes


def escaping_write(path: str | os.PathLike) -> tuple[Path, Path] | None:
    """``(profile folder, real place)`` when ``path`` is under ``data/<profile>/`` of the working directory
    but a symbolic link inside that folder leads the write out of it; else None.

    ``data/`` or ``data/<profile>`` itself may be a link (to a larger disk): the check is against the real
    place of the profile's folder.
    """
    lexical = Path(os.path.abspath(path))
    try:
        parts = lexical.relative_to(Path.cwd()).parts
    except ValueError:
        return None
    if len(parts) < 3 or parts[0] != DATA_FOLDER:
        return None
    root = (Path.cwd() / parts[0] / parts[1]).resolve()
    real = lexical.parent.resolve() / lexical.name   # the target itself is replaced, never followed
    return None if root in real.parents else (root, real)


_INTERRUPTIONS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _interruptions_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the block runs; what arrived is handled, as it would have been, at its end.

    A signal mask would not do: the kernel hands a process's signal to any of its threads that does not block
    it (torch's, a loader's), and Python then runs the handler in the main thread all the same. So the block
    swaps in handlers that only take note (in the main thread, the only one Python runs handlers in).
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    for signum in _INTERRUPTIONS:
        handler = signal.getsignal(signum)
        if handler is not None:                     # None: a handler set outside Python, left alone
            previous[signum] = signal.signal(signum, lambda number, frame: arrived.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in arrived:
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)               # KeyboardInterrupt, or qac.console's Terminated
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)        # its default action: the process ends


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    With ``directory=True`` the temporary path is an empty directory and an
    existing directory at ``path`` is replaced. On any exception the temporary
    file or directory is removed and ``path`` is left untouched.
    """
    target = Path(path)
    escape = escaping_write(target)
    if escape is not None:
        raise UserError(f"{target}: would be written to {escape[1]}, outside the profile's data folder "
                        f"{escape[0]} (a symbolic link inside it leads out). Stages write only under "
                        "data/<profile>/: remove the link, or link data/ or data/<profile>/ as a whole")
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_once(target.parent)
    prefix = f".{target.name}.{os.getpid()}."
    # Ctrl-C or SIGTERM arriving while the staging entry is created, before its name is known here, would
    # leave the entry behind: the interruption is held and raised once the removal below can find it.
    tmp = None
    try:
        with _interruptions_deferred():
            if directory:
                tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=target.parent))
            else:
                fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=target.parent)
                os.close(fd)
                tmp = Path(name)
        # mkstemp/mkdtemp create private (0600/0700) entries; outputs get the
        # permissions an ordinary open()/mkdir() would give under the umask.
        tmp.chmod((0o777 if directory else 0o666) & ~_UMASK)
        yield tmp
        # What stands at the output's path (an earlier output, or a file where a folder belongs and the other
        # way round) is set aside and removed once the new output is in place; os.replace alone does that
        # only for a file over a file.
        old = target.with_name(f".{target.name}.old")
        if directory or (target.is_dir() and not target.is_symlink()):
            if target.exists() or target.is_symlink():
                _remove(old)          # a leftover of any kind: a folder, a file or a link
                target.rename(old)
            tmp.rename(target)
        else:
            os.replace(tmp, target)
        _remove(old)
    except BaseException as error:
        with _interruptions_deferred():     # a second Ctrl-C must not stop the removal halfway
            if tmp is not None:
                _remove(tmp)
        if isinstance(error, OSError) and error.filename is None and error.errno in _FULL:
            error.filename = str(target)   # a write that found the disk full names no file: name the output
        raise


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write ``records`` as JSON lines, atomically. Returns the number written."""
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def write_json(path: str | os.PathLike, obj) -> None:
    """Write one JSON document (sorted keys, indented), atomically."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def file_md5(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """MD5 of a file's bytes, the hash DVC uses for file outputs."""
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def path_md5(path: str | os.PathLike) -> str:
    """MD5 of a file, or of a directory's sorted (relative path, file md5) listing."""
    path = Path(path)
    if path.is_file():
        return file_md5(path)
    digest = hashlib.md5()
    for child in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{child.relative_to(path).as_posix()}\0{file_md5(child)}\n".encode())
    return digest.hexdigest()


class NotUtf8(ValueError):
    """Bytes that are not UTF-8 text, with where the first bad byte is (1-based line and column)."""

    def __init__(self, line: int, column: int, byte: int):
        self.line, self.column, self.byte = line, column, byte
        super().__init__(f"not UTF-8 text at line {line}, column {column} (byte 0x{byte:02x})")


def decode_utf8(data: bytes) -> str:
    """``data`` as text; :class:`NotUtf8` names the line and column of its first byte that is not UTF-8, which a
    bare ``UnicodeDecodeError`` (an offset into the file) does not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        raise NotUtf8(data.count(b"\n", 0, error.start) + 1, error.start - line_start + 1,
                      data[error.start]) from None
