"""DVC stage generate_continuations: one causal-LM continuation per passage -> data/<profile>/continuations.arrow.

The stage itself is :mod:`qac.stages.generate_continuations`; this file is what DVC runs.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.stages.generate_continuations import main

if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
