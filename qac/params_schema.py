"""The typed schema of every parameter in a params file.

Every section and key of ``profiles/base.yaml`` (and so of each rendered
``profiles/<name>/params.yaml``) is declared here with its type, its range and
its meaning (the field's description, which ``docs/parameters.md`` is generated
from). Unknown keys are errors everywhere, so a misspelt key (``finetune.learning_rate``,
``seeed``) stops a stage before it loads any model instead of being ignored.

Two kinds of check run on a params file (:func:`validate_params`):

- per key: type and range, by pydantic (strict: ``"8"`` is not a number, ``true``
  is not 1);
- across keys (:func:`cross_field_problems`): a variant's ``query_count`` within
  ``querygen.queries_per_passage``, batch sizes that divide, datasets and variants
  that are declared, depths within the corpus a profile keeps, ...

A new parameter is declared here (a field with its type, range and description)
in the same commit that adds it to ``profiles/base.yaml``; ``tests/test_params_schema.py``
fails on a key of a profile the schema does not know, and on a stale
``docs/parameters.md`` (``qac profile docs`` rewrites it).
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from qac.errors import UserError
from qac.names import INSIDE_PATH_RULE, PLAIN_NAME_RULE, is_inside_path, is_plain_name

# ----------------------------------------------------------------------------- types

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]          # [0, 1]
OpenFraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]      # (0, 1)
DropoutProbability = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # [0, 1)
LearningRate = NonNegativeFloat
DType = Literal["auto", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32", "fp64", "float64"]
Retriever = Literal["r1", "r2", "untuned"]

# Keys that mean the same in every section holding them: type, range and description declared once.
PeakLearningRate = Annotated[LearningRate, Field(description="peak learning rate")]
WarmupRatio = Annotated[Fraction, Field(description="share of the steps with a rising learning rate")]
WeightDecay = Annotated[NonNegativeFloat, Field(description="AdamW weight decay")]
ContrastiveTemperature = Annotated[PositiveFloat, Field(description="contrastive softmax temperature")]
TopK = Annotated[NonNegativeInt, Field(description="sample among the k likeliest tokens (0: no top-k cut)")]
TopP = Annotated[Annotated[float, Field(gt=0, le=1)], Field(description="nucleus sampling mass")]


def _plain_name(value: str) -> str:
    if not is_plain_name(value):
        raise ValueError(PLAIN_NAME_RULE)
    return value


def _inside_path(value: str) -> str:
    if not is_inside_path(value):
        raise ValueError(INSIDE_PATH_RULE)
    return value


# A name that becomes one folder name (profile, dataset, variant, study); a path that stays inside its folder.
PlainName = Annotated[str, AfterValidator(_plain_name)]
InsidePath = Annotated[str, AfterValidator(_inside_path)]
ChunkSize = Annotated[PositiveInt, Field(description="passages per atomically committed chunk (resume unit)")]


class Section(BaseModel):
    """A mapping of the params file: every key declared, nothing else allowed."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# ----------------------------------------------------------------------------- sections

class MlflowSection(Section):
    experiment: str | None = Field(description="MLflow experiment name; null: qac-<profile>")
    system_metrics: bool = Field(description="CPU/GPU/memory charts per run (logged quietly; QAC_VERBOSE=1 shows "
                                             "the monitor's lines)")
    log_models: bool = Field(description="true: trained encoders become run artifacts (as --log-models on "
                                         "pretrain/finetune)")


class DatasetEntry(Section):
    format: Literal["beir", "msmarco-docs", "msmarco-passage", "trec", "hf"] = Field(
        description="how the dataset's files are laid out")
    mirror: InsidePath | None = Field(default=None, description="folder name in the local mirror (QAC_DATA_MIRROR)")
    url: str | None = Field(default=None, description="public URL downloaded when the mirror lacks the dataset")
    md5: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{32}$",
                            description="MD5 the download must match (the publisher's checksum)")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$",
                               description="SHA-256 the download must match (used before md5 when both are given)")
    splits: list[PlainName] = Field(default_factory=list, description="query/qrels splits used (train, dev, test, ...)")
    rel_threshold: NonNegativeInt | dict[str, NonNegativeInt] = Field(
        default=1, description="grade from which a judgement counts as relevant, for all splits or per split")
    ignore_identical_ids: bool = Field(default=False,
                                       description="drop a retrieved document whose id equals the query's (BEIR)")
    collection: InsidePath | None = Field(default=None, description="TSV formats: the collection file "
                                                             "(null: collection.tsv)")
    topics: dict[PlainName, InsidePath] = Field(default_factory=dict, description="TSV formats: split -> topics file")
    qrels: dict[PlainName, InsidePath] = Field(default_factory=dict, description="TSV formats: split -> qrels file")
    hub: str | None = Field(default=None, description="format hf: the Hugging Face dataset (e.g. BeIR/scifact)")
    hub_qrels: str | None = Field(default=None, description="format hf: the dataset holding its qrels")
    convert: Literal["cranfield", "cisi"] | None = Field(
        default=None, description="converter of a download in its native format (format beir)")
    titles: InsidePath | None = Field(default=None, description="msmarco-passage: pid<TAB>title file in the collection's "
                                                         "order (RocketQA's para.title.txt)")
    triples: InsidePath | None = Field(default=None, description="msmarco-passage: official training triples "
                                                          "(qid, positive, negative), retriever 1's negatives with "
                                                          "finetune.r1_negatives: official")
    triples_url: str | None = Field(default=None, description="where triples is downloaded from when neither the "
                                                              "dataset folder nor the mirror root has it")
    triples_md5: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{32}$",
                                    description="MD5 the triples download must match")
    subsets: list[PlainName] = Field(
        default_factory=list, description="beir: sub-collections in <subset>/ folders (CQADupStack's 12 forums), each "
                                          "searched in its own corpus, their figures averaged")
    max_documents: NonNegativeInt | None = Field(default=None, description="overrides prepare.max_documents")
    keep_judged_documents: bool | None = Field(default=None,
                                               description="overrides prepare.keep_judged_documents")


class PrepareSection(Section):
    max_documents: NonNegativeInt | None = Field(
        description="keep the first N documents (null: all); for scaled-down profiles")
    keep_judged_documents: bool = Field(
        description="with max_documents: never drop a document that some qrel names")
    min_text_chars: NonNegativeInt = Field(description="shorter texts are empty: skipped and counted")


class SplitSection(Section):
    tokenizer: str = Field(description="the encoder's tokenizer (paper: bert-base-uncased)")
    max_len: PositiveInt = Field(description="passage length in tokens (paper: 144, no special tokens)")
    short_span_prob: Fraction = Field(description="paper: 0.15, target length drawn from [2, max_len]")
    random_sampled_window: PositiveInt = Field(
        description="passages a random_sampled context is drawn from")
    overlap_sentences: NonNegativeInt = Field(
        description="overlap context: last k sentences of the span plus what follows")
    spans: Literal["bounded", "overflow"] = Field(
        description="bounded: a span never exceeds max_len (long sentences cut); overflow (the release): a span closes "
                    "after the sentence that crosses its target, and pre-training crops one over pretrain max_len to "
                    "a random window (seeded per step and pair)")
    workers: PositiveInt = Field(description="processes splitting documents")
    chunk_size: PositiveInt = Field(description="documents per worker task (output does not depend on it)")
    max_documents: NonNegativeInt | None = Field(
        description="split only the first N documents of the corpus (null: all); a scaled-down pre-training corpus")
    punkt: Literal["pretrained", "trained"] = Field(
        description="pretrained: NLTK's English Punkt (the release; downloaded by NLTK at split time, an error naming "
                    "`python -m nltk.downloader punkt_tab` without a network); trained: learned from the corpus (runs "
                    "offline). Never one in place of the other")
    punkt_train_documents: PositiveInt | None = Field(
        description="trained Punkt learns from the first N documents (null: all)")


class QueryGeneratorSection(Section):
    mode: Literal["train", "pretrained"] = Field(
        description="train: fine-tune a generator here; pretrained: save a hub model")
    model: str = Field(description="warm start (train) or the generator itself (pretrained)")
    architecture: Literal["prefix_lm", "bert2bert"] = Field(
        description="train: prefix_lm (the encoder generates; all weights pretrained) or bert2bert")
    copy_bias: bool = Field(description="prefix_lm: learned bonus for the logits of the passage's own tokens")
    dropout: DropoutProbability | None = Field(
        description="replaces the encoder's dropout probabilities (null: the checkpoint's, 0.1 for BERT)")
    prefix: str = Field(description="input prefix; doc2query all-with_prefix uses \"text2query: \"")
    kind_prefixes: dict[Literal["query", "title"], str] = Field(
        description="per pair kind (query, title): its own input prefix instead of `prefix`, so that one "
                    "generator learns both tasks apart; querygen.prefix must then be the query one")
    max_source_len: PositiveInt = Field(description="passage tokens the generator reads in training")
    max_target_len: PositiveInt = Field(description="query tokens the generator learns to write")
    epochs: PositiveInt = Field(description="passes over the training pairs")
    batch_size: PositiveInt = Field(description="training pairs per optimizer step")
    lr: PeakLearningRate
    warmup_ratio: WarmupRatio
    heldout_fraction: Annotated[float, Field(ge=0, lt=1)] = Field(
        description="of the (passage -> query) training pairs, held out for the quality report")
    max_heldout: NonNegativeInt = Field(description="cap on held-out pairs")
    use_titles: bool = Field(description="add (document body -> title) pairs where documents have titles")
    evidence_windows: bool = Field(
        description="read each query pair's source from the run of sentences (max_source_len tokens) that shares "
                    "most words with the query, not from the document's start (qac.querygen.generator_pairs)")
    max_train_pairs: PositiveInt | None = Field(
        description="cap on training pairs (query pairs first, then titles); null: all")
    weight_decay: WeightDecay
    log_every: PositiveInt = Field(description="optimizer steps between logged losses")
    dtype: DType = Field(description="auto: bf16 autocast on GPU, fp32 on CPU; bf16 forces autocast on CPU too")
    quality_max_documents: PositiveInt | None = Field(
        description="BM25 index of the self-retrieval check: all documents (null) or a seeded sample")
    quality_candidates: PositiveInt | None = Field(
        description="candidates sampled per held-out source (null: querygen.queries_per_passage)")
    max_steps: PositiveInt | None = Field(description="cap on optimizer steps (null: epochs decide)")
    validation_pairs: NonNegativeInt = Field(
        description="training pairs set aside to choose the best weights (0: keep the last)")
    eval_every: NonNegativeInt = Field(description="steps between validation losses (0: none)")
    patience: NonNegativeInt = Field(
        description="evaluations without improvement before stopping early (0: never)")
    judge_anchors: NonNegativeInt = Field(
        description="held-out documents for the Table 5 judge comparison (0: skip it)")
    judge_calibration_pairs: PositiveInt | None = Field(
        description="relevant pairs calibrating that judge (null: annotation.calibration_pairs)")


class QuerygenSection(Section):
    prefix: str = Field(description="input prefix of the generator (its query task)")
    repeat_penalty: NonNegativeFloat = Field(
        description="subtracted from the logits of tokens a candidate already emitted (0: the paper's sampling)")
    temperature: PositiveFloat = Field(
        description="logits divided by it before top-k/top-p (1: the paper's sampling)")
    min_new_tokens: NonNegativeInt = Field(
        description="tokens sampled before end of sequence may be (0: the paper's sampling)")
    queries_per_passage: PositiveInt = Field(
        description="candidates generated per passage (paper release: 20; Table 3 uses the first 1/5/10/20)")
    top_p: TopP
    top_k: TopK
    max_new_tokens: PositiveInt = Field(description="longest generated query, in tokens")
    max_source_len: PositiveInt = Field(description="passage tokens the generator reads")
    batch_size: PositiveInt = Field(description="passages per generation batch")
    chunk_size: ChunkSize
    max_passages: PositiveInt | None = Field(
        description="generate for the first N passages only (null: all); queries.arrow is then a prefix")
    drop_duplicates: bool = Field(description="drop a candidate that repeats an earlier one of its passage")
    drop_empty: bool = Field(description="drop empty candidates")
    dtype: DType = Field(
        description="auto: bf16 on GPU (fp16 if no bf16), fp32 on CPU; bf16 forces it on CPU too")
    batch_invariant: Literal["auto"] | bool = Field(
        description="re-decide near-tie samples from canonical logits; auto: on in fp32, off in bf16/fp16")
    sync_every: PositiveInt = Field(
        description="decoding steps between the host's reads of the device (finished rows leave the batch then); "
                    "without batch invariance only (it can then change rare tokens); batch-invariant decoding reads "
                    "every step")


class MasterWeights(Section):
    mkp: NonNegativeFloat = Field(default=1.0, description="masked keywords prediction (TF-IDF weighted mask)")
    cmp: NonNegativeFloat = Field(default=1.0, description="complementary mask: the words the encoder saw")
    npr: NonNegativeFloat = Field(default=1.0, description="next passage (or generated query) recovering")
    dor: NonNegativeFloat = Field(default=1.0, description="doc2query outputs recovering")
    gor: NonNegativeFloat = Field(default=1.0, description="GPT-2 (causal LM) outputs recovering")


class PretrainCommon(Section):
    init: str = Field(description="hub name, local path, minilm, or scratch:<hub name or path>")
    max_len: PositiveInt = Field(description="passage tokens")
    query_max_len: PositiveInt = Field(description="query (context) tokens")
    steps: PositiveInt = Field(description="optimizer steps")
    batch_size: PositiveInt = Field(description="pairs per optimizer step (global); a multiple of grad_accumulation")
    grad_accumulation: PositiveInt = Field(description="micro-batches per optimizer step")
    lr: PeakLearningRate
    weight_decay: WeightDecay
    warmup_ratio: WarmupRatio
    mlm_probability: OpenFraction = Field(description="share of tokens masked for the MLM losses")
    temperature: ContrastiveTemperature
    grad_cache_chunk: NonNegativeInt = Field(
        description="0: no gradient caching; else chunk size of the cached contrastive pass")
    n_head_layers: PositiveInt = Field(description="coCondenser head layers")
    skip_from: NonNegativeInt = Field(description="coCondenser: the encoder layer whose output skips to the head")
    cocondenser_loss_weights: Literal["paper", "release"] = Field(
        description="paper: MLM + head MLM + contrastive, 1:1:1 (Eq. 7); release: 2:2:1 (qac/deviations.yaml)")
    cotmae_mask_ratio: OpenFraction = Field(description="CoT-MAE encoder mask ratio")
    cotmae_decoder: Literal["paper", "release"] = Field(
        description="paper: bidirectional BERT layers, masked context, MLM; release: GPT-2 block(s), causal window, "
                    "unmasked query, next token")
    cotmae_decoder_layers: PositiveInt = Field(description="CoT-MAE decoder layers")
    cotmae_decoder_weight: NonNegativeFloat = Field(description="weight of the CoT-MAE decoder loss")
    cotmae_attention_window: PositiveInt = Field(description="CoT-MAE release decoder: attention window")
    cotmae_decoder_mask_ratio: OpenFraction = Field(
        description="paper decoder only: share of the context's words masked (the CoT-MAE paper's 45%; neither the "
                    "query-as-context paper nor its release has one)")
    mixed_query_prob: Fraction = Field(description="mixed context: probability that a pair's context is a query")
    master_decoders: list[Literal["mkp", "cmp", "npr", "dor", "gor"]] = Field(
        description="MASTER's decoders, any subset of mkp, cmp, npr, dor, gor (docs/architecture.md, \"MASTER\")")
    master_mask_ratio: Fraction = Field(description="MASTER encoder mask ratio (MASTER paper: 30%)")
    master_decoder_mask_ratio: Fraction = Field(
        description="MASTER decoders' mask ratio (MASTER paper: 50%); CMP masks exactly what the encoder saw instead")
    master_decoder_layers: PositiveInt = Field(description="layers of each MASTER decoder (MASTER paper: 2)")
    master_weights: MasterWeights = Field(description="loss weight per MASTER decoder (MASTER paper: all 1)")
    master_dor_queries: PositiveInt = Field(
        description="k: generated queries joined into MASTER's DOR decoder text (MASTER's release data: 10)")
    passage_context: Literal["random_sampled", "nearby", "overlap", "next"] = Field(
        description="how a passage context is drawn: random_sampled | nearby | overlap | next (the following span, "
                    "MASTER's NPR)")
    single_span_documents: Literal["drop", "self"] = Field(
        description="passage and mixed contexts of a document split into one span: drop (no other span, not an "
                    "anchor) or self (the release: paired with itself, so the passage, query and mixed variants see "
                    "the same anchors)")
    pad_to: PositiveInt | None = Field(
        description="null: pad each batch side to its longest sequence; N: pad everything to N")
    dropout: DropoutProbability | None = Field(
        description="null: the init checkpoint's dropout; 0.0 makes runs repeatable across process layouts")
    checkpoint_every: PositiveInt = Field(description="steps between resumable checkpoints")
    log_every: PositiveInt = Field(description="steps between logged losses")
    dtype: DType = Field(description="autocast dtype; auto: bf16 on GPU, fp32 on CPU")
    compile: bool = Field(description="torch.compile the model: faster steps on a GPU, the same loss to float "
                                      "tolerance")
    loader_workers: NonNegativeInt = Field(
        description="DataLoader processes collating steps ahead (0: collate in the loop); the batches are the "
                    "same at any number")
    prefetch_batches: PositiveInt = Field(description="steps each loader process collates ahead")


def _override(name: str, info: Any) -> tuple[Any, Any]:
    annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return annotation, Field(default=None, description=f"overrides pretrain.common.{name}")


# One row of the study: pretrain.common with the keys a variant sets overriding it (absent: as common).
PretrainVariant = create_model(
    "PretrainVariant", __base__=Section,
    method=(Literal["none", "cocondenser", "cotmae", "master"],
            Field(description="none (no pre-training: the init encoder as is), cocondenser, cotmae or master")),
    context_type=(Literal["passage", "query", "mixed"] | None,
                  Field(default=None, description="what a pair's context is (null: passage)")),
    query_count=(PositiveInt | None,
                 Field(default=None, description="C: generated queries a passage's context is drawn from "
                                                 "(null: 1); at most querygen.queries_per_passage")),
    **{name: _override(name, info) for name, info in PretrainCommon.model_fields.items()},
)


class PretrainSection(Section):
    common: PretrainCommon = Field(description="settings shared by every variant")
    variants: dict[PlainName, PretrainVariant] = Field(
        description="name -> {method: none|cocondenser|cotmae|master, context_type: passage|query|mixed, query_count: C, "
                    "any pretrain.common key}")


class ContinuationSection(Section):
    model: str = Field(description="causal LM: hub name (gpt2), local folder, or tiny:<tokenizer> (random 2-layer "
                                   "GPT-2, tests and smoke)")
    max_source_len: PositiveInt = Field(description="the passage's last N tokens are what the LM continues")
    max_new_tokens: PositiveInt = Field(description="tokens sampled per continuation")
    top_k: TopK
    top_p: TopP
    temperature: PositiveFloat = Field(description="logits divided by it before top-k/top-p")
    batch_size: PositiveInt = Field(description="passages per decoding batch")
    chunk_size: ChunkSize
    max_passages: PositiveInt | None = Field(
        description="continue the first N passages only (null: all); later passages have no GOR text")
    dtype: DType = Field(description="auto: bf16 on GPU, fp32 on CPU")


class FinetuneSection(Section):
    query_max_len: PositiveInt = Field(description="query tokens")
    passage_max_len: PositiveInt = Field(description="passage tokens")
    corpus_max_len: PositiveInt | None = Field(
        description="tokens (with [CLS] and [SEP]) of the corpus encoded for mining and evaluation and of retriever "
                    "1's training passages; null: passage_max_len (paper); release: 130 (128 + 2)")
    train_n_passages: Annotated[int, Field(ge=2)] = Field(
        description="passages per training query: 1 positive + the rest negatives")
    batch_size: PositiveInt = Field(description="queries per step (global); the training queries must fill whole "
                                                "batches (see incomplete_batch)")
    incomplete_batch: Literal["error", "drop"] = Field(
        description="training queries that do not fill a last whole batch: error (stop before training, naming "
                    "the counts) or drop (leave them out, counted in the summary line and in MLflow)")
    lr: PeakLearningRate
    epochs: PositiveInt = Field(description="epochs per fine-tuning stage")
    warmup_ratio: WarmupRatio
    weight_decay: WeightDecay
    temperature: ContrastiveTemperature
    pooling: Literal["cls", "mean"] = Field(description="how a text's embedding is read: cls | mean")
    bm25_depth: PositiveInt = Field(description="BM25 negatives are drawn from this depth")
    mine_depth: PositiveInt = Field(description="retriever 1 mining depth (paper: 200)")
    mine_skip_top: NonNegativeInt = Field(description="mined negatives start below this rank (0: from the top)")
    r2_use_bm25_negatives: bool = Field(description="paper release: retriever 2 sees mined negatives only")
    r1_negatives: Literal["bm25", "official"] = Field(
        description="retriever 1's negatives: bm25 (our BM25 top bm25_depth) or official (drawn from the training "
                    "triples of datasets.<train_dataset>.triples, as the release)")
    official_negatives: PositiveInt = Field(description="official: negatives kept per query (the release: 128)")
    title_join: Literal["space", "sep"] = Field(
        description="in-domain title and text for the dense encoder: space, or sep (title [SEP] text, as the "
                    "release's Tevatron corpus); zero-shot sets are joined by a space, as BEIR")
    max_train_queries: PositiveInt | None = Field(
        description="keep a seeded random subset of the training queries (null: all)")
    max_grad_norm: PositiveFloat | None = Field(
        description="gradient clipping norm (Tevatron v1 trains with the HF Trainer, which clips at 1.0); "
                    "null: no clipping")
    dtype: DType = Field(description="autocast on GPU: bf16 (fp16 without bf16); CPU runs fp32 unless bf16 is set")
    log_every: PositiveInt = Field(description="steps between loss / lr metrics")
    encode_batch_size: PositiveInt = Field(
        description="texts per forward pass when retriever 1 encodes the corpus for mining")
    loader_workers: NonNegativeInt = Field(
        description="DataLoader processes padding training steps and encoding batches ahead (0: in the loop); the "
                    "batches are the same at any number")
    prefetch_batches: PositiveInt = Field(description="batches each loader process prepares ahead")


class Bm25Section(Section):
    k1: NonNegativeFloat = Field(description="term-frequency saturation (0.9: Pyserini's default for MS MARCO and "
                                             "BEIR; 0.82: Anserini's tuned MS MARCO passage run the paper cites)")
    b: Fraction = Field(description="length normalisation (0.4: Pyserini's default; 0.68: Anserini's tuned run)")
    in_domain_title: bool = Field(
        description="index train_dataset's titles with the text (false: text only, as Anserini's title-less MS MARCO "
                    "passage collection); zero-shot datasets always index title and text, as BEIR")
    tokenizer: Literal["bm25s", "lucene"] = Field(
        description="bm25s (lower-cased \\w\\w+ words) or lucene (Lucene's StandardTokenizer approximated, English "
                    "possessive dropped, lower-cased: with stopwords lucene and stemmer porter, Lucene's "
                    "EnglishAnalyzer as Anserini runs it)")
    stopwords: str | None = Field(description="bm25s's stopword list (en), lucene (Lucene's 33-word English set); "
                                               "null keeps every word")
    stemmer: str | None = Field(description="PyStemmer algorithm: english (Snowball), porter (Lucene's "
                                            "PorterStemFilter); null: no stemming")


class EvaluateSection(Section):
    depth: PositiveInt = Field(description="documents retrieved per query")
    batch_size: PositiveInt = Field(description="texts per forward pass when encoding")
    loader_workers: NonNegativeInt = Field(
        description="DataLoader processes padding encoding batches ahead (0: in the loop); the vectors are the same "
                    "at any number")
    metrics: list[str] = Field(min_length=1, description="measures: RR[@k], R@k, Hit@k, P@k, nDCG[@k], AP")
    zero_shot_variants: list[str] | None = Field(
        description="variants evaluated on the zero-shot datasets (null: all)")
    zero_shot_retrievers: list[Retriever] | None = Field(
        description="retrievers evaluated zero-shot: r1, r2, untuned (null: all)")
    untuned_baseline: bool = Field(
        description="also evaluate the start checkpoint of variant `none` without fine-tuning")


class PublishedFigure(Section):
    dataset: str = Field(description="a dataset name of the profile (datasets:)")
    split: str = Field(description="its split")
    measure: str = Field(description="the measure, as evaluate.metrics names it (nDCG@10, RR@10, ...)")
    value: Annotated[float, Field(ge=0, le=1)] = Field(description="the published figure, a fraction")
    source: str = Field(description="where it is published")


class EncoderEntry(Section):
    pooling: Literal["cls", "mean"] = Field(description="how the model was trained to pool its token states")
    normalize: bool = Field(description="embeddings L2-normalised (cosine similarity), as the model was trained")
    query_max_len: PositiveInt = Field(description="query tokens the model reads")
    passage_max_len: PositiveInt = Field(description="passage tokens the model reads")
    published: list[PublishedFigure] = Field(
        default_factory=list, description="published figures of the model used this way, shown beside ours")


class AnnotationSection(Section):
    documents: PositiveInt = Field(description="paper: 200 documents, one passage each, two pairs per document")
    judge: Literal["encoder_cosine"] = Field(
        description="labels until people label: cosine of mean-pooled judge_model embeddings >= threshold")
    judge_model: str = Field(description="the judge's encoder")
    judge_max_len: PositiveInt = Field(description="tokens per text the judge reads (longer texts are truncated)")
    calibration_split: str = Field(description="qrels of train_dataset that calibrate the judge's threshold")
    calibration_pairs: PositiveInt = Field(
        description="relevant query-document pairs (and as many random pairs)")
    human_sheets: list[str] = Field(
        description="filled copies of sheet.csv (one per annotator); non-empty: Table 5 uses their majority")


class TableColumn(Section):
    label: str = Field(description="the column's head")
    short: str | None = Field(default=None, description="the compact LaTeX head")
    dataset: str | None = Field(default=None, description="a key of datasets (null: train_dataset)")
    split: str | None = Field(default=None, description="the dataset's split")
    measure: str | None = Field(default=None, description="a measure of evaluate.metrics")
    paper: str | None = Field(default=None, description="the paper's Table 1 column shown beside ours")
    missing: str | None = Field(default=None, description="a column the profile cannot produce: the reason")


class HardNegativesSource(Section):
    mirror: str | None = Field(description="path of the file under the data mirror root, looked for first")
    url: str | None = Field(description="public URL it is downloaded from when the mirror and cache lack it")
    md5: str | None = Field(description="pinned MD5 of the download (null: downloaded with a warning)")


class BeirRetrieverSection(Section):
    hard_negatives: HardNegativesSource = Field(
        description="sentence-transformers' msmarco-hard-negatives.jsonl.gz: mirror path, URL, checksum")
    negatives: Literal["hard_negatives", "bm25"] = Field(
        description="training negatives: hard_negatives (the file above, the paper's footnote 2) or bm25 (the "
                    "bm25 stage's negatives.jsonl)")
    systems: list[str] | None = Field(
        description="mining systems of the file whose negatives are used, in this order (null: all, file order, "
                    "as train_msmarco_v3.py)")
    negatives_per_system: PositiveInt = Field(description="negatives kept from each system (train_msmarco_v3.py: 5)")
    ce_score_margin: NonNegativeFloat | None = Field(
        description="skip negatives scored by the cross-encoder above the lowest positive's score minus this "
                    "(train_msmarco_v3.py: 3); null: keep every negative (the only choice for an unscored file)")
    pooling: Literal["cls", "mean"] = Field(description="how a text's embedding is read (train_msmarco_v3.py: mean)")
    loss: Literal["cosine_mnrl", "dot_infonce"] = Field(
        description="cosine_mnrl: MultipleNegativesRankingLoss over cosines times scale (train_msmarco_v3.py); "
                    "dot_infonce: InfoNCE over dot products divided by 1 / scale (Tevatron, scale 1)")
    scale: PositiveFloat = Field(description="similarity scale, the inverse temperature (MNRL: 20)")
    batch_size: PositiveInt = Field(description="queries per step, each with its positive and negatives "
                                                "(train_msmarco_v3.py: 75)")
    train_n_passages: Annotated[int, Field(ge=2)] = Field(
        description="passages per query: 1 positive + the rest hard negatives (train_msmarco_v3.py: 2, a triple)")
    query_max_len: PositiveInt = Field(description="query tokens (train_msmarco_v3.py: 350, one length for all)")
    passage_max_len: PositiveInt = Field(description="passage tokens, training and zero-shot corpora (350)")
    lr: LearningRate = Field(description="peak learning rate (sentence-transformers' default 2e-5)")
    epochs: PositiveInt = Field(description="epochs over the training queries (train_msmarco_v3.py: 10)")
    warmup_ratio: Fraction = Field(description="share of the steps with a rising learning rate (the script: "
                                               "1000 steps)")
    weight_decay: NonNegativeFloat = Field(description="AdamW weight decay (sentence-transformers' default 0.01)")
    max_grad_norm: PositiveFloat | None = Field(description="gradient clipping norm (sentence-transformers: 1.0)")
    incomplete_batch: Literal["error", "drop"] = Field(
        description="training queries that do not fill a last whole batch: error or drop (counted)")
    max_train_queries: PositiveInt | None = Field(
        description="keep a seeded random subset of the training queries (null: all)")
    dtype: DType = Field(description="autocast on GPU (the script trains with AMP)")
    log_every: PositiveInt = Field(description="steps between loss / lr metrics")


class TablesSection(Section):
    out_dir: str = Field(description="reports folder (reports/<profile>/)")
    main_query_count: PositiveInt | None = Field(
        description="C of the query-context rows in Tables 1, 2, 4 (null: the largest); the paper's Table 1 "
                    "QaC rows are C=5")
    zero_shot_retriever: Literal["r1", "r2", "beir"] = Field(
        description="Table 2's retriever: beir (trained by the beir_retriever stage on sentence-transformers' "
                    "MS MARCO hard negatives, the paper's footnote 2), or retriever r1 / r2 of fine-tuning")
    permutations: PositiveInt = Field(description="paired randomization test permutations")
    in_domain_columns: list[TableColumn] = Field(
        description="Tables 1, 3 and 4 columns: {label, short, dataset, split, measure, paper} or {label, missing, "
                    "paper}")


class CheckSection(Section):
    expected: str | None = Field(
        description="the profile's expected cells with tolerances (written by `qac check --record`)")


class PrunerSection(Section):
    type: Literal["median", "hyperband", "none"] = Field(description="median | hyperband | none")
    n_startup_trials: NonNegativeInt = Field(default=5, description="median: trials before pruning starts")
    n_warmup_steps: NonNegativeInt = Field(default=0, description="median: steps of a trial before it may be pruned")
    interval_steps: PositiveInt = Field(default=1, description="median: steps between pruning checks")
    min_resource: PositiveInt | Literal["auto"] = Field(default="auto", description="hyperband: minimum resource")
    max_resource: PositiveInt | Literal["auto"] = Field(default="auto", description="hyperband: maximum resource")
    reduction_factor: Annotated[int, Field(ge=2)] = Field(default=3, description="hyperband: reduction factor")


class SpaceEntry(Section):
    type: Literal["float", "int", "categorical"] = Field(description="float | int | categorical")
    low: int | float | None = Field(default=None, description="float/int: lowest value")
    high: int | float | None = Field(default=None, description="float/int: highest value")
    log: bool = Field(default=False, description="float/int: sample on a log scale")
    step: int | float | None = Field(default=None, description="float/int: grid step")
    choices: list[Any] | None = Field(default=None, description="categorical: the values")


class HpoDev(Section):
    queries: PositiveInt = Field(description="dev queries taken from the training queries, by seeded hash of the "
                                             "query id")
    max_documents: PositiveInt | None = Field(
        description="a larger corpus is cut to a pool: judged + BM25 negatives + seeded sample; null: all")


class HpoSection(Section):
    variant: str = Field(description="the pre-training variant searched (a key of pretrain.variants)")
    study_name: PlainName | None = Field(description="null: <profile>-<variant>")
    storage: str | None = Field(
        description="null: journal file data/<profile>/hpo/<study>/journal.log; or a database URL")
    n_trials: PositiveInt = Field(description="trials of the study")
    metric: str = Field(description="the dev measure the study optimises")
    direction: Literal["maximize", "minimize"] = Field(description="maximize | minimize")
    seed: int | None = Field(description="null: the top-level seed; worker i samples with seed + i")
    tpe_startup_trials: NonNegativeInt = Field(description="random trials before TPE models the results")
    pruner: PrunerSection = Field(description="median | hyperband | none, with their settings")
    retry_failed: NonNegativeInt = Field(description="re-run a trial whose worker died, at most this many times")
    heartbeat_interval: PositiveInt = Field(description="database storage: seconds between heartbeats of a running "
                                                        "trial")
    grace_period: PositiveInt = Field(description="database storage: silence after which a running trial is failed")
    launcher: Literal["python", "torchrun"] = Field(
        description="python | torchrun (each trial on nproc_per_node processes)")
    nproc_per_node: PositiveInt = Field(description="torchrun: processes per trial")
    trial_timeout: PositiveFloat | None = Field(description="seconds; null: no limit")
    job: str = Field(description="module (or .py script) a trial runs")
    dev: HpoDev = Field(description="the dev queries and corpus a trial is scored on")
    pretrain_steps: PositiveInt | None = Field(description="null: the variant's steps")
    finetune_epochs: PositiveInt = Field(description="retriever 1 epochs per trial")
    eval_every: PositiveInt = Field(
        description="fine-tuning steps between dev evaluations (the pruner's intermediate values)")
    keep_models: bool = Field(description="keep each trial's encoders under data/<profile>/hpo/<study>/trials/")
    report_dir: str = Field(description="reports/hpo/<study>/: best trial, figures")
    space: dict[str, SpaceEntry | None] = Field(
        description="key -> {type: float|int|categorical, low, high, log, step | choices}; null drops a key")


class ClusterResources(Section):
    nodes: PositiveInt | None = Field(default=None, description="sbatch --nodes")
    gpus_per_node: NonNegativeInt | None = Field(default=None, description="GPUs per node (one process per GPU under "
                                                                           "torchrun)")
    cpus_per_task: PositiveInt | None = Field(default=None, description="sbatch --cpus-per-task")
    mem: str | PositiveInt | None = Field(default=None, description="sbatch --mem, such as 64G")
    time: str | None = Field(default=None, description="sbatch --time, such as 12:00:00")
    distributed: bool | None = Field(default=None, description="run torchrun on every node")


class ClusterSection(Section):
    shared_root: str | None = Field(
        description="the checkout on storage every node mounts; null: the directory the scripts are rendered in")
    dvc_cache: str | None = Field(
        description="DVC cache on shared storage, set by submit.sh (`dvc cache dir --local`); null: leave it")
    partition: str | None = Field(description="sbatch --partition; null: the cluster's default")
    account: str | None = Field(description="sbatch --account")
    qos: str | None = Field(description="sbatch --qos")
    requeue: bool = Field(description="a pre-empted job is requeued and resumes from its last checkpoint")
    setup: list[str] = Field(description="shell lines every job runs first (module load ..., source "
                                         ".venv/bin/activate)")
    default: ClusterResources = Field(description="resources of every stage's job: nodes, gpus_per_node, "
                                                  "cpus_per_task, mem, time, distributed (all six set)")
    stages: dict[str, ClusterResources] = Field(
        description="stage -> overrides of default (a foreach stage by its base name, e.g. pretrain, then by its "
                    "full name, e.g. pretrain@none)")
    sweep: ClusterResources = Field(description="sweep.sbatch: `dvc exp run --run-all`")


class Params(Section):
    """A whole params file."""

    profile: PlainName = Field(description="the profile's name (set by rendering)")
    seed: int = Field(description="seed of every random choice")
    data_dir: str = Field(description="every stage output lives under data/<profile>/")
    mlflow: MlflowSection = Field(description="run tracking")
    datasets: dict[PlainName, DatasetEntry] = Field(
        description="datasets the profile uses, by name: format, mirror folder, public URL and checksum, splits")
    pretrain_corpus: str | None = Field(description="documents split into passages for pre-training")
    train_dataset: str | None = Field(
        description="the in-domain dataset: fine-tuning queries, in-domain test split")
    zero_shot: list[str] = Field(description="datasets evaluated zero-shot (Table 2)")
    prepare: PrepareSection = Field(description="reading and cutting the datasets (stage prepare@<dataset>)")
    split: SplitSection = Field(description="documents into passages (stage split_passages)")
    query_generator: QueryGeneratorSection = Field(description="the doc2query generator (stage query_generator)")
    querygen: QuerygenSection = Field(description="generating queries for passages (stage generate_queries)")
    pretrain: PretrainSection = Field(description="pre-training (stage pretrain@<variant>)")
    continuation: ContinuationSection = Field(
        description="causal-LM continuations of passages for MASTER's GOR decoder (stage generate_continuations)")
    finetune: FinetuneSection = Field(description="two-stage fine-tuning of the retrievers (stage finetune@<variant>)")
    bm25: Bm25Section = Field(description="BM25 negatives and baseline (bm25s, Lucene scoring)")
    evaluate: EvaluateSection = Field(description="retrieval and metrics (stage evaluate@<variant>)")
    beir_retriever: BeirRetrieverSection = Field(
        description="Table 2's zero-shot retriever recipe (stage beir_retriever, when tables.zero_shot_retriever "
                    "is beir)")
    annotation: AnnotationSection = Field(description="the Table 5 annotation study (stage annotation)")
    encoders: dict[str, EncoderEntry] = Field(
        default_factory=dict, description="by model spec (as pretrain inits name it): how a published encoder "
        "was trained, so that its untuned baseline row is evaluated that way; others use the finetune settings")
    tables: TablesSection = Field(description="Tables 1-5 (stage tables)")
    check: CheckSection = Field(description="expected-score check (`qac check`)")
    hpo: HpoSection = Field(description="hyper-parameter search (`qac hpo`, docs/hpo.md)")
    cluster: ClusterSection = Field(description="cluster launch (`qac profile plan NAME --slurm DIR`, docs/cluster.md)")


# ----------------------------------------------------------------------------- problems

class Problem(typing.NamedTuple):
    key: str          # dotted key ('' for the whole file)
    message: str


class ParamsError(ValueError, UserError):
    """A params file that breaks the schema: every problem with its dotted key and line."""

    def __init__(self, path: str | None, problems: list[Problem], lines: Mapping[str, int] | None = None):
        self.path = str(path) if path else "params"
        self.problems = list(problems)
        self.lines = dict(lines or {})
        super().__init__(self.describe())

    def describe(self) -> str:
        def place(problem: Problem) -> str:
            line = _line_of(self.lines, problem.key)
            return f"{self.path}:{line}" if line else self.path

        if all(not problem.key for problem in self.problems):
            return "; ".join(f"{place(problem)}: {problem.message}" for problem in self.problems)
        footer = ("Change it in that file (a profile's params.yaml is rendered from profiles/base.yaml and "
                  "profiles/<name>.yaml: change those, then run `qac profile render`); docs/parameters.md lists "
                  "every key with its type and range.")
        if len(self.problems) == 1:
            problem = self.problems[0]
            stop = "" if problem.message.endswith((".", "?", ")")) else "."
            return f"{place(problem)}: parameter {problem.key}: {problem.message}{stop} {footer}"
        shown = self.problems[:12]
        rows = [f"  {place(problem)}: " + (f"parameter {problem.key}: " if problem.key else "") + problem.message
                for problem in shown]
        if len(self.problems) > len(shown):
            rows.append(f"  ... and {len(self.problems) - len(shown)} more")
        return (f"{self.path}: {len(self.problems)} problems in the parameters:\n" + "\n".join(rows) + "\n"
                + footer)

    def __reduce__(self):
        return type(self), (self.path, self.problems, self.lines)


def _line_of(lines: Mapping[str, int], key: str) -> int | None:
    while key:
        if key in lines:
            return lines[key]
        key = key.rpartition(".")[0]
    return None


def _unwrap(annotation: Any) -> Any:
    """The model or container type inside Optional / Annotated / unions."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, getattr(__import__("types"), "UnionType", Union)):
            args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            models = [arg for arg in args if isinstance(arg, type) and issubclass(arg, BaseModel)]
            containers = [arg for arg in args if typing.get_origin(arg) in (dict, list)]
            annotation = (models or containers or args)[0]
        else:
            return annotation


def known_keys_at(parts: tuple) -> list[str]:
    """The keys the schema declares inside the mapping at ``parts`` (a pydantic error location)."""
    annotation: Any = Params
    for part in parts:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if part not in annotation.model_fields:
                return []
            annotation = annotation.model_fields[part].annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _dotted(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def _shown(value: Any) -> str:
    return repr(value) if not isinstance(value, (dict, list)) else f"a {'mapping' if isinstance(value, dict) else 'list'}"


def _expectation(error: dict) -> str:
    """What the schema wanted, in words (``an integer``, ``>= 1``, ``one of 'cls', 'mean'``)."""
    kind, context = error["type"], error.get("ctx") or {}
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "an integer"
    if kind in ("float_type", "float_parsing"):
        return "a number"
    if kind == "bool_type":
        return "true or false"
    if kind == "string_type":
        return "a string"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "a mapping of keys"
    if kind == "list_type":
        return "a list"
    if kind == "none_required":
        return "null"
    if kind == "literal_error":
        return f"one of {context.get('expected')}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        limit = next(iter(context.values()))
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return f"{bound} {limit}"
    if kind == "finite_number":
        return "a finite number"
    if kind == "string_pattern_mismatch":
        return f"a string of the form {context.get('pattern')}"
    if kind == "too_short":
        return "not empty"
    if kind == "value_error":
        return str(context.get("error") or error["msg"])
    return error["msg"]


def _type_problem(items: list[dict]) -> str:
    """One message for a key's errors (several when its type is a union: one per branch)."""
    given = items[0].get("input")
    expectations = list(dict.fromkeys(_expectation(item) for item in items))
    ranged = all(item["type"] in ("greater_than_equal", "greater_than", "less_than_equal", "less_than",
                                  "finite_number", "too_short") for item in items)
    hint = ""
    if isinstance(given, str) and re.fullmatch(r"\s*[-+]?(?=[._]*[0-9])[0-9._]+([eE][-+]?[0-9]+)?\s*", given):
        hint = " (a number written as a string: drop the quotes)"
    verb = "must be" if ranged else "expected"
    return f"{verb} {' or '.join(expectations)}, found {_shown(given)}{hint}"


# Names other tools give a setting, and the key qac uses for it (suggested when that key exists there).
_ALIASES = {"learning_rate": "lr", "num_epochs": "epochs", "n_epochs": "epochs", "num_train_epochs": "epochs",
            "train_batch_size": "batch_size", "per_device_train_batch_size": "batch_size", "num_steps": "steps",
            "max_steps": "steps", "max_length": "max_len", "max_seq_length": "max_len", "seed_value": "seed"}


def _suggestion(name: str, known: list[str], missing: list[str], unknown_here: int) -> str | None:
    """The declared key a misspelt ``name`` most likely means."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    if _ALIASES.get(name) in known:
        return _ALIASES[name]
    if len(missing) == 1 and unknown_here == 1:
        return missing[0]    # one key renamed: the unknown one stands for the missing one
    return None


def _schema_problems(error: ValidationError) -> list[Problem]:
    """Pydantic's errors as problems, one per key (a union's branches folded into one message)."""
    by_key: dict[tuple, list[dict]] = {}
    for item in error.errors():
        loc = _clean_location(tuple(item["loc"]))
        by_key.setdefault(loc, []).append(item)
    kinds_of = {loc: {item["type"] for item in items} for loc, items in by_key.items()}
    missing: dict[tuple, list[str]] = {}
    unknown: dict[tuple, list[str]] = {}
    for loc, kinds in kinds_of.items():
        if "missing" in kinds:
            missing.setdefault(loc[:-1], []).append(str(loc[-1]))
        if "extra_forbidden" in kinds:
            unknown.setdefault(loc[:-1], []).append(str(loc[-1]))
    explained: set[tuple] = set()      # missing keys that a misspelling accounts for
    problems = []
    for loc, items in by_key.items():
        kinds, key, parent = kinds_of[loc], _dotted(loc), loc[:-1]
        if "extra_forbidden" in kinds:
            known = known_keys_at(parent)
            close = _suggestion(str(loc[-1]), known, missing.get(parent, []), len(unknown.get(parent, [])))
            if close is not None:
                explained.add(parent + (close,))
            prefix = _dotted(parent) + "." if parent else ""
            hint = f"; did you mean {prefix}{close}?" if close else ""
            scope = f"{_dotted(parent)} has" if parent else "the file has"
            listing = f" ({scope}: {', '.join(known)})" if known and not close and len(known) <= 40 else ""
            problems.append(Problem(key, f"unknown key{hint}{listing}"))
        elif loc and loc[-1] == "[key]":
            # A mapping's key is a name (a dataset, a variant): the problem is the mapping's, naming the key.
            problems.append(Problem(_dotted(loc[:-2]), f"key {items[0].get('input')!r}: "
                                    f"{_type_problem(items)}"))
        elif "missing" not in kinds:
            problems.append(Problem(key, _type_problem(items)))
    for loc, kinds in kinds_of.items():
        if "missing" in kinds and loc not in explained:
            problems.append(Problem(_dotted(loc), "missing: this key is required (docs/parameters.md lists every "
                                                  "key; profiles/base.yaml has its usual value)"))
    return problems


def _clean_location(loc: tuple) -> tuple:
    """A pydantic error location without the union branch tags (``'int'``, ``'literal[...]'``,
    ``'PretrainVariant'``) that pydantic inserts after a field whose type is a union of several types."""
    annotation: Any = Params
    clean: list = []
    parts = list(loc)
    while parts:
        annotation = _strip(annotation)
        members = _union_members(annotation)
        if len(members) > 1 and isinstance(parts[0], str):
            tag = parts.pop(0)
            chosen = next((m for m in members if isinstance(m, type) and getattr(m, "__name__", None) == tag),
                          None)
            if chosen is None and tag.startswith("dict["):
                chosen = next((m for m in members if typing.get_origin(m) is dict), None)
            if chosen is None and tag.startswith("list["):
                chosen = next((m for m in members if typing.get_origin(m) is list), None)
            annotation = chosen
            continue
        part = parts.pop(0)
        clean.append(part)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = annotation.model_fields.get(part)
            annotation = info.annotation if info is not None else None
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        else:
            annotation = None
    return tuple(clean)


def _strip(annotation: Any) -> Any:
    """``annotation`` without Annotated wrappers and without None in a union."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    members = _union_members(annotation)
    if len(members) == 1 and members[0] is not annotation:
        return _strip(members[0])
    return annotation


def _union_members(annotation: Any) -> list:
    import types

    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return [annotation]


# ----------------------------------------------------------------------------- cross-field rules

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


def cross_field_problems(params: Params) -> list[Problem]:
    """The rules that tie keys together, each broken one named by its key."""
    problems: list[Problem] = []
    declared = list(params.datasets)

    def dataset_ref(key: str, name: str | None, allow_null: bool = True) -> None:
        if name is None:
            if not allow_null:
                problems.append(Problem(key, "must name a dataset"))
            return
        if name not in params.datasets:
            close = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(Problem(key, f"{name!r} is not a key of datasets (declared: "
                                         f"{', '.join(declared) or 'none'}){hint}"))

    dataset_ref("pretrain_corpus", params.pretrain_corpus)
    dataset_ref("train_dataset", params.train_dataset)
    for index, name in enumerate(params.zero_shot):
        dataset_ref(f"zero_shot.{index}", name)
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

    train = params.datasets.get(params.train_dataset) if params.train_dataset else None
    if train is not None and params.finetune.r1_negatives == "official" and not train.triples:
        problems.append(Problem("finetune.r1_negatives", f"'official' needs the training triples of train_dataset "
                                                         f"{params.train_dataset} (datasets.{params.train_dataset}."
                                                         "triples)"))
    if train is not None and params.annotation.calibration_split not in train.splits:
        problems.append(Problem("annotation.calibration_split",
                                f"{params.annotation.calibration_split!r} is not a split of train_dataset "
                                f"{params.train_dataset} ({', '.join(train.splits) or 'none'})"))

    # Pre-training variants, each merged with pretrain.common.
    available = params.querygen.queries_per_passage
    variants = list(params.pretrain.variants)
    for name in variants:
        settings = merged_variant(params, name)
        where = f"pretrain.variants.{name}"
        variant = params.pretrain.variants[name]
        if variant.method != "none":
            context = variant.context_type or "passage"
            count = variant.query_count if variant.query_count is not None else 1
            if context in ("query", "mixed") and count > available:
                problems.append(Problem(
                    f"{where}.query_count",
                    f"C={count} but querygen.queries_per_passage generates {available} queries per passage: the "
                    f"variant would train as C={available}; lower query_count or raise queries_per_passage"))
            if settings["batch_size"] % settings["grad_accumulation"]:
                problems.append(Problem(
                    f"{where}.batch_size" if "batch_size" in variant.model_fields_set else "pretrain.common.batch_size",
                    f"{settings['batch_size']} pairs per step do not split into grad_accumulation="
                    f"{settings['grad_accumulation']} equal micro-batches"))
    if params.hpo.variant not in params.pretrain.variants:
        close = difflib.get_close_matches(params.hpo.variant, variants, n=1, cutoff=0.6)
        problems.append(Problem("hpo.variant", f"{params.hpo.variant!r} is not a key of pretrain.variants"
                                               + (f"; did you mean {close[0]}?" if close else "")))
    for key in ("zero_shot_variants",):
        for index, name in enumerate(getattr(params.evaluate, key) or []):
            if name not in params.pretrain.variants:
                problems.append(Problem(f"evaluate.{key}.{index}", f"{name!r} is not a key of pretrain.variants"))
    if params.tables.main_query_count is not None:
        counts = {v.query_count for v in params.pretrain.variants.values()
                  if v.method != "none" and v.context_type in ("query", "mixed")}
        if counts and params.tables.main_query_count not in counts:
            problems.append(Problem("tables.main_query_count",
                                    f"no query-context variant has query_count {params.tables.main_query_count} "
                                    f"(the variants have {', '.join(map(str, sorted(counts)))})"))

    # Fine-tuning: enough candidates for the negatives, depths within the corpus the profile keeps.
    ft = params.finetune
    negatives = ft.train_n_passages - 1
    if ft.mine_skip_top >= ft.mine_depth:
        problems.append(Problem("finetune.mine_skip_top", f"{ft.mine_skip_top} skips every mined candidate "
                                                          f"(mine_depth is {ft.mine_depth})"))
    elif ft.mine_depth - ft.mine_skip_top < negatives:
        problems.append(Problem("finetune.mine_depth", f"{ft.mine_depth - ft.mine_skip_top} mined candidates below "
                                                       f"rank {ft.mine_skip_top} cannot give {negatives} negatives "
                                                       "(train_n_passages - 1)"))
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

    # Cluster resources: the default sets every one; several nodes only under torchrun.
    cluster = params.cluster
    unset = [name for name in ClusterResources.model_fields if getattr(cluster.default, name) is None]
    if unset:
        problems.append(Problem("cluster.default", f"{', '.join(unset)} not set (every stage's job needs them)"))
    for stage, resources in {"default": cluster.default, **{f"stages.{k}": v for k, v in cluster.stages.items()}}.items():
        merged = {**cluster.default.model_dump(), **resources.model_dump(exclude_unset=True)}
        if (merged["nodes"] or 1) > 1 and not merged["distributed"]:
            problems.append(Problem(f"cluster.{stage}.nodes", f"{merged['nodes']} nodes need distributed: true (a "
                                                              "stage runs on several nodes only under torchrun)"))

    # Measures.
    from qac.evaluation.metrics import Measure

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
            dataset_ref(f"{where}.dataset", column.dataset)
        entry = params.datasets.get(dataset) if dataset else None
        if entry is not None and column.split is not None and column.split not in entry.splits:
            problems.append(Problem(f"{where}.split", f"{column.split!r} is not a split of {dataset} "
                                                      f"({', '.join(entry.splits) or 'none'})"))
        if column.measure is not None and measures and column.measure not in measures:
            problems.append(Problem(f"{where}.measure", f"{column.measure!r} is not computed (evaluate.metrics: "
                                                        f"{', '.join(params.evaluate.metrics)})"))

    # Query generator.
    qg = params.query_generator
    if qg.kind_prefixes and "query" in qg.kind_prefixes and qg.kind_prefixes["query"] != params.querygen.prefix:
        problems.append(Problem("querygen.prefix", f"{params.querygen.prefix!r} differs from the generator's query "
                                                   f"prefix query_generator.kind_prefixes.query "
                                                   f"({qg.kind_prefixes['query']!r})"))

    # The search space (qac.hpo.space holds its rules).
    from qac.hpo.space import SpaceError, check_space_against_params, parse_space

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


# ----------------------------------------------------------------------------- reading

def yaml_loader():
    """A PyYAML SafeLoader that reads numbers as YAML 1.2 does, as DVC reads and writes params files.

    YAML 1.1 (PyYAML) wants a dot and a signed exponent in a float (``5.0e-05``); DVC's ``-S key=5e-5``
    writes ``5e-05`` and people type ``1e-4``: both are floats here. And YAML 1.1 reads ``24:00:00`` as
    the base-60 integer 86400, which DVC writes unquoted (a string in YAML 1.2) when it rewrites the
    file: here it stays the string it is.
    """
    import yaml

    global _LOADER
    if _LOADER is None:
        class ParamsLoader(yaml.SafeLoader):
            pass

        sexagesimal = re.compile(r"\|\[-\+\]\?\[(?:0-9|1-9)\]\[0-9_\]\*\(\?::\[0-5\]\?\[0-9\]\)\+(?:\\\.\[0-9_\]\*)?")
        resolvers = {}
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
            kept = []
            for tag, pattern in entries:
                if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
                    pattern = re.compile(sexagesimal.sub("", pattern.pattern), pattern.flags)
                kept.append((tag, pattern))
            resolvers[first] = kept
        ParamsLoader.yaml_implicit_resolvers = resolvers
        ParamsLoader.add_implicit_resolver(
            "tag:yaml.org,2002:float",
            re.compile(_YAML12_FLOAT),
            list("-+0123456789."))
        _LOADER = ParamsLoader
    return _LOADER


_LOADER = None
_DUMPER = None
_YAML12_FLOAT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"


def yaml_dumper():
    """A PyYAML SafeDumper that quotes strings :func:`yaml_loader` would read as floats (``'5e-05'``)."""
    import yaml

    global _DUMPER
    if _DUMPER is None:
        class ParamsDumper(yaml.SafeDumper):
            pass

        ParamsDumper.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_YAML12_FLOAT),
                                           list("-+0123456789."))
        _DUMPER = ParamsDumper
    return _DUMPER


def read_yaml(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=yaml_loader())  # noqa: S506 - a SafeLoader subclass


def key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of every mapping key (and list item) in a YAML text."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml_loader())
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                lines.setdefault(key, key_node.start_mark.line + 1)
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                key = f"{prefix}.{index}"
                lines.setdefault(key, item.start_mark.line + 1)
                walk(item, key)

    walk(root, "")
    return lines


def validate_params(params: Any, path: str | Path | None = None, text: str | None = None,
                    complete: bool | None = None) -> Params:
    """Check a whole params mapping; raise :class:`ParamsError` naming every broken key (and its line).

    A complete file (a rendered profile: every key of ``profiles/base.yaml``) is checked as it is,
    the rules across keys included. A partial one (a hand-written file naming only some sections, as
    small studies and tests write) is checked key by key, merged onto ``profiles/base.yaml``: every
    key it has is known, typed and in range; the rules across keys are left out, since they would
    weigh its values against base values it never chose. ``complete`` None: complete when ``text``
    carries a render digest (``qac profile render`` wrote it), when it sets every section, or when no
    base file is found.
    """
    lines = key_lines(text) if text is not None else {}
    if not isinstance(params, Mapping):
        raise ParamsError(path, [Problem("", f"expected a mapping of parameters, found "
                                             f"{type(params).__name__}")], lines)
    base = None if complete else _base_params()
    if complete is None:
        complete = (base is None or (text is not None and "# render-digest: " in text)
                    or all(name in params for name in Params.model_fields))
    checked = dict(params) if complete or base is None else _merged(base, params)
    try:
        model = Params.model_validate(checked)
    except ValidationError as error:
        raise ParamsError(path, _schema_problems(error), lines) from None
    problems = cross_field_problems(model) if complete else []
    if problems:
        raise ParamsError(path, problems, lines)
    return model


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and key not in _KEYED_SECTIONS:
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


# Mappings whose keys are names (datasets, variants, search-space entries): a file's own replace base's.
_KEYED_SECTIONS = ("datasets", "variants", "space", "stages")


def _base_params() -> dict[str, Any] | None:
    from qac.config import profiles_root

    path = profiles_root() / "base.yaml"
    if not path.exists():
        return None
    return read_yaml(path.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- documentation

def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *metadata = typing.get_args(annotation)
        return _type_name(base) + _constraint_text(metadata)
    if origin in (Union, getattr(__import__("types"), "UnionType", Union)):
        args = typing.get_args(annotation)
        names = [_type_name(arg) for arg in args if arg is not type(None)]
        text = " or ".join(names)
        return text + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " | ".join(str(value).lower() if isinstance(value, bool) else str(value)
                            for value in typing.get_args(annotation))
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"mapping of {_type_name(key)} to {_type_name(value)}"
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {int: "integer", float: "number", str: "string", bool: "boolean", Any: "any"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def _constraint_text(metadata: list) -> str:
    parts = []
    for item in metadata:
        for attribute, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attribute, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
        for inner in getattr(item, "metadata", []) or []:
            for attribute, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                value = getattr(inner, attribute, None)
                if value is not None:
                    parts.append(f"{symbol} {value}")
    return f" ({', '.join(parts)})" if parts else ""


def _field_type(info: Any) -> str:
    return _type_name(info.annotation) + _constraint_text(list(info.metadata))


def _format_value(value: Any) -> str:
    import json

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 40 else "(see profiles/base.yaml)"
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def parameters_markdown(base: Mapping[str, Any] | None = None) -> str:
    """``docs/parameters.md``: every key of the schema, its type and range, base value and meaning."""
    lines = [
        "# Parameters",
        "",
        "Every key of a params file (`profiles/base.yaml`, each `profiles/<name>.yaml` and the rendered",
        "`profiles/<name>/params.yaml`), generated from the schema in `qac/params_schema.py` by",
        "`qac profile docs` (a test fails while this file is stale). Unknown keys are errors. Every stage checks",
        "the whole file before it loads a model; `qac profile validate NAME` (or a file) checks it alone.",
        "",
        "Types are strict: `\"8\"` is not a number and `true` is not 1; floats may be written `5e-05`,",
        "`1e-4` or `1.0e-4`. *base* is the value in `profiles/base.yaml`; a profile overrides it.",
        "",
        "Rules across keys: a query- or mixed-context variant's `query_count` is at most",
        "`querygen.queries_per_passage`; a variant's `batch_size` is a multiple of its `grad_accumulation`;",
        "`finetune.max_train_queries` fills whole batches of `finetune.batch_size` (unless",
        "`finetune.incomplete_batch: drop`), and the fine-tuning stage checks the same of the training queries it",
        "finds; `finetune.bm25_depth` and `finetune.mine_depth` (less `mine_skip_top`) give at least",
        "`train_n_passages - 1` negatives and stay within the documents the profile keeps of `train_dataset`;",
        "datasets, variants, splits and measures named anywhere are declared; `hpo.space` follows `docs/hpo.md`.",
        "",
    ]

    def section(model: type[BaseModel], prefix: str, values: Any, title: str, description: str | None) -> None:
        lines.append(f"## `{title}`" if prefix else f"## {title}")
        lines.append("")
        if description:
            lines.append(description[0].upper() + description[1:] + ".")
            lines.append("")
        lines.append("| key | type | base | meaning |")
        lines.append("|---|---|---|---|")
        nested = []
        for name, info in model.model_fields.items():
            key = f"{prefix}{name}"
            inner = _unwrap(info.annotation)
            value = values.get(name) if isinstance(values, Mapping) else None
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                nested.append((inner, key, value, info.description))
                lines.append(f"| `{key}` | mapping | | {_escape(info.description or '')} (below) |")
                continue
            if typing.get_origin(inner) is dict:
                item = _unwrap(typing.get_args(inner)[1])
                if isinstance(item, type) and issubclass(item, BaseModel):
                    nested.append((item, f"{key}.<name>", None, info.description))
                    lines.append(f"| `{key}` | mapping of name to entry | {_format_value(value)} | "
                                 f"{_escape(info.description or '')} (below) |")
                    continue
            if typing.get_origin(inner) is list:
                item = _unwrap(typing.get_args(inner)[0])
                if isinstance(item, type) and issubclass(item, BaseModel):
                    nested.append((item, f"{key}[]", None, info.description))
                    lines.append(f"| `{key}` | list of entries | {_format_value(value)} | "
                                 f"{_escape(info.description or '')} (below) |")
                    continue
            if isinstance(values, Mapping) and name in values:
                shown = _format_value(value)
            elif (info.description or "").startswith("overrides "):
                shown = "as common"
            else:
                shown = "required" if info.is_required() else _format_value(info.get_default(call_default_factory=True))
            lines.append(f"| `{key}` | {_escape(_field_type(info))} | {_escape(shown)} | "
                         f"{_escape(info.description or '')} |")
        lines.append("")
        for inner, key, value, text in nested:
            section(inner, f"{key}.", value or {}, key, text)

    section(Params, "", dict(base or {}), "Top level", None)
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["Params", "ParamsError", "Problem", "validate_params", "cross_field_problems", "read_yaml",
           "yaml_loader", "key_lines", "parameters_markdown", "known_keys_at", "merged_variant"]
