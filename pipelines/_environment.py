"""Every stage script imports this first: a Python that lacks qac says which one to use, in one line.

`dvc repro` runs a stage's command (``python pipelines/<stage>.py``) with the
first ``python`` on PATH. Without the project's environment activated that is
the system's, which cannot import qac; instead of a traceback ending in
``No module named 'qac'``, the stage prints how to run it and exits. Written for
any Python 3, since it is the one file that runs under the wrong interpreter.
"""

import os
import sys

try:
    import qac  # noqa: F401
except ImportError as error:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    activate = "source .venv/bin/activate"
    if not os.path.isdir(os.path.join(repo, ".venv")):
        activate = "make install && " + activate
    script = os.path.relpath(os.path.abspath(sys.argv[0]), repo) if sys.argv[0] else "this stage"
    sys.stderr.write("%s: %s cannot import qac (%s); run: %s, then the same command again "
                     "(`make smoke` and `make repro` use .venv by themselves)\n"
                     % (script, sys.executable, error, activate))
    sys.exit(1)

# The code DVC hashes for a stage is this checkout's qac/: a Python whose qac comes from elsewhere (an
# environment installed from another clone) would run other code under this checkout's name.
_repo = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_imported = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(qac.__file__))))
if _imported != _repo:
    sys.stderr.write("%s: Python imports qac from %s, not from this checkout %s (the environment was installed "
                     "from the other one); run `.venv/bin/pip install -e .` here (or `make install` with this "
                     "checkout's .venv), or set PYTHONPATH=%s, then the same command again\n"
                     % (os.path.relpath(os.path.abspath(sys.argv[0]), _repo) if sys.argv[0] else "this stage",
                        _imported, _repo, _repo))
    sys.exit(1)

# How the stage is to run (QAC_SEARCH_*, the torch.distributed timeouts, what torchrun sets), checked before
# any work: a typo found after minutes of encoding, or a value that silently searches nothing, costs more.
from qac.environment import environment_problem, working_folder_problem  # noqa: E402

_problem = environment_problem()
if not _problem:
    from pathlib import Path

    from qac.errors import UserError
    from qac.params.locations import params_path

    try:
        _problem = working_folder_problem(params_path(), Path.cwd(), Path(_repo))
    except UserError:          # a bad QAC_PROFILE: the stage itself says so, in its own words
        pass
if _problem:
    sys.stderr.write("%s: error: %s\n" % (os.path.basename(sys.argv[0]) if sys.argv[0] else "stage", _problem))
    sys.exit(2)

# Under `qac repro`, a server that has imported torch, transformers and MLflow runs this stage in a forked copy
# of itself, and this process exits with the copy's status (qac/launcher.py); else the stage runs here.
if os.environ.get("QAC_LAUNCHER"):
    from qac.launcher import hand_over

    hand_over()
