"""One worker of a qac hpo study (started by `qac hpo`).

``python -m qac.cli.hpo_worker_command --params FILE --index I [--gpus IDS]``.
"""

from __future__ import annotations

import argparse
import signal

from qac.hpo.study import HpoSettings
from qac.hpo.worker import run_worker
from qac.params import load_params


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One worker of a qac hpo study (started by `qac hpo`).")
    parser.add_argument("--params", required=True, help="the study's params file")
    parser.add_argument("--index", type=int, default=0, help="worker number (seeds the sampler)")
    parser.add_argument("--gpus", default=None, help="CUDA_VISIBLE_DEVICES value for this worker's jobs")
    args = parser.parse_args(argv)
    from qac.console import command_logger, setup_console

    setup_console()
    command_logger("qac.hpo", f"worker {args.index}")
    # TERM (from the driver) ends the current trial as failed, with the job stopped.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    params = load_params(args.params)
    settings = HpoSettings.from_params(params)
    run_worker(params, settings, index=args.index, gpu_slot=args.gpus)
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
