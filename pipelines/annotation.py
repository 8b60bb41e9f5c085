"""Stage `annotation`: the Table 5 annotation study (sheet for people, labels, MLflow run).

The stage itself is :mod:`qac.stages.annotation`; this file is what DVC runs.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.stages.annotation import main

if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
