"""Ending a process that imported torch, transformers and MLflow without their seconds of teardown.

When a Python program ends, the interpreter waits for its non-daemon threads,
runs the exit handlers (``atexit``: MLflow ending its runs, logging flushing,
multiprocessing joining its children, temporary folders removed), and then
tears down every module and object one by one. For a stage process that has
imported torch, transformers and MLflow that last part alone takes about two
seconds, for memory the operating system frees at once when the process ends.
:func:`end_process` does the first two as the interpreter would and then
ends the process: a stage's outputs are written and renamed into place before
its summary line, so nothing it made depends on that teardown.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def end_process(status: int) -> NoReturn:
    """Exit with ``status`` once the non-daemon threads have ended and every exit handler has run."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:                  # started with that descriptor closed (`>&-`)
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
