"""Every closed set of names a params file may hold, declared once.

The schema's sections type their keys with these ``Literal`` types, and the
library imports the tuples beside them (``METHODS``, ``MASTER_TASKS``, ...)
wherever it needs the list, so a new method, decoder or pooling is added here
and nowhere else.
"""

from __future__ import annotations

from typing import Literal, get_args

Method = Literal["none", "cocondenser", "cotmae", "master"]
METHODS: tuple[str, ...] = get_args(Method)
# The methods that pre-train (``none`` keeps the init encoder as it is).
PRETRAINING_METHODS: tuple[str, ...] = tuple(method for method in METHODS if method != "none")

ContextType = Literal["passage", "query", "mixed"]
CONTEXT_TYPES: tuple[str, ...] = get_args(ContextType)

PassageContext = Literal["random_sampled", "nearby", "overlap", "next"]
PASSAGE_CONTEXTS: tuple[str, ...] = get_args(PassageContext)
# The kinds a passage context can mix, one drawn uniformly per pair (the release's data_type ``mixed`` /
# ``cotmae`` draws among all three, ``random_sampled+nearby`` among two): ``next`` is one of nearby's.
MixedPassageContext = Literal["random_sampled", "nearby", "overlap"]
MIXED_PASSAGE_CONTEXTS: tuple[str, ...] = get_args(MixedPassageContext)

# How MASTER's NPR decoder masks its text: uniformly, or by TF-IDF weight as MKP.
NprMask = Literal["uniform", "keyword"]
NPR_MASKS: tuple[str, ...] = get_args(NprMask)

# MASTER's decoders: masked keywords, complementary mask, next passage, doc2query and GPT-2 outputs recovering.
MasterTask = Literal["mkp", "cmp", "npr", "dor", "gor"]
MASTER_TASKS: tuple[str, ...] = get_args(MasterTask)

Pooling = Literal["cls", "mean"]
POOLINGS: tuple[str, ...] = get_args(Pooling)

Similarity = Literal["dot", "cosine"]
SIMILARITIES: tuple[str, ...] = get_args(Similarity)

DType = Literal["auto", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32", "fp64", "float64"]
DTYPES: tuple[str, ...] = get_args(DType)

Retriever = Literal["r1", "r2", "untuned"]
RETRIEVERS: tuple[str, ...] = get_args(Retriever)
# The fine-tuned retrievers of a variant: retriever 1 (BM25 negatives) and 2 (its own mined negatives).
FINETUNED_RETRIEVERS: tuple[str, ...] = tuple(name for name in RETRIEVERS if name != "untuned")

Pruner = Literal["median", "hyperband", "none"]
PRUNERS: tuple[str, ...] = get_args(Pruner)

# Pre-training switches whose two values are the paper's recipe and its public release's.
Recipe = Literal["paper", "release"]
RECIPES: tuple[str, ...] = get_args(Recipe)

SpanRule = Literal["bounded", "overflow"]
SPAN_RULES: tuple[str, ...] = get_args(SpanRule)

SingleSpanDocuments = Literal["drop", "self"]
SINGLE_SPAN_DOCUMENTS: tuple[str, ...] = get_args(SingleSpanDocuments)

PunktSource = Literal["pretrained", "trained"]
PUNKT_SOURCES: tuple[str, ...] = get_args(PunktSource)

DatasetFormat = Literal["beir", "msmarco-docs", "msmarco-passage", "trec", "hf"]
DATASET_FORMATS: tuple[str, ...] = get_args(DatasetFormat)

GeneratorMode = Literal["train", "pretrained"]
GENERATOR_MODES: tuple[str, ...] = get_args(GeneratorMode)

GeneratorArchitecture = Literal["prefix_lm", "bert2bert"]
GENERATOR_ARCHITECTURES: tuple[str, ...] = get_args(GeneratorArchitecture)

TitleJoin = Literal["space", "sep"]
TITLE_JOINS: tuple[str, ...] = get_args(TitleJoin)

Bm25Tokenizer = Literal["bm25s", "lucene"]
BM25_TOKENIZERS: tuple[str, ...] = get_args(Bm25Tokenizer)

# Retriever 1's training queries: every judged one, or those with negatives (the release's stage 1).
R1Queries = Literal["judged", "triples"]
R1_QUERY_SETS: tuple[str, ...] = get_args(R1Queries)

R1Negatives = Literal["bm25", "official"]
R1_NEGATIVES: tuple[str, ...] = get_args(R1Negatives)

# The zero-shot (BEIR) retriever's loss: cosine MNRL (train_msmarco_v3) | dot-product InfoNCE (Tevatron).
ZeroShotLoss = Literal["cosine_mnrl", "dot_infonce"]
ZERO_SHOT_LOSSES: tuple[str, ...] = get_args(ZeroShotLoss)

# Its negatives: sentence-transformers' hard-negatives file | the bm25 stage's negatives.
ZeroShotNegatives = Literal["hard_negatives", "bm25"]
ZERO_SHOT_NEGATIVES: tuple[str, ...] = get_args(ZeroShotNegatives)

IncompleteBatch = Literal["error", "drop"]
INCOMPLETE_BATCH: tuple[str, ...] = get_args(IncompleteBatch)

Launcher = Literal["python", "torchrun"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)

Direction = Literal["maximize", "minimize"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)

SpaceKind = Literal["float", "int", "categorical"]
SPACE_KINDS: tuple[str, ...] = get_args(SpaceKind)
