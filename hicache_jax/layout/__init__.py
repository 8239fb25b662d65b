"""Pool layouts built from model configs (control plane: pure Python, never imports jax)."""
from __future__ import annotations

from hicache_jax.config import ModelConfig
from hicache_jax.layout.deepseek import build_deepseek_layout
from hicache_jax.layout.formats import ByteFormat
from hicache_jax.layout.gemma import build_gemma_layout
from hicache_jax.layout.gqa import build_gqa_layout
from hicache_jax.layout.names import UNREGISTERED, HitPolicy, Placement, PoolKind, PoolName
from hicache_jax.layout.pool import LayerInfo, PoolLayout, PoolSpec


def build_layout(cfg: ModelConfig) -> PoolLayout:
    """The registered pools of `cfg`'s model; an invalid model raises `ValueError`."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"build_layout takes a ModelConfig, got {type(cfg).__name__}")
    cfg.validate()
    if cfg.is_deepseek:
        return build_deepseek_layout(cfg)
    if cfg.model_type == "gemma3_text":
        return build_gemma_layout(cfg)
    return build_gqa_layout(cfg)


__all__ = [
    "ByteFormat", "HitPolicy", "LayerInfo", "Placement", "PoolKind", "PoolLayout", "PoolName",
    "PoolSpec", "UNREGISTERED", "build_layout",
]
