"""A throwaway PostgreSQL server for tests: a fresh cluster in a temporary folder, on loopback.

Uses the server binaries of Debian's ``postgresql`` package (``initdb``,
``pg_ctl``, ``postgres``: on PATH or in /usr/lib/postgresql/<version>/bin).
PostgreSQL refuses to run as root, so as root the cluster belongs to, and the
server runs as, the ``postgres`` user (``nobody`` without one), through
``runuser``. The connection needs a password (scram-sha-256), so the tests can
check that it never shows.

  python tests/postgres_server.py start DIR   # prints the URL; .ci/run exports it as QAC_TEST_POSTGRES_URL
  python tests/postgres_server.py stop DIR
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

URL_ENV = "QAC_TEST_POSTGRES_URL"
BINARIES = ("initdb", "pg_ctl", "postgres")


class Unavailable(RuntimeError):
    """Why no server can be started here; the message names the missing piece."""


def find_bindir() -> Path:
    """The folder holding initdb, pg_ctl and postgres."""
    candidates = [Path(shutil.which("initdb")).resolve().parent] if shutil.which("initdb") else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)]
    for folder in candidates:
        if all((folder / name).exists() for name in BINARIES):
            return folder
    raise Unavailable("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in "
                      "/usr/lib/postgresql/*/bin: install Debian's postgresql package (apt-get install postgresql)")


def _version(path: str) -> float:
    try:
        return float(Path(path).parent.name)
    except ValueError:
        return 0.0


def _server_user() -> str | None:
    """The unprivileged user that runs the server when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise Unavailable("running as root, and PostgreSQL refuses root: no 'postgres' or 'nobody' user to run it as")


def _as_user(user: str | None, command: list[str]) -> list[str]:
    if user is None:
        return command
    runuser = shutil.which("runuser")
    if runuser is None:
        raise Unavailable("running as root, and PostgreSQL refuses root: runuser (util-linux) not found to run "
                          f"it as {user!r}")
    return [runuser, "-u", user, "--", *command]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(root: str | os.PathLike | None = None) -> tuple[str, Path]:
    """Create and start a cluster under ``root`` (a new temporary folder by default); (URL, folder)."""
    bindir = find_bindir()
    user = _server_user()
    root = Path(root) if root else Path(tempfile.mkdtemp(prefix="qac-postgres-"))
    root.mkdir(parents=True, exist_ok=True)
    data, password, port = root / "data", secrets.token_hex(12), _free_port()
    (root / "password").write_text(password + "\n")
    (root / "password").chmod(0o600)
    if user is not None:
        # The server's user must reach its folder: a temporary folder is private to root.
        entry = pwd.getpwnam(user)
        for path in (root, root / "password"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    run = lambda command: subprocess.run(_as_user(user, command), capture_output=True, text=True)  # noqa: E731
    made = run([str(bindir / "initdb"), "-D", str(data), "-U", "qac", "--pwfile", str(root / "password"),
                "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale"])
    if made.returncode != 0:
        raise Unavailable(f"initdb failed ({' '.join(_as_user(user, ['initdb']))}): {made.stderr.strip()[-800:]}")
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} -c fsync=off"
    started = run([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "server.log"),
                   "-w", "-t", "60", "start"])
    if started.returncode != 0:
        log = (root / "server.log").read_text()[-800:] if (root / "server.log").exists() else ""
        raise Unavailable(f"pg_ctl start failed: {started.stderr.strip()[-400:]} {log}")
    (root / "port").write_text(f"{port}\n")
    url = f"postgresql+psycopg2://qac:{password}@127.0.0.1:{port}/postgres"
    _wait_for(url)
    return url, root


def _wait_for(url: str, seconds: float = 30) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    deadline = time.monotonic() + seconds
    while True:
        try:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text("select 1"))
            return
        except sqlalchemy.exc.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            engine.dispose()


def stop(root: str | os.PathLike) -> None:
    """Stop the server of the cluster under ``root`` and remove the folder."""
    root = Path(root)
    if (root / "data" / "postmaster.pid").exists():
        bindir = find_bindir()
        subprocess.run(_as_user(_server_user(), [str(bindir / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate",
                                                 "-w", "stop"]), capture_output=True, text=True)
    shutil.rmtree(root, ignore_errors=True)


def check_driver() -> None:
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        raise Unavailable("the PostgreSQL driver psycopg2 is not installed (pip install -e '.[dev]' brings "
                          "psycopg2-binary)") from None


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    action, root = argv
    if action == "stop":
        stop(root)
        return 0
    try:
        check_driver()
        url, _ = start(root)
    except Unavailable as missing:
        print(f"PostgreSQL not started: {missing}", file=sys.stderr)
        return 3
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
