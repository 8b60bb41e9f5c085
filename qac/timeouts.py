"""The torch.distributed timeouts a user can set, read and checked in one place.

``QAC_DIST_TIMEOUT_MINUTES`` bounds a collective (a rank waits while another
writes an index) and ``QAC_RENDEZVOUS_TIMEOUT_MINUTES`` the wait for the other
ranks to meet. :mod:`qac.distributed` reads them where it starts a process
group; :mod:`qac.environment` checks them before a stage starts any work. They
decide how long a rank waits, never what it computes.
"""

from __future__ import annotations

import math
import os
from typing import Mapping

from qac.errors import UserError

# A week: beyond it the timeouts overflow what torch.distributed passes to its C++ store and collectives.
MAX_TIMEOUT_MINUTES = 7 * 24 * 60
TIMEOUT_VARIABLES = {"QAC_DIST_TIMEOUT_MINUTES": "the collectives' timeout",
                     "QAC_RENDEZVOUS_TIMEOUT_MINUTES": "the wait for the other ranks"}
TIMEOUT_DEFAULTS = {"QAC_DIST_TIMEOUT_MINUTES": 180, "QAC_RENDEZVOUS_TIMEOUT_MINUTES": 10}


def timeout_minutes(name: str, env: Mapping[str, str] | None = None) -> float:
    """The minutes in timeout variable ``name`` (its default when unset or blank); a value that is not a number
    of minutes above 0 and at most a week is a :class:`qac.errors.UserError` naming the variable."""
    text = (os.environ if env is None else env).get(name, "")
    if not text.strip():
        return TIMEOUT_DEFAULTS[name]
    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not (0 < minutes <= MAX_TIMEOUT_MINUTES):
        raise UserError(f"{name}={text!r}: expected a number of minutes above 0 and at most {MAX_TIMEOUT_MINUTES} "
                        f"(a week), {TIMEOUT_VARIABLES[name]}")
    return minutes
