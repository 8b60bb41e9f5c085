"""T5 decoding at fixed shapes: shared cross-attention, a static cache, one CUDA graph per batch.

The cache loop of :mod:`qac.querygen.generate` runs Hugging Face's decoder one
token at a time: every step appends to a growing key/value cache, reads the
encoder's keys and values repeated for all C candidates of a passage, and
launches a few hundred small kernels that the host has to issue one by one. On
a GPU that loop is bound by the host, not the device. This module runs the
same computation in a step whose shapes never change within a batch:

- the cross-attention keys and values are projected once per passage and the
  C candidates of a passage attend to them as C query positions of one
  attention call (``(B, heads, C, d)`` against ``(B, heads, S, d)``), so they are
  neither recomputed nor copied C times;
- the self-attention keys and values go into a ``(rows, heads, max_new_tokens, d)``
  buffer at the step's position, later positions masked, and the relative
  position bias of step ``t`` is row ``t`` of a bias table computed once;
- sampling (repeat penalty, minimum length, temperature, top-k/top-p) runs
  inside the step on the device (:func:`qac.querygen.sampling.choose_tokens`),
  and the step writes its tokens, lengths and the next inputs itself.

Nothing in the step depends on data on the host, so on CUDA it is captured once
per batch as a graph and replayed every step; the host only reads, every
``sync_every`` steps, whether any row is still running. Finished rows are not
dropped from the batch (the shapes stay fixed); they are carried to the end and
their tokens ignored, as between the cache loop's sync points. The decisions
are those of the cache loop without batch invariance: the same distribution,
the same per-passage uniforms; logits differ by float rounding only, so in
bf16 a rare token can differ, as it can with another batch size.

The weights are Hugging Face's own modules (their projections, layer norms
and feed-forward blocks are called as they are); only the attention and the
cache are laid out here. Under autocast the decoder's blocks and output
projection are copied once into the autocast precision, so no step casts a
weight (the embeddings stay in the model's precision, and with them the
residual stream). T5-style models only (``model_type`` t5 or mt5,
whose first decoder layer holds the position bias all layers share): other
generators use the cache loop.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qac.querygen.sampling import choose_tokens

T5_MODEL_TYPES = ("t5", "mt5")


def supports_static_decode(model) -> bool:
    """Whether ``model`` is a T5-style encoder-decoder the static step knows how to run."""
    config = getattr(model, "config", None)
    decoder = getattr(model, "decoder", None)
    return (getattr(config, "model_type", None) in T5_MODEL_TYPES and decoder is not None
            and hasattr(decoder, "block") and hasattr(model, "lm_head"))


@dataclass
class DecodeResult:
    generated: torch.Tensor    # (rows, max_new_tokens) long: sampled tokens, pad after a row's end
    lengths: torch.Tensor      # (rows,) long: tokens before end of sequence
    decisions: torch.Tensor    # () long: sampling decisions taken for running rows


class _State:
    """The tensors a step reads and writes in place (a CUDA graph replays on these very buffers)."""

    def __init__(self, rows: int, steps: int, start_id: int, pad_id: int, device):
        self.start_id, self.pad_id = start_id, pad_id
        self.ids = torch.empty(rows, dtype=torch.long, device=device)
        self.position = torch.empty(1, dtype=torch.long, device=device)
        self.generated = torch.empty((rows, steps), dtype=torch.long, device=device)
        self.lengths = torch.empty(rows, dtype=torch.long, device=device)
        self.alive = torch.empty(rows, dtype=torch.bool, device=device)
        self.decisions = torch.empty((), dtype=torch.long, device=device)
        self.reset()

    def reset(self) -> None:
        self.ids.fill_(self.start_id)
        self.position.zero_()
        self.generated.fill_(self.pad_id)
        self.lengths.zero_()
        self.alive.fill_(True)
        self.decisions.zero_()


class StaticT5Decoder:
    """Samples ``candidates`` continuations per passage from a T5 model in fixed-shape steps."""

    def __init__(self, model, settings, *, start_id: int, eos_id: int, pad_id: int,
                 autocast_dtype: torch.dtype | None = None, cuda_graphs: bool = True):
        if not supports_static_decode(model):
            raise ValueError(f"static decoding needs a T5-style model, got {type(model).__name__}")
        self.model, self.settings = model, settings
        self.start_id, self.eos_id, self.pad_id = start_id, eos_id, pad_id
        self.autocast_dtype = autocast_dtype
        self.cuda_graphs = cuda_graphs
        config = model.config
        self.heads, self.head_dim = config.num_heads, config.d_kv
        # T5 v1.0 scales the decoder output before the tied vocabulary projection; v1.1 does not.
        self.scale_output = getattr(config, "scale_decoder_outputs", getattr(config, "tie_word_embeddings", True))
        self.model_dim = config.d_model
        self.blocks, self.final_norm, self.head = model.decoder.block, model.decoder.final_layer_norm, model.lm_head
        if autocast_dtype is not None:
            # Weights kept in the autocast precision: autocast would otherwise cast every weight again at every
            # step (inside a graph its cache cannot hold them). The embeddings stay as they are, so the residual
            # stream keeps the model's precision, as under autocast.
            import copy

            self.blocks, self.final_norm, self.head = (copy.deepcopy(module).to(autocast_dtype) for module in
                                                       (self.blocks, self.final_norm, self.head))

    # -- public ---------------------------------------------------------
    @torch.no_grad()
    def decode(self, encoder_hidden: torch.Tensor, encoder_mask: torch.Tensor, uniforms: torch.Tensor,
               sync_every: int) -> DecodeResult:
        """Decode ``max_new_tokens`` steps for ``B`` passages of encoder states ``(B, S, d)`` with mask ``(B, S)``.

        ``uniforms`` is ``(B * C, max_new_tokens)`` float64, C consecutive rows per passage.
        """
        settings = self.settings
        passages, candidates, steps = encoder_hidden.shape[0], settings.queries_per_passage, settings.max_new_tokens
        rows, device = passages * candidates, encoder_hidden.device
        with self._autocast():
            cross = [self._cross_keys_values(block, encoder_hidden) for block in self.blocks]
        first = self.model.decoder.block[0].layer[0].SelfAttention      # the bias table from the model's own weights
        tables = _StepTables(
            cross=cross,
            cross_mask=encoder_mask.bool()[:, None, None, :],
            self_bias=first.compute_bias(steps, steps).float(),            # (1, heads, steps, steps)
            key_positions=torch.arange(steps, device=device),
            uniforms=uniforms.to(device=device, dtype=torch.float64),
            # zeros, not empty: a masked position still enters the products (0 x NaN would be NaN)
            caches=[(torch.zeros((rows, self.heads, steps, self.head_dim), device=device, dtype=cross[0][0].dtype),
                     torch.zeros((rows, self.heads, steps, self.head_dim), device=device, dtype=cross[0][0].dtype))
                    for _ in cross])
        state = _State(rows, steps, self.start_id, self.pad_id, device)

        def step():
            self._step(state, tables, passages, candidates)

        run = self._graphed(step, state) if self.cuda_graphs and device.type == "cuda" else step
        for index in range(steps):
            run()
            if (index + 1) % sync_every == 0 or index + 1 == steps:
                if not bool(state.alive.any()):        # the loop's one read from the device
                    break
        return DecodeResult(generated=state.generated, lengths=state.lengths, decisions=state.decisions)

    # -- the step -------------------------------------------------------
    def _autocast(self, cache_enabled: bool = True):
        import contextlib

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        device_type = next(self.model.parameters()).device.type
        # Inside a captured graph autocast's cache would hold casts made at capture: the step runs without it
        # (its weights are already in the autocast precision; only activations are cast).
        return torch.autocast(device_type=device_type, dtype=self.autocast_dtype, cache_enabled=cache_enabled)

    def _cross_keys_values(self, block, encoder_hidden):
        attention = block.layer[1].EncDecAttention
        batch, width = encoder_hidden.shape[:2]

        def heads(projection):
            return projection(encoder_hidden).view(batch, width, self.heads, self.head_dim).transpose(1, 2)

        return heads(attention.k).contiguous(), heads(attention.v).contiguous()

    def _step(self, state: _State, tables: "_StepTables", passages: int, candidates: int) -> None:
        with self._autocast(cache_enabled=False):
            logits = self._logits(state, tables, passages, candidates)
        tokens = choose_tokens(self._adjusted(logits, state, tables), tables.uniforms.index_select(1, state.position)[:, 0],
                               self.settings.top_k, self.settings.top_p)
        alive = state.alive
        state.decisions.add_(alive.sum())
        state.generated.index_copy_(1, state.position, torch.where(alive, tokens, self.pad_id)[:, None])
        ended = alive & (tokens == self.eos_id)
        state.lengths.add_(alive & ~ended)
        alive &= ~ended
        state.ids.copy_(torch.where(alive, tokens, self.pad_id))
        state.position.add_(1)

    def _logits(self, state: _State, tables: "_StepTables", passages: int, candidates: int) -> torch.Tensor:
        rows, heads, head_dim = state.ids.shape[0], self.heads, self.head_dim
        hidden = self.model.decoder.embed_tokens(state.ids)                        # (rows, d)
        # Self-attention mask of this step: the position bias row t, later positions ruled out.
        bias = tables.self_bias.index_select(2, state.position)                    # (1, heads, 1, steps)
        bias = bias.masked_fill(tables.key_positions > state.position, torch.finfo(bias.dtype).min)
        for block, (cross_keys, cross_values), (keys, values) in zip(self.blocks, tables.cross, tables.caches):
            layer = block.layer[0]
            attention = layer.SelfAttention
            normed = layer.layer_norm(hidden)
            query = attention.q(normed).view(rows, heads, 1, head_dim)
            keys.index_copy_(2, state.position, attention.k(normed).view(rows, heads, 1, head_dim).to(keys.dtype))
            values.index_copy_(2, state.position, attention.v(normed).view(rows, heads, 1, head_dim).to(values.dtype))
            # T5 does not scale the dot product. The product in the cache's precision (casting the cache to fp32
            # each step would copy all of it), the bias added and the softmax taken in fp32, as Hugging Face's T5.
            scores = torch.matmul(query.to(keys.dtype), keys.transpose(2, 3)).float() + bias
            weights = torch.softmax(scores, dim=-1).to(values.dtype)
            mixed = torch.matmul(weights, values).reshape(rows, heads * head_dim)
            hidden = _clamp_fp16(hidden + attention.o(mixed))

            layer = block.layer[1]
            attention = layer.EncDecAttention
            query = attention.q(layer.layer_norm(hidden))
            # The C candidates of a passage are C query positions against the passage's keys and values.
            query = query.view(passages, candidates, heads, head_dim).transpose(1, 2)
            mixed = F.scaled_dot_product_attention(query.to(cross_keys.dtype), cross_keys, cross_values,
                                                   attn_mask=tables.cross_mask, scale=1.0)
            hidden = _clamp_fp16(hidden + attention.o(mixed.transpose(1, 2).reshape(rows, heads * head_dim)))
            hidden = _clamp_fp16(block.layer[-1](hidden))                          # feed-forward, residual inside
        hidden = self.final_norm(hidden)
        if self.scale_output:
            hidden = hidden * (self.model_dim ** -0.5)
        return self.head(hidden).float()

    def _adjusted(self, logits: torch.Tensor, state: _State, tables: "_StepTables") -> torch.Tensor:
        """:func:`qac.querygen.generate.adjust_logits` with the step a tensor: the same penalty, floor, temperature."""
        settings = self.settings
        if settings.repeat_penalty:
            emitted = (tables.key_positions < state.position).to(logits.dtype).expand_as(state.generated)
            seen = torch.zeros_like(logits).scatter_add_(1, state.generated, emitted) > 0
            logits = logits - settings.repeat_penalty * seen
        if settings.min_new_tokens:
            early = state.position < settings.min_new_tokens                     # (1,) bool
            eos = torch.full_like(state.position, self.eos_id)
            column = logits.index_select(1, eos).masked_fill(early, float("-inf"))
            logits = logits.index_copy(1, eos, column)
        return logits / settings.temperature if settings.temperature != 1.0 else logits

    # -- CUDA graphs ----------------------------------------------------
    def _graphed(self, step, state: _State):
        """``step`` captured as a CUDA graph (warmed up on a side stream first), or ``step`` itself if capture fails."""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()                           # warm-up: libraries pick their kernels outside the capture
            torch.cuda.current_stream().wait_stream(side)
            state.reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
        except RuntimeError as error:            # an operator that cannot be captured: run the step as it is
            warnings.warn(f"static decoding runs without a CUDA graph ({str(error).splitlines()[0]})", stacklevel=2)
            torch.cuda.synchronize()
            state.reset()
            return step
        return graph.replay


@dataclass
class _StepTables:
    """What the step reads but never writes, except the self-attention caches it fills position by position."""

    cross: list            # per layer: (keys, values), each (B, heads, S, d)
    cross_mask: torch.Tensor       # (B, 1, 1, S) bool: True where the passage has a token
    self_bias: torch.Tensor        # (1, heads, steps, steps) float32 relative position bias
    key_positions: torch.Tensor    # (steps,) long
    uniforms: torch.Tensor         # (rows, steps) float64
    caches: list           # per layer: (keys, values), each (rows, heads, steps, d)


def _clamp_fp16(hidden: torch.Tensor) -> torch.Tensor:
    """Hugging Face T5's guard against fp16 overflow in the residual stream (a no-op in fp32 and bf16)."""
    if hidden.dtype != torch.float16:
        return hidden
    limit = torch.finfo(torch.float16).max - 1000
    return hidden.clamp(min=-limit, max=limit)


__all__ = ["StaticT5Decoder", "DecodeResult", "supports_static_decode", "T5_MODEL_TYPES"]
