"""The rules that tie keys together, each broken one named by its key (:func:`cross_field_problems`)."""

from __future__ import annotations

import difflib
from typing import Any

from qac.params.errors import Problem
from qac.params.measures import Measure
from qac.params.search_space import SpaceError, check_space_against_params, parse_space
from qac.params.sections import ClusterResources, Params


def variant_key(params: Params, name: str, field: str) -> str:
    """The dotted key that sets ``field`` for variant ``name``: the variant's own where it writes it, else
    ``pretrain.common``'s (where a problem with the merged value is to be fixed)."""
    variant = params.pretrain.variants[name]
    return f"pretrain.variants.{name}.{field}" if field in variant.model_fields_set else f"pretrain.common.{field}"


def merged_variant(params: Params, name: str) -> dict[str, Any]:
    """``pretrain.common`` overridden by the keys variant ``name`` sets."""
    common = params.pretrain.common.model_dump()
    variant = params.pretrain.variants[name]
    return {**common, **variant.model_dump(exclude_unset=True)}


def _corpus_limit(params: Params, dataset: str | None) -> int | None:
    """How many documents the profile keeps of ``dataset`` where the params say (else None)."""
    if dataset is None or dataset not in params.datasets:
        return None
    entry = params.datasets[dataset]
    return entry.max_documents if "max_documents" in entry.model_fields_set else params.prepare.max_documents


def dataset_ref(params: Params, key: str, name: str | None) -> list[Problem]:
    """``name`` (at ``key``) must be a key of ``datasets``; null names none."""
    if name is None or name in params.datasets:
        return []
    declared = list(params.datasets)
    close = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return [Problem(key, f"{name!r} is not a key of datasets (declared: {', '.join(declared) or 'none'}){hint}")]


def dataset_names(params: Params) -> list[Problem]:
    """The corpus, the training set and the zero-shot sets are declared datasets."""
    problems = []
    # null in profiles/base.yaml, for each profile to name: every pipeline reads both.
    for key, what in (("pretrain_corpus", "the documents split into passages for pre-training"),
                      ("train_dataset", "the in-domain dataset the retrievers are fine-tuned and tested on")):
        if getattr(params, key) is None:
            problems.append(Problem(key, f"required: {what}, a key of datasets ({', '.join(params.datasets)})"))
    problems += dataset_ref(params, "pretrain_corpus", params.pretrain_corpus)
    problems += dataset_ref(params, "train_dataset", params.train_dataset)
    for index, name in enumerate(params.zero_shot):
        problems += dataset_ref(params, f"zero_shot.{index}", name)
    return problems


def dataset_entries(params: Params) -> list[Problem]:
    """Each dataset's keys fit its format."""
    problems: list[Problem] = []
    for name, entry in params.datasets.items():
        if entry.format == "hf" and not entry.hub:
            problems.append(Problem(f"datasets.{name}.hub", "format hf needs hub (a Hugging Face dataset name such "
                                                            "as BeIR/scifact)"))
        if entry.subsets and entry.format != "beir":
            problems.append(Problem(f"datasets.{name}.subsets", "sub-collections need format beir"))
        if len(set(entry.subsets)) != len(entry.subsets):
            problems.append(Problem(f"datasets.{name}.subsets", "lists a folder twice"))
        if entry.convert is not None and entry.format != "beir":
            problems.append(Problem(f"datasets.{name}.convert", "a converted download needs format beir"))
        if (entry.titles or entry.triples) and entry.format not in ("msmarco-passage", "trec"):
            problems.append(Problem(f"datasets.{name}.{'titles' if entry.titles else 'triples'}",
                                    "belongs to a passage collection (format msmarco-passage or trec)"))
        if entry.triples_url and not entry.triples:
            problems.append(Problem(f"datasets.{name}.triples_url", "name the file too (triples)"))
        if isinstance(entry.rel_threshold, dict):
            for split in entry.rel_threshold:
                if split not in entry.splits:
                    problems.append(Problem(f"datasets.{name}.rel_threshold.{split}",
                                            f"not one of the dataset's splits ({', '.join(entry.splits) or 'none'})"))
    return problems


def training_set_needs(params: Params) -> list[Problem]:
    """What the fine-tuning and annotation settings need of ``train_dataset``."""
    problems: list[Problem] = []
    train = params.datasets.get(params.train_dataset) if params.train_dataset else None
    if train is not None and params.finetune.r1_negatives == "official" and not train.triples:
        problems.append(Problem("finetune.r1_negatives", f"'official' needs the training triples of train_dataset "
                                                         f"{params.train_dataset} (datasets.{params.train_dataset}."
                                                         "triples)"))
    if train is not None and params.annotation.calibration_split not in train.splits:
        problems.append(Problem("annotation.calibration_split",
                                f"{params.annotation.calibration_split!r} is not a split of train_dataset "
                                f"{params.train_dataset} ({', '.join(train.splits) or 'none'})"))
    return problems


def variant_rules(params: Params) -> list[Problem]:
    """Each pre-training variant, merged with ``pretrain.common``: its C is generated, its batch splits into
    micro-batches, its MASTER decoders are distinct."""
    problems: list[Problem] = []
    available = params.querygen.queries_per_passage
    variants = list(params.pretrain.variants)
    for name in variants:
        settings = merged_variant(params, name)
        where = f"pretrain.variants.{name}"
        variant = params.pretrain.variants[name]
        if variant.method != "none":
            context = variant.context_type
            count = variant.query_count if variant.query_count is not None else 1
            if context in ("query", "mixed") and count > available:
                problems.append(Problem(
                    f"{where}.query_count",
                    f"C={count} but querygen.queries_per_passage generates {available} queries per passage: the "
                    f"variant would train as C={available}; lower query_count or raise queries_per_passage"))
            dor = settings["master_dor_queries"]
            if variant.method == "master" and "dor" in settings["master_decoders"] and dor > available:
                problems.append(Problem(variant_key(params, name, "master_dor_queries"),
                                        f"{dor} queries for the DOR decoder but querygen.queries_per_passage generates "
                                        f"{available} per passage: it would join {available}; lower it or raise "
                                        "queries_per_passage"))
            longest = max(settings["max_len"], settings["query_max_len"])
            if settings["pad_to"] is not None and settings["pad_to"] < longest:
                problems.append(Problem(variant_key(params, name, "pad_to"),
                                        f"{settings['pad_to']} is shorter than the sequences it pads (max_len "
                                        f"{settings['max_len']}, query_max_len {settings['query_max_len']}): at "
                                        f"least {longest}"))
            if settings["batch_size"] % settings["grad_accumulation"]:
                problems.append(Problem(
                    variant_key(params, name, "batch_size"),
                    f"{settings['batch_size']} pairs per step do not split into grad_accumulation="
                    f"{settings['grad_accumulation']} equal micro-batches"))
            kinds = settings["passage_context"]
            if isinstance(kinds, list) and (not kinds or len(set(kinds)) != len(kinds)):
                problems.append(Problem(variant_key(params, name, "passage_context"),
                                        f"a mix names each kind once and at least one: {kinds}"))
            decoders = settings["master_decoders"]
            if variant.method == "master" and len(set(decoders)) != len(decoders):
                problems.append(Problem(variant_key(params, name, "master_decoders"),
                                        f"names a decoder twice: {decoders}"))
    return list(dict.fromkeys(problems))     # a pretrain.common key that fails for every variant, named once


def variant_names(params: Params) -> list[Problem]:
    """Variants named elsewhere are declared; Table 1's C is one a variant has."""
    problems: list[Problem] = []
    for name, variant in params.pretrain.variants.items():
        where = f"pretrain.variants.{name}"
        if variant.seeds is not None:
            problems.append(Problem(f"{where}.seeds", "seeds are expanded by `qac profile render` into one variant "
                                                      "per seed; render the profile instead of writing them here"))
        if variant.seed_of is None:
            continue
        origin = params.pretrain.variants.get(variant.seed_of)
        if origin is None or origin.seed_of is not None:
            problems.append(Problem(f"{where}.seed_of", f"{variant.seed_of!r} is not a variant without seed_of"))
        elif {**origin.model_dump(exclude={"seed"}), "seed_of": None} != {**variant.model_dump(exclude={"seed"}),
                                                                           "seed_of": None}:
            problems.append(Problem(f"{where}.seed_of", f"a seed copy of {variant.seed_of!r} must equal it but for "
                                                        "its seed"))
    seeds_of: dict[str, dict[int, str]] = {}     # a variant and its seed copies: seed -> the variant that runs it
    for name, variant in params.pretrain.variants.items():
        group = seeds_of.setdefault(variant.seed_of or name, {})
        seed = variant.seed if variant.seed is not None else params.seed
        if seed in group:
            problems.append(Problem(f"pretrain.variants.{name}.seed",
                                    f"seed {seed} is already run by {group[seed]!r}: a seed copy repeats the run "
                                    "and the spread across seeds would count it twice"))
        group.setdefault(seed, name)
    trained = [name for name, variant in params.pretrain.variants.items()
               if variant.seed_of is None and merged_variant(params, name).get("method") != "none"]
    if params.seeds and trained and all(set(seeds_of[name]) != set(params.seeds) for name in trained):
        problems.append(Problem("seeds", f"{list(params.seeds)}, but no variant runs these seeds: `qac profile render` "
                                         "turns the profile's seeds into one variant per seed, so a rendered file "
                                         "changed by hand (or `dvc exp run -S`) would ignore them; set seeds in "
                                         "profiles/<name>.yaml and render the profile"))
    if params.hpo.variant not in params.pretrain.variants:
        close = difflib.get_close_matches(params.hpo.variant, list(params.pretrain.variants), n=1, cutoff=0.6)
        problems.append(Problem("hpo.variant", f"{params.hpo.variant!r} is not a key of pretrain.variants"
                                               + (f"; did you mean {close[0]}?" if close else "")))
    for index, name in enumerate(params.evaluate.zero_shot_variants or []):
        if name not in params.pretrain.variants:
            problems.append(Problem(f"evaluate.zero_shot_variants.{index}",
                                    f"{name!r} is not a key of pretrain.variants"))
    if params.tables.main_query_count is not None:
        counts = {v.query_count for v in params.pretrain.variants.values()
                  if v.method != "none" and v.context_type in ("query", "mixed")}
        if counts and params.tables.main_query_count not in counts:
            problems.append(Problem("tables.main_query_count",
                                    f"no query-context variant has query_count {params.tables.main_query_count} "
                                    f"(the variants have {', '.join(map(str, sorted(counts)))})"))
    return problems


def finetune_depths(params: Params) -> list[Problem]:
    """Fine-tuning: enough candidates for the negatives, depths within the corpus the profile keeps,
    whole batches of training queries."""
    problems: list[Problem] = []
    ft = params.finetune
    negatives = ft.train_n_passages - 1
    if ft.mine_skip_top >= ft.mine_depth:
        problems.append(Problem("finetune.mine_skip_top", f"{ft.mine_skip_top} skips every mined candidate "
                                                          f"(mine_depth is {ft.mine_depth})"))
    elif ft.mine_depth - ft.mine_skip_top < negatives:
        problems.append(Problem("finetune.mine_depth", f"{ft.mine_depth - ft.mine_skip_top} mined candidates below "
                                                       f"rank {ft.mine_skip_top} cannot give {negatives} negatives "
                                                       "(train_n_passages - 1)"))
    if ft.mine_sample is not None and ft.mine_sample < negatives:
        problems.append(Problem("finetune.mine_sample", f"{ft.mine_sample} sampled mined negatives cannot give "
                                                        f"{negatives} negatives (train_n_passages - 1)"))
    if ft.bm25_depth < negatives:
        problems.append(Problem("finetune.bm25_depth", f"{ft.bm25_depth} BM25 candidates cannot give {negatives} "
                                                       "negatives (train_n_passages - 1)"))
    limit = _corpus_limit(params, params.train_dataset)
    if limit is not None:
        for key in ("bm25_depth", "mine_depth"):
            if getattr(ft, key) > limit:
                problems.append(Problem(f"finetune.{key}", f"{getattr(ft, key)} exceeds the {limit} documents the "
                                                           f"profile keeps of {params.train_dataset} "
                                                           "(prepare.max_documents)"))
    if ft.max_train_queries is not None and ft.max_train_queries < ft.batch_size:
        problems.append(Problem("finetune.max_train_queries", f"{ft.max_train_queries} queries are fewer than one "
                                                              f"batch of {ft.batch_size} (finetune.batch_size)"))
    elif (ft.max_train_queries is not None and ft.incomplete_batch == "error"
          and ft.max_train_queries % ft.batch_size):
        problems.append(Problem("finetune.max_train_queries",
                                f"{ft.max_train_queries} queries do not fill whole batches of {ft.batch_size} "
                                f"(finetune.batch_size): {ft.max_train_queries % ft.batch_size} would be left out; "
                                f"use a multiple of {ft.batch_size}, or finetune.incomplete_batch: drop"))
    return problems


def cluster_resources(params: Params) -> list[Problem]:
    """The cluster default sets every resource; several nodes only under torchrun."""
    problems: list[Problem] = []
    cluster = params.cluster
    unset = [name for name in ClusterResources.model_fields if getattr(cluster.default, name) is None]
    if unset:
        problems.append(Problem("cluster.default", f"{', '.join(unset)} not set (every stage's job needs them)"))
    for stage, resources in {"default": cluster.default, **{f"stages.{k}": v for k, v in cluster.stages.items()}}.items():
        merged = {**cluster.default.model_dump(), **resources.model_dump(exclude_unset=True)}
        if (merged["nodes"] or 1) > 1 and not merged["distributed"]:
            problems.append(Problem(f"cluster.{stage}.nodes", f"{merged['nodes']} nodes need distributed: true (a "
                                                              "stage runs on several nodes only under torchrun)"))
    return problems


def measures_and_columns(params: Params) -> list[Problem]:
    """Measures parse; the in-domain columns name declared datasets, splits and computed measures."""
    problems: list[Problem] = []
    measures = set()
    for index, name in enumerate(params.evaluate.metrics):
        try:
            measures.add(Measure.parse(name).name)
        except ValueError as error:
            problems.append(Problem(f"evaluate.metrics.{index}", str(error)))
    for index, column in enumerate(params.tables.in_domain_columns):
        where = f"tables.in_domain_columns.{index}"
        if column.missing is not None:
            continue
        for key in ("split", "measure"):
            if getattr(column, key) is None:
                problems.append(Problem(f"{where}.{key}", "required unless the column is `missing`"))
        dataset = column.dataset if column.dataset is not None else params.train_dataset
        if column.dataset is not None:
            problems += dataset_ref(params, f"{where}.dataset", column.dataset)
        entry = params.datasets.get(dataset) if dataset else None
        if entry is not None and column.split is not None and column.split not in entry.splits:
            problems.append(Problem(f"{where}.split", f"{column.split!r} is not a split of {dataset} "
                                                      f"({', '.join(entry.splits) or 'none'})"))
        if column.measure is not None and measures and column.measure not in measures:
            problems.append(Problem(f"{where}.measure", f"{column.measure!r} is not computed (evaluate.metrics: "
                                                        f"{', '.join(params.evaluate.metrics)})"))
    return problems


def generation_rules(params: Params) -> list[Problem]:
    """The generator's query prefix is the one generation uses; a query may end after ``min_new_tokens``
    only if fewer than ``max_new_tokens``."""
    problems: list[Problem] = []
    qg = params.query_generator
    if qg.kind_prefixes and "query" in qg.kind_prefixes and qg.kind_prefixes["query"] != params.querygen.prefix:
        problems.append(Problem("querygen.prefix", f"{params.querygen.prefix!r} differs from the generator's query "
                                                   f"prefix query_generator.kind_prefixes.query "
                                                   f"({qg.kind_prefixes['query']!r})"))
    querygen = params.querygen
    if querygen.min_new_tokens >= querygen.max_new_tokens:
        problems.append(Problem("querygen.min_new_tokens", f"{querygen.min_new_tokens} must be below "
                                                           f"querygen.max_new_tokens ({querygen.max_new_tokens})"))
    if querygen.decode == "static" and querygen.batch_invariant is True:
        problems.append(Problem("querygen.decode", "static decoding samples on the device and cannot re-decide "
                                                   "near-ties on the host: set querygen.batch_invariant to false or "
                                                   "auto, or querygen.decode to cache or auto"))
    return problems


def search_space(params: Params) -> list[Problem]:
    """The search space follows docs/hpo.md (qac.params.search_space holds its rules); the study's measure parses."""
    problems: list[Problem] = []
    raw_space = {key: (None if entry is None else entry.model_dump(exclude_unset=True))
                 for key, entry in params.hpo.space.items()}
    try:
        dimensions = parse_space(raw_space)
        if params.hpo.variant in params.pretrain.variants:
            check_space_against_params(dimensions, params.model_dump(exclude_unset=True), params.hpo.variant)
    except SpaceError as error:
        message = str(error)
        key, _, rest = message.partition(": ")
        problems.append(Problem(key if key.startswith("hpo.") else "hpo.space", rest or message))
    try:
        Measure.parse(params.hpo.metric)
    except ValueError as error:
        problems.append(Problem("hpo.metric", str(error)))
    return problems


def bm25_analyzer(params: Params) -> list[Problem]:
    """The stopword list and the stemmer are ones bm25s and PyStemmer know (else BM25 stops at its first text)."""
    problems: list[Problem] = []
    words = params.bm25.stopwords
    if words not in (None, "lucene", "en", "english"):      # the common ones without importing bm25s
        import bm25s.tokenization

        try:
            bm25s.tokenization.Tokenizer(stopwords=words)
        except ValueError:
            problems.append(Problem("bm25.stopwords", f"{words!r} is not a stopword list: lucene (Lucene's English "
                                                      "set), a language bm25s lists (en, de, fr, es, ...) or null"))
    stemmer = params.bm25.stemmer
    if stemmer is not None:
        import Stemmer

        if stemmer not in Stemmer.algorithms():
            close = difflib.get_close_matches(stemmer, Stemmer.algorithms(), n=1)
            problems.append(Problem("bm25.stemmer", f"{stemmer!r} is not a PyStemmer algorithm"
                                                    + (f"; did you mean {close[0]}?" if close else
                                                       " (english, porter, german, ...; null: no stemming)")))
    return problems


def output_folders(params: Params) -> list[Problem]:
    """The folders stages and reports write into are folders, where something stands at their path already."""
    import os

    problems = []
    for key, folder in (("data_dir", params.data_dir), ("tables.out_dir", params.tables.out_dir),
                        ("hpo.report_dir", params.hpo.report_dir)):
        if os.path.lexists(folder) and not os.path.isdir(folder):
            problems.append(Problem(key, f"{folder!r} is a file, not a folder: name the folder to write into"))
    return problems


RULES = (dataset_names, dataset_entries, training_set_needs, variant_rules, variant_names, finetune_depths,
         cluster_resources, measures_and_columns, generation_rules, search_space, bm25_analyzer,
         output_folders)


def cross_field_problems(params: Params) -> list[Problem]:
    """The rules that tie keys together (:data:`RULES`, one function each), each broken one named by its key."""
    return [problem for rule in RULES for problem in rule(params)]
