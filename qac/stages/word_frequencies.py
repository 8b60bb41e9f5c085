"""DVC stage word_frequencies: in how many passages each word occurs -> data/<profile>/word_frequencies.json.

One pass over data/<profile>/passages.arrow with the encoder's tokenizer
(``split.tokenizer``); words are word-pieces joined as MASTER's MKP decoder
joins them (qac.data.master). The file (``passages``: N, ``document_frequency``:
{word: count}, words sorted) gives the inverse document frequencies that weight
MKP's masking; DVC caches it, so pre-training variants share one pass.
"""

from __future__ import annotations

import time

from qac.config import profile_dir
from qac.params import load_params
from qac.stages.arguments import stage_arguments
from qac.console import StageClock, print_summary, progress
from qac.data.errors import DataFormatError
from qac.io import write_json


def main(argv: list[str] | None = None) -> int:
    stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import open_passages
    # here, not at the top: it loads numpy, pyarrow, torch
    from qac.data.master import count_word_frequencies
    # here, not at the top: it loads safetensors
    from qac.models.loading import load_tokenizer

    params = load_params()
    data = profile_dir(params)
    passages = data / "passages.arrow"
    if not passages.is_file():
        # run_main adds the stage that writes it (split_passages) to the message
        raise DataFormatError(passages, None, None, "a folder, not a file" if passages.is_dir() else "file not found")
    # Opened before the tokenizer is loaded, so a damaged file is named within a second.
    rows = open_passages(passages).num_rows
    tokenizer = load_tokenizer(params["split"]["tokenizer"])
    started = time.perf_counter()
    bar = progress(total=rows, unit="passage", desc="word frequencies")
    frequencies = count_word_frequencies(passages, tokenizer, bar.update)
    bar.close()
    write_json(data / "word_frequencies.json", {"tokenizer": params["split"]["tokenizer"], **frequencies})
    print_summary("word_frequencies", f"{frequencies['passages']} passages",
                  f"{len(frequencies['document_frequency'])} distinct words",
                  f"{time.perf_counter() - started:.1f} s counting", seconds=clock.seconds)
    return 0

