"""What a stage prints: progress bars, one summary line, and no library noise.

By default a stage prints a progress bar per long loop (on a terminal, rank 0
only) and one summary line with its key result; the libraries' chatter is
silenced: transformers' load reports ("LOAD REPORT ... MISSING"), warnings and
weight-loading bars, MLflow's INFO lines (system metrics, run links), Hugging Face Hub
and datasets messages, and Python warnings from torch and friends. ``-v`` on a
stage script, or ``QAC_VERBOSE=1`` in the environment (which reaches stages
run by ``dvc repro`` and ``torchrun``), brings all of it back.

Errors: every entry point (the ``qac`` command, each ``pipelines/*.py`` stage,
the hpo worker and trial job) runs its ``main`` through :func:`run_main`. A
user error (:class:`qac.errors.UserError`: a bad parameter, a malformed input
file, a missing dataset or upstream output; or a ``SystemExit`` with a message)
prints as one paragraph on stderr, without a traceback, and exits with status
2; ``-v`` / ``QAC_VERBOSE=1`` adds the traceback. Ctrl-C, SIGTERM (sent by
``timeout``, a batch scheduler, ``docker stop`` or torchrun stopping its other
workers) and what the machine refuses (disk full, no permission, a read-only
file system) end the same way, in one paragraph (status 130 after Ctrl-C, 143
after SIGTERM), once the outputs being written are removed. Any other exception
is a program error and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Iterable, NoReturn

from qac.errors import USER_ERROR_EXIT, UserError
from qac.exiting import end_process
from qac.model_specs import unloadable_model_message
from qac.pipeline_plan import rerun_hint, stage_writing
from qac.redaction import redact_text, redact_url
from qac.tracking.store import is_store_error, tracking_uri

VERBOSE_ENV = "QAC_VERBOSE"
# Loggers whose INFO/WARNING lines are noise in a stage's output.
NOISY_LOGGERS = ("mlflow", "alembic", "transformers", "sentence_transformers", "huggingface_hub", "datasets",
                 "urllib3", "filelock", "torch.distributed", "faiss", "bm25s", "nltk", "optuna", "git", "dvc",
                 "matplotlib", "PIL", "httpx")


def verbose_requested(flag: bool = False) -> bool:
    """``-v`` or ``QAC_VERBOSE`` set to anything but empty, 0, false or no."""
    return bool(flag) or os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def setup_console(verbose: bool = False) -> bool:
    """Quiet the libraries unless verbose; returns whether the stage runs verbose.

    Libraries imported later read the environment variables set here when they are
    imported, so nothing is imported for them: a stage that never loads transformers
    (prepare, bm25, tables) does not pay for importing it.

    Sets the environment too, so processes the stage starts (workers,
    subprocesses) stay as quiet, and so transformers picks the level up even
    where it is imported later.
    """
    verbose = verbose_requested(verbose)
    # MLflow prints each run's link on stdout, written with the tracking URL: its password too, if it has one.
    from qac.redaction import split_credentials

    if not verbose or split_credentials(os.environ.get("MLFLOW_TRACKING_URI", ""))[1] is not None:
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return True
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # transformers' own bars ("Loading weights", "Writing model shards") follow the Hub's switch.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # MLflow sets its loggers' level from this variable when it is imported, after this function ran.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    # MLflow's bar for every artifact it downloads (qac runs diff reads several per run).
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")   # inherited by subprocesses
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    # Some libraries set their own logger to DEBUG when imported (bm25s does), after this
    # function ran: the root handlers drop what is below WARNING whatever the logger's level.
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    quiet_optuna()
    if "transformers" in sys.modules:   # imported before its variables were set: quiet it directly
        transformers = sys.modules["transformers"]
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    return False


def quiet_optuna() -> None:
    """Drop Optuna's "[I] Trial 3 finished ..." lines unless verbose.

    Optuna sets its logger to INFO when it is imported, so this runs again after the import
    (the hpo modules call it once they have imported optuna).
    """
    if "optuna" in sys.modules and not verbose_requested():
        sys.modules["optuna"].logging.set_verbosity(sys.modules["optuna"].logging.WARNING)


def command_logger(name: str, prefix: str) -> logging.Logger:
    """A logger for a command's own progress lines (``qac.hpo``), shown at INFO while libraries stay quiet.

    It has its own handler and does not propagate, so the root handlers' WARNING floor
    (:func:`setup_console`) drops the libraries' INFO lines but not these.
    """
    logger = logging.getLogger(name)
    if not any(getattr(handler, "_qac_command", False) for handler in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}: %(message)s"))
        handler._qac_command = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def is_main_process() -> bool:
    """Rank 0 under ``torchrun`` (``RANK`` unset or 0), the only process that draws bars."""
    return os.environ.get("RANK", "0") == "0"


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str, unit: str = "it",
             initial: int = 0, main_only: bool = True, rank: int | None = None, **options: Any):
    """A tqdm bar with rate and ETA; off when stderr is no terminal or, with ``main_only``, not rank 0.

    ``rank`` overrides the rank read from the environment (for loops given their rank).
    """
    from tqdm.auto import tqdm

    main = is_main_process() if rank is None else rank == 0
    disable = not sys.stderr.isatty() or (main_only and not main)
    return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=disable,
                dynamic_ncols=True, leave=False, **options)


class StageClock:
    """Wall time of a stage since it started, for its summary line."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


def format_seconds(seconds: float) -> str:
    """``41 s``, ``3 min 05 s``, ``1 h 02 min``."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def summary_line(stage: str, *facts: str, seconds: float | None = None) -> str:
    """``pretrain@cocondenser-query-q5: 200 steps, final loss 3.21, 41 s``."""
    parts = [fact for fact in facts if fact]
    if seconds is not None:
        parts.append(format_seconds(seconds))
    return f"{stage}: {', '.join(parts)}"


def print_summary(stage: str, *facts: str, seconds: float | None = None) -> None:
    """Print the stage's summary line on stdout (rank 0 only), flushed so it shows under ``dvc repro``."""
    if is_main_process():
        print(summary_line(stage, *facts, seconds=seconds), flush=True)


def _rebuild_hint(error: BaseException) -> str:
    """For a malformed file that a DVC stage wrote (``data/<profile>/...``): the stage that rebuilds it."""
    path = getattr(error, "path", None)
    if not isinstance(path, str) or "dvc repro" in str(error):
        return ""

    return f"; {rerun_hint(path)}" if stage_writing(path) else ""


def user_error_message(error: BaseException) -> str | None:
    """The paragraph to print for a user error, or None when ``error`` is a program error."""
    if isinstance(error, UserError):
        return str(error) + _rebuild_hint(error)
    if isinstance(error, SystemExit) and isinstance(error.code, str):
        return error.code
    if isinstance(error, OSError):           # a model spec that names nothing fetchable here

        return unloadable_model_message(error)
    return None


def run_main(main: Callable[..., int | None], argv: list[str] | None = None, prog: str | None = None) -> NoReturn:
    """Run an entry point's ``main(argv)`` and exit: a user error as one paragraph and status 2.

    ``prog`` prefixes the message (default: the script's name). With ``-v`` on the command line or
    ``QAC_VERBOSE=1`` the traceback is printed above the paragraph. The process then ends without the
    interpreter's module teardown (:func:`qac.exiting.end_process`: exit handlers run, seconds saved).
    """
    # The command line is parsed from here on: ``main()`` alone (a test calling a stage) parses no arguments.
    status = call_main(main, sys.argv[1:] if argv is None else argv, prog)   # a program error raises on

    end_process(status)


# Exit status of a command stopped by Ctrl-C, as a shell reports a process ended by SIGINT.
INTERRUPTED_EXIT = 130
# ... and by SIGTERM, as a shell reports a process ended by it (what `timeout` and Slurm expect to see).
TERMINATED_EXIT = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt.

    A KeyboardInterrupt, so every ``except KeyboardInterrupt`` (a launcher's copy, the hpo driver stopping
    its workers) and every ``finally`` / context manager on the way out (:func:`qac.io.atomic_path` removing
    its staging) treats it as the interruption it is. Without it SIGTERM ends the process on the spot and
    leaves the staging of what it was writing.
    """


def _raise_terminated(signum, frame) -> None:
    # A second SIGTERM while the first is being handled (cleanup that hangs) ends the process at once.
    signal.signal(signum, signal.SIG_DFL)
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the block runs, SIGTERM raises :class:`Terminated`; the handler before it is restored after.

    Only in the main thread (the only one a signal handler can be set in and runs in) and only where SIGTERM
    has its default action: a handler someone else set (the hpo worker's, a launcher's) or an ignored SIGTERM
    is left as it is. In a torchrun worker this turns torchrun stopping the other workers, when one fails,
    into one paragraph each; a worker inside a long C call (a collective) sees the signal when the call
    returns, or is ended by torchrun's SIGKILL after its grace period.
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_status(error: BaseException) -> int:
    """The exit status after an interruption: as a shell reports a process ended by that signal."""
    return TERMINATED_EXIT if isinstance(error, Terminated) else INTERRUPTED_EXIT
# What the machine, not the input, refused: one paragraph says which file and what to do.
_ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file size limit exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EMFILE: "too many open files",
}


# What gloo and NCCL say when the other end of a collective is gone (their errors are plain RuntimeErrors).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker", "Broken pipe",
              "NCCL communicator was aborted", "Socket Timeout")


def lost_peer_message(error: BaseException) -> str | None:
    """The paragraph for a torchrun process whose collective failed because another rank ended, else None.

    When one rank dies (killed, out of memory, a node lost), the others fail in their next collective with
    the transport's error; torchrun's summary, or the other node's log, holds the first failure.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not isinstance(error, RuntimeError) or not (dist.is_available() and dist.is_initialized()):
        return None
    text = str(error).strip()
    if not (isinstance(error, dist.DistError) or any(sign in text for sign in _PEER_GONE)):
        return None
    reason = (text.splitlines() or [type(error).__name__])[0].split(". ")[0][:300]   # not the advice after it
    return (f"rank {dist.get_rank()} of {dist.get_world_size()} stopped because another process of this torchrun "
            f"run ended or could not be reached ({type(error).__name__}: {reason}). The first failure is that "
            "process's own: torchrun's summary, or the log of the node it ran on, names it. Outputs are written to "
            "a temporary file and renamed into place only when complete, so nothing half-written was left; run the "
            "command again (stages that resume pick up from their last completed chunk or checkpoint).")


def environment_error_message(error: BaseException) -> str | None:
    """The paragraph for an interruption or a refusal of the machine (disk full, no permission), else None.

    Outputs are written through :func:`qac.io.atomic_path`, so what a stage was writing when this
    happened was removed, never left half-written.
    """
    if isinstance(error, Terminated):
        return ("terminated (SIGTERM, as sent by `timeout`, a batch scheduler such as Slurm, `docker stop` or "
                "torchrun stopping its other workers). Every output is written to a temporary file and renamed "
                "into place only when complete, so nothing half-written was left; run the command again (stages "
                "that resume pick up from their last completed chunk or checkpoint).")
    if isinstance(error, KeyboardInterrupt):
        return ("interrupted (Ctrl-C). Every output is written to a temporary file and renamed into place "
                "only when complete, so nothing half-written was left; run the command again (stages that "
                "resume pick up from their last completed chunk or checkpoint).")

    if is_store_error(error):
        import textwrap

        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = textwrap.shorten(redact_text(reason, tracking_uri()), 300, placeholder=" ...")
        return (f"the tracking store failed ({type(error).__name__}: {reason}): the MLflow store "
                f"(MLFLOW_TRACKING_URI, else mlflow.db; here {redact_url(tracking_uri())}) or a study's database "
                "(hpo.storage). Outputs are written "
                "atomically, so nothing half-written was left; fix the store or point the setting at one that "
                "works, then run the command again.")
    lost = lost_peer_message(error)
    if lost is not None:
        return lost
    if isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS:
        where = error.filename or "a file"
        if error.filename2:
            where = f"{error.filename} -> {error.filename2}"
        fix = {errno.ENOSPC: "free space there (or point data/ at a larger disk)",
               errno.EDQUOT: "free space there (or point data/ at a larger disk)",
               errno.EFBIG: "raise the limit (ulimit -f)",
               errno.EMFILE: "raise the limit (ulimit -n)"}.get(error.errno, "make it writable by this user")
        return (f"{_ENVIRONMENT_ERRNOS[error.errno]} while working on {where}. The partial output was "
                f"removed (outputs are written to a temporary file and renamed when complete); {fix}, then "
                "run the command again.")
    return None


# As a shell reports a writer ended by SIGPIPE.
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE


def _tolerant_streams() -> None:
    """Output that the terminal's encoding cannot show (``PYTHONIOENCODING=ascii``, ``LANG=C``: the ± of a
    tolerance, a document title) is escaped rather than ending the command."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


def _silence_stdout() -> None:
    # Python flushes stdout once more at exit, into the same closed pipe: point it at /dev/null first.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def redacted_traceback(kind, error, trace) -> None:
    """Print a program error's traceback as Python does, without the credentials of any URL or the
    environment's secrets (:func:`qac.redaction.redact_text`): a traceback is pasted into issues."""
    sys.stderr.write(redact_text("".join(traceback.format_exception(kind, error, trace))))
    sys.stderr.flush()


def call_main(main: Callable[..., int | None], argv: list[str] | None = None, prog: str | None = None) -> int:
    """What :func:`run_main` does, returning the exit status instead of exiting (for tests and wrappers).

    A user error, Ctrl-C, SIGTERM (:func:`sigterm_as_interrupt`), a refusal of the machine (disk full, no
    permission, a read-only file system) and a failing tracking store each end in one paragraph; ``-v`` /
    ``QAC_VERBOSE=1`` adds the traceback. Any other exception is a program error and keeps its traceback.
    """
    _tolerant_streams()
    sys.excepthook = redacted_traceback
    with sigterm_as_interrupt():
        try:
            return int(main(argv) or 0) if argv is not None else int(main() or 0)
        except BrokenPipeError:
            # The reader went away (`qac metrics | head -1`): what it wanted it has; end as a pipe's writer does.
            _silence_stdout()
            return BROKEN_PIPE_EXIT
        except (Exception, SystemExit, KeyboardInterrupt) as error:
            message = user_error_message(error)
            status = USER_ERROR_EXIT
            if message is None:
                message = environment_error_message(error)
                status = interrupted_status(error) if isinstance(error, KeyboardInterrupt) else USER_ERROR_EXIT
            if message is None:
                raise

            arguments = sys.argv[1:] if argv is None else argv
            if verbose_requested("-v" in arguments or "--verbose" in arguments):
                print(redact_text(traceback.format_exc()), end="", file=sys.stderr)
            name = prog or os.path.basename(sys.argv[0] or "qac")
            print(f"{name}: error: {redact_text(message)}", file=sys.stderr, flush=True)
            return status
