"""DVC stage generate_queries: C sampled queries per passage -> data/<profile>/queries.arrow.

The stage itself is :mod:`qac.stages.generate_queries`; this file is what DVC runs.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.stages.generate_queries import main

if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
