"""Stage `split_passages`: the pre-training corpus cut into passages of at most `split.max_len` tokens.

The stage itself is :mod:`qac.stages.split_passages`; this file is what DVC runs.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.stages.split_passages import main

if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
