"""Stage `prepare@<dataset>`: one declared dataset, read, checked and normalised.

The stage itself is :mod:`qac.stages.prepare`; this file is what DVC runs.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.stages.prepare import main

if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
