"""One trial of a qac hpo study as a job (started by a study's worker, :mod:`qac.hpo.worker`).

    python -m qac.cli.hpo_trial_command --params TRIAL_PARAMS.yaml --out TRIAL_DIR
    torchrun --standalone --nproc-per-node 2 -m qac.cli.hpo_trial_command --params ... --out ...

What the job does and the events it prints: :mod:`qac.hpo.trial_job`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from qac.console import setup_console
from qac.distributed import cleanup
from qac.environment import environment_problem
from qac.errors import UserError
from qac.hpo.trial_job import run_trial, stop_when_parent_goes


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    stop_when_parent_goes()
    parser = argparse.ArgumentParser(description="One trial of a qac hpo study as a job.")
    parser.add_argument("--params", required=True, help="the trial's params file (written by the worker)")
    parser.add_argument("--out", required=True, help="the trial's folder")
    args = parser.parse_args(argv)

    problem = environment_problem()
    if problem:
        raise UserError(problem)
    # here, not at the top: it loads pydantic
    from qac.params import load_params

    setup_console()
    try:
        run_trial(load_params(args.params), Path(args.out))
    finally:
        cleanup()
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
