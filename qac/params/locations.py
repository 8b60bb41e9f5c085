"""Where a params file lives: the profiles and the file a stage or command reads.

Each profile (smoke, default, paper) keeps its parameters in
``profiles/<name>/params.yaml`` (rendered by :mod:`qac.config`). A stage or
command reads the file ``QAC_PARAMS`` names, else the one of profile
``QAC_PROFILE``, else the default profile's.
"""

from __future__ import annotations

import os
from pathlib import Path

from qac.names import checked_plain_name

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PROFILE_NAMES = ("smoke", "default", "paper", "paper-mini")
# A profile rendered over another one's file rather than over base.yaml alone: paper-mini is the paper
# profile with only its sizes changed (every stage, switch and code path of the paper's, run by the suite).
PROFILE_PARENTS = {"paper-mini": "paper"}
DEFAULT_PROFILE = "default"


def profiles_root() -> Path:
    """``profiles/`` of the checkout in the working directory, else of the installed package."""
    local = Path("profiles")
    return local if (local / "base.yaml").exists() else REPO_ROOT / "profiles"


def profile_params_path(name: str, profiles_dir: str | os.PathLike | None = None) -> Path:
    """``profiles/<name>/params.yaml``: the parameters DVC tracks for profile ``name``."""
    return Path(profiles_dir or profiles_root()) / name / "params.yaml"


def params_path() -> Path:
    """The params file a stage or command reads when none is named.

    ``QAC_PARAMS`` (a file) wins, then ``QAC_PROFILE`` (a profile name), then the
    default profile. DVC stages set ``QAC_PARAMS`` in their command line.
    """
    if os.environ.get("QAC_PARAMS"):
        return Path(os.environ["QAC_PARAMS"])
    # Set but empty is a mistake (a variable expanded from nothing), not a request for the default profile.
    profile = os.environ.get("QAC_PROFILE", DEFAULT_PROFILE)
    return profile_params_path(checked_plain_name(profile, "QAC_PROFILE: the profile name"))
