"""DVC stage word_frequencies: in how many passages each word occurs -> data/<profile>/word_frequencies.json.

The stage itself is :mod:`qac.stages.word_frequencies`; this file is what DVC runs.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.stages.word_frequencies import main

if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
