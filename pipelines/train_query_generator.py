"""DVC stage query_generator: the seq2seq query generator -> data/<profile>/generator/.

mode train:      fine-tune a generator built from query_generator.model (architecture prefix_lm or
                 bert2bert), stopping early on the loss of validation pairs
mode pretrained: save query_generator.model (e.g. doc2query T5) as a versioned folder
Both report the quality of generated queries on held-out pairs and documents (qac.stages.query_generator)
to MLflow, data/<profile>/metrics/query_generator.json and reports/query_generator/<profile>.md.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.params import load_params
from qac.stages.arguments import stage_arguments
from qac.console import StageClock, print_summary


def main(argv: list[str] | None = None) -> int:
    stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    from qac.stages.query_generator import make_query_generator

    facts = make_query_generator(load_params())
    print_summary("query_generator", *facts, seconds=clock.seconds)
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
