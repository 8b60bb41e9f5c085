"""The dense retriever: one shared encoder for queries and passages, its pooling and its loss.

Queries and passages go through the same transformer; a text is represented by
its [CLS] vector (or the attention-masked mean of its token states) and a
query-passage score is their dot product (their cosine when the retriever
normalises). Training uses InfoNCE over the positive, the hard negatives and
every other passage in the (global) batch. The fine-tuning loop trains it, the
evaluation and the mining encode with it (:mod:`qac.retrieval.encode` pools
through :func:`pool`), and its folder says how it encodes
(:mod:`qac.models.encoding`), so it loads as a sentence-transformers model too.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from qac.data.streams import is_stream
from qac.models import unpadded
from qac.models.encoding import (POOLINGS, Encoding, encoder_arguments, loading_arguments, read_encoding,
                                 write_encoding)
from qac.models.losses import gather_with_grad


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One vector per sequence from the last hidden states: [CLS] or masked mean.

    The mean divides by the number of attended tokens, at least 1: a row with no
    attended token (never produced by a tokenizer) gives the zero vector, not NaN.
    """
    if mode == "cls":
        return hidden[:, 0]
    if mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    raise ValueError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLINGS)}")


def infonce_loss(query_reps: torch.Tensor, passage_reps: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean cross-entropy of each query over every passage, the positive being its group's first.

    Passages are laid out in groups of ``n = len(passage_reps) // len(query_reps)``
    (positive, then negatives), query ``i``'s group starting at ``i * n``; the other
    queries' passages are the in-batch negatives.
    """
    n_queries = query_reps.size(0)
    if n_queries == 0 or passage_reps.size(0) % n_queries:
        raise ValueError(f"{passage_reps.size(0)} passages do not form groups for {n_queries} queries")
    group_size = passage_reps.size(0) // n_queries
    scores = query_reps @ passage_reps.T / temperature
    targets = torch.arange(n_queries, device=scores.device) * group_size
    return F.cross_entropy(scores.float(), targets)


class BiEncoder(nn.Module):
    """A shared-weight bi-encoder around a Hugging Face encoder (``AutoModel``)."""

    def __init__(self, encoder: nn.Module, pooling: str = "cls", temperature: float = 1.0, normalize: bool = False):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        # BERT's pooler (dense + tanh over [CLS]) is not part of a dense retriever's
        # representation; left in, its unused parameters would make DDP fail.
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None
        self.encoder = encoder
        self.pooling = pooling
        self.temperature = temperature
        # Unit-length representations: scores are cosines (sentence-transformers' MultipleNegativesRankingLoss
        # with scale s is this InfoNCE with temperature 1 / s).
        self.normalize = normalize

    @classmethod
    def from_pretrained(cls, path: str | Path, pooling: str | None = None, temperature: float = 1.0,
                        normalize: bool | None = None) -> "BiEncoder":
        """Load the encoder of a Hugging Face folder (or any model spec of ``qac.models.loading``).

        ``pooling`` and ``normalize`` default to what a retriever folder declares
        (:func:`qac.models.encoding.read_encoding`), else [CLS] and no normalisation.
        """
        # here, not at the top: it loads safetensors
        from qac.models.loading import load_model

        folder = Path(path).is_dir()
        declared = read_encoding(path) if folder else None
        if pooling is None:
            pooling = declared.pooling if declared else "cls"
        if normalize is None:
            normalize = declared.normalize if declared else False
        encoder = load_model(str(path), **(loading_arguments(path) if folder else {}))
        return cls(encoder, pooling=pooling, temperature=temperature, normalize=normalize)

    def save(self, path: str | Path, tokenizer=None, *, query_max_len: int, passage_max_len: int,
             title_separator: str = " ") -> None:
        """Write the encoder (and tokenizer) as a folder ``AutoModel`` loads, which also says how it encodes:
        pooling, normalisation and lengths, as sentence-transformers reads them (:mod:`qac.models.encoding`).

        ``passage_max_len`` is a document's length when the corpus is encoded; ``title_separator`` joins a
        document's title and body as the retriever was trained on them.
        """
        self.encoder.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        write_encoding(path, self.encoding(query_max_len, passage_max_len, title_separator),
                       self.encoder.config.hidden_size, encoder_arguments(self.encoder))

    def encoding(self, query_max_len: int, passage_max_len: int, title_separator: str = " ") -> Encoding:
        """How this retriever encodes at those lengths."""
        return Encoding(pooling=self.pooling, normalize=self.normalize, query_max_len=query_max_len,
                        passage_max_len=passage_max_len, title_separator=title_separator)

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if is_stream(batch):      # a token stream (finetune.unpadded): a BERT encoder on [T, H]
            pooled = unpadded.pool(unpadded.encode(self.encoder, batch)[0], batch, self.pooling)
            return F.normalize(pooled, p=2, dim=-1) if self.normalize else pooled
        output = self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              **({"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}))
        pooled = pool(output.last_hidden_state, batch["attention_mask"], self.pooling)
        return F.normalize(pooled, p=2, dim=-1) if self.normalize else pooled

    # Queries and passages share the encoder; the two names keep call sites readable.
    encode_query = encode
    encode_passage = encode

    @staticmethod
    def compute_similarity(query_reps: torch.Tensor, passage_reps: torch.Tensor) -> torch.Tensor:
        return query_reps @ passage_reps.T

    def compute_loss(self, query_reps: torch.Tensor, passage_reps: torch.Tensor) -> torch.Tensor:
        """InfoNCE over this batch, or over the global batch when run by several processes.

        Under DDP every process gathers all queries and passages (in global-rank
        order, so the global batch is the same as one process would see), making
        the other processes' passages negatives too. Only the local slot carries a
        gradient, so each process back-propagates into its own encoder pass. DDP
        then *averages* gradients over the W processes while the full-batch loss
        gradient is their *sum*: the loss is multiplied by W to undo the average.
        """
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            query_reps = gather_with_grad(query_reps)
            passage_reps = gather_with_grad(passage_reps)
            return infonce_loss(query_reps, passage_reps, self.temperature) * dist.get_world_size()
        return infonce_loss(query_reps, passage_reps, self.temperature)

    def forward(self, queries: dict[str, torch.Tensor], passages: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of one (local) batch: queries and their passage groups."""
        return self.compute_loss(self.encode_query(queries), self.encode_passage(passages))
