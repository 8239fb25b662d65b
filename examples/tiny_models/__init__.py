"""Seeded random-weight tiny models that read and write every pool of a layout.

    from examples.tiny_models import make_model
    model = make_model(layout, seed=0, max_pages=16)
    pools, logits = model.forward_chunk(pools, anchor_pages, swa_pages, tokens, start, valid)
    pools, logits = model.forward_batch(pools, SlotBatch(...))    # B sequences in one step

`make_model` picks the family from `layout.model.model_type`: DeepSeek V4 and V4.1 share
`DeepSeekModel` (their differences are which pools each layer owns, see `plan.py`);
plain GQA models get `GQAModel`. The contract is in `base.py`.
"""
from __future__ import annotations

from hicache_jax.layout import PoolLayout
from examples.tiny_models.base import ChunkModel, SlotBatch
from examples.tiny_models.deepseek import DeepSeekModel
from examples.tiny_models.gqa import GQAModel


def make_model(layout: PoolLayout, seed: int = 0, max_pages: int = 16) -> ChunkModel:
    """The tiny model of `layout`'s family, weights drawn from `seed`."""
    if not isinstance(layout, PoolLayout):
        raise ValueError(f"make_model takes a PoolLayout (hicache_jax.build_layout(cfg)), got {type(layout).__name__}")
    kind = layout.model.model_type
    if kind in ("deepseek_v4", "deepseek_v41"):
        return DeepSeekModel(layout, seed=seed, max_pages=max_pages)
    if kind == "gqa":
        return GQAModel(layout, seed=seed, max_pages=max_pages)
    raise ValueError(f"no tiny model for model_type {kind!r}")


__all__ = ["ChunkModel", "DeepSeekModel", "GQAModel", "SlotBatch", "make_model"]
