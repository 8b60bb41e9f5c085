"""Is the tracking store usable? One quick probe, before any run is opened.

No stage needs the MLflow store (run ids live in ``data/<profile>/.runs/``;
the tables are built from DVC outputs), so a store that cannot be used must
cost the stage seconds and one paragraph, not MLflow's retries (minutes,
against ``http://127.0.0.1:9``) and a traceback. :func:`store_problem` tries
the store once with short timeouts and no retries:

- a tracking server (``http(s)://``): one request to its REST API, with the user and password the
  URL carries (or MLFLOW_TRACKING_USERNAME / PASSWORD, or TOKEN) sent as MLflow's client sends them;
- a SQLite store (``sqlite:///mlflow.db``): opened read-only and its tables
  listed, which a corrupted or foreign file fails (``sqlite3.DatabaseError``);
  a file that does not exist yet is fine (the first run creates it); a file
  another process keeps locked for longer than the probe waits (a transaction
  left open) is a problem too, where MLflow would wait 20 s on every call; and a table is created and
  rolled back, so a store that reads but cannot take writes is found now, not at the stage's first write;
- a local folder (``file:`` or a path): it must be a folder, or creatable;
- a database (``postgresql://``, ``mysql://``, ``mssql://``, with or without ``+driver``): one connection
  with a short connect timeout, which a missing driver or an unreachable server fails.

It returns the paragraph to print, or None when the store answers. The stage
lifecycle (:mod:`qac.tracking.lifecycle`), ``qac runs sweep`` and ``qac
tables`` ask it before they touch the store and go on without the store
when it answers with a problem. The answer is kept for the process, so a stage
probes once.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

from qac.redaction import basic_authorization, redact_text, redact_url, split_credentials

PROBE_TIMEOUT_ENV = "QAC_TRACKING_PROBE_TIMEOUT"
DEFAULT_TIMEOUT = 3.0   # seconds: a server on the same network answers in milliseconds
_answers: dict[str, str | None] = {}
_printed: set[str | None] = set()


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the SQLite store ``mlflow.db`` in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def _timeout() -> float:
    """Seconds to wait for a tracking server: the variable's value within 0.1 s .. 10 min, else the default."""
    try:
        seconds = float(os.environ.get(PROBE_TIMEOUT_ENV, DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    if seconds != seconds:                  # nan
        return DEFAULT_TIMEOUT
    return min(max(0.1, seconds), 600.0)


def _shown(uri: str) -> str:
    return redact_url(uri)


def _server_problem(uri: str) -> str | None:
    import http.client
    import urllib.error
    import urllib.request

    url, user, password = _server_credentials(uri)
    request = urllib.request.Request(url.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1",
                                     method="GET")
    if _authorization(user, password):
        request.add_header("Authorization", _authorization(user, password))
    try:
        with urllib.request.urlopen(request, timeout=_timeout()):
            return None
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            return f"refuses access (HTTP {error.code}: set MLFLOW_TRACKING_USERNAME/PASSWORD or TOKEN)"
        return (f"answers HTTP {error.code} to MLflow's REST API ({error.reason}): not an MLflow tracking server, "
                "or a broken one")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return f"cannot be reached ({redact_text(str(reason), uri)})"


def _server_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """The server's address without credentials, and the user and password MLflow's client sends:
    those written in the URL, else MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD."""
    url, user, password = split_credentials(uri)
    if user is None:
        user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    return url, user, password


def _authorization(user: str | None, password: str | None) -> str | None:
    """The header MLflow's client sends: Basic for a user, else Bearer for MLFLOW_TRACKING_TOKEN."""
    if user:
        return basic_authorization(user, password)
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    return f"Bearer {token}" if token else None


def _sqlite_problem(uri: str) -> str | None:
    # SQLAlchemy's form: sqlite:///relative.db, sqlite:////absolute.db (the part after the third slash).
    path = Path(uri.split("://", 1)[-1][1:].split("?", 1)[0])
    if not path.exists():
        return _new_sqlite_problem(path)     # the first run creates it
    if path.is_dir():
        return f"is a folder, not a SQLite file ({path})"
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=_timeout()) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "runs" in tables:
                connection.execute("SELECT COUNT(*) FROM runs").fetchone()
    except sqlite3.OperationalError as error:
        if is_locked_error(error):
            # Another stage's write holds the lock for milliseconds: one held through the whole wait is not that.
            return (f"is locked: another process has held {path} for longer than {_timeout():g} s (a transaction "
                    "left open, or a long write); the lock ends when that process commits or ends")
        return f"cannot be read as a SQLite database: {path} ({error})"
    except sqlite3.DatabaseError as error:
        return (f"is damaged: {path} is not a readable SQLite database ({error}); move it aside "
                f"(mv {path} {path}.broken) and the next run starts a new store")
    if tables and "runs" not in tables:
        return f"is a SQLite database but not an MLflow store: {path} (it has no runs table)"
    return _sqlite_write_problem(path)


def _sqlite_write_problem(path: Path) -> str | None:
    """Why the SQLite store at ``path`` cannot take writes, or None: a table created and rolled back.

    A store that reads but cannot be written (a read-only file, folder or mount, an immutable file)
    would fail at the stage's first write, after its work; the rollback leaves the file as it was. A
    real write is tried because permission bits say nothing to root, whom only the mount or the
    immutable flag stops.
    """
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=_timeout(),
                                     isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("CREATE TABLE qac_write_probe (x)")
            connection.execute("ROLLBACK")
        finally:
            connection.close()
    except sqlite3.OperationalError as error:
        if is_locked_error(error):
            return (f"is locked: another process has held {path} for longer than {_timeout():g} s (a transaction "
                    "left open, or a long write); the lock ends when that process commits or ends")
        return (f"cannot take writes: {path} can be read but not written ({error}; a read-only file, folder or "
                "mount, or an immutable file); make the file and its folder writable, or point "
                "MLFLOW_TRACKING_URI at a store that is")
    return None


def _new_sqlite_problem(path: Path) -> str | None:
    """Why a SQLite store cannot be created at ``path`` (which does not exist yet), or None: MLflow creates
    the file and any folders above it, so the nearest folder that exists must take a new file."""
    import tempfile

    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"cannot be created: {folder} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return (f"cannot be created: no file can be written in {folder} ({error.strerror}); make the folder "
                "writable, or point MLFLOW_TRACKING_URI at a store that is")
    return None


def _folder_problem(uri: str) -> str | None:
    path = Path(uri[len("file://"):] if uri.startswith("file://") else uri[len("file:"):] if uri.startswith("file:")
                else uri)
    if path.exists() and not path.is_dir():
        return f"is a file, not a folder ({path})"
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("1", "true", "yes"):
        # MLflow 3 refuses its folder-of-files store unless told otherwise: said here, before any run.
        return ("is a folder store, which this MLflow refuses (MLflow's own message: migrate it to a database with "
                "`mlflow migrate-filestore`, or set MLFLOW_ALLOW_FILE_STORE=true); a database such as "
                "sqlite:///mlflow.db is the usual store")
    return None


# Database stores MLflow reaches through SQLAlchemy, and the driver argument that bounds a connection attempt.
_CONNECT_TIMEOUT_ARGUMENT = {"postgresql": "connect_timeout", "mysql": "connect_timeout", "mssql": "timeout"}


def database_problem(uri: str) -> str | None:
    """Why the SQLAlchemy database at ``uri`` cannot be used, or None: one connection attempt with a short
    timeout, where MLflow's engine (and Optuna's) retries for minutes and a missing driver ends in a
    traceback. Used for MLflow's database stores and for a search's database (``hpo.storage``)."""
    import sqlalchemy

    dialect = urlsplit(uri).scheme.lower().split("+", 1)[0]
    argument = _CONNECT_TIMEOUT_ARGUMENT.get(dialect)
    connect_args = {argument: max(1, round(_timeout()))} if argument else {}
    try:
        engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool, connect_args=connect_args)
    except ImportError as error:
        return (f"needs the database driver {error.name or error}, which is not installed here (install it, or "
                f"name an installed driver in the URL: {dialect}+<driver>://, such as postgresql+psycopg2://)")
    except (sqlalchemy.exc.ArgumentError, ValueError) as error:
        return f"is not a database URL SQLAlchemy can use ({redact_text(str(error), uri)})"
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))
    except sqlalchemy.exc.DBAPIError as error:
        # the driver's first line (host, port and why), never the URL with its password
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()
        return f"cannot be reached ({redact_text(reason[0], uri) if reason else type(error).__name__})"
    except Exception as error:      # a driver's own error type outside DBAPI's (an unsupported option, ...)
        reason = redact_text(str(error).splitlines()[0], uri) if str(error) else ""
        return f"cannot be opened ({type(error).__name__}: {reason})"
    finally:
        engine.dispose()
    return None


def store_problem(uri: str | None = None) -> str | None:
    """Why the tracking store at ``uri`` (default: the stages' store) cannot be used, or None if it can."""
    uri = uri or tracking_uri()
    if uri not in _answers:
        scheme = urlsplit(uri).scheme.lower()
        if scheme in ("http", "https"):
            problem = _server_problem(uri)
        elif scheme.startswith("sqlite"):
            problem = _sqlite_problem(uri)
        elif scheme in ("", "file") or len(scheme) == 1:    # a path (a Windows drive letter is a scheme)
            problem = _folder_problem(uri)
        elif scheme.split("+", 1)[0] in _CONNECT_TIMEOUT_ARGUMENT:    # postgresql+psycopg2, mysql, ...
            problem = database_problem(uri)
        else:
            problem = None    # databricks, ...: MLflow knows how to reach them
        _answers[uri] = problem
    return _answers[uri]


def unavailable_message(problem: str, uri: str | None = None, what: str = "this stage") -> str:
    """The paragraph printed when the store cannot be used: what, why, that the work goes on, how to fix."""
    uri = uri or tracking_uri()
    return (f"note: the MLflow tracking store {_shown(uri)} {problem}. {what[0].upper() + what[1:]} goes on "
            "without it: no run is logged there, and the outputs, their DVC hashes and the tables are the same "
            "(no stage needs the store). To record runs, fix the store or point MLFLOW_TRACKING_URI at one that "
            "works (unset, it is mlflow.db here).")


def usable_store(what: str = "this stage", uri: str | None = None) -> bool:
    """Whether the store can be used; when it cannot, prints :func:`unavailable_message` once on stderr.

    When it can and is a SQLite file, MLflow's waits on its lock are bounded from now on
    (:func:`bound_lock_waits`).
    """
    import sys

    uri = uri or tracking_uri()    # one key per store, as store_failed's, so the store is said once
    problem = store_problem(uri)
    if problem is None:
        if urlsplit(uri).scheme.lower().startswith("sqlite"):
            bound_lock_waits()
        return True
    if uri not in _printed:
        _printed.add(uri)
        print(unavailable_message(problem, uri, what), file=sys.stderr, flush=True)
    return False



_bounded = False


def bound_lock_waits() -> None:
    """Let MLflow wait on a locked SQLite store as long as the probe does, not 20 s on every call.

    MLflow starts each session on a SQLite store with ``PRAGMA busy_timeout = 20000``. A lock taken after
    the probe (a transaction another process leaves open) would cost 20 s per call, and a stage makes many;
    this rewrites that statement to the probe's timeout, so the first call that meets the lock fails within
    seconds and the stage goes on without the store (:func:`store_failed`). Other SQLite databases keep
    their own setting: only the statement MLflow sends is rewritten, on engines whose file is the stages'
    store.
    """
    global _bounded
    if _bounded:
        return
    import logging

    import sqlalchemy

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", _bounded_busy_timeout, retval=True)
    # MLflow logs the lock with its traceback before it raises; the stage says it in one paragraph instead.
    logging.getLogger("mlflow.store.db.utils").addFilter(_quiet_lock_errors)
    _bounded = True


def _quiet_lock_errors(record) -> bool:
    """Keep a log record unless it reports the store's lock and the stage is not verbose (``QAC_VERBOSE``,
    as :func:`qac.console.verbose_requested` reads it)."""
    error = record.exc_info[1] if record.exc_info else None
    verbose = os.environ.get("QAC_VERBOSE", "").strip().lower() not in ("", "0", "false", "no")
    return verbose or error is None or not is_locked_error(error)


def _bounded_busy_timeout(connection, cursor, statement, parameters, context, executemany):
    if statement.lstrip().lower().startswith("pragma busy_timeout") and _is_tracking_file(connection.engine.url):
        statement = f"PRAGMA busy_timeout = {int(_timeout() * 1000)};"
    return statement, parameters


def _is_tracking_file(url) -> bool:
    """Whether the SQLAlchemy ``url`` is the SQLite file of the stages' store."""
    if url.get_backend_name() != "sqlite" or not url.database:
        return False
    store = tracking_uri()
    if not urlsplit(store).scheme.lower().startswith("sqlite"):
        return False
    return Path(url.database).resolve() == Path(store.split("://", 1)[-1][1:].split("?", 1)[0]).resolve()


# The libraries' error modules a failing store raises from (imports of mlflow, SQLAlchemy or requests not needed).
_STORE_ERROR_MODULES = ("mlflow.exceptions", "sqlalchemy.exc", "requests.exceptions", "urllib3.exceptions")


def is_locked_error(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is SQLite's "database is locked": another process
    holds the store. MLflow wraps SQLAlchemy's error, which wraps sqlite3's, so the chain is searched."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if "database is locked" in str(error) or "database table is locked" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def is_store_error(error: BaseException) -> bool:
    """Whether ``error`` is the tracking store failing (MLflow, its database or its HTTP client), not the stage."""
    return isinstance(error, sqlite3.DatabaseError) or any(
        getattr(cls, "__module__", "").startswith(_STORE_ERROR_MODULES) for cls in type(error).__mro__)


def store_failed(error: BaseException, what: str = "this stage", uri: str | None = None) -> None:
    """Say in one paragraph (once) that the store failed although the probe found it usable.

    A store found locked stays unusable for the rest of the process (:func:`usable_store` answers False
    without asking it again), so the stage waits on the lock once, not at every later call.
    """
    import sys

    uri = uri or tracking_uri()
    if is_locked_error(error):
        _answers[uri] = "is locked by another process"
    if uri not in _printed:
        _printed.add(uri)

        # MLflow's message quotes the request's URL, credentials and all
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = redact_text(reason, uri)
        print(unavailable_message(f"failed ({type(error).__name__}: {reason[:300]})", uri, what),
              file=sys.stderr, flush=True)
