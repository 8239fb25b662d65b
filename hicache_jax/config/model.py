"""Model configuration: a frozen dataclass loaded once from a JSON file in `configs/`.

Pure Python (no jax). Every bad value raises `ValueError` naming the field and the value.
Field names follow the public Hugging Face `config.json` files where one exists
(`num_hidden_layers`, `compress_ratios`, ...); the deployment choices a serving system
makes on top (`kv_layout`, `indexer_dtype`, `page_size`) live in the same file.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any


MODEL_TYPES = ("deepseek_v4", "deepseek_v41", "gqa", "gemma3_text")
KV_LAYOUTS = ("v4", "v41", "unified")
INDEXER_DTYPES = ("fp8", "fp4")
KV_DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes of one model plus the cache-relevant deployment choices.

    DeepSeek fields are ignored by the GQA family and vice versa; `validate` checks that
    each family has what it needs (the layout builders check the rest).
    """

    model_type: str
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int                      # V4/V4.1: latent width (nope + rope); GQA: per-head dim
    name: str = ""
    hidden_size: int = 0
    num_attention_heads: int = 0
    vocab_size: int = 0
    page_size: int = 256               # tokens per page, all pools
    sliding_window: int | None = None  # tokens; None = no sliding-window pool
    # DeepSeek V4 / V4.1
    qk_rope_head_dim: int = 0
    compress_ratios: tuple[int, ...] = ()
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    kv_source_layers: tuple[int, ...] | None = None
    index_source_layers: tuple[int, ...] | None = None
    kv_layout: str = "v4"              # "v4" (H100/H200) | "v41" (SM100) | "unified" (ROCm)
    indexer_dtype: str = "fp8"         # V4 ratio-4 indexer; V4.1 low-ratio indexers are fp4
    # GQA and Gemma 3
    kv_dtype: str = "bfloat16"
    # Gemma 3 (hybrid attention): "sliding_attention" | "full_attention" per layer, and what
    # a model needs beyond the cache's shapes
    layer_types: tuple[str, ...] | None = None
    intermediate_size: int = 0
    rope_theta: float = 10000.0         # global (full-attention) layers
    rope_local_base_freq: float = 10000.0  # sliding-window layers
    query_pre_attn_scalar: int = 0      # attention scale = query_pre_attn_scalar ** -0.5
    rms_norm_eps: float = 1e-6

    @property
    def is_deepseek(self) -> bool:
        return self.model_type in ("deepseek_v4", "deepseek_v41")

    @property
    def ratios(self) -> tuple[int, ...]:
        """Compress ratio of each target-model layer (draft-layer entries dropped)."""
        return self.compress_ratios[: self.num_hidden_layers]

    def validate(self) -> "ModelConfig":
        _check_choice("model_type", self.model_type, MODEL_TYPES)
        for f in sorted(_INT_FIELDS):      # 0 where a family does not use a field; never negative
            value = getattr(self, f)
            if value is not None and value < 0:
                raise ValueError(f"config field '{f}' must not be negative, got {value}")
        for f in ("num_hidden_layers", "num_key_value_heads", "head_dim", "page_size"):
            _check_positive(f, getattr(self, f))
        if self.sliding_window is not None:
            _check_positive("sliding_window", self.sliding_window)
        if self.is_deepseek:
            _check_choice("kv_layout", self.kv_layout, KV_LAYOUTS)
            _check_choice("indexer_dtype", self.indexer_dtype, INDEXER_DTYPES)
            for f in ("qk_rope_head_dim", "index_head_dim"):
                _check_positive(f, getattr(self, f))
            if self.sliding_window is None:
                raise ValueError("config field 'sliding_window' is missing: DeepSeek V4 models need it")
            if len(self.compress_ratios) < self.num_hidden_layers:
                raise ValueError(
                    f"config field 'compress_ratios' has {len(self.compress_ratios)} entries "
                    f"for num_hidden_layers={self.num_hidden_layers}"
                )
            if self.num_key_value_heads != 1:
                raise ValueError(
                    f"config field 'num_key_value_heads' must be 1 for DeepSeek V4 models, "
                    f"got {self.num_key_value_heads}"
                )
        else:
            _check_choice("kv_dtype", self.kv_dtype, KV_DTYPES)
        return self


_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
_REQUIRED = [n for n, f in _FIELDS.items() if f.default is dataclasses.MISSING]
_INT_FIELDS = {
    "num_hidden_layers", "num_key_value_heads", "head_dim", "hidden_size", "num_attention_heads",
    "vocab_size", "page_size", "sliding_window", "qk_rope_head_dim", "index_n_heads",
    "index_head_dim", "index_topk", "intermediate_size", "query_pre_attn_scalar",
}
_INT_LIST_FIELDS = {"compress_ratios", "kv_source_layers", "index_source_layers"}
_STR_FIELDS = {"model_type", "name", "kv_layout", "indexer_dtype", "kv_dtype"}
_STR_LIST_FIELDS = {"layer_types"}
_FLOAT_FIELDS = {"rope_theta", "rope_local_base_freq", "rms_norm_eps"}
_NULLABLE = {"sliding_window", "kv_source_layers", "index_source_layers", "layer_types"}
# Keys of public config.json files that do not affect the cache: accepted and ignored.
_IGNORED = {"architectures", "torch_dtype", "max_position_embeddings", "_comment"}


def model_config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """Build and validate a `ModelConfig` from a parsed JSON object."""
    if not isinstance(raw, dict):
        raise ValueError(f"a model config must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(k for k in raw if k not in _FIELDS and k not in _IGNORED)
    if unknown:
        k = unknown[0]
        close = difflib.get_close_matches(k, list(_FIELDS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"unknown config field '{k}'{hint}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ValueError(f"config field '{missing[0]}' is missing")
    values = {}
    for key, value in raw.items():
        if key in _IGNORED:
            continue
        values[key] = _typed(key, value)
    return ModelConfig(**values).validate()


def load_model_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read a model config JSON file; any problem raises `ValueError` naming the field."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    try:
        return model_config_from_dict(raw)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _typed(key: str, value: Any) -> Any:
    if value is None and key in _NULLABLE:
        return None
    if key in _INT_FIELDS:
        if not _is_int(value):
            raise ValueError(f"config field '{key}' must be an integer, got {value!r}")
        return value
    if key in _INT_LIST_FIELDS:
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise ValueError(f"config field '{key}' must be a list of integers, got {value!r}")
        return tuple(value)
    if key in _STR_FIELDS:
        if not isinstance(value, str):
            raise ValueError(f"config field '{key}' must be a string, got {value!r}")
        return value
    if key in _STR_LIST_FIELDS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"config field '{key}' must be a list of strings, got {value!r}")
        return tuple(value)
    if key in _FLOAT_FIELDS:
        if not (_is_int(value) or isinstance(value, float)):
            raise ValueError(f"config field '{key}' must be a number, got {value!r}")
        return float(value)
    raise AssertionError(f"bug: config field '{key}' has no type rule")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive(field: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"config field '{field}' must be positive, got {value}")


def _check_choice(field: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"config field '{field}' must be one of {', '.join(choices)}; got {value!r}")
