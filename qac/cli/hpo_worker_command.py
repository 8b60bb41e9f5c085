"""One worker of a qac hpo study (started by `qac hpo`).

``python -m qac.cli.hpo_worker_command --params FILE --index I [--gpus IDS]``.
"""

from __future__ import annotations

import argparse
import signal

from qac.hpo.study import HpoSettings
from qac.hpo.worker import run_worker
from qac.params import load_params
from qac.console import Terminated, command_logger, setup_console


def _stop_on_first_term(signum, frame):
    """The first SIGTERM stops the worker as Ctrl-C would; later ones (``timeout`` signals the whole process
    group, then the driver forwards its own) are ignored, so that stopping the trial's job is not cut short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One worker of a qac hpo study (started by `qac hpo`).")
    parser.add_argument("--params", required=True, help="the study's params file")
    parser.add_argument("--index", type=int, default=0, help="worker number (seeds the sampler)")
    parser.add_argument("--gpus", default=None, help="CUDA_VISIBLE_DEVICES value for this worker's jobs")
    args = parser.parse_args(argv)

    setup_console()
    command_logger("qac.hpo", f"worker {args.index}")
    # TERM (from the driver, or `timeout`) ends the current trial as failed, with the job stopped, and the
    # worker with one paragraph (qac.console.call_main).
    signal.signal(signal.SIGTERM, _stop_on_first_term)
    params = load_params(args.params)
    settings = HpoSettings.from_params(params)
    run_worker(params, settings, index=args.index, gpu_slot=args.gpus)
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main, prog="qac hpo worker")
