"""`GemmaModel`: the NNX Gemma 3 module behind the paged-model contract of `tiny_models/base.py`.

    model = GemmaModel.random(layout, seed=0)                  # small random weights (tests)
    model, tokenizer = load_gguf_model(layout, path)            # real weights (weights.py)
    pools, logits = model.forward_chunk(pools, anchor_pages, swa_pages, tokens, start, valid)

One jitted program per model and pool shapes: the module's parameters are an argument
(`nnx.split`), the pools are donated. Only the last valid row's logits are computed, and
only when asked (`logits=True`): the 262,144-wide head reads a 671 MB table, a quarter of
a decode step on CPU, and a prefill chunk before the last does not need it.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from hicache_jax.layout import PoolLayout
from examples.gemma.modules import Gemma3
from examples.tiny_models.base import ChunkModel
from examples.tiny_models.paged import Chunk

DEFAULT_CHUNK = 32   # positions per forward; divides the 256-token page (see BENCHMARKS.md)


class GemmaModel(ChunkModel):
    """Gemma 3 text model over `layout` (model_type "gemma3_text"), weights from `module`."""

    def __init__(self, layout: PoolLayout, module: Gemma3, max_pages: int = 16, chunk_size: int = DEFAULT_CHUNK):
        check_gemma_config(layout)
        super().__init__(layout, max_pages, chunk_size)
        self.module = module
        self._graph, self.params = nnx.split(module)

    @classmethod
    def random(cls, layout: PoolLayout, seed: int = 0, max_pages: int = 16,
               chunk_size: int = DEFAULT_CHUNK) -> "GemmaModel":
        """Random weights of the Gemma 3 architecture (flax's default initialisers), from `seed`."""
        check_gemma_config(layout)
        return cls(layout, Gemma3(layout, nnx.Rngs(seed)), max_pages, chunk_size)

    @staticmethod
    def abstract(layout: PoolLayout) -> Gemma3:
        """The module with shapes and no values, for a loader to fill in."""
        check_gemma_config(layout)
        return nnx.eval_shape(lambda: Gemma3(layout, nnx.Rngs(0)))

    def forward_chunk_all(self, *args, **kwargs):
        raise NotImplementedError("GemmaModel computes the logits of the last valid row only (forward_chunk)")

    def _forward(self, params, pools, anchor_pages, swa_pages, tokens, start, valid, want_logits, landing):
        if landing is not None:   # lands the whole load before the first layer (no per-layer hook here)
            pools = landing.schedule().finish(pools)
        chunk = Chunk.make(self.page_size, anchor_pages, swa_pages, start, valid, rows=self.chunk_size)
        module = nnx.merge(self._graph, params)
        pools, logits = module(dict(pools), chunk, jnp.clip(tokens, 0, self.vocab_size - 1), want_logits)
        return pools, None, logits


def check_gemma_config(layout: PoolLayout) -> None:
    """ValueError naming the field when `layout`'s config cannot make a Gemma 3 model."""
    cfg = layout.model
    if not isinstance(layout, PoolLayout) or cfg.model_type != "gemma3_text":
        raise ValueError(f"GemmaModel needs a layout of model_type 'gemma3_text', got {cfg.model_type!r}")
    for field in ("hidden_size", "num_attention_heads", "intermediate_size", "query_pre_attn_scalar", "vocab_size"):
        if getattr(cfg, field) <= 0:
            raise ValueError(f"config {cfg.name!r}: field '{field}' must be positive for a model, got {getattr(cfg, field)}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(f"config {cfg.name!r}: num_attention_heads {cfg.num_attention_heads} is not a multiple "
                         f"of num_key_value_heads {cfg.num_key_value_heads}")
    if cfg.head_dim % 2:
        raise ValueError(f"config {cfg.name!r}: head_dim {cfg.head_dim} must be even (RoPE pairs features)")
