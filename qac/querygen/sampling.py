"""Top-k / nucleus sampling decisions drawn from per-passage random streams.

The paper samples queries with Hugging Face's ``generate(do_sample=True,
top_k=25, top_p=0.95)``. That call draws every token of a batch from the one
global torch RNG, so a passage's queries depend on which passages shared its
batch. Here each passage owns a random stream seeded by (global seed, passage
id): candidate ``j`` of a passage reads row ``j`` of a ``(C, max_new_tokens)``
matrix of uniforms drawn from that stream, and token ``t`` is chosen by
inverse-CDF sampling with the uniform ``U[j, t]``. The candidate set and its
probabilities are those of Hugging Face's ``TopKLogitsWarper`` followed by
``TopPLogitsWarper`` (temperature 1), so the distribution is the paper's.

Within the kept set the inverse CDF runs in token-id order, not probability
order, so that two nearly tied tokens swapping ranks under float noise cannot
swap their intervals.

A decision is a step function of the logits, so float noise can still flip it
when the logits sit next to one of its edges: the k-th and (k+1)-th logits
almost tied, the last kept and first dropped token almost tied, a tail mass
almost exactly ``1 - top_p``, or the uniform almost on a boundary of the CDF.
With every logit perturbed by at most ``L`` (a bound relative to the row's
largest logit magnitude) a probability ``p`` moves by at
most ``2L p``, a cumulative share ``F`` (or tail mass) by at most
``2L F (1 - F)``, and a logit gap by ``2L``; :func:`sample_tokens` reports
decisions within those margins as *fragile*, and the decoder re-decides them
from logits computed in a canonical shape (see ``qac.querygen.generate``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

# Bound on the float noise of a logit between batch shapes, relative to the
# row's largest |logit| (L = LOGIT_NOISE * max |logit|). Measured in fp32 on
# CPU: 2e-7 to 1.2e-6 (tiny T5, tiny and MiniLM bert2bert); the bound leaves a
# factor of 12 on top of the largest. Relative, because float error scales with
# the magnitudes the model computes with. A larger bound is safer and slower:
# the share of recomputed decisions grows in proportion.
LOGIT_NOISE = 1.5e-5
_ROUNDING = 1e-12     # float64 rounding of the shares themselves


def passage_seed(seed: int, pid: str) -> int:
    """A 63-bit seed for the random stream of passage ``pid`` under the global ``seed``."""
    digest = hashlib.sha256(f"{seed}\0{pid}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def passage_uniforms(seed: int, pid: str, candidates: int, max_new_tokens: int) -> torch.Tensor:
    """The ``(candidates, max_new_tokens)`` float64 uniforms of passage ``pid``.

    Row ``j`` is the same whatever ``candidates`` is, so the first C candidates
    of a run with 20 equal a run with C.
    """
    generator = torch.Generator(device="cpu")
    generator.manual_seed(passage_seed(seed, pid))
    return torch.rand((candidates, max_new_tokens), generator=generator, dtype=torch.float64)


@dataclass(frozen=True)
class Filtered:
    """The top-k/top-p candidate set of each row, most probable first."""

    token_ids: torch.Tensor   # (rows, k) long
    values: torch.Tensor      # (rows, k + 1) float32 logits of the top k + 1 (k + 1 only below the vocabulary size)
    probs: torch.Tensor       # (rows, k) float64, zero outside the nucleus, not renormalised
    topk_gap: torch.Tensor    # (rows,) logit k minus logit k+1 (inf when k covers the vocabulary)
    tail_mass: torch.Tensor   # (rows, k) probability mass from rank i to rank k


def filtered_distribution(logits: torch.Tensor, top_k: int, top_p: float) -> Filtered:
    """Apply top-k then top-p filtering to a ``(rows, vocab)`` logit matrix.

    A token of rank ``i`` (1 = most probable among the top k) is kept when the
    probability mass of ranks ``i..k`` exceeds ``1 - top_p``, which is the rule
    of ``TopPLogitsWarper`` (remove while the ascending cumulative mass is
    ``<= 1 - top_p``); the most probable token is always kept.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    k = min(top_k, vocab) if top_k > 0 else vocab
    values, token_ids = torch.topk(logits, min(k + 1, vocab), dim=-1)
    all_values = values
    if k < vocab:
        topk_gap = (values[:, k - 1] - values[:, k]).double()
        values, token_ids = values[:, :k], token_ids[:, :k]
    else:
        topk_gap = torch.full((logits.shape[0],), float("inf"), dtype=torch.float64, device=logits.device)
    probs = torch.softmax(values.double(), dim=-1)
    tail_mass = probs.flip(-1).cumsum(-1).flip(-1)
    keep = tail_mass > (1.0 - top_p)
    keep[:, 0] = True
    return Filtered(token_ids=token_ids, values=all_values, probs=probs * keep, topk_gap=topk_gap,
                    tail_mass=tail_mass)


def sample_tokens(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    top_k: int,
    top_p: float,
    logit_noise: float = LOGIT_NOISE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row by inverse-CDF sampling; also say which choices are fragile.

    ``uniforms`` holds one float64 in [0, 1) per row. Returns ``(tokens, fragile)``:
    the chosen token ids and a bool mask of rows whose decision could change if
    every logit moved by up to ``logit_noise * max |logit|`` of its row (see the
    module docstring).
    """
    # L per row, from the finite logits: a masked token (-inf) is no magnitude the model computed with
    finite = logits.float().masked_fill(~torch.isfinite(logits), 0.0)
    bound = (logit_noise * finite.abs().amax(-1)).double().cpu()
    dist = filtered_distribution(logits, top_k, top_p)
    uniforms = uniforms.to(torch.float64).cpu()
    token_ids, probs, tail = dist.token_ids.cpu(), dist.probs.cpu(), dist.tail_mass.cpu()
    values = dist.values.cpu()
    tokens, shares, n_kept = _inverse_cdf(token_ids, probs, uniforms, logits.shape[-1])
    k = probs.shape[1]

    # Edges of the kept set: the top-k cut, a tie across the nucleus cut, the nucleus threshold.
    fragile = dist.topk_gap.cpu() < 2 * bound
    cut = (n_kept < k).nonzero().flatten()
    if len(cut):
        last, first_out = values[cut, n_kept[cut] - 1], values[cut, n_kept[cut]]
        fragile[cut] |= (last - first_out).double() < 2 * bound[cut]
    if top_p < 1.0:  # with top_p = 1 the nucleus keeps every top-k token: no threshold
        margin = 2 * bound[:, None] * tail * (1 - tail) + _ROUNDING
        fragile |= ((tail - (1.0 - top_p)).abs() < margin).any(-1)
    # ... and the uniform near a boundary between two kept tokens of the CDF
    inner = torch.arange(k)[None, :] < (n_kept - 1)[:, None]
    margin = 2 * bound[:, None] * shares * (1 - shares) + _ROUNDING
    fragile |= (((shares - uniforms[:, None]).abs() < margin) & inner).any(-1)
    return tokens, fragile


def choose_tokens(logits: torch.Tensor, uniforms: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens :func:`sample_tokens` chooses, computed where the logits are, without the fragility analysis.

    Nothing is copied to the host, so a decoder on a GPU samples without waiting for it
    (batch-invariant decoding needs :func:`sample_tokens`' fragile decisions instead).
    """
    dist = filtered_distribution(logits, top_k, top_p)
    uniforms = uniforms.to(device=dist.probs.device, dtype=torch.float64)
    return _inverse_cdf(dist.token_ids, dist.probs, uniforms, logits.shape[-1])[0]


def _inverse_cdf(token_ids: torch.Tensor, probs: torch.Tensor, uniforms: torch.Tensor,
                 vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens, shares, n_kept)``: inverse-CDF choice over the kept tokens in token-id order.

    ``shares`` is the normalised cumulative mass in that order, ``n_kept`` the kept tokens per row.
    """
    k = probs.shape[1]
    kept = probs > 0
    n_kept = kept.sum(-1)
    # dropped tokens sorted last, with zero mass
    key = torch.where(kept, token_ids, token_ids.new_full((), vocab) + torch.arange(k, device=token_ids.device))
    order = key.argsort(dim=-1)
    ordered_ids, ordered_probs = token_ids.gather(1, order), probs.gather(1, order)
    shares = ordered_probs.cumsum(-1)
    shares = shares / shares[:, -1:]
    choice = (shares <= uniforms[:, None]).sum(-1).clamp(max=k - 1)
    choice = torch.minimum(choice, n_kept - 1)
    return ordered_ids.gather(1, choice[:, None]).squeeze(1), shares, n_kept
