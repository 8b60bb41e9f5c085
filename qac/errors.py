"""The one base class of every error a user can fix by changing their input.

A :class:`UserError` is bad input, not a bug: a params key out of range, a
malformed qrels line, a dataset that cannot be found, an upstream output that
is missing. Commands and stage scripts print its message as one paragraph,
without a traceback, and exit with status 2 (``qac.console.run_main``); ``-v``
or ``QAC_VERBOSE=1`` adds the traceback. Any other exception is a program
error and keeps its traceback. This module imports nothing, so every code
path (GPU workers included) can raise or catch it.
"""

from __future__ import annotations


class UserError(Exception):
    """Input the user can fix: the message names the file and line or the parameter key, and what to do."""


USER_ERROR_EXIT = 2
