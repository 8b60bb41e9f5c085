"""Reference rows: publicly released retrievers evaluated as published, beside the study's own.

An inference-only reproduction is the cheapest check at full scale: before
any GPU-hour goes into pre-training, a released retriever (params
``reference_retrievers``, e.g. ``Luyu/co-condenser-marco-retriever``) is
loaded by its hub name, encodes the in-domain corpus the way it was trained
(``encoders.<spec>``: pooling, normalisation, query and passage lengths, title join) and
is searched and scored with this project's code. Its published figures
(``encoders.<spec>.published``) are the expected values of the paper
profile's reproduction check, so encoding, search and metrics on 8.8M
passages are verified on their own.

Outputs of stage ``reference`` (:mod:`qac.stages.reference`):
``data/<profile>/reference/<slug>/<dataset>/<split>.trec`` and ``.per_query.json`` for each
retriever (``slug``: the spec with ``/`` as ``--``), and ``references.json`` naming them. This
module says what a reference row is (its slug, its encoding, its published figure), which the
tables read too; the stage's work is in :mod:`qac.stages.reference`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qac.model_specs import split_revision

if TYPE_CHECKING:
    from qac.params.sections import Params

REFERENCE_DIR = "reference"
INDEX_FILE = "references.json"


def published_name(spec: str) -> str:
    """A released model's name as published: its spec without a pinned revision (the run record says which
    commit loaded). Its ``encoders`` entry, Table 1 row and output folder go by it."""
    return split_revision(spec)[0]


def reference_slug(spec: str) -> str:
    """The folder name of a retriever's outputs: its name as published with ``/`` written ``--``."""
    return published_name(spec).replace("/", "--")


def reference_specs(params: Params) -> list[str]:
    return list(params.reference_retrievers)


def reference_settings(params: Params, spec: str) -> dict[str, Any]:
    """How ``spec`` was trained to encode (``encoders.<spec>``), and its published figures.

    A reference retriever without an ``encoders`` entry would be scored with
    settings it was not trained with, so that is refused with the key to add.
    """
    entry = params.encoder(spec)
    if entry is None:
        raise ValueError(f"params: reference_retrievers names {spec!r}, but encoders.{published_name(spec)} is "
                         "missing: give its pooling, normalize, query_max_len, passage_max_len, title_join and "
                         "published figures")
    return {key: getattr(entry, key)
            for key in ("pooling", "normalize", "query_max_len", "passage_max_len", "title_join", "published")}


def published_figure(params: Params, spec: str, dataset: str | None, split: str | None,
                     measure: str | None) -> dict[str, Any] | None:
    """The published figure of ``spec`` for one measure (``value`` a fraction, ``source``), or None."""
    for figure in reference_settings(params, spec)["published"]:
        if (figure["dataset"], figure["split"], figure["measure"]) == (dataset, split, measure):
            return figure
    return None
