"""Stage processes that start warm: a server that has imported torch, transformers and MLflow forks each stage.

A stage process spends its first seconds importing the same libraries every
time (torch, transformers with its BERT classes, MLflow with SQLAlchemy: about
5 seconds of a smoke stage's 12 on a laptop core). ``qac repro`` starts one
server per run (``python -m qac.launcher serve <socket>``) that imports them
once. A stage started by DVC is still its own command, ``python
pipelines/<stage>.py ...``, but the first thing it runs
(``pipelines/_environment.py`` -> :func:`hand_over`) asks the server, over a
Unix socket, to fork a copy of itself that becomes the stage: the copy takes
the stage's standard input and output, working directory, environment, umask
and command line, runs the script as ``__main__`` and exits with its status,
which the stage's own process waits for and exits with. DVC, the lock, the
outputs and the console see one stage process, as before.

The copy must behave as the process it stands in for:

- it runs only when every environment variable a library reads at import
  (``HF_*``, ``TRANSFORMERS_*``, ``TORCH*``, ``OMP_*``, ``MKL_*``, ``CUDA*``,
  ``PYTHON*``, ...) and the Python executable are the server's; otherwise, and
  under ``torchrun``, and whenever the server is not there or refuses, the
  stage runs in its own process as it always did;
- the random generators are reseeded as a fresh interpreter would have them;
- SIGINT, SIGTERM and SIGHUP sent to the stage's process are passed on to the
  copy (which sits in a process group of its own, so a Ctrl-C reaches it once),
  and when the stage's process dies (``kill -9``), the copy kills itself.

The server imports nothing of qac's but this module (a stage's own code is read fresh by
each copy) and quits when the process that started it is gone.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time

from qac.exiting import end_process

SOCKET_ENV = "QAC_LAUNCHER"
# What the server imports before it forks: what a training or evaluation stage imports anyway.
PRELOAD = ("numpy", "pyarrow", "pandas", "torch", "transformers", "transformers.models.bert.modeling_bert",
           "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto", "mlflow",
           "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store")
# Environment variables read when a library is imported: a stage whose values differ from the server's runs
# in its own process.
IMPORT_TIME_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "KMP_",
                        "OPENBLAS_", "CUDA", "NCCL_", "PYTHON", "TOKENIZERS_", "MLFLOW_", "LD_", "NUMEXPR_",
                        "ARROW_", "JEMALLOC")
# Set by torchrun for its workers, whose process tree torchrun itself watches.
TORCHRUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_MAX_FDS = 3


def import_time_environment(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if key.startswith(IMPORT_TIME_PREFIXES)}


# ---- the stage's own process --------------------------------------------------------------------------------

def hand_over() -> None:
    """Run this script in a copy forked from the launcher server and exit with its status; return (and let the
    script run here) when there is no server to ask, or it declines."""
    path = os.environ.get(SOCKET_ENV)
    if not path or any(os.environ.get(name) for name in TORCHRUN_VARIABLES):
        return
    status = run_in_server(path, sys.argv)
    if status is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:                                    # the copy died of a signal: so does this process
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        time.sleep(1)
    os._exit(status if status >= 0 else 128 - status)


def run_in_server(path: str, argv: list[str]) -> int | None:
    """The exit status of ``argv`` run by the server at ``path``; None when it did not run there."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(path)
    except OSError:
        client.close()
        return None
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "executable": sys.executable,
               "umask": _current_umask()}
    message = json.dumps(request).encode() + b"\n"
    try:
        sent = socket.send_fds(client, [message], [0, 1, 2])
        if sent < len(message):                       # a stream socket may take a long environment in parts
            client.sendall(message[sent:])
        reply = _read_line(client)
    except OSError:
        client.close()
        return None
    if reply is None or "pid" not in reply:
        client.close()
        return None
    child = int(reply["pid"])

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    ended = _read_line(client)                       # a forwarded signal interrupts and resumes the wait (PEP 475)
    client.close()
    if ended is None or "status" not in ended:
        sys.stderr.write(f"{argv[0]}: the stage's process (pid {child}) ended without a status from the launcher "
                         f"server ({path}); rerun without it: unset {SOCKET_ENV}\n")
        return 1
    return int(ended["status"])


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _read_line(connection: socket.socket) -> dict | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


# ---- the server ------------------------------------------------------------------------------------------------

def serve(path: str, preload: tuple[str, ...] = PRELOAD) -> int:
    """Import ``preload``, then fork a stage for every request at the Unix socket ``path`` until the process
    that started the server is gone or the socket file is removed."""
    import importlib

    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # a Ctrl-C is for the stages, which each get it once
    signal.signal(signal.SIGTERM, _leave)             # from Server.__exit__: stop now, even mid-import
    before = dict(os.environ)
    for module in preload:
        try:
            importlib.import_module(module)
        except ImportError:               # QAC_LAUNCHER_PRELOAD naming what is not installed: the stages that
            pass                          # need it import it themselves, and say so if they cannot
    sys.stdout.flush()
    sys.stderr.flush()
    environment = import_time_environment(before)     # what the libraries saw when imported
    # What they set while importing (torch's compile cache folder, MLflow's session id): a stage's own
    # process would have it too.
    added = {key: value for key, value in os.environ.items() if key not in before}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}.tmp"
    listener.bind(staging)
    listener.listen(16)
    os.replace(staging, path)                         # appears only when it answers
    children: dict[int, socket.socket] = {}
    server = os.getpid()
    try:
        while os.getppid() == parent and os.path.exists(path):
            readable, _, _ = select.select([listener], [], [], 0.05)
            if readable:
                connection, _ = listener.accept()
                pid = _start_stage(connection, [listener, *children.values()], environment, added)
                if pid is not None:
                    children[pid] = connection
                else:
                    connection.close()
            for pid, connection in list(children.items()):
                ended, status = os.waitpid(pid, os.WNOHANG)
                if ended:
                    _send(connection, {"status": os.waitstatus_to_exitcode(status)})
                    connection.close()
                    del children[pid]
    finally:
        if os.getpid() == server:                     # not in a forked stage leaving by its SystemExit
            _stop(path, listener, children)
    return 0


def _leave(signum, frame) -> None:
    raise SystemExit(0)


def _stop(path: str, listener: socket.socket, children: dict[int, socket.socket]) -> None:
    listener.close()
    for pid, connection in children.items():      # the run that started us is gone: so are its stages
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        connection.close()
    try:
        os.unlink(path)
    except OSError:
        pass


def _send(connection: socket.socket, message: dict) -> None:
    try:
        connection.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass                                          # the stage's process is gone; its copy saw that too


def _start_stage(connection: socket.socket, servers: list[socket.socket], environment: dict[str, str],
                 added: dict[str, str]) -> int | None:
    """Fork the copy that runs the request on ``connection``; its pid, or None when the request is declined."""
    try:
        connection.settimeout(5.0)
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, _MAX_FDS)
        connection.settimeout(None)
        while not message.endswith(b"\n"):
            chunk = connection.recv(1 << 20)
            if not chunk:
                raise OSError("connection closed mid-request")
            message += chunk
        request = json.loads(message)
    except (OSError, ValueError):
        return None
    reason = _declined(request, fds, environment)
    if reason:
        for fd in fds:
            os.close(fd)
        _send(connection, {"declined": reason})
        return None
    pid = os.fork()
    if pid == 0:
        for other in servers:                         # the listener and the other stages' connections
            other.close()
        _become_stage(request, fds, connection, added)   # leaves by SystemExit
    for fd in fds:
        os.close(fd)
    _send(connection, {"pid": pid})
    return pid


def _declined(request: dict, fds: list[int], environment: dict[str, str]) -> str | None:
    if len(fds) != _MAX_FDS:
        return "standard input, output and error not received"
    if os.path.realpath(str(request.get("executable"))) != os.path.realpath(sys.executable):
        return f"another Python ({request.get('executable')})"
    if import_time_environment(request.get("env", {})) != environment:
        return "environment variables read at import differ"
    return None


def _become_stage(request: dict, fds: list[int], connection: socket.socket, added: dict[str, str]) -> None:
    """In the forked copy: take the stage's place, run its script as ``__main__`` and exit with its status
    (:func:`qac.exiting.end_process`)."""
    import runpy
    import threading
    import traceback

    code = 1
    try:
        os.setpgid(0, 0)                              # signals come from the stage's process, once
        for signum in (*FORWARDED_SIGNALS, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        env = {**added, **request["env"]}
        env.pop(SOCKET_ENV, None)                     # what the stage starts, starts as usual
        os.environ.clear()
        os.environ.update(env)
        argv = list(request["argv"])
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty() or stream is sys.stderr)
        _reseed()
        threading.Thread(target=_die_with_caller, args=(connection,), daemon=True).start()
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_status(exit_.code)
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 128 + signal.SIGINT
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        # Every exit handler runs (the server's libraries registered theirs before the fork, the script its own
        # since), and the copy never returns into the server's loop.
        end_process(code)


def exit_status(code) -> int:
    """The status a process exits with for ``SystemExit(code)``, as the interpreter decides it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _reseed() -> None:
    """The generators as a fresh interpreter starts them: ``random`` and NumPy's global one from the OS, torch's
    at its fixed default."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.manual_seed(torch.initial_seed())


def _die_with_caller(connection: socket.socket) -> None:
    """The stage's own process sends nothing after its request: an end of file means it is gone (``kill -9``)."""
    try:
        while connection.recv(1):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


class Server:
    """A launcher server for the stages of one run: ``with Server(env) as path:`` starts it (in the
    background: stages that start before it answers run in their own processes), then stops it."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.folder: str | None = None
        self.process = None

    def __enter__(self) -> str:
        import subprocess
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="qac-launcher-")
        path = os.path.join(self.folder, "socket")
        self.process = subprocess.Popen([sys.executable, "-m", "qac.launcher", "serve", path], env=self.env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        return path

    def __exit__(self, *exc) -> None:
        import shutil
        import subprocess

        shutil.rmtree(self.folder, ignore_errors=True)     # the server quits when its socket is gone, or at once
        self.process.terminate()                           # when told (it may still be importing)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "serve":
        sys.stderr.write("usage: python -m qac.launcher serve SOCKET\n")
        return 2
    preload = tuple(filter(None, os.environ.get("QAC_LAUNCHER_PRELOAD", ",".join(PRELOAD)).split(",")))
    try:
        status = serve(args[1], preload)
    except SystemExit as leaving:                     # SIGTERM (_leave), in the server itself
        status = leaving.code if isinstance(leaving.code, int) else 1
    from qac.exiting import end_process               # only now: every copy has been forked

    # Leaving already: a SIGTERM now (qac repro stopped by `timeout`) would land in an exit handler as the
    # SystemExit that _leave raises, which Python reports with a traceback.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    end_process(status)                               # without tearing down torch and transformers (~2 s)


if __name__ == "__main__":
    sys.exit(main())
