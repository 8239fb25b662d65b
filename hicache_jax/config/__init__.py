"""Configuration, pure Python: the model (`model.py`, from `configs/*.json`) and the cache
(`cache.py`: `HiCacheConfig` with its `TransferConfig` and `StorageConfig` sections)."""
from hicache_jax.config.cache import (DEFAULT_LINK_BYTES_PER_SECOND, DEFAULT_LOAD_BACK_THRESHOLD,
                                      DEFAULT_PREFETCH_SHARE, HiCacheConfig, PrefetchPolicy, StorageConfig,
                                      StorageWritePolicy, TransferConfig, WritePolicyName, xla_pinned_limit_bytes)
from hicache_jax.config.model import ModelConfig, load_model_config, model_config_from_dict

__all__ = ["DEFAULT_LINK_BYTES_PER_SECOND", "DEFAULT_LOAD_BACK_THRESHOLD", "DEFAULT_PREFETCH_SHARE", "HiCacheConfig",
           "ModelConfig", "PrefetchPolicy", "StorageConfig", "StorageWritePolicy", "TransferConfig", "WritePolicyName",
           "load_model_config", "model_config_from_dict", "xla_pinned_limit_bytes"]
