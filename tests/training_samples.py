"""Small pre-training batches the step and unpadding tests share: pairs of uneven lengths (so a batch pads),
and MASTER pairs with queries and continuations."""

from __future__ import annotations

from qac.data.context_pairs import Pair
from qac.data.master import MasterPair


def pairs(n: int = 6) -> list[Pair]:
    return [Pair(i, f"the protein {i} binds the receptor of the cell membrane in study {i} " * (1 + i % 3),
                 f"what binds receptor {i}" + " of the cell" * (i % 2), "query") for i in range(n)]


def master_pairs(n: int = 4, empty_continuations: bool = False) -> list[MasterPair]:
    """``empty_continuations``: every other pair without a continuation text (the empty GPT-2 side)."""
    return [MasterPair(i, f"the protein {i} binds the receptor of the cell membrane in study {i} " * (1 + i % 2),
                       f"the membrane of cell {i} grows", "passage", row=i,
                       queries=(f"what binds receptor {i}", "which protein binds"),
                       continuation=f"and then the cell {i} divided twice" if i % 2 or not empty_continuations
                       else "")
            for i in range(n)]
