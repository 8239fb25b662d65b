"""Model configuration: a frozen dataclass loaded once from a JSON file in `configs/`.

Pure Python (no jax). Every bad value raises `ValueError` naming the field and the value.
Field names follow the public Hugging Face `config.json` files where one exists
(`num_hidden_layers`, `compress_ratios`, ...); the deployment choices a serving system
makes on top (`kv_layout`, `indexer_dtype`, `page_size`) live in the same file.
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
from typing import Any

from hicache_jax import validate

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


class WritePolicyName(enum.StrEnum):
    """`HiCacheConfig.write_policy`: when device pages get a host copy (see `tree.policy.WritePolicy`)."""

    WRITE_THROUGH = "write_through"                      # back up on the first hit
    WRITE_THROUGH_SELECTIVE = "write_through_selective"  # back up on the second hit
    WRITE_BACK = "write_back"                            # back up only when evicted from device


@dataclasses.dataclass(frozen=True)
class HiCacheConfig:
    """How big each tier is and how the cache behaves. Validated at construction.

    Device tier: `device_pages` anchor pages (tokens = pages x page_size) and
    `swa_device_pages` SWA pages (default: as many). Host tier, exactly one of:
    `host_pages` (anchor pages, or {allocator: pages}), `host_ratio` (host pages = ratio x
    device pages, every allocator), or `host_budget_bytes` ({allocator: bytes}: a per-pool
    budget, turned into pages by the bytes of one page of every pool that allocator
    addresses). Default: `host_ratio=2.0`.

    Load-back: a host hit is brought back only if it moves at least
    `max(1, load_back_threshold)` tokens (or an SWA window), and, when
    `recompute_seconds_per_token` is set, only if moving its bytes at
    `link_bytes_per_second` is faster than recomputing its tokens.
    With `layer_groups` = n > 1 the host tier stores each page as n parts, one per group
    of consecutive model layers, so a deferred load-back can be moved by the model's step
    group by group, under the compute of the groups before (`Landing`). A deferred load
    leaves one whole anchor block to the step, of one of `landing_buckets` sizes (the
    largest powers of two of a chunk), and moves the rest at once, so the step compiles for
    that many landing shapes, at warm-up (`HiCache.landing_examples`).

    Backups: a copy runs in device order with the model's steps, so a large backup batch
    delays the next step by its whole transfer time. With `backup_bytes_per_step` set,
    write-through batches are cut into pieces of at most that size and each `step()`
    dispatches pieces up to that many bytes (oldest batch first, at least one piece); the
    tree sees one transfer per batch, acknowledged when its last piece lands. Write-back
    demotions and load-backs are never paced; `drain`, `wait` and a blocked `alloc` /
    `acquire` send what is left at once.
    """

    device_pages: int
    swa_device_pages: int | None = None
    host_pages: int | dict[str, int] | None = None
    host_ratio: float | None = None
    host_budget_bytes: dict[str, int] | None = None
    write_policy: str = "write_through"
    write_through_threshold: int | None = None   # hits before a backup; policy default when None
    load_back_threshold: int = 10                # tokens
    recompute_seconds_per_token: float | None = None
    link_bytes_per_second: float = 25e9
    transfer_timeout_s: float = 30.0             # a transfer not done by then is failed
    max_staging_bytes: int = 512 << 20
    layer_groups: int = 1                        # host blocks split by layer group, for deferred loads (Landing)
    landing_buckets: int = 3                     # block sizes (pages) a deferred load may leave to a step
    backup_bytes_per_step: int | None = None     # pace write-through backups: about this much per step()
    host_memory_limit_bytes: int | None = None   # default: XLA's pinned host pool cap (see xla_pinned_limit_bytes)
    check_invariants: bool = False               # recompute every invariant after each call (tests)
    # L3 storage (off unless `storage` names a store: file:///dir, gs://..., s3://..., mooncake://host:port)
    storage: str | None = None
    storage_write_policy: str = "write_through"  # put each host copy when it lands, or when the host evicts it
    storage_prefetch_policy: str = "timeout"     # best_effort | wait_complete | timeout
    storage_prefetch_timeout_s: float = 0.05     # timeout policy: wait base + per 1K prompt tokens, capped
    storage_prefetch_timeout_per_1k_tokens_s: float = 0.01
    storage_prefetch_timeout_max_s: float = 1.0
    storage_prefetch_share: float = 0.5          # of each host allocator, at most this much reserved by prefetches
    storage_model_id: str = ""                   # names the weights in every storage key
    storage_call_timeout_s: float = 5.0          # the longest any storage call may block the serving loop
    storage_retry_after_s: float = 10.0          # after a storage failure, serve from L1/L2 only this long
    storage_connect_retry_s: float = 0.0         # keep trying to reach a store that is down this long (0: once)

    def __post_init__(self):
        _check_count("device_pages", self.device_pages, minimum=1)
        if self.swa_device_pages is not None:
            _check_count("swa_device_pages", self.swa_device_pages, minimum=1)
        given = [n for n in ("host_pages", "host_ratio", "host_budget_bytes") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of host_pages, host_ratio, host_budget_bytes; got {', '.join(given)}")
        if isinstance(self.host_pages, dict):
            for k, v in self.host_pages.items():
                _check_count(f"host_pages[{k!r}]", v)
        elif self.host_pages is not None:
            _check_count("host_pages", self.host_pages)
        if self.host_ratio is not None:
            validate.number(f"{_FIELD}'host_ratio'", self.host_ratio)
        if self.host_budget_bytes is not None:
            if not isinstance(self.host_budget_bytes, dict):
                raise ValueError(f"{_FIELD}'host_budget_bytes' must be {{allocator: bytes}}, "
                                 f"got {self.host_budget_bytes!r}")
            for k, v in self.host_budget_bytes.items():
                _check_count(f"host_budget_bytes[{k!r}]", v)
        if not isinstance(self.write_policy, str) or self.write_policy not in WritePolicyName:
            raise ValueError(f"{_FIELD}'write_policy' must be one of {', '.join(WritePolicyName)}; "
                             f"got {self.write_policy!r}")
        if self.write_through_threshold is not None:
            _check_count("write_through_threshold", self.write_through_threshold, minimum=1)
        if isinstance(self.load_back_threshold, bool) or not isinstance(self.load_back_threshold, int):
            raise ValueError(f"{_FIELD}'load_back_threshold' must be an integer, got {self.load_back_threshold!r}")
        for name in ("recompute_seconds_per_token", "link_bytes_per_second", "transfer_timeout_s"):
            v = getattr(self, name)
            if v is not None:
                validate.number(f"{_FIELD}{name!r}", v)
        _check_count("max_staging_bytes", self.max_staging_bytes, minimum=1)
        _check_count("layer_groups", self.layer_groups, minimum=1)
        _check_count("landing_buckets", self.landing_buckets, minimum=1)
        if self.backup_bytes_per_step is not None:
            _check_count("backup_bytes_per_step", self.backup_bytes_per_step, minimum=1)
        if self.host_memory_limit_bytes is not None:
            _check_count("host_memory_limit_bytes", self.host_memory_limit_bytes, minimum=1)
        if not isinstance(self.check_invariants, bool):
            raise ValueError(f"{_FIELD}'check_invariants' must be a bool, got {self.check_invariants!r}")
        self._check_storage()

    def _check_storage(self) -> None:
        if self.storage is not None and not (isinstance(self.storage, str) and "://" in self.storage):
            raise ValueError(f"{_FIELD}'storage' must be a storage URL such as file:///dir or mooncake://host:port, "
                             f"got {self.storage!r}")
        if self.storage is not None:
            from hicache_jax.storage.backend import check_url   # the URL's form only: nothing is opened
            try:
                check_url(self.storage)
            except ValueError as e:
                raise ValueError(f"{_FIELD}'storage': {e}") from None
        for name, choices in (("storage_write_policy", STORAGE_WRITE_POLICIES),
                              ("storage_prefetch_policy", PREFETCH_POLICIES)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in choices:
                raise ValueError(f"{_FIELD}{name!r} must be one of {', '.join(choices)}; got {value!r}")
        for name in ("storage_prefetch_timeout_s", "storage_prefetch_timeout_per_1k_tokens_s",
                     "storage_prefetch_timeout_max_s", "storage_call_timeout_s", "storage_retry_after_s"):
            validate.number(f"{_FIELD}{name!r}", getattr(self, name))
        validate.number(f"{_FIELD}'storage_connect_retry_s'", self.storage_connect_retry_s, positive=False)
        share = validate.number(f"{_FIELD}'storage_prefetch_share'", self.storage_prefetch_share)
        if share > 1:
            raise ValueError(f"{_FIELD}'storage_prefetch_share' must be in (0, 1], got {share!r}")
        if not isinstance(self.storage_model_id, str):
            raise ValueError(f"{_FIELD}'storage_model_id' must be a str, got {self.storage_model_id!r}")

    def host_limit_bytes(self) -> int:
        """The most pinned host memory the host tier may take: `host_memory_limit_bytes`, or
        by default the cap of XLA's pinned pool (`xla_pinned_limit_bytes`)."""
        return self.host_memory_limit_bytes if self.host_memory_limit_bytes is not None else xla_pinned_limit_bytes()

    def prefetch_wait_s(self, prompt_tokens: int) -> float | None:
        """How long `acquire` waits for a prefetch of a prompt this long (None: until it ends)."""
        if self.storage_prefetch_policy == "best_effort":
            return 0.0
        if self.storage_prefetch_policy == "wait_complete":
            return None
        return min(self.storage_prefetch_timeout_max_s,
                   self.storage_prefetch_timeout_s + self.storage_prefetch_timeout_per_1k_tokens_s * prompt_tokens / 1000)

    def page_counts(self, layout) -> tuple[dict[str, int], dict[str, int]]:
        """(device pages, host pages) per allocator of `layout` (pure: no allocation)."""
        allocators = [p.name for p in layout.allocator_pools]
        anchor = layout.anchor.name
        device = {a: self.device_pages if a == anchor else (self.swa_device_pages or self.device_pages)
                  for a in allocators}
        if isinstance(self.host_pages, dict):
            host = dict(self.host_pages)
        elif self.host_pages is not None:
            host = {a: self.host_pages for a in allocators}
        elif self.host_budget_bytes is not None:
            host = {a: b // max(1, layout.page_bytes_of(a)) for a, b in self.host_budget_bytes.items()}
        else:
            ratio = 2.0 if self.host_ratio is None else self.host_ratio
            host = {a: max(1, int(device[a] * ratio)) for a in allocators}
        unknown = sorted(set(host) - set(allocators))
        missing = sorted(set(allocators) - set(host))
        if unknown or missing:
            raise ValueError(f"host page budgets name {unknown or missing}: they must cover exactly the "
                             f"allocators {allocators}")
        return device, host


def xla_pinned_limit_bytes() -> int:
    """The cap of XLA's pinned host allocator: `XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB` GiB when
    set (XLA reads the same variable), else XLA's default of 64 GiB. Read when a cache is
    built, never at import."""
    raw = os.environ.get("XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB")
    if raw is None:
        return 64 << 30
    try:
        gib = float(raw)
    except ValueError:
        raise ValueError(f"XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB must be a number of GiB, got {raw!r}") from None
    return int(gib * (1 << 30))


_FIELD = "HiCacheConfig field "
STORAGE_WRITE_POLICIES = ("write_through", "write_back")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")


def _check_count(field: str, value, minimum: int = 0) -> None:
    validate.count(f"{_FIELD}'{field}'", value, minimum)
